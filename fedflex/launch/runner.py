"""Run a scenario on Flower's simulation runtime (Ray backend).

The runner is where the two sides meet: it hands the ServerApp of ``strategies`` and the
ClientApp of ``clients`` to :func:`flwr.simulation.run_simulation`, one virtual
SuperNode per client id.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

from fedflex import interrupts
from fedflex.config import ScenarioConfig
from fedflex.data import check_data_fits, load_dataset
from fedflex.launch.cohort_grid import cohort_grid, decide_cohorts, usable_cpus

logger = logging.getLogger(__name__)


def backend_config(cfg: ScenarioConfig) -> dict:
    """Ray backend settings: resources per virtual client, a quiet Ray."""
    resources = {"num_cpus": cfg.simulation.num_cpus, "num_gpus": cfg.simulation.num_gpus}
    init_args = {
        "num_cpus": usable_cpus(),
        "include_dashboard": False,
        "logging_level": logging.ERROR,
        "log_to_driver": False,
    }
    if cfg.simulation.num_gpus > 0:
        import torch

        init_args["num_gpus"] = torch.cuda.device_count()
    return {"client_resources": resources, "init_args": init_args}


def ray_workers(cfg: ScenarioConfig, cpus: Optional[float] = None, gpus: Optional[float] = None) -> int:
    """How many virtual clients the Ray pool runs at once: CPUs / num_cpus, and GPUs /
    num_gpus when clients ask for GPUs (this machine's, or the attached cluster's).
    """
    if cpus is None:
        cpus = usable_cpus()
    workers = int(cpus // cfg.simulation.num_cpus)
    if cfg.simulation.num_gpus > 0:
        if gpus is None:
            import torch

            gpus = torch.cuda.device_count()
        workers = min(workers, int(gpus // cfg.simulation.num_gpus))
    return max(1, workers)


#: :func:`decide_cohorts` builds a model of at most these parameter bytes on the CPU for the
#: rule's one-example forward (milliseconds for FMNIST's models), a larger one on the meta device
def check_resumed_model(cfg: ScenarioConfig, data, checkpoint: dict) -> None:
    """Check that a checkpoint's model arrays have the names, shapes and dtypes of the model
    ``cfg`` builds on ``data`` (built on the meta device: no memory, no arithmetic, the
    run's random stream untouched).

    Raises
    ------
    fedflex.results.CheckpointError
        Naming the first array that differs.
    """
    import torch

    from fedflex.models import build_model
    from fedflex.results import check_model

    with torch.random.fork_rng(devices=[]):
        try:
            with torch.device("meta"):
                model = build_model(cfg.model, data.train.input_shape, data.train.num_classes)
        except Exception:  # a model that cannot be built on the meta device
            model = build_model(cfg.model, data.train.input_shape, data.train.num_classes)
    check_model(checkpoint, model.state_dict())


def _worker_pythonpath() -> str:
    """PYTHONPATH for Ray's workers: the repository (they import ``clients``) and ours."""
    root = str(Path(__file__).resolve().parents[2])  # the repository: fedflex/launch/runner.py
    return os.pathsep.join([root, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]])


def attach_ray(address: str) -> tuple[float, float]:
    """Connect this process to a running Ray cluster (Flower's backend then uses that
    connection); returns the cluster's CPUs and GPUs.
    """
    import ray

    with interrupts.shielding_children():  # ray.init takes SIGTERM: give it back to the round loop
        ray.init(
            address=address,
            runtime_env={"env_vars": {"PYTHONPATH": _worker_pythonpath()}},
            logging_level=logging.ERROR,
            log_to_driver=False,
        )
    resources = ray.cluster_resources()
    logger.info("attached to Ray cluster %s: %s", address, resources)
    return float(resources.get("CPU", 1)), float(resources.get("GPU", 0))


def start_ray(cfg: ScenarioConfig) -> None:
    """Start the local Ray instance with :func:`backend_config`'s settings before Flower's
    backend would (it uses a running one), so that a stop signal ends the run at a round
    boundary (:func:`fedflex.interrupts.shielding_children`) instead of killing Ray.
    """
    import ray

    if ray.is_initialized():
        return
    # the workers' PYTHONPATH through the environment Ray's processes start with, not a
    # runtime_env: a job's runtime_env cannot use the workers Ray prestarts at init, and
    # waits for new ones (1-2 s of start-up here; benchmarks/startup.py). Restored after.
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = _worker_pythonpath()
    try:
        with interrupts.shielding_children():  # "local": never a cluster that `ray start` runs on this machine
            ray.init(address="local", **backend_config(cfg)["init_args"])
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before
    _stop_at_once_when_shut_down()


def _blocks_sigterm(pid: int) -> bool:
    """Whether process ``pid`` has SIGTERM blocked (Linux's ``/proc/PID/status``; False elsewhere)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            mask = next(line for line in status if line.startswith("SigBlk:")).split()[1]
        return bool(int(mask, 16) >> (signal.SIGTERM - 1) & 1)
    except (OSError, StopIteration, ValueError, IndexError):
        return False


#: seconds Ray's processes get to exit on SIGTERM before they are killed, all of them at once
RAY_GRACE_S = 1.0


def _wait_gone(psutil: Any, processes: list, timeout: float) -> list:
    """Wait up to ``timeout`` seconds for ``processes`` to end; return those still running.

    A zombie counts as ended: the raylet's agents and workers are not this process's
    children, and once the raylet is gone nothing may reap them at once (a container's
    init), so ``psutil.wait_procs``, which waits for a zombie too, sat out its whole
    timeout at the end of every Ray run (1.0 s of ``ray.shutdown``'s 1.3 s here).
    """

    def running(process: Any) -> bool:
        try:
            return process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + timeout
    alive = [p for p in processes if running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.01)
        alive = [p for p in alive if running(p)]
    return alive


def _stop_at_once_when_shut_down() -> None:
    """Make ``ray.shutdown`` (Flower's backend calls it when the simulation ends) stop the
    Ray processes this run started at once: Ray 2.x sends each of them SIGTERM and waits
    up to 1 s for it, one after the other, then kills it. Under fedflex's own signal
    handling they were started with SIGTERM blocked (:func:`fedflex.interrupts.shielding_children`:
    a stop signal to the process group must not stop Ray mid-round), so the raylet, GCS
    server, monitor, dashboard and log monitor each take the full second: 5.3 s at the
    end of every Ray run here (``ray._private.node.Node._kill_process_type`` timed). Here
    SIGTERM goes to all of them together, those still running after one wait of
    :data:`RAY_GRACE_S` are killed, as Ray would kill them; Ray's own shutdown follows
    (the reaper last, as it does). Reads Ray's private node object: on a Ray without it,
    nothing changes.
    """
    try:
        from ray._private import worker as ray_worker

        node: Any = ray_worker._global_node
        kill_all = node.kill_all_processes
    except Exception:  # another Ray: its own shutdown, unchanged
        return

    def kill_all_processes(*args: Any, **kwargs: Any) -> None:
        try:
            import psutil  # type: ignore[import-untyped]  # Ray's own dependency

            started = [
                info.process
                for kind, infos in node.all_processes.items()
                if kind != "reaper"
                for info in infos
                if info.process.poll() is None
            ]
            # the raylet's children too (its agents and workers), which outlive a raylet killed at once
            processes = [psutil.Process(p.pid) for p in started]
            processes += [c for p in processes for c in p.children(recursive=True)]
            # SIGTERM first where a process can take it; one started with SIGTERM blocked
            # (shielding_children) would only wait out the grace second
            graceful = [p for p in processes if not _blocks_sigterm(p.pid)]
            for process in graceful:
                process.terminate()
            alive = _wait_gone(psutil, graceful, RAY_GRACE_S)
            alive += [p for p in processes if p not in graceful]
            for process in alive:
                process.kill()  # what Ray does after its grace second, here for all at once
            _wait_gone(psutil, alive, RAY_GRACE_S)
            for info in node.all_processes.get("reaper", []):  # last, as Ray does: the others are gone
                if info.process.poll() is None and _blocks_sigterm(info.process.pid):
                    info.process.kill()
                    info.process.wait(RAY_GRACE_S)
                    started.append(info.process)
            for process in started:
                process.poll()  # reaped: Ray's shutdown sees them gone
        except Exception as exc:  # Ray's own shutdown still runs
            logger.debug("stopping Ray's processes at once failed: %s", exc)
        kill_all(*args, **kwargs)

    node.kill_all_processes = kill_all_processes


class _DropRunSimulationDeprecation(logging.Filter):
    """fedflex drives Flower's simulation runtime through run_simulation on purpose (it
    runs the ServerApp in-process); its deprecation notice says nothing to our users.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return "`run_simulation` function is deprecated" not in record.getMessage()


def quiet_flower(verbose: bool) -> None:
    """Flower logs every message exchange at INFO; keep only warnings unless verbose."""
    flwr_logger = logging.getLogger("flwr")
    flwr_logger.setLevel(logging.INFO if verbose else logging.WARNING)
    flwr_logger.propagate = False  # Flower has its own console handler
    if not any(isinstance(f, _DropRunSimulationDeprecation) for f in flwr_logger.filters):
        flwr_logger.addFilter(_DropRunSimulationDeprecation())
    for handler in flwr_logger.handlers:  # Flower's colours only on a terminal
        if hasattr(handler, "colored"):
            handler.colored = sys.stderr.isatty()
            # Flower's console handler holds the stderr of the moment flwr was imported;
            # a run started later in the same process (the Python API, tests) may find it
            # closed, and writing there prints "--- Logging error ---" tracebacks
            if isinstance(handler, logging.StreamHandler) and getattr(handler.stream, "closed", False):
                handler.stream = sys.stderr  # not setStream(): it flushes the closed stream
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")


def run(
    cfg: ScenarioConfig,
    out_dir: Optional[Path],
    verbose: bool = False,
    resume: Optional[dict] = None,
    recorder: Optional[Any] = None,
    ready: Optional[Callable[[], None]] = None,
) -> None:
    """Run ``cfg`` in simulation, writing the results contract to ``out_dir``; ``resume``:
    a checkpoint of that directory to continue from (its model is checked against the
    model ``cfg`` builds first: :func:`check_resumed_model`); ``recorder``: where the
    results go when ``out_dir`` is None (:class:`fedflex.results.MemoryRecorder`);
    ``ready``: called once the checks passed, before anything is written.

    A run that fails for a reason the run itself states (no round trained,
    ``churn.on_too_few=fail``) returns normally: ``out_dir/summary.json`` has
    ``"status": "failed"`` and the reason as ``failure``. Without ``out_dir`` it raises
    :class:`strategies.strategy.RunFailedError`.
    """
    from fedflex.strategies.strategy import RunFailedError

    try:
        _run(cfg, out_dir, verbose, resume, recorder, ready)
    except RunFailedError:
        if out_dir is None:
            raise


def _run(
    cfg: ScenarioConfig,
    out_dir: Optional[Path],
    verbose: bool,
    resume: Optional[dict],
    recorder: Optional[Any],
    ready: Optional[Callable[[], None]] = None,
) -> None:
    from fedflex.clients.client_app import app as client_app
    from fedflex.launch.server import make_server_app

    data = load_dataset(cfg.dataset, cfg.num_clients, cfg.seed)  # fails early, before Ray starts
    check_data_fits(cfg, data)
    if resume is not None:  # before anything in out_dir is touched
        check_resumed_model(cfg, data, resume)
    if ready is not None:
        ready()
    quiet_flower(verbose)
    decide_cohorts(cfg, data)  # before config.yaml is written: it records the choice
    if cfg.simulation.backend == "local":
        from fedflex.clients.cohort_app import CohortTrainer
        from fedflex.launch.local_grid import LocalGrid
        from fedflex.launch.server import run_server

        cohorts = CohortTrainer(cfg.simulation.cohorts(), cfg.simulation.cohort_size)
        logging.getLogger("fedflex.clients.cohort_app").setLevel(logging.INFO)  # say how clients train
        grid = LocalGrid(client_app, cfg.num_clients, seed=cfg.seed, train_batch=cohorts)
        run_server(grid, cfg, out_dir, data, resume=resume, recorder=recorder)
        return
    # Ray's backend only: flwr.simulation imports Ray (1.6 s that the in-process backend skips)
    from flwr.simulation import run_simulation

    cpus = gpus = None
    if cfg.simulation.ray_address:
        cpus, gpus = attach_ray(cfg.simulation.ray_address)
    else:
        start_ray(cfg)
    workers = ray_workers(cfg, cpus, gpus)
    run_simulation(
        server_app=make_server_app(
            cfg, out_dir, data=data, resume=resume, wrap_grid=cohort_grid(cfg, workers), recorder=recorder
        ),
        client_app=client_app,
        num_supernodes=cfg.num_clients,
        backend_name=cfg.simulation.backend,
        backend_config=backend_config(cfg),
        verbose_logging=verbose,
    )
