"""FedDyn's h and shifted average, FedCM's global momentum: hand-worked, without Flower."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

from fedflex import keys
from fedflex.config import LocalRuleConfig
from fedflex.options import FedDynOptions
from fedflex.strategies.fedcm import FedCMServer, fedcm_delta
from fedflex.strategies.feddyn import FedDynServer, feddyn_h
from fedflex.strategies.parts import ClientUpdate


def _arrays(w: float, count: int = 7) -> "OrderedDict[str, np.ndarray]":
    return OrderedDict(w=np.array([w], dtype=np.float32), count=np.array([count], dtype=np.int64))


def test_feddyn_h_moves_by_minus_alpha_times_the_mean_drift_over_all_clients():
    # start 1, replies 3 and 2, m = 4, alpha 1/2: h = 0 - 1/2 (2 + 1) / 4 = -0.375
    h = feddyn_h(OrderedDict(), [_arrays(3.0), _arrays(2.0)], _arrays(1.0), alpha=0.5, num_clients=4)
    assert list(h) == ["w"]  # integer arrays take no part
    assert h["w"].tolist() == pytest.approx([-0.375])


def test_feddyn_replies_are_shifted_so_their_mean_is_the_papers_model():
    # Prepare: the same round; w^t = mean(3, 2) - h / alpha = 2.5 + 0.75 = 3.25
    server = FedDynServer(num_clients=4, options=LocalRuleConfig(name="feddyn", feddyn=FedDynOptions(alpha=0.5)))
    updates = [ClientUpdate(0, 10, _arrays(3.0)), ClientUpdate(1, 10, _arrays(2.0))]

    # Execute
    server.observe(1, updates, _arrays(1.0))

    # Assert
    assert np.mean([u.arrays["w"][0] for u in updates]) == pytest.approx(3.25)
    assert all(u.arrays["count"][0] == 7 for u in updates)


def test_feddyn_h_accumulates_over_rounds():
    # round 2 from the model 3.25 with one reply 4.25: h = -0.375 - 0.5 * 1 / 4 = -0.5
    server = FedDynServer(num_clients=4, options=LocalRuleConfig(name="feddyn", feddyn=FedDynOptions(alpha=0.5)))
    server.observe(1, [ClientUpdate(0, 1, _arrays(3.0)), ClientUpdate(1, 1, _arrays(2.0))], _arrays(1.0))
    server.observe(2, [ClientUpdate(0, 1, _arrays(4.25))], _arrays(3.25))
    assert server.h["w"].tolist() == pytest.approx([-0.5])


def test_fedcm_delta_is_the_mean_per_step_direction():
    # start 1, lr 0.1: (1 - 0.5) / (0.1 * 5) = 1 and (1 - (-1)) / (0.1 * 10) = 2 -> 1.5
    delta = fedcm_delta([_arrays(0.5), _arrays(-1.0)], [5, 10], _arrays(1.0), lr=0.1)
    assert list(delta) == ["w"]
    assert delta["w"].tolist() == pytest.approx([1.5])


def test_fedcm_server_sends_the_momentum_it_computed_last_round():
    # Prepare
    server = FedCMServer(lr=0.1)
    updates = [
        ClientUpdate(0, 1, _arrays(0.5), metrics={keys.NUM_STEPS: 5}),
        ClientUpdate(1, 1, _arrays(-1.0), metrics={keys.NUM_STEPS: 10}),
    ]

    # Execute
    server.observe(1, updates, _arrays(1.0))

    # Assert
    assert server.train_payload(2)[keys.FEDCM_DELTA]["w"].tolist() == pytest.approx([1.5])
    assert server.train_config(2) == {
        "local-rule.name": "fedcm",
        "local-rule.fixed-order": False,
        "local-rule.fedcm.alpha": 0.1,
    }
