"""Cost accounting (fedflex.launch.metered_grid): the bytes of the messages a run sends and
receives, per round in metrics.jsonl and in total in summary.json, and each round's phases."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

import fedflex
from fedflex.launch.metered_grid import MeteredGrid, message_bytes

QUICKSTART = Path(__file__).parents[2] / "scenarios" / "quickstart.yaml"
TINY = ["num_clients=4", "rounds=2", "dataset.samples_per_client=40", "strategy.sampler.clients_per_round=4"]
# a NumPy .npy serialization of a small 1-D array: a 128-byte header, then the values
NPY_HEADER = 128


class _Msg:
    """A message as the grid sees it: content, or an error."""

    def __init__(self, content=None):
        self.content = content

    def has_error(self) -> bool:
        return self.content is None


class _Grid:
    """Answers every message with 5 float64 values (40 bytes), the second with an error."""

    def send_and_receive(self, messages, timeout=None):
        reply = RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(5, np.float64))})})
        return [_Msg(reply), _Msg(None), _Msg(reply)][: len(messages)]


def test_a_message_is_its_arrays_bytes_plus_its_records():
    # Prepare: 10 float32 values = 40 bytes of data after the .npy header
    arrays = ArrayRecord({"w": Array(np.zeros(10, np.float32))})
    metrics = MetricRecord({"num-examples": 10})
    # Execute / Assert
    assert message_bytes(_Msg(RecordDict({"arrays": arrays}))) == NPY_HEADER + 40
    with_metrics = message_bytes(_Msg(RecordDict({"arrays": arrays, "metrics": metrics})))
    assert with_metrics == NPY_HEADER + 40 + len(metrics.deflate())
    assert message_bytes(_Msg(None)) == 0  # an error reply carries nothing


def test_the_grid_counts_down_and_up_and_starts_again_after_take():
    # Prepare: three messages sharing one model record (168 bytes)
    shared = RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(10, np.float32))})})
    grid = MeteredGrid(_Grid())
    # Execute
    grid.send_and_receive([_Msg(shared)] * 3)
    first = grid.take()
    second = grid.take()
    # Assert: 3 x 168 down; two replies of 128 + 40 up, the error reply none
    assert first == (3 * (NPY_HEADER + 40), 2 * (NPY_HEADER + 40))
    assert second == (0, 0)


@pytest.fixture(scope="module")
def runs():
    one_at_a_time = fedflex.run(QUICKSTART, [*TINY, "simulation.vectorize=off", "output.progress=off"])
    cohorts = fedflex.run(QUICKSTART, [*TINY, "simulation.vectorize=on", "output.progress=off"])
    return one_at_a_time, cohorts


def test_rows_count_each_clients_model_down_and_up_and_the_summary_adds_them(runs):
    run, _ = runs
    # the model's arrays as .npy bytes: what each train message carries down and each reply up
    model = sum(NPY_HEADER + np.asarray(v).nbytes for v in run.model.values())
    second = run.rows[1]
    k = len(second["sampled"])  # the online clients (churn) that trained
    # Assert: round 2 sends the model to its k clients and gets k models back, plus small
    # records (the config with the task spec down, the metrics up: under 2 KB a message)
    assert k >= 2 and not second["failed"]
    assert k * model < second["bytes_down"] < k * (model + 2048)
    assert k * model < second["bytes_up"] < k * (model + 2048)
    # round 1 also holds the partition-id queries: more than round 2
    assert run.rows[0]["bytes_down"] > second["bytes_down"]
    assert run.summary["bytes_down"] == sum(r["bytes_down"] for r in run.rows)
    assert run.summary["bytes_up"] == sum(r["bytes_up"] for r in run.rows)


def test_the_counts_do_not_depend_on_how_the_workers_train_the_clients(runs):
    # vectorize on: a cohort trained as one batch; off: one client after another
    one_at_a_time, cohorts = runs
    assert [(r["bytes_down"], r["bytes_up"]) for r in one_at_a_time.rows] == [
        (r["bytes_down"], r["bytes_up"]) for r in cohorts.rows
    ]


def test_each_round_has_the_seconds_of_its_phases(runs):
    run, _ = runs
    for row in run.rows:
        phases = [row[k] for k in ("sample_s", "train_s", "aggregate_s", "evaluate_s")]
        assert all(p >= 0 for p in phases)
        assert sum(phases) <= row["wall_s"] + 1e-3  # the phases are laps of the round's clock


def test_run_wall_time_counts_from_the_commands_start(tmp_path, monkeypatch):
    import time

    from fedflex import runinfo

    # Prepare: a command that started 100 s ago (its imports, data load, a Ray start)
    monkeypatch.setattr(runinfo, "_command_start", time.perf_counter() - 100.0)
    # Execute
    commanded = fedflex.run(QUICKSTART, [*TINY, "output.progress=off"], out=tmp_path / "a")
    monkeypatch.setattr(runinfo, "_command_start", None)  # the Python API: no command
    called = fedflex.run(QUICKSTART, [*TINY, "output.progress=off"], out=tmp_path / "b")
    # Assert: the command's 100 s count; the API's clock starts with the run
    assert commanded.summary["run_wall_s"] >= 100.0
    assert called.summary["run_wall_s"] < 100.0


def test_a_processs_age_counts_from_its_start():
    import subprocess
    import sys

    # Execute: a process that sleeps 0.5 s before it asks
    code = "import time; time.sleep(0.5); from fedflex.runinfo import process_age; print(process_age())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    # Assert: at least the sleep (clock ticks are 10 ms), not the test session's age
    assert 0.49 <= float(out.stdout) < 60


def test_the_grid_wrapper_passes_every_call_of_flowers_grid_through():
    from flwr.serverapp import Grid

    from fedflex.launch.grid_wrapper import GridWrapper

    # Flower's Grid has defaults (get_nodes: the ids without their public keys) that a
    # wrapper must not fall back to: each of its calls is the wrapped grid's
    names = [n for n in dir(Grid) if not n.startswith("_")]
    assert "get_nodes" in names
    assert [n for n in names if getattr(GridWrapper, n) is getattr(Grid, n)] == []
