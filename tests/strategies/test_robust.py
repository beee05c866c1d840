"""Byzantine-robust aggregators and update clipping (strategies/robust.py): hand-computed
expectations, the combinations refused at load, and one small run with a hostile client."""

from collections import OrderedDict

import numpy as np
import pytest
from flwr.app import Array

from fedflex.clients.client_app import app as client_app
from fedflex.config import ConfigError
from fedflex.launch.local_grid import LocalGrid
from fedflex.launch.server import run_server
from fedflex.loader import load_scenario
from fedflex.results import read_metrics
from fedflex.strategies.combinations import check_parts
from fedflex.strategies.parts import ClientUpdate
from fedflex.strategies.robust import (
    BulyanAggregator,
    KrumAggregator,
    MedianAggregator,
    TrimmedMeanAggregator,
    clip_update,
)


def _m(*w, n=0):
    return OrderedDict(w=np.array(w, dtype=np.float32), n=np.array(n, dtype=np.int64))


def _updates(*vectors, sizes=None):
    sizes = sizes or [1] * len(vectors)
    return [ClientUpdate(client=i, num_examples=s, arrays=_m(*v, n=7)) for i, (v, s) in enumerate(zip(vectors, sizes))]


# ---------------------------------------------------------------------------- kernels
def test_median_of_three_clients_by_hand():
    # Prepare: per coordinate, the middle of (1, 4, 100), (2, -5, 0), (3, 6, -1)
    ups = _updates([1, 2, 3], [4, -5, 6], [100, 0, -1])
    # Execute
    out = MedianAggregator().aggregate(1, _m(0, 0, 0), ups)
    # Assert
    np.testing.assert_array_equal(out["w"], [4.0, 0.0, 3.0])
    assert out["w"].dtype == np.float32
    assert out["n"] == 0  # counters keep the global model's value, no client sets them


def test_trimmed_mean_cuts_one_of_five_values_per_side_by_hand():
    # beta 0.2 of 5 replies: floor(1.0) = 1 cut off each tail
    ups = _updates([1, 10], [2, 20], [3, 30], [4, 40], [100, -1000])
    agg = TrimmedMeanAggregator(beta=0.2)
    out = agg.aggregate(1, _m(0, 0), ups)
    # w0: mean(2, 3, 4) = 3; w1: sorted -1000, 10, 20, 30, 40 -> mean(10, 20, 30) = 20
    np.testing.assert_allclose(out["w"], [3.0, 20.0])
    assert agg.round_metrics() == {"trimmed_per_side": 1}


# a = (0,0), b = (1,0), c = (0,2), d = (1,1), e = (10,10): squared distances
#   a: b 1, c 4, d 2, e 200      -> 2 nearest (n - f - 2 = 2 with f = 1): 1 + 2 = 3
#   b: a 1, c 5, d 1, e 181      -> 1 + 1 = 2   (lowest: Krum's pick)
#   c: a 4, b 5, d 2, e 164      -> 2 + 4 = 6
#   d: a 2, b 1, c 2, e 162      -> 1 + 2 = 3
#   e: 200, 181, 164, 162        -> 162 + 164 = 326
KRUM_POINTS = ([0, 0], [1, 0], [0, 2], [1, 1], [10, 10])


def test_krum_picks_the_reply_closest_to_its_neighbours():
    agg = KrumAggregator(num_malicious=1, select=1)
    out = agg.aggregate(1, _m(0, 0), _updates(*KRUM_POINTS))
    np.testing.assert_array_equal(out["w"], [1.0, 0.0])  # b
    assert agg.round_metrics() == {"krum_selected": [1]}


def test_multikrum_averages_the_three_best_by_examples():
    # the three lowest scores: b (2), a (3), d (3); weighted by examples 1, 1, 2
    agg = KrumAggregator(num_malicious=1, select=3)
    out = agg.aggregate(1, _m(0, 0), _updates(*KRUM_POINTS, sizes=[1, 1, 5, 2, 1]))
    np.testing.assert_allclose(out["w"], [0.75, 0.5])  # ((0,0) + (1,0) + 2 (1,1)) / 4
    assert agg.round_metrics() == {"krum_selected": [0, 1, 3]}


def test_multikrum_unweighted_averages_plainly():
    agg = KrumAggregator(num_malicious=1, select=3, weighted=False)
    out = agg.aggregate(1, _m(0, 0), _updates(*KRUM_POINTS, sizes=[1, 1, 5, 2, 1]))
    np.testing.assert_allclose(out["w"], [2 / 3, 1 / 3])


def test_bulyan_by_hand():
    # Prepare: scalars 0, 1, 2, 3, 4, 6 and an attacker at 100; f = 1 (n = 7 = 4f + 3).
    # Krum scores (4 nearest squared distances): 0: 1+4+9+16 = 30, 1: 1+1+4+9 = 15,
    # 2: 1+1+4+4 = 10, 3: 1+1+4+9 = 15, 4: 1+4+4+9 = 18, 6: 4+9+16+25 = 54, 100: huge.
    # theta = n - 2f = 5 selected: 2, 1, 3, 4, 0 (clients 0-4); their median is 2;
    # the theta - 2f = 3 values closest to it: 2, 1, 3 -> mean 2.
    ups = _updates([0], [1], [2], [3], [4], [6], [100])
    agg = BulyanAggregator(num_malicious=1)
    # Execute
    out = agg.aggregate(1, _m(50), ups)
    # Assert
    np.testing.assert_allclose(out["w"], [2.0])
    assert agg.round_metrics() == {"bulyan_selected": [0, 1, 2, 3, 4]}


def test_bulyan_with_too_few_replies_keeps_the_model(caplog):
    out = BulyanAggregator(num_malicious=1).aggregate(3, _m(5), _updates([0], [1], [2]))
    np.testing.assert_array_equal(out["w"], [5.0])
    assert "bulyan: 3 replies, fewer than 4f + 3 = 7: model kept" in caplog.text


def test_robust_step_follows_server_lr():
    out = MedianAggregator(server_lr=0.5).aggregate(1, _m(2, 2), _updates([4, 0], [4, 0], [6, 9]))
    np.testing.assert_allclose(out["w"], [3.0, 1.0])  # 2 + 0.5 (4 - 2), 2 + 0.5 (0 - 2)


def test_clipping_scales_a_long_delta_to_the_max_norm():
    # delta = (4, 5) - (1, 1) = (3, 4), norm 5; max 1 -> (0.6, 0.8)
    out, norm = clip_update(_m(4, 5, n=3), _m(1, 1), 1.0)
    assert norm == 5.0
    np.testing.assert_allclose(out["w"], [1.6, 1.8], rtol=1e-6)
    assert out["n"] == 3  # counters untouched


def test_clipping_leaves_a_short_delta_alone():
    arrays = _m(1.3, 1.4)
    out, norm = clip_update(arrays, _m(1, 1), 1.0)
    assert out is arrays
    assert norm == pytest.approx(0.5)


# ---------------------------------------------------------------------------- config
BASE = ["num_clients=10", "churn.kind=none", "strategy.sampler.clients_per_round=5"]


@pytest.mark.parametrize(
    "overrides, key, fragment",
    [
        (["strategy.aggregator.name=median", "strategy.local_rule.name=scaffold"], "strategy.local_rule.name", "steer"),
        (
            ["strategy.aggregator.name=krum", "strategy.aggregator.aware.enabled=true"],
            "strategy.aggregator.aware.enabled",
            "wraps",
        ),
        (["strategy.aggregator.name=bulyan"], "strategy.sampler.clients_per_round", "4f + 3 = 7"),
        (
            ["strategy.aggregator.name=krum", "strategy.aggregator.krum.num_malicious=2"],
            "strategy.sampler.clients_per_round",
            "2f + 3 = 7",
        ),
        (
            ["strategy.aggregator.name=multikrum", "strategy.aggregator.krum.num_selected=5"],
            "strategy.aggregator.krum.num_selected",
            "<= clients_per_round - krum.num_malicious = 4",
        ),
        (
            ["strategy.aggregator.clip_norm=1", "strategy.local_rule.name=fednova"],
            "strategy.aggregator.clip_norm",
            "fednova",
        ),
        (
            ["strategy.aggregator.clip_norm=1", "strategy.aggregator.name=bherd", "strategy.local_rule.name=bherd"],
            "strategy.aggregator.clip_norm",
            "bherd",
        ),
    ],
)
def test_combinations_that_would_not_be_robust_or_cannot_run_are_refused_by_name(overrides, key, fragment):
    cfg = load_scenario(None, BASE + overrides)
    with pytest.raises(ConfigError) as err:
        check_parts(cfg)
    assert err.value.key == key
    assert fragment in str(err.value)


@pytest.mark.parametrize("key, value", [("trimmed_mean.beta", 0.5), ("krum.num_malicious", -1), ("clip_norm", 0)])
def test_robust_options_out_of_range_are_refused_at_load(key, value):
    with pytest.raises(ConfigError, match=f"strategy.aggregator.{key}"):
        load_scenario(None, BASE + [f"strategy.aggregator.{key}={value}"])


def test_a_trimmed_mean_that_trims_nothing_is_warned_about(caplog):
    overrides = ["strategy.aggregator.name=trimmed-mean", "strategy.aggregator.trimmed_mean.beta=0.1"]
    check_parts(load_scenario(None, BASE + overrides))
    assert "trims nothing from 5 replies: it is the plain mean" in caplog.text


# ---------------------------------------------------------------------------- a hostile client
RUN = [
    "num_clients=6",
    "rounds=3",
    "dataset.samples_per_client=60",
    "partition.scheme=iid",  # one distribution: an honest median is as good as the mean
    "churn.kind=none",
    "strategy.sampler.clients_per_round=6",
    "evaluation.stop_on_divergence=false",
    "output.progress=off",
    "output.plots=false",
    "output.checkpoint_every=0",
]


class _Scaler(LocalGrid):
    """Client 0 multiplies every float array of its training replies by 1e6."""

    def send_and_receive(self, messages, *, timeout=None):
        replies = list(super().send_and_receive(messages, timeout=timeout))
        for reply in replies:
            pid = self.contexts[reply.metadata.src_node_id].node_config["partition-id"]
            if pid == 0 and reply.metadata.message_type == "train":
                arrays = reply.content["arrays"]
                for key in list(arrays):
                    a = arrays[key].numpy()
                    if np.issubdtype(a.dtype, np.floating):
                        arrays[key] = Array(a * np.float32(1e6))
        return replies


def _last_row(tmp_path, name, overrides, hostile=True):
    cfg = load_scenario(None, RUN + overrides)
    grid = _Scaler(client_app, cfg.num_clients) if hostile else LocalGrid(client_app, cfg.num_clients)
    run_server(grid, cfg, tmp_path / name)
    return read_metrics(tmp_path / name)[-1]


@pytest.mark.slow  # five 3-round runs: ~12 s
@pytest.mark.usefixtures("isolated_cache")
def test_a_robust_aggregator_keeps_accuracy_when_one_client_scales_its_weights(tmp_path):
    # Execute: the same run, honest, and with client 0 sending weights x 1e6
    honest = _last_row(tmp_path, "honest", [], hostile=False)
    fedavg = _last_row(tmp_path, "fedavg", [])
    median = _last_row(tmp_path, "median", ["strategy.aggregator.name=median"])
    krum = _last_row(tmp_path, "krum", ["strategy.aggregator.name=krum"])
    clipped = _last_row(tmp_path, "clipped", ["strategy.aggregator.clip_norm=1.0"])
    # Assert: fedavg follows the attacker (measured: accuracy 0.654 and loss 1.5e15
    # against 0.889 and 0.67 honest); median, krum and clipping end near the honest run
    acc, loss = honest["test_accuracy"], honest["test_loss"]
    assert fedavg["test_accuracy"] < acc - 0.15 and fedavg["test_loss"] > 1000 * loss, (fedavg, honest)
    for row in (median, krum, clipped):
        assert row["test_accuracy"] > acc - 0.05 and row["test_loss"] < 1.2 * loss, (row, honest)
    assert 0 not in krum["krum_selected"]
    assert clipped["clipped"] == [0]
