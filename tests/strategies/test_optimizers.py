"""Server optimisers and SCAFFOLD's server half, by hand on one-number models."""

from collections import OrderedDict

import numpy as np
import pytest

from fedflex import keys
from fedflex.strategies.optimizers import (
    FedAdagradAggregator,
    FedAdamAggregator,
    FedAMSAggregator,
    FedAvgMAggregator,
    FedYogiAggregator,
    ams_step,
)
from fedflex.strategies.parts import ClientUpdate
from fedflex.strategies.scaffold import ScaffoldServer


def _g(x):
    return OrderedDict(w=np.array([x], dtype=np.float64))


def _ups(*values):
    return [ClientUpdate(i, 1, _g(v)) for i, v in enumerate(values)]


def test_fedavgm_accumulates_momentum_by_hand():
    opt = FedAvgMAggregator(server_lr=1.0, momentum=0.5)
    # round 1: avg = 2, x = 0: x - avg = -2 -> v = -2, x = 0 - (-2) = 2
    x1 = opt.aggregate(1, _g(0.0), _ups(1.0, 3.0))
    assert x1["w"][0] == pytest.approx(2.0)
    # round 2: avg = 2 again: x - avg = 0 -> v = 0.5 * -2 + 0 = -1 -> x = 2 + 1 = 3
    x2 = opt.aggregate(2, x1, _ups(2.0, 2.0))
    assert x2["w"][0] == pytest.approx(3.0)


def test_fedavgm_without_momentum_and_lr_one_is_fedavg():
    out = FedAvgMAggregator(server_lr=1.0, momentum=0.0).aggregate(1, _g(5.0), _ups(1.0, 2.0))
    assert out["w"][0] == pytest.approx(1.5)


def test_fedadam_first_step_by_hand():
    # delta = 1; m = 0.1; v = beta2 tau^2 + (1-beta2) = 0.99e-6 + 0.01; x = 0 + 0.1 * 0.1 / (sqrt(v) + 1e-3)
    opt = FedAdamAggregator(server_lr=0.1, beta1=0.9, beta2=0.99, tau=1e-3)
    out = opt.aggregate(1, _g(0.0), _ups(1.0))
    v = 0.99 * 1e-6 + 0.01
    assert out["w"][0] == pytest.approx(0.1 * 0.1 / (np.sqrt(v) + 1e-3))


def test_fedyogi_second_moment_moves_toward_delta_squared():
    # v0 = tau^2 = 1e-6 < delta^2 = 4: v = v0 - (1-beta2) * 4 * sign(v0 - 4) = 1e-6 + 0.04
    opt = FedYogiAggregator(server_lr=1.0, beta1=0.0, beta2=0.99, tau=1e-3)
    out = opt.aggregate(1, _g(0.0), _ups(2.0))
    assert out["w"][0] == pytest.approx(2.0 / (np.sqrt(1e-6 + 0.04) + 1e-3))


def test_fedadagrad_sums_squares():
    opt = FedAdagradAggregator(server_lr=1.0, beta1=0.0, tau=1e-3)
    opt.aggregate(1, _g(0.0), _ups(1.0))
    out = opt.aggregate(2, _g(0.0), _ups(2.0))
    # v = 1e-6 + 1 + 4
    assert out["w"][0] == pytest.approx(2.0 / (np.sqrt(1e-6 + 5.0) + 1e-3))


def test_fedams_first_step_by_hand():
    # delta = 2: m = 0.1 * 2 = 0.2; v = 0.01 * 4 = 0.04; v_hat = max(0, 0.04, 1e-3) = 0.04
    # x = 0 + 0.1 * 0.2 / sqrt(0.04) = 0.1
    opt = FedAMSAggregator(server_lr=0.1, beta1=0.9, beta2=0.99, tau=1e-3)
    out = opt.aggregate(1, _g(0.0), _ups(2.0))
    assert out["w"][0] == pytest.approx(0.1)


def test_fedams_keeps_the_largest_second_moment():
    # round 1, delta = 2: m = 1, v = v_hat = 0.04; round 2, delta = 0: m = 0.5,
    # v = 0.99 * 0.04 = 0.0396 but v_hat stays 0.04: step 1.0 * 0.5 / 0.2 = 2.5
    # (FedAdam's v would shrink and its step grow: 0.5 / sqrt(0.0396) = 2.5126)
    opt = FedAMSAggregator(server_lr=1.0, beta1=0.5, beta2=0.99, tau=1e-6)
    opt.aggregate(1, _g(0.0), _ups(2.0))
    out = opt.aggregate(2, _g(0.0), _ups(0.0))
    assert out["w"][0] == pytest.approx(2.5)
    assert opt.state["v"]["w"][0] == pytest.approx(0.0396)
    assert opt.state["v_hat"]["w"][0] == pytest.approx(0.04)


@pytest.mark.parametrize(
    "epsilon_at, expected",
    [
        # v = delta^2 = 1e-4 (beta2 = 0), eps = 1e-2, m = delta = 0.01 (beta1 = 0)
        ("max", 0.01 / np.sqrt(1e-2)),  # v_hat = max(1e-4, 1e-2) = 1e-2: 0.01 / 0.1 = 0.1
        ("denominator", 0.01 / (np.sqrt(1e-4) + 1e-2)),  # 0.01 / (0.01 + 0.01) = 0.5
    ],
)
def test_fedams_epsilon_placement_by_hand(epsilon_at, expected):
    m, v, v_hat, u = ams_step(
        np.zeros(1), np.zeros(1), np.zeros(1), np.array([0.01]), 1.0, 0.0, 0.0, 1e-2, epsilon_at=epsilon_at
    )
    assert u[0] == pytest.approx(expected)
    assert v[0] == pytest.approx(1e-4)


def test_fedams_refuses_an_unknown_epsilon_placement():
    with pytest.raises(ValueError, match="epsilon_at"):
        FedAMSAggregator(epsilon_at="both")


def test_fedams_is_registered_and_wraps_with_aware():
    from fedflex.config import ConfigError
    from fedflex.loader import load_scenario
    from fedflex.strategies.build import build_parts
    from fedflex.strategies.combinations import check_parts
    from fedflex.strategies.fedaware import AwarePlugin

    cfg = load_scenario(None, ["strategy.aggregator.name=fedams", "strategy.aggregator.aware.enabled=true"])
    check_parts(cfg)
    part = build_parts(cfg)[1]
    assert isinstance(part, AwarePlugin) and isinstance(part.base, FedAMSAggregator)
    with pytest.raises(ConfigError, match="fedams.epsilon_at"):
        load_scenario(None, ["strategy.aggregator.name=fedams", "strategy.aggregator.fedams.epsilon_at=sum"])


def test_reset_on_switch_forgets_the_momentum():
    keep, reset = FedAvgMAggregator(momentum=0.5), FedAvgMAggregator(momentum=0.5, reset_on_switch=True)
    for opt in (keep, reset):
        opt.aggregate(1, _g(0.0), _ups(2.0))
        opt.on_model_switch(2)
    # with the momentum kept, a zero pseudo-gradient still moves x
    assert keep.aggregate(2, _g(0.0), _ups(0.0))["w"][0] != 0.0
    assert reset.aggregate(2, _g(0.0), _ups(0.0))["w"][0] == 0.0


def test_scaffold_server_variate_moves_by_the_deltas_over_n():
    server = ScaffoldServer(num_clients=4)
    server.bind(type("Ctx", (), {"global_arrays": _g(0.0)})())
    assert server.train_payload(1)[keys.SCAFFOLD_C]["w"][0] == 0.0
    ups = [
        ClientUpdate(0, 1, _g(0.0), extras={keys.SCAFFOLD_DC: _g(2.0)}),
        ClientUpdate(1, 1, _g(0.0), extras={keys.SCAFFOLD_DC: _g(6.0)}),
    ]
    server.observe(1, ups, _g(0.0))
    assert server.c["w"][0] == pytest.approx(2.0)  # (2 + 6) / 4


def test_scaffold_server_refuses_a_reply_without_delta():
    server = ScaffoldServer(num_clients=2)
    with pytest.raises(ValueError, match="scaffold-dc"):
        server.observe(1, [ClientUpdate(3, 1, _g(0.0))], _g(0.0))
