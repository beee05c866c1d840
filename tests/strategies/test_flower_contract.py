"""The named strategies behave as Flower's own in a Flower app: they send nothing a plain
ClientApp cannot answer, honour ``start(timeout=...)``, never return an untrained model as
a success, take the app's ``train_config["lr"]`` and say when their mechanism acts or
cannot act.

The grids are :class:`~fedflex.launch.local_grid.LocalGrid` (messages handed to a
ClientApp in-process) driven by Flower's own ``Strategy.start`` loop; expectations are
worked out by hand in the comments.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from fedflex import keys
from fedflex.arrays import numpy_to_record, record_to_numpy
from fedflex.launch.local_grid import LocalGrid
from fedflex.options import AwareOptions, BHerdOptions
from fedflex.strategies import BHerd, FedAWARE, FedCM, FedDyn, HiCSFL, named
from fedflex.strategies.strategy import RunFailedError


@pytest.fixture(autouse=True)
def _flower_logs_to_caplog():
    """Flower's logger does not propagate; let pytest's caplog see its records."""
    flwr_logger = logging.getLogger("flwr")
    before, level = flwr_logger.propagate, flwr_logger.level
    flwr_logger.propagate = True
    flwr_logger.setLevel(logging.INFO)  # another test may have quietened it
    yield
    flwr_logger.propagate = before
    flwr_logger.setLevel(level)


def _model(*values: float) -> OrderedDict:
    return OrderedDict(w=np.array(values, dtype=np.float32))


def _reply(msg: Message, arrays: OrderedDict, metrics: dict, **records: OrderedDict) -> Message:
    content = RecordDict({keys.ARRAYS: numpy_to_record(arrays), keys.METRICS: MetricRecord(metrics)})
    for name, rec in records.items():
        content[name] = numpy_to_record(rec)
    return Message(content=content, reply_to=msg)


def _start(strategy, grid, initial, rounds=1, lr=0.01, timeout=3600.0):
    return strategy.start(
        grid=grid,
        initial_arrays=numpy_to_record(initial),
        num_rounds=rounds,
        timeout=timeout,
        train_config=ConfigRecord({"lr": lr}),
    )


# ---------------------------------------------------------------- identity: no QUERY
@pytest.mark.usefixtures("quickstart_example")
@pytest.mark.parametrize("name", sorted(set(named.NAMED) - {"BHerd", "SCAFFOLD", "FedNova"}))
def test_a_named_strategy_sends_flowers_quickstart_client_nothing_it_cannot_answer(name, caplog):
    # Prepare: Flower's quickstart ClientApp (no query function), 4 nodes
    from flowerquickstart.client_app import app
    from flowerquickstart.task import Net

    grid = LocalGrid(app, 4)
    for context in grid.contexts.values():
        context.run_config.update({"examples": 20})
    strategy = named.NAMED[name](fraction_train=0.5, fraction_evaluate=0.5)
    # Execute
    with caplog.at_level(logging.INFO, logger="flwr"):
        strategy.start(
            grid=grid,
            initial_arrays=ArrayRecord(Net().state_dict()),
            num_rounds=2,
            train_config=ConfigRecord({"lr": 0.05}),
        )
    # Assert: only TRAIN and EVALUATE messages went out, no ERROR was logged, every node has a client id
    assert {m.metadata.message_type for m in grid.sent} <= {MessageType.TRAIN, MessageType.EVALUATE}
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert sorted(strategy.nodes.client_to_node) == [0, 1, 2, 3]


def test_in_simulation_client_ids_are_the_partition_ids_without_a_message():
    # Prepare: LocalGrid's node i holds partition-id i (as Flower's simulation registers them)
    def client(msg, context):
        return _reply(msg, record_to_numpy(msg.content[keys.ARRAYS]), {keys.NUM_EXAMPLES: 1})

    grid = LocalGrid(client, 3, seed=5)
    strategy = HiCSFL(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=3)
    # Execute
    _start(strategy, grid, _model(1.0, 2.0))
    # Assert: the node of partition i serves client id i, and only train messages were sent
    by_partition = {c.node_config["partition-id"]: n for n, c in grid.contexts.items()}
    assert strategy.nodes.client_to_node == by_partition
    assert {m.metadata.message_type for m in grid.sent} == {MessageType.TRAIN}


# ---------------------------------------------------------------- every wait honours the timeout
class SlowGrid(LocalGrid):
    """Nodes that answer every message 90 s after it was sent, on a virtual clock: a wait
    shorter than that gets nothing (the messages' TTL expires); a longer one gets it all.
    """

    latency = 90.0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.clock = 0.0

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        if timeout is not None and timeout < self.latency:
            self.clock += timeout
            self.sent.extend(messages)
            return []
        self.clock += self.latency
        return super().send_and_receive(messages, timeout=timeout)


def _plain_client(step: float):
    """A client that moves every weight by -step and says 10 examples."""

    def client(msg, context):
        arrays = record_to_numpy(msg.content[keys.ARRAYS])
        return _reply(msg, OrderedDict((k, v - step) for k, v in arrays.items()), {keys.NUM_EXAMPLES: 10})

    return client


def test_nodes_slower_than_the_timeout_fail_the_run_loudly(caplog):
    # Prepare: replies take 90 s; start waits 30 s a round
    grid = SlowGrid(_plain_client(0.5), 2)
    strategy = HiCSFL(fraction_train=1.0, fraction_evaluate=0.0)
    # Execute / Assert: no round trained, so no Result: one ERROR line naming the cause
    with pytest.raises(RunFailedError, match=r"no round trained in 2 round\(s\).*replied within timeout=30 s"):
        _start(strategy, grid, _model(1.0), rounds=2, timeout=30)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "none of the 2 sampled node(s) replied within timeout=30 s" in errors[0]


def test_nodes_slower_than_flowers_default_wait_train_under_a_longer_timeout():
    # Prepare: the same 90 s nodes, start waits 300 s
    grid = SlowGrid(_plain_client(0.5), 2)
    strategy = HiCSFL(fraction_train=1.0, fraction_evaluate=0.0)
    # Execute
    result = _start(strategy, grid, _model(1.0), rounds=2, timeout=300)
    # Assert: two rounds of -0.5 each: 1.0 -> 0.0
    np.testing.assert_allclose(record_to_numpy(result.arrays)["w"], [0.0])
    assert sorted(result.train_metrics_clientapp) == [1, 2]


def test_too_few_nodes_fail_after_the_timeout_instead_of_waiting_forever():
    # Prepare: one node, two needed
    grid = LocalGrid(_plain_client(0.5), 1)
    strategy = HiCSFL(min_available_nodes=2, fraction_evaluate=0.0)
    # Execute / Assert
    with pytest.raises(RunFailedError, match=r"only 1 of min_available_nodes=2 node\(s\) connected after 0.2 s"):
        _start(strategy, grid, _model(1.0), timeout=0.2)


def test_a_run_whose_replies_are_all_rejected_is_not_a_success():
    # Prepare: clients that send a model of another shape
    def client(msg, context):
        return _reply(msg, _model(1.0, 2.0, 3.0), {keys.NUM_EXAMPLES: 10})

    strategy = HiCSFL(fraction_train=1.0, fraction_evaluate=0.0)
    # Execute / Assert
    with pytest.raises(RunFailedError, match="every reply was rejected"):
        _start(strategy, LocalGrid(client, 2), _model(1.0))


# ---------------------------------------------------------------- the app's learning rate
def _bherd_client(msg, context):
    # every client herds g = (4, 0) over 5 steps, 2 selected
    arrays = record_to_numpy(msg.content[keys.ARRAYS])
    metrics = {keys.NUM_EXAMPLES: 10, keys.NUM_STEPS: 5, keys.HERD_TAU: 5, keys.HERD_K: 2, keys.HERD_ALPHA_I: 0.4}
    return _reply(msg, arrays, metrics, **{keys.HERD_G: _model(4.0, 0.0)})


def test_bherd_steps_with_the_apps_learning_rate():
    # w - lr / alpha * sum_i p_i g_i = (1, 2) - 0.01 / 0.5 * (4, 0) = (0.92, 2)  (0.05 would give 0.6)
    strategy = BHerd(options=BHerdOptions(alpha=0.5), fraction_train=1.0, fraction_evaluate=0.0)
    result = _start(strategy, LocalGrid(_bherd_client, 2), _model(1.0, 2.0), lr=0.01)
    np.testing.assert_allclose(record_to_numpy(result.arrays)["w"], [0.92, 2.0], rtol=1e-6)


def test_an_lr_option_that_disagrees_with_the_app_is_warned_about_once(caplog):
    # Prepare: the strategy is told 0.05, the app trains its clients with 0.01
    strategy = BHerd(options=BHerdOptions(alpha=0.5), lr=0.05, fraction_train=1.0, fraction_evaluate=0.0)
    # Execute: two rounds, each (0.92 - 1) = -0.08 on w[0]
    result = _start(strategy, LocalGrid(_bherd_client, 2), _model(1.0, 2.0), rounds=2, lr=0.01)
    # Assert: the app's lr is used, and the disagreement said once
    np.testing.assert_allclose(record_to_numpy(result.arrays)["w"], [0.84, 2.0], rtol=1e-6)
    warned = [r.getMessage() for r in caplog.records if "was given, but the app's train_config" in r.getMessage()]
    assert len(warned) == 1 and "lr=0.05 was given" in warned[0] and "uses 0.01" in warned[0]


def test_fedcm_momentum_divides_by_the_apps_learning_rate():
    # Prepare: from x = (0, 0) both clients reach y = (-0.1, 0.2) in K = 10 steps at lr 0.01:
    # Delta = (x - y) / (lr K) = (0.1, -0.2) / 0.1 = (1, -2)  (lr 0.05 would give (0.2, -0.4))
    def client(msg, context):
        return _reply(msg, _model(-0.1, 0.2), {keys.NUM_EXAMPLES: 10, keys.NUM_STEPS: 10})

    grid = LocalGrid(client, 2)
    strategy = FedCM(fraction_train=1.0, fraction_evaluate=0.0)
    # Execute: round 2's train messages carry round 1's Delta
    _start(strategy, grid, _model(0.0, 0.0), rounds=2, lr=0.01)
    # Assert
    second = [m for m in grid.sent if m.content[keys.CONFIG][keys.SERVER_ROUND] == 2]
    delta = record_to_numpy(second[0].content[keys.FEDCM_DELTA])
    np.testing.assert_allclose(delta["w"], [1.0, -2.0], rtol=1e-5)


# ---------------------------------------------------------------- saying what the method does
@pytest.mark.parametrize("cls, helper", [(FedCM, "client_half"), (FedDyn, "client_half")])
def test_plain_replies_to_a_client_half_method_are_warned_about_once_naming_the_helper(cls, helper, caplog):
    # Prepare: a ClientApp that trains plainly (no num-steps, as Flower's quickstart)
    strategy = cls(fraction_train=1.0, fraction_evaluate=0.0)
    # Execute
    _start(strategy, LocalGrid(_plain_client(0.1), 2), _model(1.0), rounds=3)
    # Assert
    warned = [r.getMessage() for r in caplog.records if "client half" in r.getMessage()]
    assert len(warned) == 1 and helper in warned[0] and "is FedAvg" in warned[0]


def test_fedaware_says_when_its_warm_up_cannot_end_and_when_it_ends(caplog):
    # Prepare: 6 clients, 1 a round for 3 rounds: after round 1, 5 lack a momentum and at most
    # 2 more can reply, so the warm-up cannot end
    strategy = FedAWARE(clients_per_round=1, fraction_evaluate=0.0)
    # Execute
    with caplog.at_level(logging.INFO, logger="flwr"):
        _start(strategy, LocalGrid(_plain_client(0.1), 6), _model(1.0), rounds=3)
    # Assert: one warning, no "warm-up over"
    messages = [r.getMessage() for r in caplog.records]
    stuck = [m for m in messages if "warm-up cannot end" in m]
    assert len(stuck) == 1 and "5 online client(s) have no momentum" in stuck[0]
    assert not any("warm-up over" in m for m in messages)


def test_fedaware_says_once_when_its_warm_up_ends(caplog):
    # Prepare: 2 clients, both every round: the warm-up ends in round 1
    strategy = FedAWARE(
        options=AwareOptions(momentum=0.5), fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=2
    )
    # Execute
    with caplog.at_level(logging.INFO, logger="flwr"):
        _start(strategy, LocalGrid(_plain_client(0.1), 2), _model(1.0), rounds=3)
    # Assert
    messages = [r.getMessage() for r in caplog.records]
    assert sum("warm-up over after 1 aggregation(s)" in m for m in messages) == 1
    assert not any("warm-up cannot end" in m for m in messages)
