"""The FedFlex strategy driving the real ClientApp through an in-process grid.

LocalGrid hands each message to the real ClientApp handlers (records, metadata, error
replies) without Ray, so these tests exercise the server/client contract in seconds.
"""

import json
import math

import numpy as np
import pytest
from flwr.app import Array

import fedflex.clients.runtime as runtime
from fedflex.clients.client_app import app as client_app
from fedflex.launch.local_grid import LocalGrid
from fedflex.launch.server import run_server
from fedflex.loader import load_scenario
from fedflex.results import read_metrics
from fedflex.strategies.strategy import RunFailedError, TooFewClientsError

BASE = [
    "num_clients=6",
    "rounds=4",
    "dataset.samples_per_client=30",
    "churn.kind=none",
    "strategy.sampler.clients_per_round=3",
    "output.progress=off",
    "output.plots=false",
]


@pytest.fixture(autouse=True)
def _isolated(isolated_cache):  # tests/conftest.py
    yield


def _run(tmp_path, overrides, grid=None):
    cfg = load_scenario(None, BASE + overrides)
    grid = grid or LocalGrid(client_app, cfg.num_clients)
    result = run_server(grid, cfg, tmp_path / "out")
    return result, read_metrics(tmp_path / "out"), grid


def test_worker_loads_the_data_once_for_all_messages(tmp_path, monkeypatch):
    calls = []
    real = runtime.load_dataset
    monkeypatch.setattr(runtime, "load_dataset", lambda *a, **k: calls.append(1) or real(*a, **k))
    _, rows, _ = _run(tmp_path, [])
    trained = sum(len(r["sampled"]) for r in rows)
    assert trained == 12  # 4 rounds x 3 clients, all served by this one "worker"
    assert len(calls) == 1


def test_round_with_too_few_online_clients_is_skipped_and_logged(tmp_path, caplog):
    # sessions of 1 round: {0,1,2}, {3} (1 client < min_clients=2), cycling
    _, rows, _ = _run(
        tmp_path,
        [
            "churn.kind=sessions",
            "churn.sessions=[[0,1,2],[3]]",
            "churn.rounds_per_session=1",
            "strategy.sampler.min_clients=2",
        ],
    )
    assert [r["skipped"] for r in rows] == [False, True, False, True]
    assert rows[1]["sampled"] == [] and rows[1]["online"] == [3]
    assert "fewer than min_clients=2" in caplog.text


def test_too_few_clients_can_fail_the_run(tmp_path):
    with pytest.raises(TooFewClientsError, match="round 2"):
        _run(
            tmp_path,
            [
                "churn.kind=sessions",
                "churn.sessions=[[0,1,2],[3]]",
                "churn.rounds_per_session=1",
                "strategy.sampler.min_clients=2",
                "churn.on_too_few=fail",
            ],
        )


def test_too_few_clients_failing_the_run_is_in_the_summary(tmp_path):
    # Prepare: round 2 has 1 client online, min_clients 2
    churn = ["churn.kind=sessions", "churn.sessions=[[0,1,2],[3]]", "churn.rounds_per_session=1"]
    # Execute
    with pytest.raises(RunFailedError):
        _run(tmp_path, [*churn, "strategy.sampler.min_clients=2", "churn.on_too_few=fail"])
    # Assert: round 1 kept, the reason recorded
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["last_round"] == 1
    assert summary["failure"] == "round 2: 1 client(s) online, fewer than min_clients=2 (churn.on_too_few=fail)"


def test_a_run_with_some_skipped_rounds_still_completes(tmp_path):
    churn = ["churn.kind=sessions", "churn.sessions=[[0,1,2],[3]]", "churn.rounds_per_session=1"]
    _, rows, _ = _run(tmp_path, [*churn, "strategy.sampler.min_clients=2"])
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [r["skipped"] for r in rows] == [False, True, False, True]
    assert summary["status"] == "completed" and "failure" not in summary


def test_a_run_whose_every_reply_failed_is_a_failed_run(tmp_path):
    # Prepare: clients answer who they are but every training fails
    def no_training(msg, context):
        if msg.metadata.message_type == "train":
            raise RuntimeError("out of memory")
        return client_app(msg, context)

    cfg = load_scenario(None, BASE)
    # Execute
    with pytest.raises(RunFailedError) as raised:
        run_server(LocalGrid(no_training, cfg.num_clients), cfg, tmp_path / "out")
    # Assert: 4 rounds, none trained
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    reason = "no round trained: of 4 round(s), 4 without a usable reply"
    assert str(raised.value) == reason
    assert summary["status"] == "failed" and summary["failure"] == reason and summary["rounds"] == 4


def test_a_run_without_results_directory_that_trained_nothing_raises_too():
    cfg = load_scenario(None, [*BASE, "churn.kind=sessions", "churn.sessions=[[0]]", "strategy.sampler.min_clients=2"])
    with pytest.raises(RunFailedError, match=r"of 4 round\(s\), 4 skipped with fewer than"):
        run_server(LocalGrid(client_app, cfg.num_clients), cfg, None)


def test_skipped_round_keeps_the_model(tmp_path):
    churn = [
        "churn.kind=sessions",
        "churn.sessions=[[0,1,2],[3]]",
        "churn.rounds_per_session=1",
        "strategy.sampler.min_clients=2",
    ]
    result, rows, _ = _run(tmp_path, ["rounds=2", *churn])
    assert rows[1]["skipped"]
    first = _run(tmp_path / "b", ["rounds=1", *churn])[0]
    for key in first.arrays:
        np.testing.assert_array_equal(result.arrays[key].numpy(), first.arrays[key].numpy())


def test_same_seed_same_final_model(tmp_path):
    a = _run(tmp_path / "a", ["churn.kind=markov"])[0]
    runtime.get_task.cache_clear()
    b = _run(tmp_path / "b", ["churn.kind=markov"])[0]
    for key in a.arrays:
        np.testing.assert_array_equal(a.arrays[key].numpy(), b.arrays[key].numpy())


class _Departures(LocalGrid):
    """Client 5's node leaves before round 2 and is back for round 4."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = 0

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        if messages and messages[0].metadata.message_type == "train":
            self.calls += 1
            if self.calls == 1:
                self.remove_node(5)
            elif self.calls == 3:
                self.add_node(5)
        return super().send_and_receive(messages, timeout=timeout)


def test_live_nodes_are_the_online_set_in_a_deployment(tmp_path):
    _, rows, _ = _run(tmp_path, ["strategy.sampler.clients_per_round=6"], grid=_Departures(client_app, 6))
    assert [r["online"] for r in rows] == [list(range(6)), list(range(5)), list(range(5)), list(range(6))]
    assert [r["session"] for r in rows] == [0, 1, 1, 2]
    assert 5 in rows[3]["sampled"]  # the returning node is used again


class _Broken(LocalGrid):
    """Client 2 answers with NaN weights (client 4's app raising is set up in the test)."""

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for reply in super().send_and_receive(messages, timeout=timeout):
            pid = self.contexts[reply.metadata.src_node_id].node_config["partition-id"]
            if pid == 2 and reply.metadata.message_type == "train":
                arrays = reply.content["arrays"]
                key = next(iter(arrays))
                bad = arrays[key].numpy().copy()
                bad.flat[0] = math.nan
                arrays[key] = Array(bad)
            replies.append(reply)
        return replies


def test_bad_replies_are_rejected_with_the_client_id(tmp_path, caplog):
    grid = _Broken(client_app, 6)
    real_app = grid.client_app

    def app(msg, ctx):
        if ctx.node_config["partition-id"] == 4 and msg.metadata.message_type == "train":
            raise RuntimeError("disk on fire")
        return real_app(msg, ctx)

    grid.client_app = app
    _, rows, _ = _run(tmp_path, ["strategy.sampler.clients_per_round=6"], grid=grid)
    for row in rows:
        assert row["failed"] == [2, 4]
        assert row["sampled"] == [0, 1, 3, 5]
    assert "client 2" in caplog.text and "NaN or Inf" in caplog.text
    assert "client 4" in caplog.text and "disk on fire" in caplog.text


def test_node_with_partition_id_outside_the_scenario_is_ignored(tmp_path, caplog):
    grid = LocalGrid(client_app, 6)
    grid.add_node(17)
    _, rows, _ = _run(tmp_path, ["rounds=1"], grid=grid)
    assert rows[0]["online"] == list(range(6))
    assert "client id 17" in caplog.text


def test_parts_see_the_round_in_progress_while_they_aggregate(tmp_path, monkeypatch):
    # FedAWARE reads the round's facts for the online set: they must be this round's
    from fedflex.strategies.baseline import FedAvgAggregator

    seen = []
    original = FedAvgAggregator.aggregate

    def spy(self, server_round, global_arrays, updates):
        seen.append((server_round, self.ctx.facts.round, self.ctx.facts.online.tolist()))
        return original(self, server_round, global_arrays, updates)

    monkeypatch.setattr(FedAvgAggregator, "aggregate", spy)
    _, rows, _ = _run(tmp_path, ["churn.kind=markov", "churn.initial_online=0.5"])
    assert [r for r, _, _ in seen] == [row["round"] for row in rows if not row["skipped"]]
    for (server_round, record_round, online), row in zip(seen, [r for r in rows if not r["skipped"]]):
        assert record_round == server_round
        assert online == row["online"]
