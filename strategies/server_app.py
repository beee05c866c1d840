"""fedflex's Flower ServerApp: runs a scenario's rounds and writes its results.

Two ways in:

- ``fedflex run SCENARIO`` (the runner) builds the app with :func:`make_server_app`
  around an already loaded config and a results directory;
- ``flwr run .`` loads the module-level ``app``, which reads ``scenario`` (a YAML path),
  ``overrides`` (space-separated dotted.key=value) and ``out`` (results directory) from
  the run config (``[tool.flwr.app.config]`` or ``--run-config``); or ``resume`` (a
  results directory with a checkpoint): the run continues there, on the federation, from
  its last checkpoint, as configured in its ``config.yaml``. Under ``flwr run`` a
  checkpoint is saved after every round unless the scenario or the overrides set
  ``output.checkpoint_every`` (a deployment's round takes seconds; the checkpoint, a
  pickle of the server state, milliseconds).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import shlex
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Result

import fedflex
from fedflex import keys
from fedflex.arrays import numpy_to_record
from fedflex.churn import make_availability
from fedflex.config import ConfigError, ScenarioConfig, load_scenario, to_dict, to_yaml
from fedflex.data import FederatedData, load_dataset
from fedflex.models import build_model, output_bias_key
from fedflex.node_keys import read_binding
from fedflex.orphans import exit_when_orphaned
from fedflex.partition import partition_data
from fedflex.progress import Progress
from fedflex.records import to_record
from fedflex.results import RunRecorder, default_out_dir, summarize, transition_summary, unusable_out_dir
from fedflex.runinfo import provenance, run_log
from fedflex.tracking import open_trackers
from strategies.build import ModelInfo, build_strategy
from strategies.observers import Checkpointer, EachRound, RowWriter, RunClock, StopRules, TestSetEvaluation, Tracking

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
    """The ConfigRecord every train message carries: the task, the seed and the local
    training settings (``client.*``, :func:`fedflex.records.to_record`); the local rule's
    server half adds the rule's own options each round."""
    return ConfigRecord(
        {
            keys.TASK: task_json(cfg),
            keys.SEED: cfg.seed,
            **to_record(cfg.client, keys.CLIENT, only=cfg.client.training_fields()),
        }
    )


def initial_model(cfg: ScenarioConfig, input_shape: tuple[int, ...], num_classes: int) -> torch.nn.Module:
    """The round-0 global model, seeded by the scenario."""
    torch.manual_seed(cfg.seed)
    return build_model(cfg.model, input_shape, num_classes)


CHECKPOINT_FILE = "checkpoint.pkl"


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


def run_server(
    grid: Grid,
    cfg: ScenarioConfig,
    out_dir: Optional[Path],
    data: Optional[FederatedData] = None,
    resume: Optional[dict] = None,
    wrap_grid: Optional[Callable[[Grid, Callable[[int], Optional[int]]], Grid]] = None,
    recorder: Optional[Any] = None,
    node_keys: Optional[Path] = None,
) -> Result:
    """Run the scenario's rounds on ``grid``; write results to ``out_dir`` (if given).

    ``data``: the loaded data set, when the caller has it already. ``resume``: a
    checkpoint (:func:`load_checkpoint`) to continue from; ``out_dir``'s metrics are kept
    up to its round. ``wrap_grid(grid, client_of)``: a Grid to use instead of ``grid``,
    given the node id -> client id lookup (the runner's cohort messages on Ray).
    ``recorder``: where rows, summary and final model go when ``out_dir`` is None
    (:class:`fedflex.results.MemoryRecorder`: the Python API's in-memory run). The run's
    log lines are copied to ``out_dir/run.log`` while it runs.
    ``node_keys``: a binding file (:mod:`fedflex.node_keys`): a node serves a client id
    only if it authenticated with the key bound to it.
    """
    action = "resuming" if resume is not None else "starting"
    first_line = f"fedflex {fedflex.__version__}: {action} {cfg.name} (seed {cfg.seed}, {cfg.rounds} rounds)"
    with run_log(out_dir, first_line):
        return _run_server(grid, cfg, out_dir, data, resume, wrap_grid, recorder, node_keys)


def _run_server(
    grid: Grid,
    cfg: ScenarioConfig,
    out_dir: Optional[Path],
    data: Optional[FederatedData],
    resume: Optional[dict],
    wrap_grid: Optional[Callable[[Grid, Callable[[int], Optional[int]]], Grid]],
    recorder: Optional[Any],
    node_keys: Optional[Path],
) -> Result:
    clock = RunClock(resume.get("run_wall_s", 0.0) if resume is not None else 0.0)
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
    sizes = {client: len(ix) for client, ix in enumerate(partition.indices)}  # what each client holds
    strategy = build_strategy(cfg, availability, info, client_sizes=sizes)
    if node_keys is not None:
        strategy.nodes.bindings = read_binding(node_keys, cfg.num_clients)
        logger.info("partition ids bound to the node keys in %s", node_keys)
    initial = ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()})
    first_round = 1
    if resume is not None:
        strategy.load_state_dict(resume["strategy"])
        initial = numpy_to_record(strategy.global_arrays)
        first_round = int(resume["round"]) + 1
    tracking = None
    if out_dir is not None:
        saved = _with_trace_copy(cfg, Path(out_dir))
        recorder = RunRecorder(out_dir, to_yaml(saved), keep_until=first_round - 1 if resume is not None else None)
        if cfg.output.trackers:
            tracking = Tracking(open_trackers(cfg.output.trackers, Path(out_dir), cfg.name), to_dict(saved))
    elif cfg.output.trackers:
        logger.warning("output.trackers %s: no results directory, so no tracking", list(cfg.output.trackers))
    info = provenance(cfg.client.device) if recorder is not None else None
    progress = Progress(cfg.rounds, cfg.output.progress, initial=first_round - 1)
    stops = StopRules(cfg, lambda: strategy.global_arrays)
    checkpoints = None
    if out_dir is not None:
        checkpoints = Checkpointer(
            lambda r, wall: save_checkpoint(out_dir, r, strategy, run_wall_s=wall),
            cfg.output.checkpoint_every,
            cfg.rounds,
            stops,
            lambda: strategy.record,
            clock,
        )
    extra: dict[str, Any] = {"status": "failed"}
    # Flower's simulation registers its nodes while the ServerApp already runs: wait for
    # all of them; a deployment waits for deployment.wait_for_nodes SuperNodes (bounded)
    simulated = type(grid).__name__ == "InMemoryGrid"
    wait_n = cfg.num_clients if simulated else cfg.deployment.wait_for_nodes
    if wait_n:
        strategy.nodes.wait_for(grid, wait_n, cfg.deployment.wait_timeout, poll=0.05 if simulated else 1.0)
    if wrap_grid is not None:
        grid = wrap_grid(grid, strategy.nodes.client_of)
    try:
        result = strategy.run_rounds(
            grid,
            initial,
            num_rounds=cfg.rounds,
            timeout=cfg.deployment.round_timeout or cfg.simulation.timeout,
            train_config=train_config(cfg),
            evaluate_fn=TestSetEvaluation(cfg, model, data.test, partition.client_labels),
            on_round=EachRound(RowWriter(recorder, progress), tracking),
            first_round=first_round,
            after_round=checkpoints,
            stop=stops,
        )
        if recorder is not None:
            recorder.save_model(strategy.global_arrays)
        extra["status"] = "completed"  # unless a stop rule says otherwise (below)
        return result
    finally:
        progress.close()
        extra.update(stops.fields)
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
                    "run_wall_s": clock.total(),
                    "label_entropy_mean": float(np.mean(partition.entropies())),
                    "provenance": info,
                }
            )
            extra["transitions"] = transition_summary(recorder.rows, cfg.evaluation.transition_window)
            summary = summarize(recorder.rows, extra)
            recorder.finish(summary, timeline=availability.timeline(cfg.rounds), plots=cfg.output.plots)
            if tracking is not None:
                tracking.finish(summary)


def make_server_app(
    cfg: ScenarioConfig,
    out_dir: Optional[Path],
    data: Optional[FederatedData] = None,
    resume: Optional[dict] = None,
    wrap_grid: Optional[Callable[[Grid, Callable[[int], Optional[int]]], Grid]] = None,
    recorder: Optional[Any] = None,
) -> ServerApp:
    """A ServerApp bound to a loaded scenario (used by the runner)."""
    server_app = ServerApp()

    @server_app.main()
    def _main(grid: Grid, context: Context) -> None:
        run_server(grid, cfg, out_dir, data, resume=resume, wrap_grid=wrap_grid, recorder=recorder)

    return server_app


class RunConfigError(ValueError):
    """A run config (``flwr run --run-config``) that cannot be run; nothing was written."""


def results_dir(run_config: Any, name: str) -> Path:
    """Where a ``flwr run`` writes its results: ``out``, or ``runs/<name>-<timestamp>``.

    The same contract as ``fedflex run --out``: a new or empty directory that can be
    written; earlier results are never overwritten.

    Raises
    ------
    RunConfigError
        When the directory exists and is not empty, or cannot be created or written.
    """
    out = str(run_config.get("out", "")) or None
    path = Path(out) if out else default_out_dir(name)
    problem = unusable_out_dir(path, option="out=")
    if problem:
        raise RunConfigError(problem)
    return path


def resume_point(out_dir: Path, option: str = "resume=") -> tuple[ScenarioConfig, dict]:
    """The config and checkpoint to continue the run in ``out_dir`` with.

    Raises
    ------
    RunConfigError
        No checkpoint there, a damaged one, a config that does not load, or a run that
        already finished its rounds; nothing is changed.
    """
    out_dir = Path(out_dir)
    if not (out_dir / CHECKPOINT_FILE).is_file():
        raise RunConfigError(f"{option}{out_dir}: no {CHECKPOINT_FILE} there (was output.checkpoint_every 0?)")
    try:
        cfg = load_scenario(out_dir / "config.yaml")
    except ConfigError as exc:
        raise RunConfigError(f"config error in {out_dir / 'config.yaml'}: {exc}") from None
    try:
        checkpoint = load_checkpoint(out_dir)
    except CheckpointError as exc:
        raise RunConfigError(f"{option}{out_dir}: {exc}; nothing was changed") from None
    if checkpoint["round"] >= cfg.rounds:
        raise RunConfigError(f"{option}{out_dir}: the run already finished its {cfg.rounds} rounds")
    return cfg, checkpoint


DEPLOYMENT_CHECKPOINT_EVERY = 1


def _sets_checkpoint_every(scenario: str, overrides: list[str]) -> bool:
    """Whether the scenario file or the overrides set ``output.checkpoint_every``."""
    if any(o.split("=", 1)[0].strip() == "output.checkpoint_every" for o in overrides):
        return True
    try:
        import yaml

        data = yaml.safe_load(Path(scenario).read_text()) or {}
    except (OSError, ValueError):
        return False
    output = data.get("output") if isinstance(data, dict) else None
    return isinstance(output, dict) and "checkpoint_every" in output


def flwr_run_scenario(run_config: Any) -> ScenarioConfig:
    """The scenario of a ``flwr run`` (``scenario`` + ``overrides``), checkpointing after
    every round unless the scenario or the overrides say otherwise."""
    import dataclasses

    scenario = str(run_config.get("scenario", "scenarios/quickstart.yaml"))
    overrides = shlex.split(str(run_config.get("overrides", "")))
    cfg = load_scenario(scenario, overrides)
    if not _sets_checkpoint_every(scenario, overrides):
        output = dataclasses.replace(cfg.output, checkpoint_every=DEPLOYMENT_CHECKPOINT_EVERY)
        cfg = dataclasses.replace(cfg, output=output)
    return cfg


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Entry point under ``flwr run``: the scenario (or the run to resume) comes from the
    run config."""
    exit_when_orphaned()  # a ServerApp whose SuperLink is gone must not run on
    run_config = context.run_config
    node_keys = Path(str(run_config["node-keys"])) if run_config.get("node-keys") else None
    resume = str(run_config.get("resume", ""))
    if resume:
        cfg, checkpoint = resume_point(Path(resume))
        logger.info("resuming %s after round %d", resume, checkpoint["round"])
        run_server(grid, cfg, Path(resume), resume=checkpoint, node_keys=node_keys)
        return
    cfg = flwr_run_scenario(run_config)
    run_server(grid, cfg, results_dir(run_config, cfg.name), node_keys=node_keys)
