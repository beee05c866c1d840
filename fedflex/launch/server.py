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
  ``output.checkpoint_every`` (a deployment's round takes seconds; the checkpoint,
  ``checkpoint.npz`` with the server state's arrays and the rest as JSON, milliseconds).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shlex
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, cast

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Result

import fedflex
from fedflex import keys
from fedflex.arrays import numpy_to_record
from fedflex.churn import make_availability
from fedflex.config import ConfigError, ScenarioConfig
from fedflex.data import FederatedData, load_dataset
from fedflex.launch.metered_grid import CostMeter, MeteredGrid
from fedflex.launch.observers import (
    Checkpointer,
    RowWriter,
    RunClock,
    StopRules,
    TestSetEvaluation,
    Tracking,
)
from fedflex.launch.system_grid import SystemClock, SystemGrid
from fedflex.loader import load_scenario, to_yaml
from fedflex.models import build_model, output_bias_key
from fedflex.node_keys import read_binding
from fedflex.orphans import exit_when_orphaned
from fedflex.partition import partition_data
from fedflex.progress import Progress
from fedflex.records import to_record
from fedflex.results import (  # noqa: F401 - the checkpoint pair, also importable from here
    CHECKPOINT_FILE,
    CONFIG_FILE,
    LEGACY_CHECKPOINT_FILE,
    MODEL_FILE,
    SUMMARY_FILE,
    TRACE_FILE,
    CheckpointError,
    RunRecorder,
    default_out_dir,
    load_checkpoint,
    save_checkpoint,
    summarize,
    transition_summary,
    unusable_out_dir,
)
from fedflex.rundir import RunDirError, RunDirLock
from fedflex.runinfo import log_outcome, parse_commit, provenance, run_log
from fedflex.strategies.build import build_strategy
from fedflex.strategies.combinations import load_checked
from fedflex.strategies.nodes import simulated_node_count
from fedflex.strategies.parts import ModelInfo
from fedflex.strategies.strategy import RoundObserver, RunFailedError
from fedflex.taskspec import TaskSpec
from fedflex.tracking import open_trackers

logger = logging.getLogger(__name__)


def train_config(cfg: ScenarioConfig) -> ConfigRecord:
    """Return the ConfigRecord every train message carries: the task spec
    (:class:`fedflex.taskspec.TaskSpec`), the seed and the local training settings
    (``client.*``, :func:`fedflex.records.to_record`); the local rule's server half adds the
    rule's own options each round.
    """
    return ConfigRecord(
        {
            **TaskSpec.of(cfg).to_record(),
            keys.SEED: cfg.seed,
            **to_record(cfg.client, keys.CLIENT, only=cfg.client.training_fields()),
        }
    )


def initial_model(cfg: ScenarioConfig, input_shape: tuple[int, ...], num_classes: int) -> torch.nn.Module:
    """Return the round-0 global model, seeded by the scenario."""
    torch.manual_seed(cfg.seed)
    return build_model(cfg.model, input_shape, num_classes)


def _with_trace_copy(cfg: ScenarioConfig, out_dir: Path) -> ScenarioConfig:
    """Return the config to save in ``out_dir``: a trace CSV is copied there and config.yaml
    names the copy (relative paths in a scenario resolve against its file), so the
    results directory re-runs anywhere.
    """
    if not cfg.churn.trace:
        return cfg
    import dataclasses
    import shutil

    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / TRACE_FILE
    if Path(cfg.churn.trace).resolve() != target.resolve():
        try:
            shutil.copyfile(cfg.churn.trace, target)
        except BaseException:  # a full disk: no partial copy left behind
            target.unlink(missing_ok=True)
            raise
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
    git: Optional[dict] = None,
) -> Result:
    """Run the scenario's rounds on ``grid``; write results to ``out_dir`` (if given).

    ``data``: the loaded data set, when the caller has it already. ``resume``: a
    checkpoint (:func:`load_checkpoint`) to continue from; ``out_dir``'s metrics are kept
    up to its round. ``wrap_grid(grid, client_of)``: a Grid to use instead of ``grid``,
    given the node id -> client id lookup (the runner's cohort messages on Ray).
    ``recorder``: where rows, summary and final model go when ``out_dir`` is None
    (:class:`fedflex.results.MemoryRecorder`: the Python API's in-memory run). The run's
    log lines are copied to ``out_dir/run.log`` while it runs.
    ``git``: the commit to record in the provenance (:func:`fedflex.runinfo.git_commit`'s
    form) when it is not the checkout this code runs from (a deployment runs the app bundle).
    ``node_keys``: a binding file (:mod:`fedflex.node_keys`): a node serves a client id
    only if it authenticated with the key bound to it.
    """
    action = "resuming" if resume is not None else "starting"
    first_line = f"fedflex {fedflex.__version__}: {action} {cfg.name} (seed {cfg.seed}, {cfg.rounds} rounds)"
    with run_log(out_dir, first_line):
        return _run_server(grid, cfg, out_dir, data, resume, wrap_grid, recorder, node_keys, git)


def _run_server(
    grid: Grid,
    cfg: ScenarioConfig,
    out_dir: Optional[Path],
    data: Optional[FederatedData],
    resume: Optional[dict],
    wrap_grid: Optional[Callable[[Grid, Callable[[int], Optional[int]]], Grid]],
    recorder: Optional[Any],
    node_keys: Optional[Path],
    git: Optional[dict],
) -> Result:
    clock = RunClock(resume.get("run_wall_s", 0.0) if resume is not None else 0.0)
    if type(grid).__name__ == "InMemoryGrid":
        # Flower's simulation grid polls for replies every 0.1 s; a round of small models
        # then waits ~0.05 s for nothing. Polling the in-memory state is cheap.
        cast(Any, grid).pull_interval = min(getattr(grid, "pull_interval", 0.1), 0.005)  # the simulation grid's
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
    simulated = type(grid).__name__ == "InMemoryGrid"
    if simulated:  # nothing is written before this check: a wrong federation size is a usage error
        check_simulated_nodes(grid, cfg)
    tracking = None
    if out_dir is not None:
        saved = _with_trace_copy(cfg, Path(out_dir))
        recorder = RunRecorder(out_dir, to_yaml(saved), keep_until=first_round - 1 if resume is not None else None)
        if cfg.output.trackers:
            tracking = Tracking(open_trackers(cfg.output.trackers, Path(out_dir), cfg.name), asdict(saved))
    elif cfg.output.trackers:
        logger.warning("output.trackers %s: no results directory, so no tracking", list(cfg.output.trackers))
    origin = provenance(cfg.client.device, git) if recorder is not None else None
    progress = Progress(cfg.rounds, cfg.output.progress, initial=first_round - 1)
    stops = StopRules(cfg)
    checkpoints = None
    if out_dir is not None:
        checkpoints = Checkpointer(
            lambda r, wall: save_checkpoint(out_dir, r, strategy, run_wall_s=wall),
            cfg.output.checkpoint_every,
            cfg.rounds,
            stops,
            clock,
        )
    extra: dict[str, Any] = {"status": "failed"}
    raising = False
    # Flower's simulation registers its nodes while the ServerApp already runs: wait for
    # all of them; a deployment waits for deployment.wait_for_nodes SuperNodes (bounded)
    wait_n = cfg.num_clients if simulated else cfg.deployment.wait_for_nodes
    if wait_n:
        strategy.nodes.wait_for(grid, wait_n, cfg.deployment.wait_timeout, poll=0.05 if simulated else 1.0)
    if wrap_grid is not None:
        grid = wrap_grid(grid, strategy.nodes.client_of)
    clocked = None
    if cfg.system.kind != "none":
        if type(grid).__name__ in ("InMemoryGrid", "LocalGrid") or wrap_grid is not None:
            grid = clocked = SystemGrid(grid, cfg, strategy.nodes.client_of, sizes)
        else:
            logger.warning(
                "system.kind=%s: a real federation keeps its own time; the system model is off", cfg.system.kind
            )
    metered = MeteredGrid(grid)  # outside the cohorts: the bytes each client is sent and returns
    counts = None
    if cfg.evaluation.per_client != "off":  # each client's labels, for its test split's proportions
        labels = data.train.y.cpu().numpy()
        counts = [np.bincount(labels[ix], minlength=data.train.num_classes) for ix in partition.indices]
    evaluation = TestSetEvaluation(cfg, model, data.test, partition.client_labels, counts)
    rows = recorder.rows if recorder is not None else []
    # the rows are needed to tell whether any round trained: kept here when no recorder keeps them
    row_writer = RowWriter(recorder, progress, rows=rows if recorder is None else None)
    clock_s = next((r["sim_clock_s"] for r in reversed(rows) if "sim_clock_s" in r), 0.0)  # a resumed run's
    system = SystemClock(clocked, clock_s) if clocked is not None else None
    observers: list[Optional[RoundObserver]] = [CostMeter(metered), system, row_writer, tracking, checkpoints, stops]
    try:
        result = strategy.run_rounds(
            metered,
            initial,
            num_rounds=cfg.rounds,
            timeout=cfg.deployment.round_timeout or cfg.simulation.timeout,
            train_config=train_config(cfg),
            evaluate_fn=evaluation,
            observers=[o for o in observers if o is not None],
            first_round=first_round,
        )
        if recorder is not None:
            recorder.save_model(strategy.global_arrays)
        failure = untrained(rows, cfg.strategy.sampler.min_clients)
        extra["status"] = "completed" if failure is None else "failed"  # unless a stop rule says otherwise
        if failure is not None:
            extra["failure"] = failure
    except RunFailedError as exc:  # churn.on_too_few=fail
        extra["failure"] = str(exc)
        raising = True
        raise
    except BaseException:
        raising = True
        raise
    finally:
        progress.close()
        extra.update(stops.fields)
        if "failure" in extra and extra["status"] != "failed":  # interrupted or diverged: that is the news
            del extra["failure"]
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
                    "provenance": origin,
                }
            )
            if evaluation.confusion is not None:  # the last evaluated round's: [true class][predicted]
                extra["confusion_matrix"] = evaluation.confusion.tolist()
            extra["transitions"] = transition_summary(recorder.rows, cfg.evaluation.transition_window)
            refused = strategy.nodes.refusals()
            if refused:  # claims the node directory refused, each logged once as an ERROR
                extra["refused_nodes"] = refused
            summary = summarize(recorder.rows, extra)
            short = strategy.nodes.shortfall(served_clients(recorder.rows))
            if short and summary.get("status") == "completed":  # bound ids no node served
                summary["status"], summary["degraded"] = "degraded", short
            try:
                recorder.finish(summary, timeline=availability.timeline(cfg.rounds), plots=cfg.output.plots)
            except OSError as exc:
                if not raising:
                    raise
                # the error on its way out says what happened (a full disk, most likely)
                logger.info("summary.json not written either: %s", exc)
            if tracking is not None:
                tracking.finish(summary)
    if extra.get("failure"):  # summary.json says it too
        raise RunFailedError(extra["failure"])
    return result


def served_clients(rows: list[dict[str, Any]]) -> set[int]:
    """Return the client ids online in some train round of ``rows`` (a node served them)."""
    return {int(c) for row in rows if row.get("phase", "train") == "train" for c in row.get("online", []) or []}


def untrained(rows: list[dict[str, Any]], min_clients: int) -> Optional[str]:
    """Why no round of a run trained (None when one did): ``rows`` are the run's rows
    (metrics.jsonl); a round trained when a reply was aggregated (``num_examples`` > 0).
    Extra rounds of parts (``phase`` != "train") do not count.
    """
    train = [r for r in rows if r.get("phase", "train") == "train"]
    if not train or any(r.get("num_examples") for r in train):
        return None  # no round ran (stopped before round 1), or one trained
    skipped = sum(1 for r in train if r.get("skipped"))
    why = []
    if skipped:
        why.append(f"{skipped} skipped with fewer than strategy.sampler.min_clients={min_clients} clients online")
    if len(train) > skipped:
        why.append(f"{len(train) - skipped} without a usable reply")
    return f"no round trained: of {len(train)} round(s), {' and '.join(why)}"


def check_simulated_nodes(grid: Grid, cfg: ScenarioConfig) -> None:
    """Refuse a simulation with fewer SuperNodes than the scenario has clients.

    ``flwr run .`` simulates Flower's default federation, 2 SuperNodes unless
    ``num-supernodes`` is set; the missing client ids would never come online and every
    round would be skipped after ``deployment.wait_timeout``.

    Raises
    ------
    RunConfigError
        With the ``flwr run`` option that sets the federation's size.
    """
    have = simulated_node_count(grid, cfg.num_clients, cfg.deployment.wait_timeout)
    if have < cfg.num_clients:
        raise RunConfigError(
            f"the simulation runs {have} SuperNode(s) but scenario {cfg.name!r} has num_clients={cfg.num_clients}: "
            f'run it with flwr run . --federation-config "num-supernodes={cfg.num_clients}" '
            f"(or a scenario with num_clients={have})"
        )
    if have > cfg.num_clients:
        logger.warning("the simulation runs %d SuperNodes; the scenario uses %d of them", have, cfg.num_clients)


def make_server_app(
    cfg: ScenarioConfig,
    out_dir: Optional[Path],
    data: Optional[FederatedData] = None,
    resume: Optional[dict] = None,
    wrap_grid: Optional[Callable[[Grid, Callable[[int], Optional[int]]], Grid]] = None,
    recorder: Optional[Any] = None,
) -> ServerApp:
    """Return a ServerApp bound to a loaded scenario (used by the runner)."""
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


def run_finished(out_dir: Path) -> bool:
    """Whether the run in ``out_dir`` wrote its final model and a summary.json that says
    neither ``failed`` (a run whose last files did not fit on the disk) nor ``interrupted``
    (a signal that came during the last round: its resume runs no round and ends it).
    """
    out_dir = Path(out_dir)
    try:
        summary = json.loads((out_dir / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(summary, dict)
        and summary.get("status") not in ("failed", "interrupted")
        and (out_dir / MODEL_FILE).is_file()
    )


def _start_over_hint(out_dir: Path) -> str:
    """Say what to do with a directory that has no checkpoint: not a run directory, or a
    run that stopped before its first checkpoint (a second Ctrl-C, a full disk, or
    ``output.checkpoint_every 0``), which starts over in place with ``fedflex run --resume``.
    """
    if not (out_dir / CONFIG_FILE).is_file():
        return f"not a fedflex run directory (no {CONFIG_FILE} either)"
    return (
        "the run stopped before its first checkpoint, so nothing can be resumed; "
        f"start it over in place with: fedflex run --resume {out_dir} (or remove {out_dir} and start the run again)"
    )


def resume_point(out_dir: Path, option: str = "resume=") -> tuple[ScenarioConfig, dict]:
    """Return the config and checkpoint to continue the run in ``out_dir`` with. A run whose
    checkpoint is of its last round but whose model or summary is missing (a full
    disk) is resumed too: it runs no round and writes them.

    Raises
    ------
    RunConfigError
        No checkpoint there, a damaged one (or an old pickle), a config that does not
        load, or a run that already finished; nothing is changed.
    """
    out_dir = Path(out_dir)
    if not (out_dir / CHECKPOINT_FILE).is_file() and not (out_dir / LEGACY_CHECKPOINT_FILE).is_file():
        raise RunConfigError(f"{option}{out_dir}: no {CHECKPOINT_FILE} there: {_start_over_hint(out_dir)}")
    try:
        cfg = load_scenario(out_dir / CONFIG_FILE)
    except ConfigError as exc:
        raise RunConfigError(f"config error in {out_dir / CONFIG_FILE}: {exc}") from None
    try:
        checkpoint = load_checkpoint(out_dir)
    except CheckpointError as exc:
        raise RunConfigError(f"{option}{out_dir}: {exc}; nothing was changed") from None
    if checkpoint["round"] >= cfg.rounds and run_finished(out_dir):
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
    """Return the scenario of a ``flwr run`` (``scenario`` + ``overrides``, its parts checked),
    checkpointing after every round unless the scenario or the overrides say otherwise.
    """
    import dataclasses

    scenario = str(run_config.get("scenario", "scenarios/quickstart.yaml"))
    overrides = shlex.split(str(run_config.get("overrides", "")))
    cfg = load_checked(scenario, overrides)  # the part names and combinations, before the data are loaded
    if not _sets_checkpoint_every(scenario, overrides):
        output = dataclasses.replace(cfg.output, checkpoint_every=DEPLOYMENT_CHECKPOINT_EVERY)
        cfg = dataclasses.replace(cfg, output=output)
    return cfg


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Entry point under ``flwr run``: the scenario (or the run to resume) comes from the
    run config.
    """
    exit_when_orphaned()  # a ServerApp whose SuperLink is gone must not run on
    run_config = context.run_config
    node_keys = Path(str(run_config["node-keys"])) if run_config.get("node-keys") else None
    git = parse_commit(str(run_config.get("git-commit", "")))  # set by fedflex deploy local
    resume = str(run_config.get("resume", ""))
    if resume:
        resume_point(Path(resume))  # a run directory, before the lock file goes there
        with _locked(Path(resume), new=False, option="resume="), _outcome_logged(Path(resume)):
            cfg, checkpoint = resume_point(Path(resume))
            logger.info("resuming %s after round %d", resume, checkpoint["round"])
            data, wrap = simulation_cohorts(grid, cfg, run_config)
            run_server(grid, cfg, Path(resume), data, resume=checkpoint, wrap_grid=wrap, node_keys=node_keys, git=git)
        return
    cfg = flwr_run_scenario(run_config)
    out = results_dir(run_config, cfg.name)
    with _locked(out, new=True, option="out="), _outcome_logged(out):
        data, wrap = simulation_cohorts(grid, cfg, run_config)
        run_server(grid, cfg, out, data, wrap_grid=wrap, node_keys=node_keys, git=git)


def simulation_cohorts(
    grid: Grid, cfg: ScenarioConfig, run_config: Any
) -> tuple[Optional[FederatedData], Optional[Callable[[Grid, Callable[[int], Optional[int]]], Grid]]]:
    """Under Flower's simulation (``flwr run`` on a local simulation federation), train
    each round's clients as fedflex's Ray backend does: one cohort message per worker
    (:class:`fedflex.launch.cohort_grid.CohortGrid`), trained together where
    ``simulation.vectorize`` says so, instead of one message and one ClientApp call per
    SuperNode. ``workers`` (run config; 0 or absent: the CPUs this process may use) is how
    many cohort messages a round sends: set it to the number of ClientApps Flower's
    backend runs at once (its CPUs / ``client-resources.num-cpus``). Returns the loaded
    data (the cohort rule reads it) and the ``wrap_grid``; (None, None) on a deployment,
    where a SuperNode is one client.
    """
    if type(grid).__name__ != "InMemoryGrid":
        return None, None
    from fedflex.launch.cohort_grid import cohort_grid, decide_cohorts, usable_cpus

    try:
        workers = int(run_config.get("workers", 0) or 0)
    except (TypeError, ValueError):
        raise RunConfigError(f"workers={run_config.get('workers')!r}: must be a whole number") from None
    if workers < 0:
        raise RunConfigError(f"workers={workers}: must be 0 (the CPUs) or more")
    data = load_dataset(cfg.dataset, cfg.num_clients, cfg.seed)
    decide_cohorts(cfg, data)  # before config.yaml is written: it records the choice
    return data, cohort_grid(cfg, workers or usable_cpus())


@contextlib.contextmanager
def _outcome_logged(out: Path) -> Iterator[None]:
    """End a ``flwr run``'s (or deployment's) ``run.log`` with how the run ended, as
    ``fedflex run`` does: its status and last round from summary.json and, where a
    checkpoint is left, the run config that continues it; or the error that ended it. A
    ServerApp killed with its SuperLink writes nothing: its resume's ``resuming`` line
    follows the last round's.
    """
    from fedflex.study.runs import read_summary

    def then() -> str:
        return f"; continue with: resume={out}" if (out / CHECKPOINT_FILE).is_file() else ""

    try:
        yield
    except Exception as exc:
        log_outcome(out, logging.ERROR, f"ended by {type(exc).__name__}: {exc}{then()}")
        raise
    summary = read_summary(out)
    if summary is None:
        return
    status, last = summary.get("status"), summary.get("last_round")
    if status == "completed":
        log_outcome(out, logging.INFO, f"completed after round {last}; results: {out}")
    else:
        why = f" ({summary['degraded']})" if status == "degraded" and summary.get("degraded") else ""
        line = f"ended {status} after round {last}{why}; results: {out}{then()}"
        logger.warning("%s", line)  # the console's (run.log's handler is gone by now)
        log_outcome(out, logging.WARNING, line)


FLWR_RUN_LOCK_WAIT = 60.0  # s: a stopped run's ServerApp may still be ending when its resume starts


@contextlib.contextmanager
def _locked(out: Path, new: bool, option: str) -> Iterator[RunDirLock]:
    """Hold the lock on a ``flwr run``'s results directory (:mod:`fedflex.rundir`)
    while the block runs (taken once: RunDirLock's own ``with`` would take it again).

    Raises
    ------
    RunConfigError
        When another run holds it, or (``new``) it is no longer empty.
    """
    try:
        lock = RunDirLock(out, new=new, option=option, wait=FLWR_RUN_LOCK_WAIT).acquire()
    except RunDirError as exc:
        raise RunConfigError(str(exc)) from None
    try:
        yield lock
    finally:
        lock.release()
