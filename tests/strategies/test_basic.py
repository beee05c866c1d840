"""Uniform sampling, FedAvg aggregation, reply checks: hand-computed expectations."""

from collections import OrderedDict

import numpy as np
import pytest
from flwr.app import MetricRecord, RecordDict

from fedflex.arrays import flatten, numpy_to_record, record_to_numpy, unflatten
from fedflex.strategies.baseline import FedAvgAggregator, UniformSampler, weighted_average
from fedflex.strategies.parts import ClientUpdate
from fedflex.strategies.replies import check_reply


def _model(w, b, counter=0):
    return OrderedDict(
        w=np.array(w, dtype=np.float32), b=np.array(b, dtype=np.float32), n=np.array(counter, dtype=np.int64)
    )


def test_weighted_average_by_hand():
    a, b = _model([1.0, 2.0], [0.0], 5), _model([3.0, 6.0], [4.0], 9)
    avg = weighted_average([a, b], np.array([1.0, 3.0]))
    # w: (1*1 + 3*3)/4 = 2.5, (1*2 + 3*6)/4 = 5.0; b: (0 + 12)/4 = 3.0
    np.testing.assert_allclose(avg["w"], [2.5, 5.0])
    np.testing.assert_allclose(avg["b"], [3.0])
    assert avg["n"] == 5  # counters are carried from the first model, not averaged
    assert avg["w"].dtype == np.float32


def test_fedavg_weights_by_examples_or_plain():
    g = _model([0.0, 0.0], [0.0])
    ups = [ClientUpdate(0, 10, _model([1.0, 1.0], [1.0])), ClientUpdate(1, 30, _model([5.0, 5.0], [5.0]))]
    weighted = FedAvgAggregator(weighted=True).aggregate(1, g, ups)
    plain = FedAvgAggregator(weighted=False).aggregate(1, g, ups)
    np.testing.assert_allclose(weighted["w"], [4.0, 4.0])  # (10*1 + 30*5)/40
    np.testing.assert_allclose(plain["w"], [3.0, 3.0])  # (1 + 5)/2


def test_fedavg_server_lr_scales_the_step():
    g = _model([2.0, 2.0], [0.0])
    ups = [ClientUpdate(0, 1, _model([4.0, 0.0], [2.0]))]
    out = FedAvgAggregator(server_lr=0.5).aggregate(1, g, ups)
    np.testing.assert_allclose(out["w"], [3.0, 1.0])  # 2 + 0.5*(4-2), 2 + 0.5*(0-2)
    np.testing.assert_allclose(out["b"], [1.0])


def test_uniform_sampler_draws_distinct_online_clients():
    sampler = UniformSampler(seed=3)
    online = np.array([2, 5, 7, 11, 13])
    picks = sampler.sample(1, online, 3)
    assert len(set(picks.tolist())) == 3
    assert set(picks.tolist()) <= set(online.tolist())


def test_uniform_sampler_takes_all_when_fewer_online():
    picks = UniformSampler(seed=0).sample(1, np.array([4, 1]), 5)
    assert picks.tolist() == [1, 4]


def test_uniform_sampler_is_reproducible_and_resumable():
    a, b = UniformSampler(seed=9), UniformSampler(seed=9)
    online = np.arange(50)
    a.sample(1, online, 5)
    state = a.state_dict()
    b.load_state_dict(state)
    assert a.sample(2, online, 5).tolist() == b.sample(2, online, 5).tolist()


def test_weighted_uniform_sampler_prefers_big_clients():
    sampler = UniformSampler(seed=0, weighted=True)
    sampler.observe(1, [ClientUpdate(0, 1, OrderedDict()), ClientUpdate(1, 999, OrderedDict())], OrderedDict())
    counts = np.zeros(2)
    for t in range(2000):
        counts[sampler.sample(t, np.array([0, 1]), 1)[0]] += 1
    # P(client 1) = 999/1000: expected ~2 draws of client 0 in 2000
    assert counts[0] < 20


def _reply(arrays, n=10):
    return RecordDict({"arrays": numpy_to_record(arrays), "metrics": MetricRecord({"num-examples": n})})


def test_check_reply_accepts_a_good_reply():
    g = _model([0.0, 0.0], [0.0])
    update, reason = check_reply(_reply(_model([1.0, 2.0], [3.0])), g)
    assert reason == ""
    assert update.num_examples == 10


@pytest.mark.parametrize(
    "arrays, n, fragment",
    [
        (_model([np.nan, 0.0], [0.0]), 10, "NaN or Inf"),
        (_model([np.inf, 0.0], [0.0]), 10, "NaN or Inf"),
        (_model([1.0, 2.0, 3.0], [0.0]), 10, "shape"),
        (OrderedDict(w=np.zeros(2, np.float32)), 10, "names differ"),
        (_model([1.0, 2.0], [0.0]), 0, "must be >= 1"),
    ],
)
def test_check_reply_rejects_bad_replies(arrays, n, fragment):
    update, reason = check_reply(_reply(arrays, n), _model([0.0, 0.0], [0.0]))
    assert update is None
    assert fragment in reason


def test_check_reply_rejects_missing_records():
    update, reason = check_reply(RecordDict({"metrics": MetricRecord({"num-examples": 1})}), _model([0.0], [0.0]))
    assert (update, reason) == (None, "no arrays")


def test_flatten_round_trip_skips_counters():
    m = _model([1.0, 2.0], [3.0], 7)
    vec = flatten(m)
    np.testing.assert_array_equal(vec, [1.0, 2.0, 3.0])
    back = unflatten(vec * 2, m)
    np.testing.assert_array_equal(back["w"], [2.0, 4.0])
    assert back["n"] == 7


def test_record_round_trip_keeps_names_and_order():
    m = _model([1.0, 2.0], [3.0], 7)
    back = record_to_numpy(numpy_to_record(m))
    assert list(back) == ["w", "b", "n"]
    np.testing.assert_array_equal(back["w"], m["w"])
