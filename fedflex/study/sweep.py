"""``fedflex sweep``: one scenario over a grid of overrides and seeds, one ``fedflex run``
per grid point and seed.

Each member runs as its own ``python -m fedflex run`` process (the CLI's run path, with
its exit status and ``summary.json``), in ``OUT/<key>=<value>,...,seed=<s>/``, with its
output in ``OUT/logs/<name>.log``. ``jobs`` members run at a time, each bounded to its
share of this process's CPUs: pinned to its own cores (Linux), ``OMP_NUM_THREADS`` and
friends set to the share, and ``simulation.num_cpus`` lowered to it where the scenario
asks for more. Invoked again on the same ``OUT``, a sweep keeps every member that
finished (:data:`fedflex.study.runs.FINISHED`), resumes an interrupted or killed one
from its checkpoint (``fedflex run --resume``), and runs a failed one (or one without a
checkpoint) again from the start, after moving its directory to ``OUT/.replaced/``.
``OUT/sweep.json`` indexes the sweep: scenario, overrides, grid, seeds, and per member
its grid point, overrides, directory, status and exit code.

A study file (``scenarios/studies/*.yaml``) names what to sweep::

    base: other_study.yaml        # optional: start from that study (keys below replace
                                  # or, for overrides / variants / reference, extend its own)
    scenario: ../quickstart.yaml  # resolved against this file's folder
    overrides: {rounds: 10}       # for every run (a mapping, or a list of key=value)
    variants:                     # optional: named bundles of overrides, one axis each
      method:
        fedavg: {strategy.aggregator.name: fedavg}
        fedavgm: {strategy.aggregator.name: fedavgm, strategy.aggregator.fedavgm.momentum: 0.7}
    grid:                         # key -> values; a variant axis -> variant names
      method: [fedavg, fedavgm]
      client.lr: [0.01, 0.1]
    seeds: [0, 1, 2]
    reference: {...}              # the paper's numbers (:mod:`fedflex.study.reference`)

A run's directory and its grid point name a variant by its axis and name
(``method=fedavgm,client.lr=0.1,seed=0``); ``--grid method=fedavg`` on the command line
picks among the file's variants.

A signal (Ctrl-C, SIGTERM, SIGHUP) starts no further member and is passed on once to
the running ones, which stop at a round boundary with a checkpoint (``fedflex run``'s
own handling); a second signal is passed on too (they exit at once).

Members run through an executor: :class:`LocalExecutor` (child processes of the sweep), or,
with ``ray_address``, :class:`fedflex.study.ray_executor.RayExecutor` (one Ray task per
member on an existing cluster, the sweep's directory on a filesystem every node shares).

It is over 600 lines because planning a sweep, checking an existing one and running its
members (CPU slots, signals, the index) share the member and sweep records.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import hashlib
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import deque
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence, TextIO

from fedflex.config import ConfigError
from fedflex.loader import alias_mapping, load_scenario, to_yaml
from fedflex.study.process import Ended, child_env, fedflex_root
from fedflex.study.runs import (
    FINISHED,
    RESUMABLE,
    StudyError,
    flatten,
    has_checkpoint,
    is_execution_key,
    read_summary,
    run_state,
)
from fedflex.study.studyfile import is_study_file, read_study  # noqa: F401 - also importable from here

logger = logging.getLogger(__name__)

INDEX_FILE = "sweep.json"
LOG_DIR = "logs"
REPLACED_DIR = ".replaced"
LOCK_FILE = ".sweep.lock"
_SAFE = re.compile(r"[^A-Za-z0-9._=,+-]")
MAX_NAME = 200


@dataclasses.dataclass(frozen=True)
class Member:
    """One run of a sweep: a grid point and a seed."""

    name: str
    point: tuple[tuple[str, str], ...]  # (key, value) of the grid point, seed last
    settings: tuple[str, ...] = ()  # its overrides, variants expanded (default: key=value of the point)

    @property
    def overrides(self) -> list[str]:
        """Return the member's dotlist overrides."""
        return list(self.settings) if self.settings else [f"{k}={v}" for k, v in self.point]


@dataclasses.dataclass
class Sweep:
    """A planned sweep: ``scenario`` with ``overrides``, over ``grid`` x ``seeds`` into ``out``."""

    scenario: Path
    overrides: list[str]
    grid: dict[str, list[str]]
    seeds: list[int]
    out: Path
    jobs: int = 1
    members: list[Member] = dataclasses.field(default_factory=list)
    variants: dict[str, dict[str, list[str]]] = dataclasses.field(default_factory=dict)
    ray_address: Optional[str] = None  # run the members as tasks on this Ray cluster
    cpus_per_run: int = 1  # each member's CPUs there


# ---------------------------------------------------------------------------- planning
def split_values(text: str) -> list[str]:
    """``v1,v2`` -> ``["v1", "v2"]``; commas inside brackets or quotes stay (``[1,2],[3]``)."""
    values, depth, quote, current = [], 0, "", ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            values.append(current.strip())
            current = ""
            continue
        current += ch
    values.append(current.strip())
    return values


def parse_grid(items: Iterable[str]) -> dict[str, list[str]]:
    """``["key=v1,v2", ...]`` -> ``{"key": ["v1", "v2"], ...}``."""
    grid: dict[str, list[str]] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        values = split_values(text) if sep else []
        if not key or not values or any(v == "" for v in values):
            raise StudyError(f"--grid {item!r}: expected key=value1,value2,...")
        grid[key] = values
    return grid


def parse_seeds(text: str) -> list[int]:
    """``0,1,2`` -> ``[0, 1, 2]``."""
    try:
        seeds = [int(s) for s in text.split(",")]
    except ValueError:
        raise StudyError(f"--seeds {text!r}: expected non-negative integers separated by commas") from None
    if any(s < 0 for s in seeds):
        raise StudyError(f"--seeds {text!r}: expected non-negative integers separated by commas")
    return seeds


def member_name(point: Sequence[tuple[str, str]]) -> str:
    """Return the directory name of a grid point: ``key=value,...`` with characters other than
    letters, digits and ``._=,+-`` replaced by ``_``; a long name is cut and ends in a
    hash of the whole.
    """
    text = ",".join(f"{k}={v}" for k, v in point)
    safe = _SAFE.sub("_", text)
    if safe.startswith("."):
        safe = "_" + safe[1:]
    if len(safe) > MAX_NAME:
        safe = safe[: MAX_NAME - 11] + "-" + hashlib.sha1(text.encode()).hexdigest()[:10]
    return safe


def plan(
    scenario: Path,
    overrides: Sequence[str],
    grid: dict[str, list[str]],
    seeds: Optional[Sequence[int]],
    out: Path,
    jobs: int = 1,
    variants: Optional[dict[str, dict[str, list[str]]]] = None,
) -> Sweep:
    """Return the members of a sweep, every one's config loaded and checked (nothing started).
    A grid axis named in ``variants`` takes variant names, each standing for its overrides.

    Raises
    ------
    StudyError
        For a grid over ``seed`` (use the seeds), no values, an unknown variant name, a
        variant axis named like a config key, or two grid points with one directory name.
    ConfigError
        For a bad key or value of any member (the message names the member).
    """
    if "seed" in grid:
        raise StudyError("--grid seed=...: give the seeds with --seeds (or seeds: in a study file)")
    if jobs < 1:
        raise StudyError(f"--jobs {jobs}: must be >= 1")
    variants = variants or {}
    base = load_scenario(scenario, overrides)
    fields = {f.name for f in dataclasses.fields(base)}
    for axis in variants:
        if axis in fields:
            raise StudyError(f"variants: axis {axis!r} is a config key; name the axis otherwise")
    for key, values in grid.items():
        unknown = [v for v in values if key in variants and v not in variants[key]]
        if unknown:
            raise StudyError(
                f"--grid {key}={unknown[0]}: not a variant of {key}; there are: {', '.join(variants[key])}"
            )
    seeds = list(seeds) if seeds else [base.seed]
    points: list[list[tuple[str, str]]] = [[]]
    for key, values in grid.items():
        points = [[*p, (key, v)] for p in points for v in values]

    def settings(point: list[tuple[str, str]]) -> tuple[str, ...]:
        return tuple(o for k, v in point for o in (variants[k][v] if k in variants else [f"{k}={v}"]))

    members = [
        Member(member_name([*p, ("seed", str(s))]), (*p, ("seed", str(s))), settings([*p, ("seed", str(s))]))
        for p in points
        for s in seeds
    ]
    names = [m.name for m in members]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise StudyError(f"two grid points share the directory name {twice[0]!r}: give distinct values")
    sweep = Sweep(Path(scenario), list(overrides), dict(grid), seeds, Path(out), jobs, members, dict(variants))
    for member in members:
        try:
            load_scenario(scenario, [*overrides, *member.overrides])
        except ConfigError as exc:
            raise ConfigError(exc.key, exc.value, f"{exc.allowed} (in sweep member {member.name})") from None
    return sweep


# ---------------------------------------------------------------------------- config identity
def read_config(run_dir: Path) -> dict[str, Any]:
    """Return a run's ``config.yaml`` as a flat ``{dotted.key: value}`` dict ({} when unreadable)."""
    import yaml

    try:
        data = yaml.safe_load((Path(run_dir) / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    # a run of the first release saved the flat option keys: read them in the new places
    return flatten(alias_mapping(data, warn=False)) if isinstance(data, dict) else {}


@functools.lru_cache(maxsize=1)
def default_config() -> dict[str, Any]:
    """Return this version's default scenario as a flat ``{dotted.key: value}`` dict."""
    import yaml

    return flatten(yaml.safe_load(to_yaml(load_scenario(None, []))))


def config_difference(planned: dict[str, Any], saved: dict[str, Any]) -> Optional[str]:
    """Return the first result key on which two flat configs differ (execution keys aside), as
    ``key: saved vs planned``; None when they agree. A key that a saved run lacks (an option
    added after the run was made) reads as this version's default: a new option's default
    keeps what earlier versions did.
    """
    defaults = default_config()
    for key in sorted(set(planned) | set(saved)):
        if is_execution_key(key):
            continue
        there = saved[key] if key in saved else defaults.get(key)
        if planned.get(key) != there:
            return f"{key}: {there!r} there, {planned.get(key)!r} planned"
    return None


def check_existing(sweep: Sweep) -> None:
    """Refuse a sweep whose directory holds a member run of another configuration (a
    changed scenario or override would otherwise reuse old results).
    """
    import yaml

    for member in sweep.members:
        run_dir = sweep.out / member.name
        saved = read_config(run_dir)
        if not saved:
            continue
        cfg = load_scenario(sweep.scenario, [*sweep.overrides, *member.overrides])
        difference = config_difference(flatten(yaml.safe_load(to_yaml(cfg))), saved)
        if difference:
            raise StudyError(
                f"{run_dir} holds a run of another configuration ({difference}): "
                "sweep into another --out, or move that directory away"
            )


# ---------------------------------------------------------------------------- CPU shares
def usable_cpus() -> list[int]:
    """Return the CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def cpu_slots(jobs: int, cpus: Optional[Sequence[int]] = None) -> list[list[int]]:
    """Disjoint CPU sets for ``jobs`` concurrent members (shared round-robin when there are
    more jobs than CPUs).
    """
    cpus = list(cpus if cpus is not None else usable_cpus())
    if jobs >= len(cpus):
        return [[cpus[k % len(cpus)]] for k in range(jobs)]
    share = len(cpus) // jobs
    return [cpus[k * share : (k + 1) * share] for k in range(jobs)]


def execution_overrides(sweep: Sweep, member: Member, share: int, bounded: Optional[bool] = None) -> list[str]:
    """Return what the sweep adds to a member: plain progress lines (the log is a file), and
    ``simulation.num_cpus`` lowered to the member's CPU share when it is ``bounded`` to
    one (default: when ``sweep.jobs > 1``).
    """
    extra = ["output.progress=lines"]
    if sweep.jobs > 1 if bounded is None else bounded:
        cfg = load_scenario(sweep.scenario, [*sweep.overrides, *member.overrides])
        if cfg.simulation.backend == "ray" and cfg.simulation.num_cpus > share:
            extra.append(f"simulation.num_cpus={share}")
    return extra


# ---------------------------------------------------------------------------- running
class LocalExecutor:
    """Members as child processes of the sweep, ``jobs`` at a time, each pinned to its
    slot's share of this process's CPUs (Linux) when ``jobs > 1``.
    """

    def __init__(self, jobs: int, python: str = sys.executable) -> None:
        self.jobs = jobs
        self.python = python
        self.slots = cpu_slots(jobs)
        self.bounded = jobs > 1  # a member's share is less than the whole machine

    def open(self) -> None:
        """Nothing to connect to."""

    def close(self) -> None:
        """Nothing to disconnect from."""

    def share(self, slot: int) -> int:
        """Return the number of CPUs of slot ``slot``."""
        return len(self.slots[slot])

    def start(self, slot: int, args: list[str], log_path: Path, header: str) -> tuple[subprocess.Popen, TextIO]:
        """Start ``python args...`` with its output appended to ``log_path``."""
        cpus = self.slots[slot]
        log = open(log_path, "a", encoding="utf-8")
        log.write(header)
        log.flush()
        process = subprocess.Popen(
            [self.python, *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env(dict(os.environ), fedflex_root(), len(cpus) if self.bounded else None),
            start_new_session=True,  # a terminal's Ctrl-C reaches the sweep, which passes it on once
        )
        if self.bounded and hasattr(os, "sched_setaffinity"):
            try:
                os.sched_setaffinity(process.pid, cpus)
            except OSError:
                logger.warning("could not pin %s to CPUs %s", args, cpus)
        return process, log

    def poll(self, handle: tuple[subprocess.Popen, TextIO]) -> Optional[Ended]:
        """Return how the run's process ended, or None while it runs (its log is closed when it ends)."""
        process, log = handle
        if process.poll() is None:
            return None
        log.close()
        return Ended(process.returncode)

    def interrupt(self, handle: tuple[subprocess.Popen, TextIO], signum: int) -> None:
        """Pass the sweep's signal on to the member."""
        try:
            os.killpg(handle[0].pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, handle: tuple[subprocess.Popen, TextIO]) -> None:
        """End a member at once (an error of the sweep itself) and wait for it."""
        process, log = handle
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        process.wait()
        log.close()


@dataclasses.dataclass
class _Running:
    member: Member
    index: int
    action: str  # run | resume | rerun
    handle: Any  # the executor's
    slot: int
    started: float


class SweepRunner:
    """Runs a planned sweep's members as ``fedflex run`` processes (see the module) through
    an executor: :class:`LocalExecutor` on this machine, or
    :class:`fedflex.study.ray_executor.RayExecutor` (as tasks on a Ray cluster) when the
    sweep has a ``ray_address``.
    """

    def __init__(
        self, sweep: Sweep, say: Callable[[str], None] = print, python: str = sys.executable, executor: Any = None
    ) -> None:
        self.sweep = sweep
        self.say = say
        if executor is None and sweep.ray_address:
            from fedflex.study.ray_executor import RayExecutor

            executor = RayExecutor(sweep.ray_address, sweep.cpus_per_run, sweep.jobs)
        self.executor = executor or LocalExecutor(sweep.jobs, python)
        self.records: dict[str, dict[str, Any]] = {}
        self.signal: Optional[int] = None
        self._running: dict[int, _Running] = {}
        self._started = 0

    # -- index
    def _record(self, member: Member, **fields: Any) -> None:
        entry = self.records.setdefault(
            member.name,
            {"name": member.name, "dir": str(self.sweep.out / member.name), "overrides": member.overrides},
        )
        entry["point"] = dict(member.point)  # also for entries of an index written before points
        entry.update(fields)

    def write_index(self) -> None:
        """Write the sweep's index file (scenario, grid and members) atomically."""
        sweep = self.sweep
        index = {
            "scenario": str(sweep.scenario),
            "overrides": sweep.overrides,
            "variants": sweep.variants,
            "grid": sweep.grid,
            "seeds": sweep.seeds,
            "jobs": sweep.jobs,
            **({"ray_address": sweep.ray_address, "cpus_per_run": sweep.cpus_per_run} if sweep.ray_address else {}),
            "updated": datetime.now().isoformat(timespec="seconds"),
            "members": [self.records[m.name] for m in sweep.members if m.name in self.records],
        }
        path = sweep.out / INDEX_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(index, indent=2) + "\n")
        os.replace(tmp, path)

    # -- processes
    def _command(self, member: Member, action: str, share: int) -> list[str]:
        """Return the member's ``fedflex run`` arguments (after the Python interpreter), with
        absolute paths: a member on another machine of a cluster runs in another folder.
        """
        run_dir = self.sweep.out.absolute() / member.name
        if action == "resume":
            return ["-m", "fedflex", "run", "--resume", str(run_dir)]
        return [
            "-m",
            "fedflex",
            "run",
            str(self.sweep.scenario.absolute()),
            *self.sweep.overrides,
            *member.overrides,
            *execution_overrides(self.sweep, member, share, self.executor.bounded),
            "--out",
            str(run_dir),
        ]

    def _start(self, member: Member, index: int, action: str, slot: int) -> None:
        run_dir = self.sweep.out / member.name
        if action != "resume" and run_dir.exists():
            moved = self._move_aside(run_dir)
            self.say(f"[{index}/{len(self.sweep.members)}] {member.name}: earlier run moved to {moved}")
        log_path = self.sweep.out.absolute() / LOG_DIR / f"{member.name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        handle = self.executor.start(
            slot,
            self._command(member, action, self.executor.share(slot)),
            log_path,
            f"=== {datetime.now().isoformat(timespec='seconds')} {action}\n",
        )
        self._started += 1
        self._running[self._started] = _Running(member, index, action, handle, slot, time.monotonic())
        what = {"run": "start", "rerun": "start (again)", "resume": "resume"}[action]
        self.say(f"[{index}/{len(self.sweep.members)}] {what} {member.name}")
        self._record(member, status="running", exit_code=None, action=action)

    def _move_aside(self, run_dir: Path) -> Path:
        state = run_state(run_dir)
        target = self.sweep.out / REPLACED_DIR / f"{run_dir.name}.{state}-{datetime.now():%Y%m%d-%H%M%S-%f}"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(run_dir), str(target))
        return target

    def _finish(self, job: _Running, ended: Ended) -> Optional[str]:
        """Record a member that ended; returns ``rerun`` when a refused resume must start
        over from scratch.
        """
        code = ended.code
        run_dir = self.sweep.out / job.member.name
        if job.action == "resume" and code == 2 and self.signal is None:
            return "rerun"  # the checkpoint was refused (nothing written): start again
        state = run_state(run_dir)
        if code is None and state == "missing":  # cancelled before it started
            self._record(job.member, status="pending", exit_code=None)
            self.say(f"[{job.index}/{len(self.sweep.members)}] not started {job.member.name}: {ended.note}")
            return None
        stopped = self.signal is not None or (code is not None and (code < 0 or code > 128))  # a signal
        resumable = stopped and state == "incomplete" and has_checkpoint(run_dir)
        if state in ("missing", "incomplete") and code != 0 and not resumable:
            state = "failed"
        summary = read_summary(run_dir) or {}
        accuracy = summary.get("final_test_accuracy")
        self._record(
            job.member,
            status=state,
            exit_code=code,
            final_test_accuracy=accuracy,
            last_round=summary.get("last_round"),
            wall_s=round(time.monotonic() - job.started, 3),
        )
        acc = f"final accuracy {accuracy:.4f}" if isinstance(accuracy, (int, float)) else "no accuracy"
        how = f"exit {code}" if code is not None else ended.note
        more = "" if state in FINISHED else f", {how}, log {self.sweep.out / LOG_DIR / (job.member.name + '.log')}"
        if resumable:  # stopped at once (a second signal): it resumes from its checkpoint
            more += "; resumes from its checkpoint when the sweep runs again"
        self.say(
            f"[{job.index}/{len(self.sweep.members)}] done {job.member.name}: {state}, {acc} "
            f"({time.monotonic() - job.started:.1f} s{more})"
        )
        return None

    def _on_signal(self, signum, _frame) -> None:
        first = self.signal is None
        self.signal = self.signal or signum
        name = signal.Signals(signum).name
        self.say(
            f"fedflex sweep: {name}: no further member starts; "
            + ("the running ones stop after their round in flight" if first else "the running ones exit now")
        )
        for job in self._running.values():
            self.executor.interrupt(job.handle, signum)

    def _todo(self) -> list[tuple[Member, int, str]]:
        todo = []
        total = len(self.sweep.members)
        for index, member in enumerate(self.sweep.members, 1):
            run_dir = self.sweep.out / member.name
            state = run_state(run_dir)
            if state in FINISHED:
                summary = read_summary(run_dir) or {}
                self._record(
                    member,
                    status=state,
                    exit_code=self.records.get(member.name, {}).get("exit_code"),
                    final_test_accuracy=summary.get("final_test_accuracy"),
                    last_round=summary.get("last_round"),
                    action="kept",
                )
                self.say(f"[{index}/{total}] kept {member.name}: {state} before")
                continue
            action = "resume" if state in RESUMABLE and has_checkpoint(run_dir) else "run"
            self._record(member, status=state if state != "missing" else "pending", exit_code=None)
            todo.append((member, index, action))
        return todo

    def run(self) -> int:
        """Run what is left; returns the sweep's exit status: 0 when every member
        finished, 1 when one failed, 128 + N when stopped by signal N.
        """
        sweep = self.sweep
        sweep.out.mkdir(parents=True, exist_ok=True)
        with open(sweep.out / LOCK_FILE, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                raise StudyError(f"another fedflex sweep is running in {sweep.out}") from None
            previous = _read_index(sweep.out)
            self.records = {m["name"]: m for m in previous.get("members", []) if isinstance(m, dict) and "name" in m}
            pending = deque(self._todo())
            self.write_index()
            opened = bool(pending)
            if opened:
                self.executor.open()  # before the handlers: ray.init takes SIGTERM
            handlers = {s: signal.getsignal(s) for s in _SIGNALS}
            for s in _SIGNALS:
                signal.signal(s, self._on_signal)
            try:
                self._loop(pending)
            finally:
                for s, h in handlers.items():
                    signal.signal(s, h)
                for job in self._running.values():  # only on an error of the sweep itself
                    self.executor.stop(job.handle)
                self.write_index()
                if opened:
                    self.executor.close()
        if self.signal is not None:
            return 128 + int(self.signal)
        failed = [r for r in self.records.values() if r.get("status") not in FINISHED]
        return 1 if failed else 0

    def _loop(self, pending: deque) -> None:
        free = list(range(self.sweep.jobs))
        while self._running or (pending and self.signal is None):
            while pending and free and self.signal is None:
                member, index, action = pending.popleft()
                self._start(member, index, action, free.pop(0))
            time.sleep(0.1)
            for key, job in list(self._running.items()):
                ended = self.executor.poll(job.handle)
                if ended is None:
                    continue
                del self._running[key]
                free.append(job.slot)
                again = self._finish(job, ended)
                if again:
                    self.say(f"[{job.index}/{len(self.sweep.members)}] {job.member.name}: its checkpoint was refused")
                    pending.appendleft((job.member, job.index, again))
                self.write_index()


_SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)


def _read_index(out: Path) -> dict[str, Any]:
    try:
        index = json.loads((Path(out) / INDEX_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return index if isinstance(index, dict) else {}


def describe(sweep: Sweep) -> str:
    """``N members (G grid points x S seeds) into OUT, J at a time`` (and where, for a
    sweep on a Ray cluster).
    """
    points = math.prod(len(v) for v in sweep.grid.values()) if sweep.grid else 1
    where = (
        f"as tasks on the Ray cluster at {sweep.ray_address}, {sweep.cpus_per_run} CPU"
        f"{'s' if sweep.cpus_per_run != 1 else ''} each, up to {sweep.jobs} at a time"
        if sweep.ray_address
        else f"{sweep.jobs} at a time"
    )
    return (
        f"{len(sweep.members)} runs ({points} grid point{'s' if points != 1 else ''} x {len(sweep.seeds)} "
        f"seed{'s' if len(sweep.seeds) != 1 else ''}) into {sweep.out}, {where}"
    )
