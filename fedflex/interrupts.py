"""Stopping a run cleanly on SIGINT (Ctrl-C), SIGTERM or SIGHUP.

The first signal asks the run to stop at the next round boundary: the round in flight
finishes, its row is written, a checkpoint is saved, ``summary.json`` says
``"status": "interrupted"``, and the CLI prints the ``fedflex run --resume DIR``
command and exits with 128 + the signal number (130 for Ctrl-C, 143 for SIGTERM, 129 for
SIGHUP). A second signal exits at once (the rows written so far stay).

Flower's simulation runs the ServerApp in a thread while the main thread drives the
clients, so the signal handler (main thread) only sets a flag; the round loop reads it
(:func:`requested`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Optional

SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)

_received: Optional[int] = None
_lock = threading.Lock()


def requested() -> Optional[int]:
    """The signal number that asked the run to stop, or None."""
    return _received


def exit_code(signum: int) -> int:
    """The shell's convention: 128 + the signal number."""
    return 128 + int(signum)


def signal_name(signum: int) -> str:
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


def uninstall() -> None:
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler)


def reset() -> None:
    global _received
    _received = None
