"""Stopping a run cleanly on SIGINT (Ctrl-C), SIGTERM or SIGHUP.

The first signal asks the run to stop at the next round boundary: the round in flight
finishes, its row is written, a checkpoint is saved, ``summary.json`` says
``"status": "interrupted"``, and the CLI prints the ``fedflex run --resume DIR``
command and exits with 128 + the signal number (130 for Ctrl-C, 143 for SIGTERM, 129 for
SIGHUP). A second signal exits at once (the rows written so far stay).

Flower's simulation runs the ServerApp in a thread while the main thread drives the
clients, so the signal handler (main thread) only sets a flag; the round loop reads it
(:func:`requested`).

Ray's ``ray.init()`` replaces the process's SIGTERM handler with one that exits at once,
and Ray's processes (GCS, raylet, the workers that run the clients) share the run's
process group: a SIGTERM to the group (``timeout``, SLURM, systemd) would kill them in
the middle of a round. :func:`shielding_children` keeps both from happening.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Optional

SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)

_received: Optional[int] = None
_lock = threading.Lock()


def requested() -> Optional[int]:
    """Return the signal number that asked the run to stop, or None."""
    return _received


def exit_code(signum: int) -> int:
    """Return the shell's convention: 128 + the signal number."""
    return 128 + int(signum)


def signal_name(signum: int) -> str:
    """Return the name of signal ``signum`` (its number when it has none)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _handler(signum, _frame) -> None:
    global _received
    with _lock:
        first = _received is None
        if first:
            _received = signum
    if not first:  # the second signal: leave now
        print(f"\nfedflex: {signal_name(signum)} again: exiting now", file=sys.stderr, flush=True)
        os._exit(exit_code(signum))
    print(
        f"\nfedflex: {signal_name(signum)}: stopping after the round in flight (press Ctrl-C again to exit now)",
        file=sys.stderr,
        flush=True,
    )


def install() -> None:
    """Route SIGINT / SIGTERM / SIGHUP to the round loop (main thread only)."""
    reset()
    for sig in SIGNALS:
        signal.signal(sig, _handler)


def installed() -> bool:
    """Whether the round loop owns the stop signals (:func:`install` was called)."""
    return signal.getsignal(signal.SIGTERM) is _handler


# Ray blocks SIGINT in the processes it starts itself; these are the other stop signals.
_SHIELDED = frozenset(s for s in SIGNALS if s != signal.SIGINT)


@contextlib.contextmanager
def shielding_children():
    """Start helper processes (Ray's) inside this block so that a stop signal stays the run's.

    While the block runs, SIGTERM and SIGHUP are blocked in this thread: processes started
    in it inherit the blocked mask (across ``exec``), so a signal sent to the whole
    process group leaves them running and the round in flight can finish; they still
    stop when the run ends (Ray kills what outlives its grace second). On leaving, this
    module's handlers are put back (``ray.init`` replaces SIGTERM's) and the signals
    unblocked: one that arrived meanwhile then reaches the round loop. Does nothing
    unless :func:`install` was called (a library caller keeps its own handling).
    """
    if not installed():
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, _SHIELDED)
    try:
        yield
    finally:
        for sig in SIGNALS:
            signal.signal(sig, _handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def uninstall() -> None:
    """Restore the default signal handlers."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler)


def reset() -> None:
    """Forget a received signal."""
    global _received
    _received = None
