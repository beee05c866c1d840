"""NodeDirectory: node ids <-> client ids on a grid whose nodes come and go."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from flwr.app import ConfigRecord, Message, RecordDict

from fedflex import keys
from fedflex.clients.client_app import app as client_app
from fedflex.launch.local_grid import LocalGrid
from fedflex.strategies.nodes import NodeDirectory, simulated_node_count


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _who_am_i(silent: set[int]):
    """A ClientApp that answers the identity query, except for partition ids in ``silent``
    (they raise: an error reply)."""

    def app(msg: Message, context) -> Message:
        pid = int(context.node_config["partition-id"])
        if pid in silent:
            raise RuntimeError("not ready")
        return Message(RecordDict({keys.CONFIG: ConfigRecord({keys.PARTITION_ID: pid})}), reply_to=msg)

    return app


def _queries(grid: LocalGrid) -> int:
    return sum(m.metadata.message_type == "query" for m in grid.sent)


def test_unanswered_node_is_asked_again_after_retry_after():
    # Prepare: node of client 1 fails its first query
    silent = {1}
    grid = LocalGrid(_who_am_i(silent), 2)
    clock = _Clock()
    nodes = NodeDirectory(2, retry_after=30.0, clock=clock)
    nodes.refresh(grid)
    assert nodes.clients().tolist() == [0]
    silent.clear()
    # Execute: before retry_after nothing is asked; after it the node is identified
    clock.now = 10.0
    nodes.refresh(grid)
    asked_early = _queries(grid)
    clock.now = 31.0
    nodes.refresh(grid)
    # Assert
    assert asked_early == 2
    assert nodes.clients().tolist() == [0, 1]


def test_identified_nodes_are_not_asked_again():
    grid = LocalGrid(_who_am_i(set()), 3)
    nodes = NodeDirectory(3)
    nodes.refresh(grid)
    nodes.refresh(grid)
    assert _queries(grid) == 3


def test_query_messages_expire_with_the_query_timeout():
    grid = LocalGrid(_who_am_i(set()), 1)
    NodeDirectory(1, query_timeout=12.0).refresh(grid)
    assert grid.sent[0].metadata.ttl == 12.0


def test_second_node_with_a_client_id_in_use_is_refused_and_not_asked_again():
    # Prepare: client 1 has a live node; a second node says it holds client 1 as well
    grid = LocalGrid(_who_am_i(set()), 2)
    nodes = NodeDirectory(2)
    nodes.refresh(grid)
    first = nodes.client_to_node[1]
    second = grid.add_node(1)
    # Execute
    nodes.refresh(grid)
    nodes.refresh(grid)
    # Assert: the first node keeps client 1; the second serves nothing and was asked once
    assert nodes.client_to_node[1] == first and nodes.client_of(second) is None
    assert nodes.clients().tolist() == [0, 1]
    assert _queries(grid) == 3


def test_refused_duplicate_is_logged_as_an_error_naming_both_nodes(flower_records):
    grid = LocalGrid(_who_am_i(set()), 1)
    nodes = NodeDirectory(1)
    nodes.refresh(grid)
    first = nodes.client_to_node[0]
    second = grid.add_node(0)
    nodes.refresh(grid)
    errors = [r for r in flower_records if r.levelno >= logging.WARNING]
    assert [(r.name, r.levelname) for r in errors] == [("flwr", "ERROR")]  # Flower's: the run log's
    assert f"node {second} also says it holds client id 0, which node {first} serves" in errors[0].getMessage()


def test_waiting_node_takes_the_client_id_over_once_the_first_node_left():
    # Prepare: a node restarted (new node id) while the SuperLink still lists the old one
    grid = LocalGrid(_who_am_i(set()), 2)
    nodes = NodeDirectory(2)
    nodes.refresh(grid)
    old = nodes.client_to_node[1]
    new = grid.add_node(1)
    nodes.refresh(grid)
    # Execute: the old node is gone from the grid (noticed dead, or stopped)
    del grid.contexts[old]
    nodes.refresh(grid)
    # Assert: the new node serves client 1 without a further query
    assert nodes.client_to_node[1] == new and nodes.client_of(old) is None
    assert nodes.clients().tolist() == [0, 1]
    assert _queries(grid) == 3


def test_out_of_range_client_id_is_ignored_and_not_asked_every_refresh():
    grid = LocalGrid(_who_am_i(set()), 3)  # partition ids 0..2, the scenario has 2 clients
    clock = _Clock()
    nodes = NodeDirectory(2, clock=clock)
    nodes.refresh(grid)
    nodes.refresh(grid)
    assert nodes.clients().tolist() == [0, 1]
    assert _queries(grid) == 3


def test_wait_for_returns_once_enough_clients_are_online():
    # Prepare: client 2's node connects only after two polls
    grid = LocalGrid(_who_am_i(set()), 2)
    nodes = NodeDirectory(3, retry_after=0.0)
    polls = []
    real_refresh = nodes.refresh

    def refresh(g):
        polls.append(1)
        if len(polls) == 3:
            grid.add_node(2)
        real_refresh(g)

    nodes.refresh = refresh
    # Execute
    have = nodes.wait_for(grid, 3, timeout=10.0, poll=0.01)
    # Assert
    assert have == 3 and len(polls) == 3
    assert nodes.clients().tolist() == [0, 1, 2]


def test_wait_for_gives_up_after_its_timeout():
    grid = LocalGrid(_who_am_i(set()), 1)
    nodes = NodeDirectory(3)
    assert nodes.wait_for(grid, 3, timeout=0.05, poll=0.01) == 1


class InMemoryGrid(LocalGrid):
    """Stands in for Flower's simulation grid: nodes in its state in registration order."""

    def __init__(self, *args, shuffle=False, **kwargs):
        super().__init__(*args, **kwargs)
        order = list(self.contexts)
        if shuffle:
            order = order[1:] + order[:1]
        self.state = SimpleNamespace(nodes={n: None for n in order})


def _query_messages(grid):
    return [m for m in grid.sent if m.metadata.message_type == "query"]


@pytest.mark.parametrize(
    "grid_class",
    [InMemoryGrid, LocalGrid],
    ids=["simulation-registration-order", "in-process-grid-says-its-partition-ids"],
)
def test_nodes_are_identified_with_few_queries(grid_class):
    grid = grid_class(client_app, 100)
    directory = NodeDirectory(100)
    directory.refresh(grid)
    assert len(_query_messages(grid)) == NodeDirectory.SIMULATION_PROBES
    for node, ctx in grid.contexts.items():
        assert directory.client_of(node) == ctx.node_config["partition-id"]


def test_out_of_order_simulated_nodes_are_all_asked():
    grid = InMemoryGrid(client_app, 100, shuffle=True)
    directory = NodeDirectory(100)
    directory.refresh(grid)
    for node, ctx in grid.contexts.items():
        assert directory.client_of(node) == ctx.node_config["partition-id"]
    assert len(_query_messages(grid)) > NodeDirectory.SIMULATION_PROBES


def test_in_process_nodes_that_say_other_ids_are_all_asked():
    def shifted(msg: Message, context) -> Message:  # every node claims the next client id
        pid = (int(context.node_config["partition-id"]) + 1) % 100
        return Message(RecordDict({keys.CONFIG: ConfigRecord({keys.PARTITION_ID: pid})}), reply_to=msg)

    grid = LocalGrid(shifted, 100)
    directory = NodeDirectory(100)
    directory.refresh(grid)
    assert len(_query_messages(grid)) > NodeDirectory.SIMULATION_PROBES
    for node, ctx in grid.contexts.items():  # what the nodes said, as before the shortcut
        assert directory.client_of(node) == (ctx.node_config["partition-id"] + 1) % 100


def test_an_in_process_grid_with_a_node_gone_is_asked_node_by_node():
    grid = LocalGrid(client_app, 100)
    grid.remove_node(7)
    assert grid.registration_order() == []
    directory = NodeDirectory(100)
    directory.refresh(grid)
    assert len(_query_messages(grid)) == 99 and len(directory.clients()) == 99


def test_simulated_nodes_still_registering_are_waited_for_not_queried():
    grid = InMemoryGrid(client_app, 100)
    first = list(grid.contexts)[:70]
    grid.get_node_ids = lambda: first  # Flower has registered 70 of 100 so far
    grid.state = SimpleNamespace(nodes={n: None for n in first})
    directory = NodeDirectory(100)
    directory.refresh(grid)
    assert _query_messages(grid) == [] and len(directory.clients()) == 0
    del grid.get_node_ids  # all registered now
    grid.state = SimpleNamespace(nodes={n: None for n in grid.contexts})
    directory.refresh(grid)
    assert len(directory.clients()) == 100
    assert len(_query_messages(grid)) == NodeDirectory.SIMULATION_PROBES


# ------------------------------------------------------------------ simulated_node_count
class _Registering:
    """A simulation grid whose node list grows by ``step`` per poll up to ``total``; the
    fake clock advances by each sleep."""

    def __init__(self, total: int, step: int) -> None:
        self.total, self.step, self.seen = total, step, 0
        self.clock = _Clock()

    def get_node_ids(self) -> list[int]:
        self.seen = min(self.total, self.seen + self.step)
        return list(range(self.seen))

    def sleep(self, seconds: float) -> None:
        self.clock.now += seconds


def _count(grid: _Registering, need: int, timeout: float = 300.0) -> int:
    return simulated_node_count(grid, need, timeout, settle=1.0, poll=0.25, clock=grid.clock, sleep=grid.sleep)


def test_simulated_node_count_returns_as_soon_as_every_client_has_a_node():
    grid = _Registering(total=20, step=20)
    assert _count(grid, 20) == 20
    assert grid.clock.now == 0.0


def test_simulated_node_count_settles_on_a_smaller_federation_within_a_second():
    # Prepare: Flower's default 2 SuperNodes, registered one per poll; the scenario needs 20
    grid = _Registering(total=2, step=1)
    # Execute
    have = _count(grid, 20)
    # Assert: 2 seen at t=0.25, unchanged for 1 s: t=1.25, not the 300 s timeout
    assert have == 2
    assert grid.clock.now == 1.25


def test_simulated_node_count_gives_up_at_the_timeout_when_no_node_registers():
    grid = _Registering(total=0, step=0)
    assert _count(grid, 20, timeout=2.0) == 0
    assert grid.clock.now == 2.0
