"""``fedflex sweep --ray-address``: the sweep's members as tasks on an existing Ray cluster.

Each member is one Ray task (``num_cpus`` = the sweep's ``cpus_per_run``) that runs the
member's ``python -m fedflex run ...`` as a child process on whichever node Ray places it,
with the worker's own Python, its output appended to ``OUT/logs/<name>.log``, in the
sweep's working folder when that node has it. The sweep's directory must therefore be on
a filesystem every node reaches at the same path, and fedflex and the data installed on
every node. The member's own ``simulation`` settings apply on its node: the in-process
backend, or a Ray instance of its own (``simulation.ray_address`` unset), or the cluster
named by ``simulation.ray_address``.

Stopping: :meth:`RayExecutor.interrupt` calls ``ray.cancel`` (not forced), which raises
``KeyboardInterrupt`` in the task's main thread; the task passes it on as SIGINT to its
``fedflex run``, which stops at a round boundary with a checkpoint (a second cancel, a
second SIGINT: it exits at once). A Ray worker runs with SIGINT blocked, which its
children would inherit, so the child unblocks it before ``exec``; on Linux the child also
gets SIGTERM when its worker dies (a forced cancel, a lost driver), so that it does not
outlive it.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

from fedflex.study.process import Ended, child_env, fedflex_root
from fedflex.study.runs import StudyError

logger = logging.getLogger(__name__)

#: Ray's settings of a worker process that a member, which may start a Ray instance of its
#: own, must not inherit
RAY_WORKER_VARS = ("RAY_ADDRESS", "RAY_JOB_ID", "RAY_RAYLET_PID")
_PR_SET_PDEATHSIG = 1
_UNBLOCK = (signal.SIGINT, signal.SIGTERM)


def member_env(base: dict[str, str], root: str, threads: int) -> dict[str, str]:
    """Return a member's environment on a cluster node: the worker's, less Ray's own settings of
    that worker (:data:`RAY_WORKER_VARS`), with ``root`` on ``PYTHONPATH`` and the thread
    counts set to the member's CPUs.
    """
    env = {k: v for k, v in base.items() if k not in RAY_WORKER_VARS}
    return child_env(env, root, threads)


def _child_setup() -> Callable[[], None]:
    """Return what the member's process does between ``fork`` and ``exec``: unblock the stop
    signals (a Ray worker blocks SIGINT) and, on Linux, ask for SIGTERM when its parent
    (the worker) dies.
    """
    prctl = None
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before the fork
        except (OSError, AttributeError):
            prctl = None

    def setup() -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _UNBLOCK)
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))

    return setup


def run_member(args: list[str], threads: int, root: str, cwd: str, log_path: str, header: str) -> int:
    """Return the Ray task: run ``python args...`` (this worker's Python) to its end and return its
    exit status; a ``KeyboardInterrupt`` (``ray.cancel``) is passed on to it as SIGINT.
    """
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(header)
        if not os.path.isdir(cwd):
            log.write(f"(the sweep's folder {cwd} is not on {os.uname().nodename}: running in {os.getcwd()})\n")
        log.flush()
        process = subprocess.Popen(
            [sys.executable, *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=member_env(dict(os.environ), root, threads),
            cwd=cwd if os.path.isdir(cwd) else None,
            start_new_session=True,
            preexec_fn=_child_setup(),
        )
        while True:
            try:
                while process.poll() is None:
                    time.sleep(0.1)  # not process.wait(): a cancel interrupts only Python code
                return process.returncode
            except KeyboardInterrupt:
                try:
                    os.killpg(process.pid, signal.SIGINT)
                except (ProcessLookupError, PermissionError):
                    pass


class RayExecutor:
    """Members as Ray tasks on the cluster at ``address``, ``cpus`` CPUs each, at most
    ``jobs`` submitted at a time (Ray queues those it cannot place yet).
    """

    bounded = True  # a member's share is its cpus, not its node

    def __init__(self, address: str, cpus: int, jobs: int) -> None:
        self.address = address
        self.cpus = cpus
        self.jobs = jobs
        self._task: Any = None

    def open(self) -> None:
        """Connect to the cluster; refuse ``cpus`` more than its largest node has.

        Raises
        ------
        StudyError
            When the cluster cannot be reached, or no node has ``cpus`` CPUs.
        """
        import ray

        os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # quiet Ray's FutureWarning, as a run does
        pythonpath = child_env(dict(os.environ), fedflex_root(), None)["PYTHONPATH"]  # workers import run_member
        try:
            ray.init(
                address=self.address,
                runtime_env={"env_vars": {"PYTHONPATH": pythonpath}},
                logging_level=logging.ERROR,
                log_to_driver=False,
            )
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise StudyError(f"--ray-address {self.address}: {str(exc).splitlines()[0]}") from None
        largest = max((n.get("Resources", {}).get("CPU", 0) for n in ray.nodes() if n.get("Alive")), default=0)
        if self.cpus > largest:
            ray.shutdown()
            raise StudyError(
                f"--cpus-per-run {self.cpus}: no node of the Ray cluster at {self.address} has that many "
                f"CPUs (the largest has {largest:g})"
            )
        logger.info("sweep attached to Ray cluster %s: %s", self.address, ray.cluster_resources())
        self._task = ray.remote(run_member)

    def close(self) -> None:
        """Shut Ray down."""
        import ray

        ray.shutdown()

    def share(self, slot: int) -> int:
        """Return the CPUs a run gets (each Ray task asks for the same number)."""
        return self.cpus

    def start(self, slot: int, args: list[str], log_path: Path, header: str) -> Any:
        """Submit the member; returns its task's ObjectRef."""
        return self._task.options(num_cpus=self.cpus, max_retries=0, name=f"fedflex sweep {log_path.stem}").remote(
            args, self.cpus, fedflex_root(), os.getcwd(), str(log_path), header
        )

    def poll(self, ref: Any) -> Optional[Ended]:
        """Return how the task ``ref`` ended, or None while it runs."""
        import ray
        from ray.exceptions import RayError, TaskCancelledError

        ready, _ = ray.wait([ref], timeout=0)
        if not ready:
            return None
        try:
            return Ended(ray.get(ref))
        except TaskCancelledError:
            return Ended(None, "cancelled before it started")
        except RayError as exc:
            return Ended(None, f"lost on the Ray cluster ({type(exc).__name__})")

    def interrupt(self, ref: Any, signum: int) -> None:
        """Pass a stop on: ``ray.cancel`` raises KeyboardInterrupt in the task, which sends
        the member SIGINT (whatever ``signum`` the sweep got); a queued task never starts.
        """
        import ray

        ray.cancel(ref)

    def stop(self, ref: Any) -> None:
        """End a member at once (an error of the sweep itself): two cancels, two SIGINTs."""
        import ray

        ray.cancel(ref)
        time.sleep(0.5)
        ray.cancel(ref)
        ray.wait([ref], timeout=60)
