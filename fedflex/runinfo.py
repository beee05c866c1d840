"""What a run directory says about the run beyond its results: ``run.log`` (the run's log
lines) and the provenance recorded in ``summary.json`` (which fedflex, Flower, torch,
NumPy and Python produced it, on which device).
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator, Optional

import fedflex
from fedflex.results import CONFIG_FILE

logger = logging.getLogger(__name__)

RUN_LOG = "run.log"
# the loggers of a run: fedflex's packages and Flower's
RUN_LOGGERS = ("fedflex", "flwr")  # fedflex.strategies and fedflex.clients included
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
GIT_TIMEOUT_S = 3.0


#: ``time.perf_counter()`` when the running ``fedflex`` command started (:func:`command_clock`)
_command_start: Optional[float] = None


def process_age() -> float:
    """Return the seconds since this process started (Linux ``/proc``; 0 where unknown)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            start_ticks = int(fh.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/uptime", encoding="ascii") as fh:
            uptime = float(fh.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


@contextlib.contextmanager
def command_clock(from_process_start: bool = False) -> Iterator[None]:
    """Start the run clock of a ``fedflex`` command, for the block: now, or with
    ``from_process_start`` when the process started (the ``fedflex`` executable: the
    interpreter and its imports count too). The command's imports of torch and Flower,
    the data load and a Ray start then count in ``run_wall_s``. The CLI wraps each command
    in it; without a command (the Python API, ``flwr run``'s ServerApp) the clock
    (:class:`fedflex.launch.observers.RunClock`) starts with the run.
    """
    global _command_start
    _command_start = time.perf_counter() - (process_age() if from_process_start else 0.0)
    try:
        yield
    finally:
        _command_start = None


def command_start() -> Optional[float]:
    """Return when the running ``fedflex`` command started, or None outside one."""
    return _command_start


def checkout() -> Optional[Path]:
    """Return the git checkout fedflex is imported from (None when installed from a wheel)."""
    root = Path(fedflex.__file__).resolve().parent.parent
    return root if (root / ".git").exists() else None  # a worktree has a .git file


def git_commit(root: Optional[Path] = None) -> Optional[dict[str, Any]]:
    """``{"commit": sha, "dirty": bool}`` of the checkout (tracked files changed or not),
    or None: no checkout, no git, or git too slow.
    """
    root = root if root is not None else checkout()
    if root is None:
        return None
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=GIT_TIMEOUT_S
        )
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if head.returncode != 0 or status.returncode != 0:
        return None
    return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}


def _version(distribution: str) -> Optional[str]:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def device_name(client_device: str = "auto") -> str:
    """``cpu``, or ``cuda (<GPU name>)`` when ``client.device`` lets the run use a GPU
    and this machine has one.
    """
    import torch

    if client_device != "cpu" and torch.cuda.is_available():
        return f"cuda ({torch.cuda.get_device_name(0)})"
    return "cpu"


def parse_commit(text: str) -> Optional[dict[str, Any]]:
    """``"SHA"`` / ``"SHA+dirty"`` (the run config's ``git-commit``) -> :func:`git_commit`'s
    form; None for an empty text.
    """
    text = text.strip()
    if not text:
        return None
    commit, _, flag = text.partition("+")
    return {"commit": commit, "dirty": flag == "dirty"}


def provenance(client_device: str = "auto", git: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Return what produced a run: versions, the git commit (``git``, else that of the checkout
    fedflex runs from, if any), the device of this machine (in simulation the clients' too;
    in a deployment the server's).
    """
    import numpy
    import torch

    info: dict[str, Any] = {"fedflex": fedflex.__version__}
    git = git if git is not None else git_commit()
    if git is not None:
        info["git_commit"], info["git_dirty"] = git["commit"], git["dirty"]
    info.update(
        {
            "flwr": _version("flwr"),
            "torch": torch.__version__,
            "numpy": numpy.__version__,
            "python": platform.python_version(),
            "device": device_name(client_device),
        }
    )
    return info


def version_line() -> str:
    """``fedflex 0.1.0`` (and the commit when run from a checkout): ``fedflex --version``."""
    line = f"fedflex {fedflex.__version__}"
    git = git_commit()
    if git is not None:
        line += f" (git {git['commit'][:12]}{', uncommitted changes' if git['dirty'] else ''})"
    return line


@contextlib.contextmanager
def run_log(out_dir: Optional[Path], first_line: str = "") -> Iterator[None]:
    """Copy the run's log lines to ``out_dir/run.log`` (appended: a resumed run continues
    the file) while the block runs: a FileHandler on fedflex's and Flower's loggers,
    removed after. The file holds what those loggers pass at their levels, i.e. what the
    console shows (warnings; with ``--verbose`` also INFO). ``first_line``: written first
    (to the file only). ``out_dir`` None: nothing. A new run that did not get as far as
    writing config.yaml (e.g. a full disk) leaves no run.log behind either: its results
    directory stays empty, so the same ``--out`` can be used again.
    """
    if out_dir is None:
        yield
        return
    made = [p for p in [Path(out_dir), *Path(out_dir).parents] if not p.exists()]
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    path = Path(out_dir) / RUN_LOG
    new = not path.exists()
    handler = logging.FileHandler(path, mode="a", encoding="utf-8")
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    if first_line:
        record = {"name": __name__, "levelno": logging.INFO, "levelname": "INFO", "msg": first_line}
        handler.handle(logging.makeLogRecord(record))
    loggers = [logging.getLogger(name) for name in RUN_LOGGERS]
    for lg in loggers:
        lg.addHandler(handler)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeHandler(handler)
        handler.close()
        if new and not (Path(out_dir) / CONFIG_FILE).exists():
            path.unlink(missing_ok=True)
            for folder in made:  # the folders made here, if nothing else went there
                try:
                    folder.rmdir()
                except OSError:
                    break


def log_outcome(out: Path, level: int, line: str) -> None:
    """Append how a run ended (or how it was started again) to its ``run.log``, when it has
    one, so that the file keeps the history of a run stopped and resumed; a log that
    cannot be written is left as is.
    """
    path = Path(out) / RUN_LOG
    if not path.is_file():
        return
    record = logging.makeLogRecord({"name": "fedflex", "levelno": level, "levelname": logging.getLevelName(level)})
    record.msg = line
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(logging.Formatter(LOG_FORMAT).format(record) + "\n")
    except OSError:
        pass
