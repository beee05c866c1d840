"""Stopping a run cleanly on SIGINT (Ctrl-C), SIGTERM or SIGHUP.

The first signal asks the run to stop at the next round boundary: the round in flight
finishes, its row is written, a checkpoint is saved, ``summary.json`` says
``"status": "interrupted"``, and the CLI prints the ``fedflex run --resume DIR``
command and exits with 128 + the signal number (130 for Ctrl-C, 143 for SIGTERM, 129 for
SIGHUP). A second signal exits at once (the rows written so far stay): the checkpoint
of the last round boundary is written first when the run kept one in memory
(:func:`add_exit_hook`), so that the run still resumes from there.

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
from typing import Callable, Optional

SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)

_received: Optional[int] = None
_lock = threading.Lock()
#: called by a second signal before the process exits, the latest first: they write what
#: the run can keep (the checkpoint of the last round boundary) and say how to continue
_exit_hooks: list[Callable[[], Optional[str]]] = []
#: receive the exit line of a second signal (the run's log)
_exit_sinks: list[Callable[[str], None]] = []


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
    if not first:  # the second signal: leave now, after writing what the run can keep
        notes = []
        for hook in reversed(list(_exit_hooks)):  # each one: they write, then say
            try:
                notes.append(hook())
            except BaseException as exc:  # noqa: BLE001 - a full disk, say: exit all the same
                notes.append(f"its last round boundary could not be written ({exc})")
        note = next((n for n in notes if n), None)
        line = f"fedflex: {signal_name(signum)} again: exiting now" + (f"; {note}" if note else "")
        print(f"\n{line}", file=sys.stderr, flush=True)
        for sink in list(_exit_sinks):
            try:
                sink(line)
            except BaseException:  # noqa: BLE001, S110 - exiting all the same
                pass
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
    """Restore the default signal handlers (and forget the exit hooks)."""
    _exit_hooks.clear()
    _exit_sinks.clear()
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler)


def add_exit_hook(hook: Callable[[], Optional[str]]) -> None:
    """Have a second signal call ``hook`` before the process exits at once (once, however
    often it is added).

    A hook runs in the signal handler and should be quick: it writes what the run can keep
    (:meth:`fedflex.launch.observers.Checkpointer.write_snapshot`) and returns the end of
    the exit line (how to continue), or None. Every hook is called, the latest first; the
    first note is said.
    """
    if hook not in _exit_hooks:
        _exit_hooks.append(hook)


def add_exit_sink(sink: Callable[[str], None]) -> None:
    """Have a second signal pass its exit line to ``sink`` (e.g. the run's log) before the process exits."""
    if sink not in _exit_sinks:
        _exit_sinks.append(sink)


def reset() -> None:
    """Forget a received signal and the exit hooks."""
    global _received
    _received = None
    _exit_hooks.clear()
    _exit_sinks.clear()
