"""FedCor: the GP fit and the greedy selection by hand, the query schedule, and the
sampler on a federation whose loss changes come in two correlated groups."""

from collections import OrderedDict

import numpy as np
import pytest

from fedflex import keys
from fedflex.config import ConfigError
from fedflex.loader import load_scenario
from fedflex.strategies.fedcor import FedCorSampler, fit_ppca, greedy_loss_reduction


def test_ppca_reproduces_a_covariance_with_one_direction_and_noise():
    # S = diag(2, 0.5) (mean 0): rank 1 keeps e1 with 2; s2 = the other eigenvalue 0.5;
    # W = e1 sqrt(2 - 0.5), so W W^T + s2 I = diag(2, 0.5) = S
    y = np.array([[2.0, 0.0], [-2.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    mu, w, s2 = fit_ppca(y, rank=1)
    np.testing.assert_allclose(mu, [0.0, 0.0])
    assert s2 == pytest.approx(0.5)
    np.testing.assert_allclose(w @ w.T + s2 * np.eye(2), np.diag([2.0, 0.5]), atol=1e-12)


def test_ppca_rank_is_capped_by_the_number_of_observations():
    # two observations: the sample covariance has rank 1 whatever rank is asked for
    _, w, _ = fit_ppca(np.array([[1.0, 2.0, 3.0], [-1.0, -2.0, -3.0]]), rank=5)
    assert w.shape[1] == 1


# Sigma = W W^T + I with W = (1, 1, 0): clients 0 and 1 correlated, 2 on its own:
# Sigma = [[2, 1, 0], [1, 2, 0], [0, 0, 1]], p = 1/3 each, Sigma p = (1, 1, 1/3)
W = np.array([[1.0], [1.0], [0.0]])
P = np.full(3, 1.0 / 3)


def test_greedy_conditions_on_each_pick():
    # scores (Sigma p)_k / sqrt(Sigma_kk): 1/sqrt2, 1/sqrt2, 1/3 -> client 0 (tie: lower);
    # conditioned on 0: Sigma = diag(0, 1.5, 1), Sigma p = (0, 0.5, 1/3): scores
    # 0.5/sqrt(1.5) = 0.408 for client 1, 1/3 for client 2 -> client 1
    chosen, gain = greedy_loss_reduction(W, 1.0, P, 2)
    assert chosen.tolist() == [0, 1]
    np.testing.assert_allclose(gain, [1 / np.sqrt(2), 0.5 / np.sqrt(1.5)])


def test_greedy_discount_lowers_a_recent_pick():
    # halving client 1's assumed drop: 0.204 < 1/3, so client 2 comes second
    chosen, gain = greedy_loss_reduction(W, 1.0, P, 2, drop=np.array([1.0, 0.5, 1.0]))
    assert chosen.tolist() == [0, 2]
    assert gain[1] == pytest.approx(1 / 3)


def test_query_schedule_warmup_then_two_rounds_per_refresh():
    sampler = FedCorSampler(seed=0, warmup=3, refresh=4)
    assert [t for t in range(1, 14) if sampler.queries(t)] == [1, 2, 3, 4, 7, 8, 11, 12]


class GroupCtx:
    """Four clients in two groups: each group's loss moves by a shared random amount per
    round (plus small noise), so clients of one group are strongly correlated."""

    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)
        self.global_arrays = OrderedDict(w=np.zeros(1, dtype=np.float32))
        self.loss = np.full(4, 2.0)
        self.queried = []

    def query(self, server_round, clients, arrays):
        self.queried.append(server_round)
        a, b = self.rng.normal(size=2)
        self.loss = self.loss + np.array([a, a, b, b]) + 0.01 * self.rng.normal(size=4)
        return {int(c): {keys.EVAL_LOSS: float(self.loss[c]), keys.NUM_EXAMPLES: 10} for c in clients}


def test_sampler_picks_one_client_per_correlated_group_after_warmup():
    # after picking a client of one group, the other member's loss change is explained
    # (its posterior variance ~ noise), so the second pick comes from the other group
    ctx = GroupCtx()
    sampler = FedCorSampler(seed=0, warmup=6, refresh=0, rank=2, discount=1.0)
    sampler.bind(ctx)
    for t in range(1, 8):
        picks = sampler.sample(t, np.arange(4), 2)
    assert ctx.queried == [1, 2, 3, 4, 5, 6, 7]
    assert len(sampler.changes) == 6
    assert sorted(int(c) // 2 for c in picks) == [0, 1]
    assert sampler.round_metrics()["fedcor_gain"] > 0


def test_sampler_explores_a_client_without_loss_history_first():
    ctx = GroupCtx()
    sampler = FedCorSampler(seed=0, warmup=3, refresh=0, rank=1)
    sampler.bind(ctx)
    for t in range(1, 5):
        sampler.sample(t, np.arange(4), 1)
    # client 4 never reported a loss: the one place of round 5 goes to it
    assert sampler.sample(5, np.arange(5), 1).tolist() == [4]


def test_config_refuses_a_one_round_refresh_by_name():
    with pytest.raises(ConfigError, match="strategy.sampler.fedcor.refresh"):
        load_scenario(None, ["strategy.sampler.name=fedcor", "strategy.sampler.fedcor.refresh=1"])
