"""BHerd's server step and FedNova's normalised averaging by hand; combinations
refused at config load."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

from fedflex import keys
from fedflex.config import ConfigError
from fedflex.loader import load_scenario
from fedflex.strategies.baseline import FedAvgAggregator
from fedflex.strategies.bherd import BHerdAggregator, bherd_coefficients
from fedflex.strategies.build import build_strategy
from fedflex.strategies.combinations import check_parts
from fedflex.strategies.fednova import FedNovaServer, fednova_step
from fedflex.strategies.parts import ClientUpdate
from fedflex.strategies.scaffold import ScaffoldServer


def _arrays(*values):
    return OrderedDict(w=np.array(values, dtype=np.float32))


def _update(n, arrays=None, extras=None, **metrics):
    return ClientUpdate(
        client=0, num_examples=n, arrays=arrays or _arrays(0.0, 0.0), metrics=metrics, extras=extras or {}
    )


# ------------------------------------------------------------------ BHerd
def test_bherd_step_by_hand():
    # eta = 0.1, alpha = 0.5, n = (1, 3): p = (1/4, 3/4); g1 = (4, 0), g2 = (0, 8)
    # w - 0.2 (1, 6) = (1, 2) - (0.2, 1.2) = (0.8, 0.8)
    agg = BHerdAggregator(lr=0.1, alpha=0.5)
    updates = [
        _update(1, extras={keys.HERD_G: _arrays(4.0, 0.0)}),
        _update(3, extras={keys.HERD_G: _arrays(0.0, 8.0)}),
    ]
    new = agg.aggregate(1, _arrays(1.0, 2.0), updates)
    np.testing.assert_allclose(new["w"], [0.8, 0.8], rtol=1e-6)


def test_herd_gap_is_reported_and_a_large_one_warned_about_once(caplog):
    # gaps 0.6 / 0.3 = 2 and 0.2 / 0.4 = 0.5: median 1.25 > GAP_WARNING (0.5)
    agg = BHerdAggregator(lr=0.1, alpha=0.5)

    def updates(d1, d2):
        return [
            _update(1, extras={keys.HERD_G: _arrays(1.0, 0.0)}, **{keys.HERD_DISTANCE: d1, keys.HERD_MEAN_NORM: 0.3}),
            _update(1, extras={keys.HERD_G: _arrays(0.0, 1.0)}, **{keys.HERD_DISTANCE: d2, keys.HERD_MEAN_NORM: 0.4}),
        ]

    agg.aggregate(1, _arrays(0.0, 0.0), updates(0.03, 0.04))  # gaps 0.1: quiet
    assert agg.round_metrics()["herd_gap"] == pytest.approx([0.1, 0.1])
    assert "herded gradients differ" not in caplog.text
    agg.aggregate(2, _arrays(0.0, 0.0), updates(0.6, 0.2))
    assert agg.round_metrics()["herd_gap"] == pytest.approx([2.0, 0.5])
    assert caplog.text.count("herded gradients differ") == 1 and "by a median 125%" in caplog.text
    agg.aggregate(3, _arrays(0.0, 0.0), updates(0.6, 0.2))
    assert caplog.text.count("herded gradients differ") == 1  # once per run


def test_grab_divides_by_the_weighted_reported_alpha():
    # p = (1/4, 3/4), alpha_i = (1/2, 1/6): alpha_t = 1/8 + 1/8 = 1/4; coefficients eta p / alpha_t
    coefs, figures = bherd_coefficients(
        "reported", 0.1, 0.5, np.array([1, 3]), np.array([0.5, 1 / 6]), np.zeros(2), np.zeros(2)
    )
    assert figures["herd_alpha_t"] == pytest.approx(0.25)
    np.testing.assert_allclose(coefs, [0.1, 0.3])


def test_grab_round_with_nothing_selected_keeps_the_parameters():
    coefs, _ = bherd_coefficients("reported", 0.1, 0.5, np.ones(2), np.zeros(2), np.zeros(2), np.zeros(2))
    assert not coefs.any()


def test_bherd_on_fednova_normalises_by_k_and_tau_eff():
    # p = (1/2, 1/2), tau = (4, 8): tau_eff = 6; k = (2, 4): c = eta * 6 * (1/2) / k = (0.15, 0.075)
    coefs, figures = bherd_coefficients(
        "fednova", 0.1, 0.5, np.ones(2), np.zeros(2), np.array([4, 8]), np.array([2, 4])
    )
    assert figures["herd_tau_eff"] == 6.0
    np.testing.assert_allclose(coefs, [0.15, 0.075])


def test_buffers_are_averaged_and_counters_kept():
    # w moves by the gradient step (lr 1, alpha 1, p = 1/2 each): 0 - (1 + 1) / 2 = -1;
    # the running statistic is the clients' average (2 + 4) / 2; the counter the first's
    global_arrays = OrderedDict(w=np.zeros(1, np.float32), running=np.zeros(1, np.float32), count=np.array(5))
    updates = [
        _update(
            1,
            arrays=OrderedDict(w=np.ones(1, np.float32), running=np.array([r], np.float32), count=np.array(7)),
            extras={keys.HERD_G: OrderedDict(w=np.ones(1, np.float32))},
        )
        for r in (2.0, 4.0)
    ]
    new = BHerdAggregator(lr=1.0, alpha=1.0).aggregate(1, global_arrays, updates)
    assert new["w"][0] == pytest.approx(-1.0) and new["running"][0] == pytest.approx(3.0) and int(new["count"]) == 7


def test_bherd_aggregator_without_gradients_names_the_record():
    with pytest.raises(ValueError, match=keys.HERD_G):
        BHerdAggregator(lr=0.1, alpha=0.5).aggregate(1, _arrays(0.0, 0.0), [_update(1)])


# ------------------------------------------------------------------ FedNova
FEDNOVA_CASE = dict(
    # n = (1, 3): p = (1/4, 3/4); ||a|| = (2, 4): tau_eff = 1/2 + 3 = 3.5
    # sum p d = (0.025 + 0.225, 0.05 - 0.075) = (0.25, -0.025); x - 3.5 * that = (0.125, 2.0875)
    x=_arrays(1.0, 2.0),
    ds=[_arrays(0.1, 0.2), _arrays(0.3, -0.1)],
    a=np.array([2.0, 4.0]),
    n=np.array([1, 3]),
    expected=[0.125, 2.0875],
)


def test_fednova_step_by_hand():
    c = FEDNOVA_CASE
    np.testing.assert_allclose(fednova_step(c["x"], c["ds"], c["a"], c["n"])["w"], c["expected"], rtol=1e-6)


def test_fednova_server_then_fedavg_is_the_fednova_step():
    c = FEDNOVA_CASE
    updates = [
        _update(int(n), extras={keys.FEDNOVA_D: d}, **{keys.FEDNOVA_A_NORM: float(a)})
        for n, d, a in zip(c["n"], c["ds"], c["a"])
    ]
    server = FedNovaServer(weighted=True)
    server.observe(1, updates, c["x"])
    new = FedAvgAggregator(weighted=True).aggregate(1, c["x"], updates)
    assert server.tau_eff == 3.5
    np.testing.assert_allclose(new["w"], c["expected"], rtol=1e-6)


# ------------------------------------------------------------------ config
BASE = ["num_clients=4", "churn.kind=none"]


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["strategy.aggregator.name=bherd"], "strategy.aggregator.name"),
        (["strategy.local_rule.name=bherd"], "strategy.local_rule.name"),
        (["strategy.local_rule.name=grab", "strategy.aggregator.name=fedavg"], "strategy.local_rule.name"),
        (
            [
                "strategy.local_rule.name=grab",
                "strategy.aggregator.name=bherd",
                "strategy.local_rule.bherd.base=scaffold",
            ],
            "strategy.local_rule.bherd.base",
        ),
        (
            ["strategy.local_rule.name=bherd", "strategy.aggregator.name=bherd", "client.optimizer=adam"],
            "client.optimizer",
        ),
        (["strategy.local_rule.name=fednova", "client.optimizer=adam"], "client.optimizer"),
        (["model.name=svm", "model.loss=squared-hinge"], "dataset.label_map"),
        (
            [
                "strategy.local_rule.name=bherd",
                "strategy.aggregator.name=bherd",
                "strategy.aggregator.aware.enabled=true",
            ],
            "strategy.aggregator.aware.enabled",
        ),
    ],
)
def test_combinations_that_cannot_work_are_refused_by_key(overrides, key):
    cfg = load_scenario(None, BASE + overrides)
    with pytest.raises(ConfigError) as err:
        check_parts(cfg)
    assert err.value.key == key


def test_svm_with_cross_entropy_fails_at_load():
    with pytest.raises(ConfigError, match="model.loss"):
        load_scenario(None, ["model.name=svm"])


def test_bherd_base_value_is_checked_at_load():
    with pytest.raises(ConfigError, match="bherd.base"):
        load_scenario(None, ["strategy.local_rule.bherd.base=fedprox"])


def test_bherd_on_scaffold_carries_options_and_the_control_variate():
    cfg = load_scenario(
        None,
        BASE
        + [
            "strategy.local_rule.name=bherd",
            "strategy.aggregator.name=bherd",
            "strategy.local_rule.bherd.base=scaffold",
            "strategy.local_rule.bherd.alpha=0.3",
        ],
    )
    strategy = build_strategy(cfg, None)
    rule = strategy.server_rule
    assert isinstance(rule, ScaffoldServer)
    sent = rule.train_config(1)
    assert sent["local-rule.bherd.alpha"] == 0.3 and sent["local-rule.bherd.base"] == "scaffold"
    assert isinstance(strategy.aggregator, BHerdAggregator) and strategy.aggregator.divisor == "alpha"


@pytest.mark.parametrize("rule, base, divisor", [("grab", "fedavg", "reported"), ("bherd", "fednova", "fednova")])
def test_divisor_follows_the_local_rule(rule, base, divisor):
    cfg = load_scenario(
        None,
        BASE
        + [
            f"strategy.local_rule.name={rule}",
            "strategy.aggregator.name=bherd",
            f"strategy.local_rule.bherd.base={base}",
        ],
    )
    assert build_strategy(cfg, None).aggregator.divisor == divisor


def test_plain_fedavg_sends_only_the_options_sgd_reads():
    # sgd reads no option of its own: its server half sends the name and the batch order
    rule = build_strategy(load_scenario(None, BASE + ["strategy.local_rule.fedprox.mu=0.3"]), None).server_rule
    assert rule.train_config(1) == {"local-rule.name": "sgd", "local-rule.fixed-order": False}
