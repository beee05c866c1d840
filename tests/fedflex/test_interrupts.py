"""fedflex.interrupts without a run: helper processes started by the run (Ray's) keep
running through a stop signal, and the round loop keeps the signals that ray.init takes."""

import signal
import subprocess
import sys

import pytest

from fedflex import interrupts

# a child that prints which of SIGTERM / SIGHUP / SIGINT it starts with blocked
_REPORT_MASK = (
    "import signal; blocked = signal.pthread_sigmask(signal.SIG_BLOCK, set()); "
    "print(sorted(s.name for s in blocked if s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)))"
)


@pytest.fixture
def handlers():
    """Leave the test process's signal handling as it found it."""
    before = {sig: signal.getsignal(sig) for sig in interrupts.SIGNALS}
    yield
    for sig, handler in before.items():
        signal.signal(sig, handler)
    interrupts.reset()


def _child_mask() -> str:
    return subprocess.run([sys.executable, "-c", _REPORT_MASK], capture_output=True, text=True, check=True).stdout


def test_children_started_while_shielding_do_not_take_sigterm_or_sighup(handlers):
    # Prepare
    interrupts.install()
    # Execute
    with interrupts.shielding_children():
        inside = _child_mask()
    after = _child_mask()
    # Assert: blocked in a child started inside (SIGINT is Ray's to block), nothing after
    assert inside.strip() == "['SIGHUP', 'SIGTERM']"
    assert after.strip() == "[]"
    assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == set()


def test_shielding_gives_sigterm_back_to_the_round_loop(handlers):
    # Prepare: what ray.init does inside the block
    interrupts.install()
    # Execute
    with interrupts.shielding_children():
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(15))
    signal.raise_signal(signal.SIGTERM)
    # Assert: the signal asked the run to stop instead of exiting
    assert interrupts.installed()
    assert interrupts.requested() == signal.SIGTERM


def test_shielding_does_nothing_without_the_cli_handlers(handlers):
    # Prepare: a library caller's own handling
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # Execute
    with interrupts.shielding_children():
        inside = _child_mask()
    # Assert
    assert inside.strip() == "[]"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
