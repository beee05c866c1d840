"""The named strategies inside Flower's differential-privacy wrappers (in-process).

Flower's own ``Strategy.start`` loop drives the wrapper, the wrapper drives the named
strategy, :class:`~fedflex.launch.local_grid.LocalGrid` hands the messages to Flower's
quickstart ClientApp (examples/flower-quickstart) in-process.
"""

import logging

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, MessageType
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import fixedclipping_mod
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
)

from fedflex.churn import ExplicitSessions
from fedflex.launch.local_grid import LocalGrid
from fedflex.strategies import named

pytestmark = pytest.mark.usefixtures("quickstart_example")  # tests/conftest.py


def _grid(n=4, clip_on_client=False):
    from flowerquickstart import client_app

    app = client_app.app
    if clip_on_client:  # the user's one change on the client: Flower's clipping mod on train
        app = ClientApp()
        app.train(mods=[fixedclipping_mod])(client_app.train)
        app.evaluate()(client_app.evaluate)
    grid = LocalGrid(app, n)
    for context in grid.contexts.values():
        context.run_config.update({"examples": 40})
    return grid


def _initial():
    import torch
    from flowerquickstart.task import Net

    torch.manual_seed(0)  # the same start model for the run and the assertions
    return ArrayRecord(Net().state_dict())


def _run(strategy, grid, rounds=2, evaluate_fn=None):
    return strategy.start(
        grid=grid,
        initial_arrays=_initial(),
        num_rounds=rounds,
        train_config=ConfigRecord({"lr": 0.05}),
        evaluate_fn=evaluate_fn,
    )


def _flat(record):
    return np.concatenate([a.ravel() for a in record.to_numpy_ndarrays()])


def _train_models(grid):
    """The model each round's train messages carried, in order (one per send)."""
    return [m.content["arrays"] for m in grid.sent if m.metadata.message_type == MessageType.TRAIN]


PLAIN_REPLIES = [n for n in named.NAMED if n not in ("SCAFFOLD", "FedNova", "BHerd")]


@pytest.mark.parametrize("name", PLAIN_REPLIES)
def test_server_side_clipping_wraps_every_named_strategy_with_plain_replies(name, caplog):
    # Prepare: clipping to 1e-3 without noise, so every round moves the model by <= 1e-3
    strategy = named.NAMED[name](clients_per_round=2, fraction_evaluate=0.0, rounds=2)
    dp = DifferentialPrivacyServerSideFixedClipping(
        strategy, noise_multiplier=0.0, clipping_norm=1e-3, num_sampled_clients=2
    )
    # Execute
    with caplog.at_level(logging.WARNING, logger="flwr"):
        result = _run(dp, _grid())
    # Assert: both rounds trained; the aggregate of clipped updates is within 2 x 1e-3
    # of the start (a convex combination of updates of norm <= 1e-3 per round), except
    # for server optimisers whose step is not a convex combination
    assert sorted(result.train_metrics_clientapp) == [1, 2]
    moved = np.linalg.norm(_flat(result.arrays) - _flat(_initial()))
    if name in ("HiCSFL", "PowerOfChoice", "ClusteredSampling", "DivFL", "FedCor", "FedAWARE", "FedDyn"):
        assert moved <= 2e-3 + 1e-6
    # every method that keeps per-client state or server state says what the noise does not cover
    warned = [r.getMessage() for r in caplog.records if "the DP noise covers the aggregate only" in r.getMessage()]
    assert len(warned) == 1 and name in warned[0]


def test_the_warning_names_what_each_method_keeps_outside_the_noise(caplog):
    expected = {
        "HiCSFL": "output-layer bias update",
        "FedAWARE": "momentum of each client",
        "SessionAware": "gradient rounds",
    }
    for name, words in expected.items():
        caplog.clear()
        strategy = named.NAMED[name](clients_per_round=2, fraction_evaluate=0.0, rounds=1)
        dp = DifferentialPrivacyServerSideFixedClipping(strategy, 0.0, 1.0, 2)
        with caplog.at_level(logging.WARNING, logger="flwr"):
            _run(dp, _grid(), rounds=1)
        assert words in caplog.text, name


@pytest.mark.parametrize("name", ["SCAFFOLD", "FedNova", "BHerd"])
def test_a_method_whose_replies_carry_more_than_the_model_is_refused(name):
    strategy = named.NAMED[name](clients_per_round=2, fraction_evaluate=0.0)
    dp = DifferentialPrivacyServerSideFixedClipping(strategy, 1.0, 1.0, 2)
    with pytest.raises(ValueError, match=f"{name} cannot run inside DifferentialPrivacyServerSideFixedClipping"):
        _run(dp, _grid(), rounds=1)


def test_a_told_wrapper_is_checked_without_looking_for_it(monkeypatch):
    # Prepare: the strategy is told its wrapper; looking for one would fail the test
    from fedflex.strategies import strategy as strategy_module

    def no_search(strategy):
        raise AssertionError("a told strategy looked for its wrapper")

    monkeypatch.setattr(strategy_module, "find_dp_wrapper", no_search)
    strategy = named.SCAFFOLD(clients_per_round=2, fraction_evaluate=0.0)
    dp = DifferentialPrivacyServerSideFixedClipping(strategy, 1.0, 1.0, 2)
    strategy.wrapper = dp
    # Execute / Assert: refused as when it is found
    with pytest.raises(ValueError, match="SCAFFOLD cannot run inside DifferentialPrivacyServerSideFixedClipping"):
        _run(dp, _grid(), rounds=1)


def test_a_strategy_under_its_own_start_does_not_look_for_a_wrapper(monkeypatch):
    from fedflex.strategies import strategy as strategy_module

    calls = []
    monkeypatch.setattr(strategy_module, "find_dp_wrapper", lambda s: calls.append(s))
    _run(named.HiCSFL(clients_per_round=2, fraction_evaluate=0.0, rounds=2), _grid(), rounds=2)
    assert calls == []


def test_an_untold_strategy_looks_for_its_wrapper_once(monkeypatch):
    from fedflex.strategies import privacy
    from fedflex.strategies import strategy as strategy_module

    found = []

    def spy(strategy):
        found.append(privacy.find_dp_wrapper(strategy))
        return found[-1]

    monkeypatch.setattr(strategy_module, "find_dp_wrapper", spy)
    strategy = named.HiCSFL(clients_per_round=2, fraction_evaluate=0.0, rounds=2)
    dp = DifferentialPrivacyServerSideFixedClipping(strategy, 0.0, 10.0, 2)
    _run(dp, _grid(), rounds=2)
    assert found == [dp]  # looked for at round 1 only


def test_client_side_clipping_refuses_a_method_whose_train_messages_carry_more_than_the_model():
    strategy = named.FedCM(clients_per_round=2, fraction_evaluate=0.0)
    dp = DifferentialPrivacyClientSideFixedClipping(strategy, 1.0, 1.0, 2)
    with pytest.raises(ValueError, match="FedCM cannot run inside .*fedcm-delta"):
        _run(dp, _grid(clip_on_client=True), rounds=1)


@pytest.mark.parametrize("name", ["HiCSFL", "FedAWARE"])
def test_client_side_clipping_with_flowers_mod_on_the_quickstart_client(name):
    # Prepare: the clients clip to 1e-3 (fixedclipping_mod), no noise
    strategy = named.NAMED[name](clients_per_round=2, fraction_evaluate=0.5, rounds=2)
    dp = DifferentialPrivacyClientSideFixedClipping(
        strategy, noise_multiplier=0.0, clipping_norm=1e-3, num_sampled_clients=2
    )
    grid = _grid(clip_on_client=True)
    # Execute
    result = _run(dp, grid)
    # Assert: the wrapper's clipping_norm reached the clients, their updates came back
    # clipped (2 rounds of convex combinations: <= 2e-3), and evaluation still works
    train = [m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN]
    assert len(train) == 4 and all(m.content["config"]["clipping_norm"] == 1e-3 for m in train)
    assert sorted(result.train_metrics_clientapp) == [1, 2]
    assert np.linalg.norm(_flat(result.arrays) - _flat(_initial())) <= 2e-3 + 1e-6
    assert sorted(result.evaluate_metrics_clientapp) == [1, 2]


def test_server_side_clipping_measures_updates_from_the_model_a_session_starts_from():
    # Prepare: sessions {0,1}, {2,3}, {0,1}, {2,3}: at round 4 SessionAware starts from a
    # mix of sessions 1 and 2's last (noised) models, not from the model the wrapper was given
    schedule = ExplicitSessions(4, [[0, 1], [2, 3], [0, 1], [2, 3]], rounds_per_session=1, cycle=False)
    strategy = named.SessionAware(
        clients_per_round=2, fraction_evaluate=0.0, availability=schedule, identify="node-id", rounds=4
    )
    dp = DifferentialPrivacyServerSideFixedClipping(
        strategy, noise_multiplier=1.0, clipping_norm=1e-3, num_sampled_clients=2
    )
    aggregates = []  # what the strategy hands the wrapper, before the noise
    add_noise = dp._add_noise_to_aggregated_arrays
    dp._add_noise_to_aggregated_arrays = lambda arrays: aggregates.append(arrays) or add_noise(arrays)
    grid = _grid()
    released = {}
    # Execute
    _run(dp, grid, rounds=4, evaluate_fn=lambda t, arrays: released.setdefault(t, arrays) and None)
    # Assert: round 4 trained from a model other than round 3's release (the session model) ...
    sent = _flat(_train_models(grid)[-1])
    assert np.linalg.norm(sent - _flat(released[3])) > 1e-2
    # ... and its updates were clipped from that model: the aggregate lies within 1e-3 of it
    assert len(aggregates) == 4
    assert np.linalg.norm(_flat(aggregates[-1]) - sent) <= 1e-3 + 1e-6


def test_session_aware_stores_the_noised_model_the_wrapper_released():
    # Prepare: noise on; session 0 is round 1, so the pilot is round 1's released model
    schedule = ExplicitSessions(4, [[0, 1], [2, 3]], rounds_per_session=1, cycle=False)
    strategy = named.SessionAware(
        clients_per_round=2, fraction_evaluate=0.0, availability=schedule, identify="node-id", rounds=2
    )
    dp = DifferentialPrivacyServerSideFixedClipping(
        strategy, noise_multiplier=1.0, clipping_norm=0.1, num_sampled_clients=2
    )
    released = {}
    # Execute
    _run(dp, _grid(), rounds=2, evaluate_fn=lambda t, arrays: released.setdefault(t, arrays) and None)
    # Assert: the pilot (a model later sent to clients) is the noised release, not the
    # un-noised aggregate the wrapper added noise to (noise std 1.0 x 0.1 / 2 = 0.05)
    pilot = np.concatenate([a.ravel() for a in strategy.initializer.pilot.values()])
    np.testing.assert_array_equal(pilot, _flat(released[1]))
