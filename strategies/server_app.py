"""fedflex's Flower ServerApp: runs a scenario's rounds and writes its results.

Two ways in:

- ``fedflex run SCENARIO`` (the runner) builds the app with :func:`make_server_app`
  around an already loaded config and a results directory;
- ``flwr run .`` loads the module-level ``app``, which reads ``scenario`` (a YAML path),
  ``overrides`` (space-separated dotted.key=value) and ``out`` (results directory) from
  the run config (``[tool.flwr.app.config]`` or ``--run-config``).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import shlex
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Result

from fedflex import interrupts, keys
from fedflex.arrays import numpy_to_record
from fedflex.churn import make_availability
from fedflex.config import ScenarioConfig, load_scenario, to_yaml
from fedflex.data import FederatedData, load_dataset
from fedflex.evaluation import evaluate
from fedflex.models import build_model, output_bias_key
from fedflex.partition import partition_data
from fedflex.progress import Progress
from fedflex.results import RunRecorder, default_out_dir, summarize, transition_summary
from strategies.build import ModelInfo, build_strategy

logger = logging.getLogger(__name__)


def task_json(cfg: ScenarioConfig) -> str:
    """What a client needs to rebuild the task (data, partition, model), as stable JSON."""
    spec = {
        "dataset": asdict(cfg.dataset),
        "partition": asdict(cfg.partition),
        "model": asdict(cfg.model),
        "num_clients": cfg.num_clients,
        "seed": cfg.seed,
        "device": cfg.client.device,
        "num_threads": cfg.client.num_threads,
    }
    return json.dumps(spec, sort_keys=True)


def train_config(cfg: ScenarioConfig) -> ConfigRecord:
    """The ConfigRecord every train message carries."""
    c = cfg.client
    return ConfigRecord(
        {
            keys.TASK: task_json(cfg),
            keys.SEED: cfg.seed,
            keys.EPOCHS: c.epochs,
            keys.STEPS: -1 if c.steps is None else c.steps,
            keys.BATCH_SIZE: c.batch_size,
            keys.OPTIMIZER: c.optimizer,
            keys.LR: c.lr,
            keys.MOMENTUM: c.momentum,
            keys.WEIGHT_DECAY: c.weight_decay,
            keys.LOCAL_RULE: cfg.strategy.local_rule.name,
            keys.PROXIMAL_MU: cfg.strategy.local_rule.mu if cfg.strategy.local_rule.name == "fedprox" else 0.0,
        }
    )


def initial_model(cfg: ScenarioConfig, input_shape: tuple[int, ...], num_classes: int) -> torch.nn.Module:
    """The round-0 global model, seeded by the scenario."""
    torch.manual_seed(cfg.seed)
    return build_model(cfg.model, input_shape, num_classes)


class OnlineLabelRows:
    """Test rows whose label some online client holds (cached per online set)."""

    def __init__(self, test_labels: torch.Tensor, client_labels: list[frozenset[int]]) -> None:
        self.test_labels = test_labels
        self.client_labels = client_labels
        self._cache: dict[tuple[int, ...], torch.Tensor] = {}

    def __call__(self, online: list[int]) -> torch.Tensor:
        key = tuple(online)
        if key not in self._cache:
            labels = sorted(set().union(*(self.client_labels[c] for c in online))) if online else []
            mask = torch.isin(self.test_labels, torch.tensor(labels, dtype=self.test_labels.dtype))
            self._cache = {key: torch.nonzero(mask).flatten().to(self.test_labels.device)}
        return self._cache[key]


CHECKPOINT_FILE = "checkpoint.pkl"
MODEL_FILE = "model.npz"


class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be read back."""


def save_checkpoint(out_dir: Path, server_round: int, strategy, run_wall_s: float = 0.0) -> None:
    """The server state after ``server_round`` (atomic write); ``run_wall_s``: the run's
    wall time so far (summed over resumes)."""
    path = Path(out_dir) / CHECKPOINT_FILE
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        pickle.dump({"round": server_round, "strategy": strategy.state_dict(), "run_wall_s": run_wall_s}, fh)
    os.replace(tmp, path)


def load_checkpoint(out_dir: Path) -> dict:
    """A run directory's checkpoint (written by :func:`save_checkpoint`).

    Raises
    ------
    CheckpointError
        When the file is missing, truncated, or not a fedflex checkpoint.
    """
    path = Path(out_dir) / CHECKPOINT_FILE
    try:
        with open(path, "rb") as fh:
            checkpoint = pickle.load(fh)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file") from None
    except Exception as exc:  # truncated / random bytes raise many types
        reason = " ".join(str(exc).split())  # one line, whatever the unpickler says
        raise CheckpointError(f"{path} is damaged ({type(exc).__name__}: {reason}); it cannot be resumed") from None
    if not isinstance(checkpoint, dict) or not {"round", "strategy"} <= set(checkpoint):
        raise CheckpointError(f"{path} is not a fedflex checkpoint; it cannot be resumed")
    return checkpoint


TRACE_FILE = "trace.csv"


def _with_trace_copy(cfg: ScenarioConfig, out_dir: Path) -> ScenarioConfig:
    """The config to save in ``out_dir``: a trace CSV is copied there and config.yaml
    names the copy (relative paths in a scenario resolve against its file), so the
    results directory re-runs anywhere."""
    if not cfg.churn.trace:
        return cfg
    import dataclasses
    import shutil

    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / TRACE_FILE
    if Path(cfg.churn.trace).resolve() != target.resolve():
        shutil.copyfile(cfg.churn.trace, target)
    return dataclasses.replace(cfg, churn=dataclasses.replace(cfg.churn, trace=TRACE_FILE))


def divergence_cause(record, global_arrays) -> Optional[str]:
    """Why the run has diverged after ``record``'s round (None: it has not).

    Diverged: every reply of the round was rejected for NaN / Inf values, the global
    model holds NaN / Inf, or the test loss is not finite.
    """
    nonfinite = int(record.extra.get("rejected_nonfinite", 0))
    if nonfinite and not record.sampled:
        return f"all {nonfinite} repl{'y' if nonfinite == 1 else 'ies'} had NaN or Inf values (local training diverged)"
    bad = [k for k, a in global_arrays.items() if np.issubdtype(a.dtype, np.floating) and not np.all(np.isfinite(a))]
    if bad:
        return f"the global model has NaN or Inf values ({', '.join(bad[:3])})"
    if record.test_loss is not None and not np.isfinite(record.test_loss):
        return f"the test loss is {record.test_loss}"
    return None


def run_server(
    grid: Grid,
    cfg: ScenarioConfig,
    out_dir: Optional[Path],
    data: Optional[FederatedData] = None,
    resume: Optional[dict] = None,
    wrap_grid: Optional[Callable[[Grid, Callable[[int], Optional[int]]], Grid]] = None,
) -> Result:
    """Run the scenario's rounds on ``grid``; write results to ``out_dir`` (if given).

    ``data``: the loaded data set, when the caller has it already. ``resume``: a
    checkpoint (:func:`load_checkpoint`) to continue from; ``out_dir``'s metrics are kept
    up to its round. ``wrap_grid(grid, client_of)``: a Grid to use instead of ``grid``,
    given the node id -> client id lookup (the runner's cohort messages on Ray).
    """
    t_start = time.perf_counter()
    if type(grid).__name__ == "InMemoryGrid":
        # Flower's simulation grid polls for replies every 0.1 s; a round of small models
        # then waits ~0.05 s for nothing. Polling the in-memory state is cheap.
        grid.pull_interval = min(getattr(grid, "pull_interval", 0.1), 0.005)
    if data is None:
        data = load_dataset(cfg.dataset, cfg.num_clients, cfg.seed)
    partition = partition_data(cfg.partition, data, cfg.num_clients, cfg.seed)
    availability = make_availability(cfg.churn, cfg.num_clients, cfg.seed, partition.client_labels)
    model = initial_model(cfg, data.train.input_shape, data.train.num_classes)
    info = ModelInfo(
        output_bias_key=output_bias_key(model), num_classes=data.train.num_classes, input_shape=data.train.input_shape
    )
    strategy = build_strategy(cfg, availability, info)
    initial = ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()})
    first_round = 1
    if resume is not None:
        strategy.load_state_dict(resume["strategy"])
        initial = numpy_to_record(strategy.global_arrays)
        first_round = int(resume["round"]) + 1
    test = data.test
    every, last = cfg.evaluation.every, cfg.rounds

    online_rows = OnlineLabelRows(test.y, partition.client_labels) if cfg.evaluation.online_labels else None

    def evaluate_fn(record, arrays: ArrayRecord) -> Optional[MetricRecord]:
        server_round = record.round
        if server_round % every and server_round != last:
            return None
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, acc, _ = evaluate(model, test, batch_size=cfg.evaluation.batch_size, loss=cfg.model.loss)
        metrics = MetricRecord({"test-loss": loss, "test-accuracy": acc})
        if online_rows is not None:
            rows = online_rows(record.online)
            if len(rows):
                _, online_acc, _ = evaluate(
                    model, test, rows, batch_size=cfg.evaluation.batch_size, loss=cfg.model.loss
                )
                metrics["online-accuracy"] = online_acc
        return metrics

    recorder = None
    if out_dir is not None:
        saved = _with_trace_copy(cfg, Path(out_dir))
        recorder = RunRecorder(out_dir, to_yaml(saved), keep_until=first_round - 1 if resume is not None else None)
    progress = Progress(cfg.rounds, cfg.output.progress, initial=first_round - 1)
    every_k = cfg.output.checkpoint_every
    target = cfg.evaluation.stop_at_accuracy

    def reached(record) -> bool:
        return bool(target) and record.test_accuracy is not None and record.test_accuracy >= target

    def after_round(server_round: int) -> None:
        final = server_round == last or (strategy.record is not None and reached(strategy.record))
        stopping = interrupts.requested() is not None  # saved even with checkpoint_every 0: resumable
        if out_dir is not None and ((every_k and (server_round % every_k == 0 or final)) or stopping):
            wall = extra.get("previous_wall_s", 0.0) + time.perf_counter() - t_start
            save_checkpoint(out_dir, server_round, strategy, run_wall_s=wall)

    def stop(record) -> bool:
        if cfg.evaluation.stop_on_divergence:
            cause = divergence_cause(record, strategy.global_arrays)
            if cause is not None:
                extra.update(status="diverged", diverged_round=record.round, divergence=cause)
                logger.error(
                    "round %d: the run diverged: %s; likely cause: client.lr = %g is too large for this model "
                    "(or the server step: strategy.aggregator.server_lr); stopping",
                    record.round,
                    cause,
                    cfg.client.lr,
                )
                return True
        signum = interrupts.requested()
        if signum is not None:
            extra.update(status="interrupted", interrupted_by=interrupts.signal_name(signum))
            return True
        if reached(record):
            extra["stopped_early"] = True
            logger.info(
                "Round %d reached test accuracy %.4f >= %.4f: stopping", record.round, record.test_accuracy, target
            )
            return True
        return False

    def on_round(record) -> None:
        row = record.to_json()
        if recorder is not None:
            recorder.log_round(row)
        progress.update(row)

    extra: dict[str, Any] = {"status": "failed"}
    if resume is not None:
        extra["previous_wall_s"] = float(resume.get("run_wall_s", 0.0))
    # Flower's simulation registers its nodes while the ServerApp already runs: wait for
    # all of them; a deployment waits for deployment.wait_for_nodes SuperNodes (bounded)
    simulated = type(grid).__name__ == "InMemoryGrid"
    wait_n = cfg.num_clients if simulated else cfg.deployment.wait_for_nodes
    if wait_n:
        strategy.nodes.wait_for(grid, wait_n, cfg.deployment.wait_timeout, poll=0.05 if simulated else 1.0)
    if wrap_grid is not None:
        grid = wrap_grid(grid, strategy.nodes.client_of)
    try:
        result = strategy.start(
            grid,
            initial,
            num_rounds=cfg.rounds,
            timeout=cfg.deployment.round_timeout or cfg.simulation.timeout,
            train_config=train_config(cfg),
            evaluate_fn=evaluate_fn,
            on_round=on_round,
            first_round=first_round,
            after_round=after_round,
            stop=stop,
        )
        if out_dir is not None:
            np.savez(Path(out_dir) / MODEL_FILE, **strategy.global_arrays)
        if extra["status"] == "failed":  # not interrupted, not diverged
            extra["status"] = "completed"
        return result
    finally:
        progress.close()
        if recorder is not None:
            extra.update(
                {
                    "scenario": cfg.name,
                    "seed": cfg.seed,
                    "num_clients": cfg.num_clients,
                    "strategy": {
                        "sampler": strategy.sampler.summary(),
                        "aggregator": strategy.aggregator.summary(),
                        "initializer": strategy.initializer.summary(),
                        "local_rule": strategy.local_rule,
                    },
                    "run_wall_s": extra.pop("previous_wall_s", 0.0) + time.perf_counter() - t_start,
                    "label_entropy_mean": float(np.mean(partition.entropies())),
                }
            )
            extra["transitions"] = transition_summary(recorder.rows, cfg.evaluation.transition_window)
            recorder.finish(
                summarize(recorder.rows, extra),
                timeline=availability.timeline(cfg.rounds),
                plots=cfg.output.plots,
            )


def make_server_app(
    cfg: ScenarioConfig,
    out_dir: Optional[Path],
    data: Optional[FederatedData] = None,
    resume: Optional[dict] = None,
    wrap_grid: Optional[Callable[[Grid, Callable[[int], Optional[int]]], Grid]] = None,
) -> ServerApp:
    """A ServerApp bound to a loaded scenario (used by the runner)."""
    server_app = ServerApp()

    @server_app.main()
    def _main(grid: Grid, context: Context) -> None:
        run_server(grid, cfg, out_dir, data, resume=resume, wrap_grid=wrap_grid)

    return server_app


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Entry point under ``flwr run``: the scenario comes from the run config."""
    run_config = context.run_config
    scenario = str(run_config.get("scenario", "scenarios/quickstart.yaml"))
    overrides = shlex.split(str(run_config.get("overrides", "")))
    cfg = load_scenario(scenario, overrides)
    out = str(run_config.get("out", "")) or None
    run_server(grid, cfg, Path(out) if out else default_out_dir(cfg.name))
