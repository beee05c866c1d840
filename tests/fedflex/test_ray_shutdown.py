"""The Ray backend's shutdown waits for its processes to end, and a zombie has ended: the
raylet's agents and workers are not the run's children, and once the raylet is killed
nothing may reap them at once, so waiting for them to disappear sat out the whole grace
second at the end of every Ray run (issue 46)."""

import importlib
import subprocess
import sys
import time

from fedflex.launch.runner import _wait_gone


def _psutil():
    importlib.import_module("ray")  # puts Ray's vendored psutil on the path, as in a Ray run
    return importlib.import_module("psutil")


def test_a_zombie_counts_as_gone_and_a_live_process_is_returned_after_the_timeout():
    psutil = _psutil()
    # Prepare: a zombie that is not this process's child (as the raylet's workers are not
    # the run's): a parent that starts a child which exits, never reaped, and a sleeper
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'pass'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert parent.stdout is not None
        zombie = psutil.Process(int(parent.stdout.readline()))
        deadline = time.monotonic() + 30
        while zombie.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.01)
        assert zombie.status() == psutil.STATUS_ZOMBIE
        # psutil's own wait counts it as running for its whole timeout: the 1 s it cost
        _, alive = psutil.wait_procs([zombie], timeout=0.3)
        assert alive == [zombie]
        # Execute
        t0 = time.monotonic()
        gone = _wait_gone(psutil, [zombie], timeout=5.0)
        waited_for_zombie = time.monotonic() - t0
        still = _wait_gone(psutil, [zombie, psutil.Process(live.pid)], timeout=0.2)
        # Assert: no wait for the zombie; the live one outlasts its 0.2 s
        assert gone == [] and waited_for_zombie < 1.0
        assert [p.pid for p in still] == [live.pid]
    finally:
        for proc in (parent, live):
            proc.kill()
            proc.wait()
