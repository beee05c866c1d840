"""A node's failure and its reason reach summary.json (not only a log).

The grid plays the SuperLink of a deployment whose SuperNode of client 3 is killed
during round 2: the train message sent to it comes back as the error reply the SuperLink
makes for a node that missed its heartbeats (from the SuperLink's node id, with the
original message id in ``reply_to_message_id``), and the node is gone afterwards.
"""

import json

import pytest
from flwr.server.superlink.linkstate.utils import (
    NODE_UNAVAILABLE_ERROR_REASON,
    create_message_error_unavailable_res_message,
)

from fedflex.clients.client_app import app as client_app
from fedflex.launch.local_grid import LocalGrid
from fedflex.launch.server import run_server
from fedflex.loader import load_scenario
from fedflex.results import read_metrics

KILLED, KILLED_IN = 3, 2


@pytest.fixture(autouse=True)
def _isolated(isolated_cache):  # tests/conftest.py
    yield


class _KilledNode(LocalGrid):
    """Client 3's SuperNode dies holding its round-2 train message."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.train_calls = 0
        self.killed_node = None

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        if not messages or messages[0].metadata.message_type != "train":
            return super().send_and_receive(messages, timeout=timeout)
        self.train_calls += 1
        if self.train_calls != KILLED_IN:
            return super().send_and_receive(messages, timeout=timeout)
        node = next(n for n, c in self.contexts.items() if c.node_config["partition-id"] == KILLED)
        others = [m for m in messages if m.metadata.dst_node_id != node]
        lost = [m for m in messages if m.metadata.dst_node_id == node]
        replies = list(super().send_and_receive(others, timeout=timeout))
        for msg in lost:  # the message id LocalGrid would give it, then the SuperLink's error reply
            msg.metadata.__dict__["_message_id"] = f"lost-{node}"
            replies.append(create_message_error_unavailable_res_message(msg.metadata, "node_unavail"))
        self.remove_node(KILLED)
        self.killed_node = node
        return replies


def test_killed_node_and_its_reason_are_in_the_summary(tmp_path):
    # Prepare: 4 clients, all trained every round, 3 rounds
    cfg = load_scenario(
        None,
        [
            "num_clients=4",
            "rounds=3",
            "dataset.samples_per_client=20",
            "churn.kind=none",
            "strategy.sampler.clients_per_round=4",
            "strategy.sampler.min_clients=1",
            "output.progress=off",
            "output.plots=false",
        ],
    )
    grid = _KilledNode(client_app, cfg.num_clients)
    # Execute
    run_server(grid, cfg, tmp_path / "out")
    # Assert: round 2 lists the failure with the SuperLink's reason; the summary has it
    # with its round; rounds 1 and 3 have none
    rows = read_metrics(tmp_path / "out")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    expected = {"client": KILLED, "node": grid.killed_node, "code": 5, "error": NODE_UNAVAILABLE_ERROR_REASON}
    assert rows[1]["failed"] == [KILLED]
    assert rows[1]["node_failures"] == [expected]
    assert "node_failures" not in rows[0] and "node_failures" not in rows[2]
    assert summary["node_failures"] == [{"round": 2, **expected}]


def test_a_run_without_failures_says_so(tmp_path):
    # Prepare
    cfg = load_scenario(
        None,
        ["num_clients=2", "rounds=1", "dataset.samples_per_client=20", "churn.kind=none", "output.plots=false"],
    )
    # Execute
    run_server(LocalGrid(client_app, 2), cfg, tmp_path / "out")
    # Assert
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["node_failures"] == []
