"""Experiment trackers: TensorBoard, MLflow and Weights & Biases receive a run as it goes.

``output.trackers: [tensorboard, mlflow, wandb]`` (:class:`fedflex.config.OutputConfig`)
opens one tracker per name for a run directory. Each gets, at the start, the resolved
config flattened to dotted keys (``strategy.sampler.name``); every round, the numeric
fields of the round's metrics.jsonl row (``test_accuracy``, ``train_loss``, ``wall_s``,
method fields; extra rounds of a part under ``<phase>/``) at step ``round``; at the end,
the numeric fields of summary.json under ``summary/`` and the run's status.

- ``tensorboard``: event files in ``DIR/tensorboard`` (torch's ``SummaryWriter``); the
  config as a text table. ``tensorboard --logdir DIR/tensorboard``.
- ``mlflow``: one MLflow run per fedflex run (experiment: the scenario name, run name:
  the directory name) at ``MLFLOW_TRACKING_URI``, else in ``DIR/mlflow.db`` (MLflow 3
  refuses its old file store): ``mlflow ui --backend-store-uri sqlite:///DIR/mlflow.db``.
- ``wandb``: one W&B run (project ``WANDB_PROJECT``, default ``fedflex``) with its files
  in ``DIR/wandb``; ``WANDB_MODE=offline`` keeps it on this machine (``wandb sync`` later).

The packages are optional extras (``pip install 'fedflex[tensorboard]'``); the config
refuses a tracker whose package is missing.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any, Mapping, Protocol

TENSORBOARD_DIR = "tensorboard"
MLFLOW_DB = "mlflow.db"
WANDB_PROJECT = "fedflex"


class Tracker(Protocol):
    """What a run tells a tracker."""

    def start(self, params: dict[str, Any]) -> None:
        """Send the flattened config, before round 1."""

    def log(self, step: int, scalars: dict[str, float]) -> None:
        """One round's numeric fields."""

    def finish(self, summary: dict[str, float], status: str, step: int) -> None:
        """Send the summary's numeric fields and the run's status; then close."""


# ---------------------------------------------------------------------------- values
def flatten(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as one level of dotted keys (lists and scalars kept as values)."""
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            flat.update(flatten(value, name))
        else:
            flat[name] = value
    return flat


def numeric(mapping: Mapping[str, Any]) -> dict[str, float]:
    """Return the top-level finite numbers of ``mapping`` (not booleans, None, lists)."""
    return {
        k: float(v)
        for k, v in mapping.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


#: list fields of a row sent to the trackers one scalar per item: ``class_accuracy/<class>``
#: (a list by class) and ``client_accuracy/<client>`` ([client, accuracy] pairs)
LIST_SCALARS = ("class_accuracy", "client_accuracy")


def row_scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """Return a metrics row's numeric fields, ``round`` left out (it is the step), with the
    items of :data:`LIST_SCALARS` as ``<field>/<key>``; a part's extra round (``phase``
    other than ``train``) under ``<phase>/``.
    """
    scalars = numeric(row)
    scalars.pop("round", None)
    for name in LIST_SCALARS:
        items = row.get(name)
        if isinstance(items, list):
            pairs = items if items and isinstance(items[0], list) else list(enumerate(items))
            scalars.update(numeric({f"{name}/{key}": value for key, value in pairs}))
    phase = row.get("phase", "train")
    return scalars if phase == "train" else {f"{phase}/{k}": v for k, v in scalars.items()}


# ---------------------------------------------------------------------------- trackers
class TensorBoardTracker:
    """Scalars and the config as text in ``out_dir/tensorboard``."""

    def __init__(self, out_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(out_dir) / TENSORBOARD_DIR))

    def start(self, params: dict[str, Any]) -> None:
        """Write the run's config as a text table."""
        table = "| key | value |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in params.items())
        self.writer.add_text("config", table)
        self.writer.flush()

    def log(self, step: int, scalars: dict[str, float]) -> None:
        """Write one round's scalars (flushed: a killed run keeps its rounds)."""
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()  # a killed run keeps its rounds

    def finish(self, summary: dict[str, float], status: str, step: int) -> None:
        """Write the summary's figures and the status, then close the writer."""
        for key, value in summary.items():
            self.writer.add_scalar(f"summary/{key}", value, step)
        self.writer.add_text("status", status, step)
        self.writer.close()


MLFLOW_STATUS = {"completed": "FINISHED", "interrupted": "KILLED"}  # else FAILED
MLFLOW_BATCH = 100  # MLflow's limit of params per log_batch call
MLFLOW_PARAM_CHARS = 500


def mlflow_uri(out_dir: Path) -> str:
    """``MLFLOW_TRACKING_URI``, else a SQLite store in the run directory."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(Path(out_dir) / MLFLOW_DB).resolve()}"


class MLflowTracker:
    """One MLflow run: params, metrics per step, the summary, the status."""

    def __init__(self, out_dir: Path, experiment: str, run_name: str) -> None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=mlflow_uri(out_dir))
        found = self.client.get_experiment_by_name(experiment)
        if found is not None:
            experiment_id = found.experiment_id
        else:
            local = "MLFLOW_TRACKING_URI" not in os.environ
            artifacts = (Path(out_dir).resolve() / "mlartifacts").as_uri() if local else None
            experiment_id = self.client.create_experiment(experiment, artifact_location=artifacts)
        self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id

    def start(self, params: dict[str, Any]) -> None:
        """Log the run's config as parameters (values cut to MLflow's length limit)."""
        from mlflow.entities import Param

        items = [Param(k, str(v)[:MLFLOW_PARAM_CHARS]) for k, v in params.items()]
        for i in range(0, len(items), MLFLOW_BATCH):
            self.client.log_batch(self.run_id, params=items[i : i + MLFLOW_BATCH])

    def _metrics(self, scalars: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, v, now, step) for k, v in scalars.items()]
        for i in range(0, len(items), MLFLOW_BATCH):
            self.client.log_batch(self.run_id, metrics=items[i : i + MLFLOW_BATCH])

    def log(self, step: int, scalars: dict[str, float]) -> None:
        """Log one round's scalars as metrics."""
        self._metrics(scalars, step)

    def finish(self, summary: dict[str, float], status: str, step: int) -> None:
        """Log the summary's figures and the status, then end the run."""
        self._metrics({f"summary/{k}": v for k, v in summary.items()}, step)
        self.client.set_tag(self.run_id, "fedflex.status", status)
        self.client.set_terminated(self.run_id, MLFLOW_STATUS.get(status, "FAILED"))


class WandbTracker:
    """One W&B run (``WANDB_MODE=offline``: files in ``out_dir/wandb`` only)."""

    def __init__(self, out_dir: Path, experiment: str, run_name: str) -> None:
        self.out_dir, self.experiment, self.run_name = Path(out_dir), experiment, run_name
        self.run: Any = None

    def start(self, params: dict[str, Any]) -> None:
        """Start the wandb run with the run's config."""
        import wandb

        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", WANDB_PROJECT),
            group=self.experiment,
            name=self.run_name,
            dir=str(self.out_dir),
            config=params,
        )

    def log(self, step: int, scalars: dict[str, float]) -> None:
        """Log one round's scalars."""
        self.run.log(scalars, step=step)

    def finish(self, summary: dict[str, float], status: str, step: int) -> None:
        """Put the summary's figures and the status into the run's summary, then finish it."""
        self.run.summary.update({f"summary/{k}": v for k, v in summary.items()} | {"status": status})
        self.run.finish(exit_code=0 if status == "completed" else 1)


def open_trackers(names: list[str], out_dir: Path, experiment: str) -> list[Tracker]:
    """Return the trackers named in ``output.trackers`` for the run in ``out_dir`` (MLflow's and
    W&B's run name: the directory's name).
    """
    made: list[Tracker] = []
    for name in names:
        if name == "tensorboard":
            made.append(TensorBoardTracker(out_dir))
        elif name == "mlflow":
            made.append(MLflowTracker(out_dir, experiment, Path(out_dir).name))
        elif name == "wandb":
            made.append(WandbTracker(out_dir, experiment, Path(out_dir).name))
        else:  # the config refuses other names
            raise ValueError(f"unknown tracker {name!r}")
    return made
