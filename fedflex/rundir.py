"""One run per results directory: an exclusive lock on ``--out`` for the run's lifetime.

A run (new or resumed) takes an exclusive ``fcntl.flock`` on ``DIR/.fedflex.lock``
before it looks at or writes anything in ``DIR``; a second run on the same directory is
refused at once with one line naming the holder's pid. The operating system drops the
lock when the holding process ends in any way (``kill -9`` included), so a killed run
can be resumed at once; the lock file is removed when the run ends. A new run checks
that ``DIR`` is empty only once it holds the lock, so two runs started together cannot
both pass the check.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import Optional

LOCK_FILE = ".fedflex.lock"
#: the files of a run directory (docs/run-directory.md)
CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
MODEL_FILE = "model.npz"
ACCURACY_PLOT = "accuracy.png"
CHURN_PLOT = "churn.png"
CONFUSION_PLOT = "confusion.png"
CHECKPOINT_FILE = "checkpoint.npz"  # save_checkpoint / load_checkpoint
TRACE_FILE = "trace.csv"  # a churn trace, copied into the run directory
LEGACY_CHECKPOINT_FILE = "checkpoint.pkl"  # a pickle (fedflex before issue 26): never loaded


class RunDirError(ValueError):
    """A results directory that this run cannot use (busy, not empty, not writable)."""


def _holder(fd: int) -> str:
    """Return the pid written in an open lock file ("unknown" when it holds none yet)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    if not text.isdigit():
        return "pid unknown"
    try:  # what that process is, where /proc says (Linux)
        with open(f"/proc/{text}/cmdline", "rb") as f:
            command = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        command = ""
    if int(text) == os.getpid():
        command = f"this process, {command}" if command else "this process"
    return f"pid {text}: {command[:120]}" if command else f"pid {text}"


class RunDirLock:
    """The lock on one results directory (a context manager).

    Parameters
    ----------
    out
        The results directory.
    new
        A new run: ``out`` is created when missing (with its parents) and must be empty
        apart from the lock file; what the lock created is taken back on
        :meth:`release` when nothing was written there. False: a resumed run, ``out``
        must exist.
    option
        How one-line messages name the directory ("--out", "--resume", "out=").
    wait
        Seconds to wait for another holder to let go before refusing (0: refuse at
        once). ``flwr run`` waits: after ``flwr stop`` the stopped run's ServerApp may
        still be ending when its resume starts.

    Raises
    ------
    RunDirError
        From :meth:`acquire`: another run holds the lock, or ``out`` is not a new or
        empty directory (``new``), or it cannot be created or written.
    """

    def __init__(self, out: Path, *, new: bool, option: str = "--out", wait: float = 0.0) -> None:
        self.out = Path(out)
        self.new = new
        self.option = option
        self.wait = wait
        self._fd: Optional[int] = None
        self._made: list[Path] = []

    @property
    def path(self) -> Path:
        """Return the path of the lock file in the run directory."""
        return self.out / LOCK_FILE

    def _not_empty(self) -> bool:
        return any(p.name != LOCK_FILE for p in self.out.iterdir())

    def acquire(self) -> "RunDirLock":
        """Take the lock, refusing a directory that is locked or (for a new run) not empty; return self."""
        out, option = self.out, self.option
        refused = f"{option} {out} exists and is not an empty directory: choose another one"
        if self.new:
            if out.exists() and (not out.is_dir() or self._not_empty()):  # before writing anything
                raise RunDirError(refused)
            self._made = [p for p in [out, *out.parents] if not p.exists()]
        elif not out.is_dir():
            raise RunDirError(f"{option} {out}: no such directory")
        try:
            if self.new:
                out.mkdir(parents=True, exist_ok=True)
            fd = self._lock()
        except OSError as exc:
            self._take_back()
            raise RunDirError(
                f"{option} {out} cannot be created or written ({exc.strerror or exc}): choose another directory"
            ) from None
        self._fd = fd
        try:
            if self.new and self._not_empty():
                raise RunDirError(refused)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        except OSError as exc:
            self.release()
            raise RunDirError(
                f"{option} {out} cannot be written ({exc.strerror or exc}): choose another directory"
            ) from None
        except RunDirError:
            self.release()
            raise
        return self

    def _lock(self) -> int:
        """Return an fd of the lock file with the lock held (RunDirError: another run holds it,
        also after ``wait`` seconds).
        """
        deadline = time.monotonic() + self.wait
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                if time.monotonic() < deadline:  # e.g. a stopped run's process still ending
                    time.sleep(0.2)
                    continue
                self._take_back()
                raise RunDirError(
                    f"{self.option} {self.out} is in use by another fedflex run ({holder}): "
                    "wait for it to end, or choose another directory"
                ) from None
            except BaseException:
                os.close(fd)
                raise
            # the holder may have ended and removed the file between open and flock: the
            # lock must be on the file that the path names now
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                return fd
            os.close(fd)

    def release(self) -> None:
        """Remove the lock file and drop the lock (idempotent); a new run's directory
        (and the folders above it) that it created and that stayed empty are removed.
        """
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if os.path.samestat(os.fstat(fd), os.stat(self.path)):
                os.unlink(self.path)
        except OSError:
            pass
        os.close(fd)
        self._take_back()

    def _take_back(self) -> None:
        for p in self._made:  # deepest first; only empty folders go
            try:
                p.rmdir()
            except OSError:
                break
        self._made = []

    def __enter__(self) -> "RunDirLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
