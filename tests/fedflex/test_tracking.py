"""Experiment trackers (output.trackers): what they receive, read back from their own
files; refused at config load when unknown or when their package is missing."""

import importlib.util
import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest

from fedflex.config import ConfigError
from fedflex.launch.cli import main
from fedflex.launch.observers import Tracking
from fedflex.loader import load_scenario
from fedflex.tracking import flatten, numeric, row_scalars

ROOT = Path(__file__).parents[2]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
ROUNDS = 3
TINY = [
    f"rounds={ROUNDS}",
    "num_clients=6",
    "dataset.samples_per_client=40",
    "strategy.sampler.clients_per_round=3",
    "simulation.backend=local",
    "output.progress=off",
    "output.plots=false",
]


# ---------------------------------------------------------------------------- pure parts
def test_row_scalars_keep_the_finite_numbers_of_a_row():
    # Prepare
    row = {
        "round": 3,
        "phase": "train",
        "session": 1,
        "online": [0, 2],
        "skipped": False,
        "test_accuracy": 0.5,
        "test_loss": None,
        "e_lud": float("nan"),
        "wall_s": 0.25,
    }

    # Execute / Assert: round is the step; lists, booleans, None and NaN are no scalars
    assert row_scalars(row) == {"session": 1.0, "test_accuracy": 0.5, "wall_s": 0.25}


def test_per_class_and_per_client_accuracies_are_one_scalar_each():
    row = {"round": 2, "class_accuracy": [0.5, None, 1.0], "client_accuracy": [[3, 0.25], [7, 0.75]]}
    assert row_scalars(row) == {
        "class_accuracy/0": 0.5,
        "class_accuracy/2": 1.0,
        "client_accuracy/3": 0.25,
        "client_accuracy/7": 0.75,
    }


def test_row_scalars_of_a_parts_extra_round_carry_its_phase():
    assert row_scalars({"round": 4, "phase": "session-init", "train_loss": 1.5}) == {"session-init/train_loss": 1.5}


def test_flatten_gives_dotted_keys():
    assert flatten({"a": 1, "b": {"c": [1, 2], "d": {"e": "x"}}}) == {"a": 1, "b.c": [1, 2], "b.d.e": "x"}


class _Fake:
    def __init__(self, fail_on_log: bool = False) -> None:
        self.fail_on_log = fail_on_log
        self.calls: list = []

    def start(self, params):
        self.calls.append(("start", params))

    def log(self, step, scalars):
        if self.fail_on_log:
            raise RuntimeError("tracking server gone")
        self.calls.append(("log", step, scalars))

    def finish(self, summary, status, step):
        self.calls.append(("finish", summary, status, step))


class _Record:
    def __init__(self, row):
        self.row = row

    def to_json(self):
        return dict(self.row)


def test_a_failing_tracker_is_dropped_and_the_others_go_on(caplog):
    # Prepare
    broken, working = _Fake(fail_on_log=True), _Fake()
    tracking = Tracking([broken, working], {"rounds": 2, "client": {"lr": 0.1}})

    # Execute
    with caplog.at_level(logging.ERROR):
        tracking.after_round(_Record({"round": 1, "test_accuracy": 0.4}))
        tracking.after_round(_Record({"round": 2, "test_accuracy": 0.6}))
    tracking.finish({"status": "completed", "final_test_accuracy": 0.6, "strategy": {"sampler": "uniform"}})

    # Assert
    assert working.calls == [
        ("start", {"rounds": 2, "client.lr": 0.1}),
        ("log", 1, {"test_accuracy": 0.4}),
        ("log", 2, {"test_accuracy": 0.6}),
        ("finish", {"final_test_accuracy": 0.6}, "completed", 2),
    ]
    assert broken.calls == [("start", {"rounds": 2, "client.lr": 0.1})]
    assert sum("tracker _Fake failed" in r.getMessage() for r in caplog.records) == 1


# ---------------------------------------------------------------------------- config
def test_an_unknown_tracker_is_refused_naming_the_allowed_ones():
    with pytest.raises(ConfigError) as err:
        load_scenario(QUICKSTART, ["output.trackers=[neptune]"])
    assert str(err.value) == "output.trackers = 'neptune': must be one of tensorboard, mlflow, wandb"


def _without(monkeypatch, missing: str) -> None:
    """Make ``missing`` look not installed to importlib.util.find_spec."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a, **k: None if name == missing else real(name, *a, **k)
    )


@pytest.mark.parametrize("tracker", ["tensorboard", "mlflow", "wandb"])
def test_a_tracker_whose_package_is_missing_is_refused_naming_the_extra(monkeypatch, tracker):
    # Prepare
    _without(monkeypatch, tracker)

    # Execute / Assert
    with pytest.raises(ConfigError) as err:
        load_scenario(QUICKSTART, [f"output.trackers=[{tracker}]"])
    assert str(err.value) == (
        f"output.trackers = '{tracker}': tracker {tracker} needs the {tracker} package: "
        f"pip install 'fedflex[{tracker}]'"
    )


def test_the_cli_refuses_a_missing_tracker_in_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    # Prepare
    _without(monkeypatch, "wandb")
    out = tmp_path / "o"

    # Execute
    code = main(["run", str(QUICKSTART), "output.trackers=[wandb]", "--out", str(out)])

    # Assert
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err == (
        "fedflex: config error: output.trackers = 'wandb': tracker wandb needs the wandb package: "
        "pip install 'fedflex[wandb]'"
    )
    assert not out.exists()


# ---------------------------------------------------------------------------- real runs
def _tracked_run(tmp: Path, tracker: str) -> Path:
    """A tiny quickstart run with ``tracker``; its directory."""
    import fedflex

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FEDFLEX_CACHE", str(tmp / "cache"))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        fedflex.run(QUICKSTART, [*TINY, f"output.trackers=[{tracker}]"], out=tmp / "run")
    return tmp / "run"


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_tensorboard_scalars_read_back_equal_metrics_jsonl(tmp_path):
    # Prepare
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracked_run = _tracked_run(tmp_path, "tensorboard")
    rows = _metrics(tracked_run)
    summary = json.loads((tracked_run / "summary.json").read_text())

    # Execute
    events = EventAccumulator(str(tracked_run / "tensorboard"))
    events.Reload()

    # Assert: every numeric field of every row, at its round, as float32 (TensorBoard's type)
    for field in ("test_accuracy", "test_loss", "train_loss", "wall_s", "num_examples", "session"):
        scalars = events.Scalars(field)
        assert [s.step for s in scalars] == [r["round"] for r in rows] == list(range(1, ROUNDS + 1))
        assert [s.value for s in scalars] == [float(np.float32(r[field])) for r in rows]
    final = events.Scalars("summary/final_test_accuracy")
    assert [(s.step, s.value) for s in final] == [(ROUNDS, float(np.float32(summary["final_test_accuracy"])))]
    assert "config/text_summary" in events.Tags()["tensors"]


@pytest.mark.slow  # MLflow creates its SQLite store with ~30 migrations (seconds)
def test_mlflow_records_the_run_in_the_run_directorys_store(tmp_path):
    # Prepare
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    tracked_run = _tracked_run(tmp_path, "mlflow")
    rows = _metrics(tracked_run)
    client = MlflowClient(tracking_uri=f"sqlite:///{tracked_run / 'mlflow.db'}")

    # Execute
    experiment = client.get_experiment_by_name("quickstart")
    (run,) = client.search_runs([experiment.experiment_id])
    history = client.get_metric_history(run.info.run_id, "test_accuracy")

    # Assert
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "run"
    assert run.data.params["rounds"] == str(ROUNDS)
    assert run.data.params["strategy.sampler.name"] == "uniform"
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == [
        (r["round"], r["test_accuracy"]) for r in rows
    ]
    summary = json.loads((tracked_run / "summary.json").read_text())
    assert math.isclose(run.data.metrics["summary/final_test_accuracy"], summary["final_test_accuracy"])
    assert numeric(summary)["rounds"] == ROUNDS
