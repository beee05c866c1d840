"""The named Flower strategies with Flower's quickstart ClientApp (examples/flower-quickstart).

The ClientApp is Flower's convention only (no QUERY handler, ``train_loss`` /
``num-examples`` metrics); LocalGrid hands it the messages in-process, Flower's own
``Strategy.start`` loop drives the rounds, so each test takes a second or two.
"""

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, MessageType
from flwr.serverapp.strategy import Strategy

from fedflex.churn import ExplicitSessions
from fedflex.config import ConfigError
from fedflex.launch.local_grid import LocalGrid
from fedflex.strategies import named
from fedflex.strategies.strategy import FedFlex

pytestmark = pytest.mark.usefixtures("quickstart_example")  # tests/conftest.py


def _grid(n=4):
    from flowerquickstart.client_app import app

    grid = LocalGrid(app, n)
    for context in grid.contexts.values():
        context.run_config.update({"examples": 40})
    return grid


def _run(strategy, grid, rounds=2, evaluate_fn=None):
    from flowerquickstart.task import Net

    return strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(Net().state_dict()),
        num_rounds=rounds,
        train_config=ConfigRecord({"lr": 0.05}),
        evaluate_fn=evaluate_fn,
    )


#: strategies whose server half works with any client: 2 rounds of training each
ANY_CLIENT = ["HiCSFL", "PowerOfChoice", "ClusteredSampling", "DivFL", "FedCor", "FedAWARE", "FedAMS", "AWARE"]
ANY_CLIENT += ["FedDyn", "FedCM", "SessionAware"]


@pytest.mark.parametrize("name", ANY_CLIENT)
def test_every_named_strategy_trains_flowers_quickstart_client(name):
    # Prepare
    grid = _grid()
    strategy = named.NAMED[name](fraction_train=0.5, fraction_evaluate=0.5)
    # Execute
    result = _run(strategy, grid)
    # Assert: Flower's Result, as Flower's FedAvg fills it (2 of 4 nodes train and evaluate)
    assert sorted(result.train_metrics_clientapp) == [1, 2]
    assert set(result.train_metrics_clientapp[2]) == {"train_loss"}  # Flower drops the weight key
    assert sorted(result.evaluate_metrics_clientapp) == [1, 2]
    assert "eval_acc" in result.evaluate_metrics_clientapp[2]
    assert strategy.nodes.identify == "auto" and len(strategy.nodes.by_node_id) == 4
    from flowerquickstart.task import Net

    assert list(result.arrays) == list(Net().state_dict())


def test_evaluate_fn_gets_the_round_and_the_arrays_as_in_flower():
    # Prepare
    from flwr.app import MetricRecord

    seen = []

    def evaluate_fn(server_round, arrays):
        seen.append((server_round, type(arrays).__name__))
        return None if server_round == 1 else MetricRecord({"accuracy": 0.5})

    # Execute
    result = _run(named.FedAMS(fraction_train=0.5, fraction_evaluate=0.0), _grid(), evaluate_fn=evaluate_fn)
    # Assert: before round 1 (round 0) and after each round; None is not recorded
    assert seen == [(0, "ArrayRecord"), (1, "ArrayRecord"), (2, "ArrayRecord")]
    assert sorted(result.evaluate_metrics_serverapp) == [0, 2]
    assert result.evaluate_metrics_clientapp == {}


def test_flowers_base_class_loop_runs_a_named_strategy():
    # Prepare
    grid = _grid()
    strategy = named.HiCSFL(fraction_train=1.0, fraction_evaluate=0.0, rounds=2)
    from flowerquickstart.task import Net

    # Execute: Flower's Strategy.start itself, not FedFlex's override
    result = Strategy.start(
        strategy, grid, ArrayRecord(Net().state_dict()), num_rounds=2, train_config=ConfigRecord({"lr": 0.05})
    )
    # Assert: every client trained in round 1 (HiCS-FL's warm-up) and has an entropy estimate
    assert sorted(result.train_metrics_clientapp) == [1, 2]
    assert sorted(strategy.record.extra["hics_entropy"]) == ["0", "1", "2", "3"]


def test_node_ids_become_dense_client_ids_in_order_of_appearance():
    grid = _grid(3)
    strategy = named.FedAWARE(fraction_train=1.0, fraction_evaluate=0.0, identify="node-id")
    _run(strategy, grid, rounds=1)
    # no QUERY was sent; the nodes seen together are numbered in node-id order
    assert all(m.metadata.message_type != MessageType.QUERY for m in grid.sent)
    assert strategy.nodes.node_to_client == {n: i for i, n in enumerate(sorted(grid.contexts))}


def test_fedaware_weights_are_not_uniform():
    # Prepare: partitions of 1, 5 and 10 classes: their update momenta differ
    grid = _grid(3)
    strategy = named.FedAWARE(fraction_train=1.0, fraction_evaluate=0.0)
    # Execute
    _run(strategy, grid, rounds=3)
    # Assert
    weights = strategy.aggregator.core.last_weights
    assert weights.sum() == pytest.approx(1.0, abs=1e-6)
    assert np.ptp(weights) > 0.05, weights


def test_power_of_choice_asks_a_flower_client_for_its_loss_with_an_evaluate_message():
    grid = _grid()
    strategy = named.PowerOfChoice(clients_per_round=2, fraction_evaluate=0.0, d=4)
    _run(strategy, grid, rounds=1)
    kinds = [m.metadata.message_type for m in grid.sent]
    # 4 identification queries (errors: no query function), 4 loss evaluations, 2 train messages
    assert kinds.count(MessageType.QUERY) == 4
    assert kinds.count(MessageType.EVALUATE) == 4
    assert kinds.count(MessageType.TRAIN) == 2


def test_session_aware_builds_a_model_at_a_scripted_change_of_the_online_set():
    # Prepare: clients {0, 1} in round 1, {2, 3} from round 2 (a new session)
    grid = _grid()
    schedule = ExplicitSessions(4, [[0, 1], [2, 3]], rounds_per_session=1, cycle=False)
    strategy = named.SessionAware(clients_per_round=2, fraction_evaluate=0.0, availability=schedule, identify="node-id")
    # Execute
    _run(strategy, grid, rounds=2)
    # Assert: the pilot was built from session 0, and session 1 started from the model of
    # its gradient round (one extra training round with the new clients)
    train = [m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN]
    assert len(train) == 2 + 2 + 2  # round 1, the gradient round, round 2
    assert strategy.initializer.pilot is not None
    assert strategy.tracker.session == 1


@pytest.mark.parametrize(
    ("name", "helper"),
    [("SCAFFOLD", "local rule scaffold"), ("FedNova", "local rule fednova"), ("BHerd", "local rule bherd")],
)
def test_a_method_that_needs_more_rejects_a_plain_reply_in_one_line(name, helper, caplog):
    strategy = named.NAMED[name](fraction_train=0.5, fraction_evaluate=0.0)
    result = _run(strategy, _grid(), rounds=1)
    assert result.train_metrics_clientapp == {}
    reasons = [reason for _, reason in strategy.record.rejected]
    assert len(reasons) == 2 and all(helper in r and "\n" not in r for r in reasons)


def test_a_bad_option_fails_at_construction_with_the_scenario_key():
    with pytest.raises(ConfigError, match="strategy.sampler.hics.entropy_weight"):
        named.HiCSFL(hics_lambda=-1.0)


def test_options_and_their_defaults_come_from_the_config_classes():
    import inspect

    from fedflex.config import AggregatorConfig

    params = inspect.signature(named.FedAMS).parameters
    assert params["server_lr"].default == AggregatorConfig.server_lr
    assert "options : AdaptiveOptions, default AdaptiveOptions(beta1=0.9, beta2=0.99" in named.FedAMS.__doc__
    assert "``strategy.aggregator.fedams``" in named.FedAMS.__doc__


def test_fedflex_with_parts_keeps_flowers_fedavg_options():
    from fedflex.strategies.baseline import FedAvgAggregator, PreviousInitializer, UniformSampler

    strategy = FedFlex(
        sampler=UniformSampler(seed=0),
        aggregator=FedAvgAggregator(),
        initializer=PreviousInitializer(),
        num_clients=4,
        fraction_train=0.5,
        min_train_nodes=1,
        fraction_evaluate=0.25,
    )
    result = _run(strategy, _grid())
    assert sorted(result.train_metrics_clientapp) == [1, 2]
    assert strategy._per_round(4) == 2
    assert sorted(result.evaluate_metrics_clientapp) == [1, 2]
