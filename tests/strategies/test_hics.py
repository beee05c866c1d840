"""HiCS-FL, Power-of-Choice and Clustered Sampling: kernels by hand, samplers with a fake
context, the Fig. 8 claim on real FMNIST partitions, and end-to-end rounds through the
real ClientApp."""

import math
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

from fedflex.strategies.clustered import ClusteredSampler, CountSketch
from fedflex.strategies.clustering import (
    algorithm2_distributions,
    draw_distinct,
    draw_one_per_distribution,
    ward_labels,
    ward_tree,
    weight_capped_clusters,
)
from fedflex.strategies.hics import (
    HiCSSampler,
    client_probabilities,
    cluster_mean,
    cluster_probabilities,
    estimate_entropy,
    gamma_schedule,
    hics_distance,
    scaled_update,
)
from fedflex.strategies.parts import ClientUpdate
from fedflex.strategies.powd import PowDSampler, highest_loss

BIAS = "fc_out.bias"
WEIGHT = "fc_out.weight"
C = 4  # classes in the hand-made cases


class FakeCtx:
    """The RoundContext a sampler sees: sizes, the global model, a scripted QUERY."""

    facts = None  # no round facts: parts fall back to their own lr

    def __init__(self, sizes=None, losses=None, global_arrays=None):
        self.num_clients = 0
        self.global_arrays = global_arrays if global_arrays is not None else OrderedDict()
        self.sizes = dict(sizes or {})
        self.losses = dict(losses or {})
        self.queries = []

    def data_sizes(self):
        return self.sizes

    def query(self, server_round, clients, arrays):
        self.queries.append(sorted(int(c) for c in clients))
        return {
            int(c): {"eval-loss": self.losses[int(c)], "num-examples": 10} for c in clients if int(c) in self.losses
        }

    def train_round(self, server_round, arrays, clients, phase):
        raise AssertionError("samplers run no extra rounds")


def _global():
    return OrderedDict([(WEIGHT, np.zeros((C, 3), dtype=np.float32)), (BIAS, np.zeros(C, dtype=np.float32))])


def _update(client, db, n=10, dw=None):
    arrays = OrderedDict(
        [
            (WEIGHT, np.asarray(dw if dw is not None else np.zeros((C, 3)), dtype=np.float32)),
            (BIAS, np.asarray(db, dtype=np.float32)),
        ]
    )
    return ClientUpdate(client=client, num_examples=n, arrays=arrays)


def _hics(n=6, k=2, **kwargs):
    args = dict(bias_key=BIAS, num_clients=n, rounds=100, seed=0, temperature=1.0, estimate="bias")  # Eq. 7 as written
    args.update(kwargs)
    sampler = HiCSSampler(**args)
    sampler.bind(FakeCtx(global_arrays=_global()))
    return sampler


def _run_warmup(sampler, online, k, db_of):
    """The warm-up rounds: sample, then every sampled client reports ``db_of(c)``."""
    rounds, t = [], 1
    while True:
        picks = sampler.sample(t, online, k)
        sampler.observe(t, [_update(int(c), db_of(int(c))) for c in picks], _global())
        rounds.append(picks.tolist())
        if t >= sampler.warmup_rounds:  # known after the first sample()
            return rounds
        t += 1


# ---------------------------------------------------------------------------- estimate
def test_entropy_of_zero_update_is_log_c():
    # softmax of equal logits is uniform: H = ln C
    assert estimate_entropy(np.zeros(C), 0.01) == pytest.approx(math.log(C))


def test_entropy_at_a_hand_computed_softmax():
    # db / T = [ln 3, 0] -> softmax [3/4, 1/4] -> H = -(.75 ln .75 + .25 ln .25)
    t = 0.0025
    h = estimate_entropy(np.array([math.log(3) * t, 0.0]), t)
    assert h == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))  # 0.5623


def test_one_dominant_label_gives_entropy_near_zero():
    assert estimate_entropy(np.array([1.0, 0.0, 0.0, 0.0]), 0.01) < 1e-6


def test_temperature_scales_the_update():
    db = np.array([0.02, -0.01, 0.005, 0.0])
    # H(softmax(db / T)) depends on db / T only
    assert estimate_entropy(db, 0.01) == pytest.approx(estimate_entropy(2 * db, 0.02))
    # a smaller T sharpens the softmax: lower entropy; a huge T flattens it to ln C
    assert estimate_entropy(db, 0.001) < estimate_entropy(db, 0.01) < estimate_entropy(db, 10.0)
    assert estimate_entropy(db, 1e6) == pytest.approx(math.log(C))


def test_entropy_of_rows():
    h = estimate_entropy(np.array([[0.0, 0.0], [100.0, 0.0]]), 1.0)
    np.testing.assert_allclose(h, [math.log(2), 0.0], atol=1e-12)


# ---------------------------------------------------------------------------- distance
def test_distance_of_orthogonal_updates_is_half_pi_plus_lambda_gap():
    d = hics_distance(np.array([[1.0, 0.0]]), np.array([0.5]), np.array([[0.0, 3.0]]), np.array([0.2]), 10.0)
    assert d[0, 0] == pytest.approx(math.pi / 2 + 10 * 0.3)


def test_distance_of_parallel_and_opposite_updates():
    a = np.array([[1.0, 2.0]])
    same = hics_distance(a, np.array([1.0]), 5 * a, np.array([1.0]), 10.0)
    opposite = hics_distance(a, np.array([1.0]), -a, np.array([1.0]), 10.0)
    assert same[0, 0] == pytest.approx(0.0, abs=1e-7)  # scale does not matter, equal entropies
    assert opposite[0, 0] == pytest.approx(math.pi)


def test_zero_update_is_at_half_pi_from_everything():
    d = hics_distance(np.zeros((1, 2)), np.array([0.0]), np.array([[1.0, 1.0]]), np.array([0.0]), 10.0)
    assert d[0, 0] == pytest.approx(math.pi / 2)


# ---------------------------------------------------------------------------- Ward
def _euclid(points):
    return lambda r, c: np.linalg.norm(points[r][:, None, :] - points[c][None, :, :], axis=2)


def test_ward_separates_two_obvious_blobs():
    pts = np.array([[0, 0], [0.1, 0], [0, 0.1], [10, 10], [10.1, 10], [10, 10.1]], dtype=float)
    labels = ward_labels(_euclid(pts), 6, 2)
    assert len(set(labels[:3])) == 1 and len(set(labels[3:])) == 1 and labels[0] != labels[3]


def test_ward_with_more_clusters_than_items_keeps_each_alone():
    assert ward_labels(_euclid(np.zeros((3, 2))), 3, 5).tolist() == [0, 1, 2]


def test_scalable_ward_equals_exact_when_the_subsample_is_everyone():
    pts = np.random.default_rng(0).normal(size=(40, 3))
    exact = ward_labels(_euclid(pts), 40, 4)
    scalable = ward_labels(_euclid(pts), 40, 4, ward="scalable", max_exact=40, rng=np.random.default_rng(1))
    np.testing.assert_array_equal(exact, scalable)


def test_scalable_ward_recovers_blobs_from_a_subsample():
    rng = np.random.default_rng(0)
    centers = np.array([[0, 0], [20, 0], [0, 20]], dtype=float)
    truth = np.repeat(np.arange(3), 100)
    pts = centers[truth] + rng.normal(scale=0.5, size=(300, 2))
    labels = ward_labels(_euclid(pts), 300, 3, ward="scalable", max_exact=30, rng=rng)
    for b in range(3):  # every blob lies in one cluster, different blobs in different ones
        assert len(set(labels[truth == b])) == 1
    assert len(set(labels)) == 3


# ---------------------------------------------------------------------------- rule
def test_gamma_anneals_linearly_to_zero():
    assert [gamma_schedule(t, 200, 4.0) for t in (0, 50, 100, 200, 250)] == [4.0, 3.0, 2.0, 0.0, 0.0]


def test_cluster_probabilities_are_softmax_of_gamma_times_mean_entropy():
    pi = cluster_probabilities(np.array([0.0, math.log(2)]), 1.0)
    np.testing.assert_allclose(pi, [1 / 3, 2 / 3])  # exp(0) : exp(ln 2) = 1 : 2
    np.testing.assert_allclose(cluster_probabilities(np.array([0.1, 2.0]), 0.0), [0.5, 0.5])


def test_cluster_mean():
    np.testing.assert_allclose(cluster_mean(np.array([1.0, 3.0, 5.0]), np.array([0, 0, 1])), [2.0, 5.0])


def test_client_probability_is_cluster_probability_times_share_inside_it():
    q = client_probabilities(np.array([0, 0, 1]), np.array([0.5, 0.5]), np.array([1.0, 3.0, 2.0]))
    np.testing.assert_allclose(q, [0.5 * 1 / 4, 0.5 * 3 / 4, 0.5 * 1.0])


def test_draw_distinct_never_repeats_and_skips_zero_probabilities():
    rng = np.random.default_rng(0)
    for _ in range(50):
        picks = draw_distinct(rng, np.array([0.7, 0.0, 0.2, 0.1]), 3)
        assert sorted(picks.tolist()) == [0, 2, 3]


def test_draw_distinct_first_pick_follows_q():
    rng = np.random.default_rng(0)
    firsts = np.array([draw_distinct(rng, np.array([0.6, 0.3, 0.1]), 1)[0] for _ in range(4000)])
    np.testing.assert_allclose(np.bincount(firsts, minlength=3) / 4000, [0.6, 0.3, 0.1], atol=0.03)


# ---------------------------------------------------------------------------- HiCS sampler
def test_warmup_visits_every_client_exactly_once_in_ceil_n_over_k_rounds():
    sampler = _hics(n=7, k=3)
    online = np.arange(7)
    rounds = _run_warmup(sampler, online, 3, lambda c: np.eye(C)[c % C])
    assert sampler.warmup_rounds == 3  # ceil(7 / 3)
    assert [len(r) for r in rounds] == [3, 3, 1]  # Algorithm 1: min(K, |S0|)
    assert sorted(c for r in rounds for c in r) == list(range(7))


def test_warmup_order_is_random():
    orders = {tuple(_hics(n=6, seed=s).sample(1, np.arange(6), 2).tolist()) for s in range(10)}
    assert len(orders) > 1


def test_only_online_clients_are_drawn():
    sampler = _hics(n=6, k=2)
    _run_warmup(sampler, np.arange(6), 2, lambda c: np.eye(C)[c % C] * (c + 1))
    online = np.array([1, 3, 4])
    for t in range(4, 30):
        assert set(sampler.sample(t, online, 2).tolist()) <= {1, 3, 4}


def test_new_online_clients_are_explored_first():
    sampler = _hics(n=6, k=2)
    _run_warmup(sampler, np.arange(5), 2, lambda c: np.eye(C)[c % C])  # client 5 offline
    assert 5 not in sampler.entropies
    picks = sampler.sample(10, np.arange(6), 2)
    assert 5 in picks.tolist()


@pytest.mark.parametrize("tries, silent_drawn", [(None, 6), (2, 2)])
def test_a_client_that_never_replies_is_explored_at_most_explore_tries_times(tries, silent_drawn):
    # 6 clients, K = 2; clients 4 and 5 are drawn but never reply (stragglers past every
    # deadline). The warm-up (ceil(6 / 2) = 3 rounds) draws each once; without a limit they
    # then take the exploration slots of every round (rounds 4-8: 5 more, 6 in all); with
    # explore_tries=2 they are drawn once more (round 4) and then the rule draws among the
    # four that reply
    sampler = _hics(n=6, k=2, explore_tries=tries)
    drawn = {4: 0, 5: 0}
    for t in range(1, 9):
        picks = sampler.sample(t, np.arange(6), 2).tolist()
        for c in (4, 5):
            drawn[c] += c in picks
        sampler.observe(t, [_update(c, np.eye(C)[c % C]) for c in picks if c < 4], _global())
    assert drawn == {4: silent_drawn, 5: silent_drawn}
    tried = sampler.state_dict()["tries"]
    assert (tried["4"], tried["5"]) == (silent_drawn, silent_drawn)
    assert all(tried[str(c)] == 1 for c in range(4))  # drawn once before their first reply


def test_departed_clients_keep_their_estimates_by_default():
    sampler = _hics(n=4, k=2, departed="keep")
    _run_warmup(sampler, np.arange(4), 2, lambda c: np.eye(C)[c])
    sampler.sample(5, np.array([0, 1, 2]), 2)  # client 3 is away
    assert 3 in sampler.entropies


def test_departed_clients_lose_their_estimates_with_drop_and_are_explored_again():
    sampler = _hics(n=4, k=2, departed="drop")
    _run_warmup(sampler, np.arange(4), 2, lambda c: np.eye(C)[c])
    sampler.sample(5, np.array([0, 1, 2]), 2)  # client 3 is away
    assert 3 not in sampler.entropies
    assert 3 in sampler.sample(6, np.arange(4), 2).tolist()  # back: explored first


def test_rule_prefers_the_balanced_cluster_early_on():
    # clients 0-3 balanced (db ~ 0: H ~ ln C), clients 4-7 one label each (H ~ 0)
    rng = np.random.default_rng(0)

    def db(c):
        return rng.normal(scale=1e-3, size=C) if c < 4 else 5.0 * np.eye(C)[c - 4]

    sampler = _hics(n=8, k=1, gamma0=20.0, rounds=1000, num_clusters=2)
    _run_warmup(sampler, np.arange(8), 1, db)
    picks = [int(sampler.sample(t, np.arange(8), 1)[0]) for t in range(9, 209)]
    # pi_balanced = 1 / (1 + exp(-gamma ln 4)) > 0.999 at gamma ~ 20
    assert np.mean(np.array(picks) < 4) > 0.97


def test_rule_samples_clusters_uniformly_when_gamma_is_zero():
    rng = np.random.default_rng(0)

    def db(c):
        return rng.normal(scale=1e-3, size=C) if c < 4 else 5.0 * np.eye(C)[c - 4]

    sampler = _hics(n=8, k=1, gamma0=0.0, num_clusters=2)
    _run_warmup(sampler, np.arange(8), 1, db)
    picks = np.array([int(sampler.sample(t, np.arange(8), 1)[0]) for t in range(9, 1009)])
    assert np.mean(picks < 4) == pytest.approx(0.5, abs=0.06)


def test_in_cluster_draw_follows_data_share():
    # one cluster (M=1): the draw is proportional to the data sizes 1 : 3
    sampler = _hics(n=2, k=1, num_clusters=1)
    sampler.ctx.sizes = {0: 10, 1: 30}
    _run_warmup(sampler, np.arange(2), 1, lambda c: np.eye(C)[c])
    picks = np.array([int(sampler.sample(t, np.arange(2), 1)[0]) for t in range(3, 2003)])
    assert np.mean(picks == 1) == pytest.approx(0.75, abs=0.04)


def test_observe_takes_local_minus_global_bias():
    sampler = _hics(n=2, k=1)
    g = _global()
    g[BIAS] = np.array([1.0, 1.0, 1.0, 1.0], dtype=np.float32)
    sampler.observe(1, [_update(0, [1.0, 1.0, 1.0, 3.0])], g)
    np.testing.assert_allclose(sampler.vectors[0], [0, 0, 0, 2.0])
    assert sampler.entropies[0] == pytest.approx(float(estimate_entropy(np.array([0, 0, 0, 2.0]), 1.0)))


def test_round_metrics_report_the_rule_and_the_estimates_once():
    # 4 clients, K = 1, M = 2: warm-up rounds 1-4, then the entropy rule
    sampler = _hics(n=4, k=1, num_clusters=2, gamma0=2.0, rounds=10)
    dbs = {0: np.zeros(C), 1: np.zeros(C), 2: 5.0 * np.eye(C)[0], 3: 5.0 * np.eye(C)[1]}
    picks = sampler.sample(1, np.arange(4), 1)
    sampler.observe(1, [_update(int(picks[0]), dbs[int(picks[0])])], _global())
    m = sampler.round_metrics()
    assert m["hics_rule"] == "warmup"
    assert m["hics_entropy"] == {
        str(int(picks[0])): pytest.approx(float(estimate_entropy(dbs[int(picks[0])], 1.0)), abs=1e-5)
    }
    assert sampler.round_metrics() == {}  # read once
    for t in (2, 3, 4):
        c = int(sampler.sample(t, np.arange(4), 1)[0])
        sampler.observe(t, [_update(c, dbs[c])], _global())
    sampler.round_metrics()
    c = int(sampler.sample(5, np.arange(4), 1)[0])
    sampler.observe(5, [_update(c, dbs[c])], _global())
    m = sampler.round_metrics()
    # clusters {0, 1} (H = ln 4) and {2, 3} (H = H(softmax([5, 0, 0, 0])) ~ 0.12 each);
    # gamma_5 = 2 (1 - 5/10) = 1; pi = softmax(1 x Hbar) over the two clusters
    h_one = float(estimate_entropy(5.0 * np.eye(C)[0], 1.0))
    assert m["hics_rule"] == "entropy" and m["hics_gamma"] == pytest.approx(1.0)
    assert sorted(m["hics_cluster_entropy"]) == pytest.approx([h_one, math.log(C)], abs=1e-4)
    hi = math.exp(math.log(C)) / (math.exp(math.log(C)) + math.exp(h_one))
    assert sorted(m["hics_cluster_prob"]) == pytest.approx([1 - hi, hi], abs=1e-4)
    assert list(m["hics_entropy"]) == [str(c)]


def test_state_dict_restores_the_same_future():
    a = _hics(n=6, k=2)
    _run_warmup(a, np.arange(6), 2, lambda c: np.eye(C)[c % C] * (c + 1))
    b = _hics(n=6, k=2, seed=99)
    b.load_state_dict(a.state_dict())
    for t in range(4, 10):
        np.testing.assert_array_equal(a.sample(t, np.arange(6), 2), b.sample(t, np.arange(6), 2))


def test_missing_bias_key_is_refused_with_a_message():
    with pytest.raises(ValueError, match="output-layer bias"):
        HiCSSampler(bias_key=None, num_clients=4, rounds=10, seed=0)


def test_authors_variant_estimates_from_weight_row_means_and_freezes():
    sampler = _hics(n=2, k=1, variant="authors")
    dw = np.zeros((C, 3))
    dw[2] = 3.0  # row means [0, 0, 3, 0]; db says nothing
    sampler.sample(1, np.arange(2), 1)
    sampler.observe(1, [_update(0, np.zeros(C), dw=dw)], _global())
    assert sampler.entropies[0] == pytest.approx(float(estimate_entropy(np.array([0, 0, 3.0, 0]), 1.0)))
    sampler.observe(5, [_update(0, np.zeros(C))], _global())  # after the warm-up (2 rounds): frozen
    assert sampler.entropies[0] == pytest.approx(float(estimate_entropy(np.array([0, 0, 3.0, 0]), 1.0)))


def test_scaled_updates_by_hand():
    db = np.array([0.0, 3.0, 0.0, -4.0])
    np.testing.assert_allclose(scaled_update(db, "bias"), db)
    np.testing.assert_allclose(scaled_update(db, "unit"), [0.0, 0.6, 0.0, -0.8])  # ||db|| = 5
    np.testing.assert_allclose(scaled_update(np.zeros(4), "unit"), np.zeros(4))  # no direction: stays 0
    np.testing.assert_allclose(scaled_update(db, "per-step", lr=0.5, steps=4), db / 2.0)
    with pytest.raises(ValueError, match="estimate 'norm'"):
        scaled_update(db, "norm")


def test_unit_estimate_does_not_depend_on_the_size_of_the_update():
    # the bias estimate of one update and of the same update 100x smaller differ (the
    # small one looks balanced); the unit estimate gives both the same entropy
    db = np.array([3.0, -1.0, -1.0, -1.0])
    for estimate, same in (("bias", False), ("unit", True)):
        sampler = _hics(n=2, k=1, estimate=estimate)
        sampler.observe(1, [_update(0, db), _update(1, db / 100)], _global())
        assert (sampler.entropies[0] == pytest.approx(sampler.entropies[1])) is same
    big = float(estimate_entropy(db / np.linalg.norm(db), 1.0))
    assert sampler.entropies[1] == pytest.approx(big)


def test_per_step_estimate_divides_by_lr_and_the_reported_steps():
    sampler = _hics(n=1, k=1, estimate="per-step", lr=0.01)
    update = _update(0, [0.2, 0.0, 0.0, 0.0])
    update.metrics["num-steps"] = 4  # db / (0.01 x 4) = [5, 0, 0, 0]
    sampler.observe(1, [update], _global())
    assert sampler.entropies[0] == pytest.approx(float(estimate_entropy(np.array([5.0, 0, 0, 0]), 1.0)))


@pytest.mark.parametrize("refresh, renewed", [("every-round", True), ("frozen", False), (None, True)])
def test_refresh_option_renews_or_freezes_estimates_after_the_warmup(refresh, renewed):
    sampler = _hics(n=2, k=1, refresh=refresh)  # warm-up: 2 rounds
    first, later = np.array([4.0, 0, 0, 0]), np.zeros(C)
    sampler.sample(1, np.arange(2), 1)
    sampler.observe(1, [_update(0, first)], _global())
    sampler.observe(2, [_update(0, later)], _global())  # still in the warm-up: always renewed
    assert sampler.entropies[0] == pytest.approx(math.log(C))
    sampler.observe(1, [_update(0, first)], _global())
    sampler.observe(5, [_update(0, later)], _global())  # after the warm-up
    expected = math.log(C) if renewed else float(estimate_entropy(first, 1.0))
    assert sampler.entropies[0] == pytest.approx(expected)


def test_unset_estimate_is_unit_except_for_the_authors_variant():
    assert HiCSSampler(bias_key=BIAS, num_clients=2, rounds=1, seed=0).estimate == "unit"
    assert HiCSSampler(bias_key=BIAS, num_clients=2, rounds=1, seed=0).temperature == 0.2
    authors = HiCSSampler(bias_key=BIAS, num_clients=2, rounds=1, seed=0, variant="authors")
    assert (authors.estimate, authors.temperature) == ("bias", 0.0025)


def test_authors_variant_freezes_unless_refresh_says_otherwise():
    assert _hics(variant="authors").refresh == "frozen"
    assert _hics(variant="authors", refresh="every-round").refresh == "every-round"
    assert _hics().refresh == "every-round"


def test_authors_variant_falls_back_to_clustered_sampling_when_estimates_spread():
    # estimates ln 4 and 0: variance > 0.1 -> one client per Algorithm 2 distribution
    sampler = _hics(n=4, k=2, variant="authors")
    dws = {
        0: np.zeros((C, 3)),
        1: np.zeros((C, 3)),
        2: 50 * np.outer(np.eye(C)[0], np.ones(3)),
        3: 50 * np.outer(np.eye(C)[1], np.ones(3)),
    }
    for t in (1, 2):
        picks = sampler.sample(t, np.arange(4), 2)
        sampler.observe(t, [_update(int(c), np.zeros(C), dw=dws[int(c)]) for c in picks], _global())
    assert np.var(list(sampler.entropies.values())) > 0.1
    picks = sampler.sample(3, np.arange(4), 2)
    assert len(set(picks.tolist())) == 2


# ---------------------------------------------------------------------------- pow-d
def test_powd_picks_the_highest_loss_candidates():
    ctx = FakeCtx(losses={0: 0.1, 1: 2.0, 2: 0.5, 3: 1.5, 4: 0.2})
    sampler = PowDSampler(seed=0, d=0)
    sampler.bind(ctx)
    picks = sampler.sample(1, np.arange(5), 2)
    assert picks.tolist() == [1, 3]
    assert ctx.queries == [[0, 1, 2, 3, 4]]  # d = 0: every online client is asked


def test_powd_round_metrics_compare_the_chosen_losses_with_all_candidates():
    sampler = PowDSampler(seed=0, d=0)
    sampler.bind(FakeCtx(losses={0: 0.1, 1: 2.0, 2: 0.5, 3: 1.5, 4: 0.2}))
    sampler.sample(1, np.arange(5), 2)
    m = sampler.round_metrics()
    assert m["powd_candidates"] == 5
    assert m["powd_mean_loss"] == pytest.approx(4.3 / 5)
    assert m["powd_chosen_loss"] == pytest.approx((2.0 + 1.5) / 2)
    assert sampler.round_metrics() == {}


def test_powd_queries_d_online_candidates_only():
    ctx = FakeCtx(losses={c: float(c) for c in range(10)})
    sampler = PowDSampler(seed=0, d=4)
    sampler.bind(ctx)
    online = np.array([1, 3, 5, 7, 9, 8])
    picks = sampler.sample(1, online, 2)
    (asked,) = ctx.queries
    assert len(asked) == 4 and set(asked) <= set(online.tolist())
    assert picks.tolist() == sorted(asked)[-2:]  # the two highest losses among the asked


def test_powd_candidates_follow_data_size():
    ctx = FakeCtx(sizes={0: 1, 1: 1, 2: 1000}, losses={0: 0.0, 1: 0.0, 2: 0.0})
    sampler = PowDSampler(seed=0, d=2)
    sampler.bind(ctx)
    for t in range(50):
        sampler.sample(t, np.arange(3), 1)
    assert all(2 in q for q in ctx.queries)  # P(client 2 not among 2 of 3) ~ 1e-3 per round


def test_powd_fills_with_silent_candidates_when_too_few_answer():
    assert highest_loss(np.array([4, 2, 9]), {2: 1.0}, 2).tolist() == [2, 4]


def test_powd_with_d_at_most_k_skips_the_query():
    ctx = FakeCtx()
    sampler = PowDSampler(seed=0, d=2)
    sampler.bind(ctx)
    assert len(sampler.sample(1, np.arange(5), 3)) == 3
    assert ctx.queries == []


# ---------------------------------------------------------------------------- clustered
def _blob_updates(blobs=3, per=4, dim=6, seed=0):
    rng = np.random.default_rng(seed)
    dirs = np.eye(dim)[:blobs] * 10
    out = {}
    for b in range(blobs):
        for i in range(per):
            out[b * per + i] = dirs[b] + rng.normal(scale=0.3, size=dim)
    return out


def _clustered_with(updates, sizes=None):
    sampler = ClusteredSampler(seed=0, sketch_dim=64)
    sampler.bind(FakeCtx(sizes=sizes or {c: 10 for c in updates}))
    g = OrderedDict(w=np.zeros(6))
    sampler.observe(1, [ClientUpdate(c, 10, OrderedDict(w=u)) for c, u in updates.items()], g)
    return sampler


def test_clustered_picks_one_client_per_cluster():
    sampler = _clustered_with(_blob_updates())
    for t in range(2, 30):
        picks = sampler.sample(t, np.arange(12), 3)
        assert sorted(c // 4 for c in picks) == [0, 1, 2]


def test_clustered_explores_clients_without_an_update_first():
    updates = _blob_updates()
    del updates[5]
    sampler = _clustered_with(updates)
    assert 5 in sampler.sample(2, np.arange(12), 3).tolist()


def test_algorithm2_on_two_equal_blobs_gives_one_distribution_each():
    z = ward_tree(_euclid(np.array([[0, 0], [0, 1], [9, 9], [9, 10]], dtype=float)), 4)[0]
    dists = algorithm2_distributions(z, np.arange(4), np.full(4, 0.25), 2, np.random.default_rng(0))
    rows = sorted(dists.round(12).tolist())
    assert rows == [[0.0, 0.0, 0.5, 0.5], [0.5, 0.5, 0.0, 0.0]]


def test_algorithm2_splits_a_heavy_blob_and_stays_unbiased():
    # shares .4 .2 | .2 .2, m = 2: in units of 1/m, blob {0,1} weighs 1.2 > 1 and is cut
    # into {0} (0.8) and {1} (0.4); {2,3} weighs 0.8. Kept: {0} and {2,3}; client 1 is
    # poured: 0.2 tops up the first distribution, 0.2 the second.
    z = ward_tree(_euclid(np.array([[0, 0], [0, 1], [9, 9], [9, 10]], dtype=float)), 4)[0]
    p = np.array([0.4, 0.2, 0.2, 0.2])
    dists = algorithm2_distributions(z, np.arange(4), p, 2, np.random.default_rng(0))
    np.testing.assert_allclose(dists.sum(axis=1), [1.0, 1.0])
    np.testing.assert_allclose(dists.sum(axis=0) / 2, p)  # each client's expected weight is p_i
    rows = sorted(dists.round(12).tolist())
    assert rows == [[0.0, 0.2, 0.4, 0.4], [0.8, 0.2, 0.0, 0.0]]


def test_weight_capped_cut_keeps_maximal_light_subtrees():
    z = ward_tree(_euclid(np.array([[0.0], [1.0], [10.0], [11.0]])), 4)[0]
    labels = weight_capped_clusters(z, np.array([0.5, 0.5, 0.7, 0.7]), 1.0)
    assert labels[0] == labels[1] and labels[2] != labels[3] and labels[0] not in (labels[2], labels[3])


def test_one_per_distribution_draws_distinct_clients():
    dists = np.array([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])  # both want client 0
    picks = draw_one_per_distribution(np.random.default_rng(0), dists, np.array([0.2, 0.0, 0.8]))
    assert picks.tolist() == [0, 2]  # the second falls back to the data shares


def test_count_sketch_keeps_small_vectors_and_preserves_angles_of_big_ones():
    small = np.arange(5.0)
    np.testing.assert_array_equal(CountSketch(8, 0)(small), small.astype(np.float32))
    rng = np.random.default_rng(0)
    a = rng.normal(size=20000)
    b = a + rng.normal(size=20000)  # cos(a, b) = 1/sqrt(2)
    sk = CountSketch(512, 0)
    sa, sb = sk(a), sk(b)
    cos = sa @ sb / np.linalg.norm(sa) / np.linalg.norm(sb)
    assert cos == pytest.approx(1 / math.sqrt(2), abs=0.06)


# ---------------------------------------------------------------------------- real FMNIST (Fig. 8)
def _spearman(a, b):
    """Spearman's rho: Pearson correlation of the ranks (ties get their mean rank)."""

    def ranks(x):
        r = np.empty(len(x))
        r[np.argsort(x, kind="stable")] = np.arange(len(x))
        for v in np.unique(x):
            r[x == v] = r[x == v].mean()
        return r

    return float(np.corrcoef(ranks(np.asarray(a)), ranks(np.asarray(b)))[0, 1])


def test_spearman_helper_by_hand():
    # ranks [0, 1, 2] vs [2, 1, 0]: -1; ties [0.5, 0.5, 2] vs [0, 1, 2]: corr = 0.866
    assert _spearman([1, 2, 3], [9, 5, 1]) == pytest.approx(-1.0)
    assert _spearman([0, 0, 5], [1, 2, 3]) == pytest.approx(math.sqrt(3) / 2)


FMNIST = Path("/usr/share/datasets/fashion-mnist")


@pytest.mark.skipif(not FMNIST.is_dir(), reason="Debian package dataset-fashion-mnist not installed")
def test_estimated_entropy_ranks_real_fmnist_clients_like_their_label_entropy():
    import torch

    from fedflex.config import DatasetConfig, ModelConfig, PartitionConfig
    from fedflex.data import load_dataset
    from fedflex.models import build_model, output_bias_key
    from fedflex.partition import label_entropy, make_partition

    # Prepare: the paper's setting (2) over 50 clients. Each client trains 2 epochs of
    # plain SGD (lr 0.001, batch 64) on 192 of its examples from one common
    # initialisation: 6 steps for everyone. The estimate scales with lr x steps (T
    # divides db), so clients are comparable only at equal steps: the few clients with
    # fewer than 192 examples (1 to 178 here) are left out -- with 1 to 3 steps their db
    # is tiny and they look balanced, a limitation of the method (docs/hics-fl.md).
    # Every second eligible client (22 of 43), to keep the test at a few seconds.
    data = load_dataset(DatasetConfig(name="fmnist", download=False), 50, 0)
    part = make_partition(
        PartitionConfig(scheme="mixed-dirichlet", alphas=[0.001, 0.002, 0.005, 0.01, 0.2]),
        data.train.y.numpy(),
        50,
        10,
        seed=0,
    )
    clients = [c for c in range(50) if part.sizes[c] >= 192][::2]
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="cnn-fmnist"), data.train.input_shape, 10)
    key = output_bias_key(model)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    true_h, est_h = [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    # Execute
    try:
        for c in clients:
            idx = part.indices[c]
            idx = idx[torch.randperm(len(idx), generator=gen)[:192].numpy()]
            x, y = data.train.inputs(idx), data.train.labels(idx)
            model.load_state_dict(start)
            for _ in range(2):
                order = torch.randperm(len(idx), generator=gen)
                for b in range(0, len(idx), 64):
                    sel = order[b : b + 64]
                    model.zero_grad()
                    torch.nn.functional.cross_entropy(model(x[sel]), y[sel]).backward()
                    with torch.no_grad():  # plain SGD step, lr 0.001
                        for param in model.parameters():
                            param -= 0.001 * param.grad
            db = (model.state_dict()[key] - start[key]).numpy()
            est_h.append(float(estimate_entropy(db, 0.0025)))
            true_h.append(float(label_entropy(np.bincount(y.numpy(), minlength=10))))
    finally:
        torch.set_num_threads(threads)
    # Assert: rank agreement. Under independence, Spearman >= 0.7 over 22 clients has
    # p < 0.001. We measured 0.935 here, 0.85-0.91 on other seeds and subsets and 0.90
    # with 10 steps over all 43 (the paper's Fig. 8 shows a near-monotone relation), so
    # 0.7 leaves room for seeds and torch versions while still failing a broken sign,
    # key or temperature (those give |rho| < 0.5 or a constant estimate).
    true_h, est_h = np.array(true_h), np.array(est_h)
    rho = _spearman(true_h, est_h)
    assert rho >= 0.7, (rho, true_h.round(2).tolist(), est_h.round(2).tolist())
    # and every one-label client looks less balanced than every client of the alpha = 0.2 group
    balanced = np.array([c >= 40 for c in clients])
    assert est_h[true_h < 0.05].max() < est_h[balanced].min()


# ---------------------------------------------------------------------------- end to end
@pytest.mark.parametrize("sampler", ["hics", "pow-d", "clustered"])
def test_sampler_runs_three_rounds_through_the_real_client_app(tmp_path, isolated_cache, sampler):
    from fedflex.clients.client_app import app as client_app
    from fedflex.launch.local_grid import LocalGrid
    from fedflex.launch.server import run_server
    from fedflex.loader import load_scenario
    from fedflex.results import read_metrics

    # Prepare: 6 clients, K = 2: hics warms up in rounds 1-3, pow-d queries every round
    cfg = load_scenario(
        None,
        [
            "num_clients=6",
            "rounds=3",
            "dataset.samples_per_client=30",
            "churn.kind=none",
            f"strategy.sampler.name={sampler}",
            "strategy.sampler.clients_per_round=2",
            "output.progress=off",
            "output.plots=false",
        ],
    )
    grid = LocalGrid(client_app, cfg.num_clients)
    # Execute
    run_server(grid, cfg, tmp_path / "out")
    rows = read_metrics(tmp_path / "out")
    # Assert
    assert [len(r["sampled"]) for r in rows] == [2, 2, 2]
    # loss queries carry the model (the directory's who-are-you queries do not)
    queries = [m for m in grid.sent if m.metadata.message_type == "query" and "arrays" in m.content.array_records]
    if sampler == "hics":
        assert sorted(c for r in rows for c in r["sampled"]) == list(range(6))  # warm-up
        # the sampler's own figures reach metrics.jsonl: one estimate per trained client
        assert [r["hics_rule"] for r in rows] == ["warmup"] * 3
        assert all(sorted(map(int, r["hics_entropy"])) == r["sampled"] for r in rows)
        assert all(0 <= h <= math.log(10) + 1e-6 for r in rows for h in r["hics_entropy"].values())
    if sampler == "pow-d":
        assert len(queries) == 3 * 6  # d = all: every online client is asked every round
        assert all(r["powd_candidates"] == 6 and r["powd_chosen_loss"] >= r["powd_mean_loss"] for r in rows)
    else:
        assert not queries


def test_scenario_keys_reach_the_hics_sampler():
    from fedflex.loader import load_scenario
    from fedflex.strategies.build import build_parts
    from fedflex.strategies.combinations import check_parts
    from fedflex.strategies.parts import ModelInfo

    cfg = load_scenario(
        Path(__file__).resolve().parents[2] / "scenarios" / "hics_fmnist.yaml",
        [
            "strategy.sampler.hics.temperature=0.01",
            "strategy.sampler.hics.departed=drop",
            "strategy.sampler.hics.ward=scalable",
        ],
    )
    check_parts(cfg)
    s = build_parts(cfg, ModelInfo(output_bias_key="fc_out.bias"))[0]
    assert (s.temperature, s.hics_lambda, s.gamma0, s.rounds, s.num_clients) == (0.01, 10.0, 4.0, 200, 50)
    assert (s.departed, s.variant, s.ward, s.num_clusters) == ("drop", "paper", "scalable", 0)
    assert (s.estimate, s.refresh) == ("unit", "every-round")  # the default estimate


@pytest.mark.parametrize(
    "overrides, temperature",
    [
        (["strategy.sampler.hics.estimate=unit", "strategy.sampler.hics.temperature=null"], 0.2),
        (["strategy.sampler.hics.estimate=per-step", "strategy.sampler.hics.temperature=null"], 0.1),
        (["strategy.sampler.hics.estimate=bias", "strategy.sampler.hics.temperature=null"], 0.0025),  # the paper's T
        (["strategy.sampler.hics.temperature=null"], 0.2),  # unset estimate: unit
        (["strategy.sampler.hics.estimate=unit", "strategy.sampler.hics.temperature=0.3"], 0.3),
    ],
)
def test_unset_temperature_takes_the_estimates_default(overrides, temperature):
    from fedflex.loader import load_scenario
    from fedflex.strategies.build import build_parts
    from fedflex.strategies.parts import ModelInfo

    cfg = load_scenario(Path(__file__).resolve().parents[2] / "scenarios" / "hics_fmnist.yaml", overrides)
    s = build_parts(cfg, ModelInfo(output_bias_key="fc_out.bias"))[0]
    assert s.temperature == temperature and s.lr == cfg.client.lr == 0.001


def test_bad_estimate_and_refresh_are_config_errors():
    from fedflex.config import ConfigError
    from fedflex.loader import load_scenario

    path = Path(__file__).resolve().parents[2] / "scenarios" / "hics_fmnist.yaml"
    with pytest.raises(ConfigError, match="hics.estimate"):
        load_scenario(path, ["strategy.sampler.hics.estimate=norm"])
    with pytest.raises(ConfigError, match="hics.refresh"):
        load_scenario(path, ["strategy.sampler.hics.refresh=sometimes"])
