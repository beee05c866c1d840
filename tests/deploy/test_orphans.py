"""No process of a local federation outlives ``fedflex deploy local`` (real Flower
processes on loopback; processes are found by their FLWR_HOME in /proc, no psutil).

- the SuperLink is SIGKILLed from outside mid-run: its ServerApp, re-parented to init,
  is stopped with the rest before ``deploy local`` returns (it used to run on for
  seconds to minutes, writing into the results directory);
- ``deploy local`` itself is SIGKILLed: its SuperLink and SuperNodes die with it (Linux
  parent-death signal), and their SuperExecs, ServerApp and ClientApps follow within
  seconds (Flower's parent-process monitors).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deploy_helpers import QUICKSTART, ROOT, processes_using, read_rows, tiny_overrides, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and PR_SET_PDEATHSIG are Linux's"),
]


def _command(out: Path, workdir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "fedflex",
        "deploy",
        "local",
        str(QUICKSTART),
        *tiny_overrides(2, rounds=50),
        "--out",
        str(out),
        "--workdir",
        str(workdir),
        "--timeout",
        "300",
    ]


def _named(workdir: Path, name: str) -> list[int]:
    """Pids of the federation's processes whose command line contains ``name``."""
    found = []
    for pid in processes_using(workdir):
        try:
            if name.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            pass
    return found


def _described(pids: list[int]) -> dict[int, str]:
    """pid -> the start of its command line (for failure messages)."""
    described = {}
    for pid in pids:
        try:
            described[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
        except OSError:
            pass
    return described


def _start(tmp_path: Path) -> tuple[subprocess.Popen, Path, Path]:
    out, workdir = tmp_path / "out", tmp_path / "work"
    deploy = subprocess.Popen(
        _command(out, workdir), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for(lambda: read_rows(out) or deploy.poll() is not None, 150, "the first round")
        assert deploy.poll() is None, deploy.communicate()[1][-3000:]
        assert _named(workdir, "flwr-serverapp"), "no ServerApp process found"
    except BaseException:
        deploy.kill()
        deploy.communicate()
        for pid in processes_using(workdir):
            os.kill(pid, signal.SIGKILL)
        raise
    return deploy, out, workdir


def test_superlink_killed_from_outside_leaves_no_serverapp_behind(tmp_path):
    # Prepare: a deploy local with its run under way
    deploy, _, workdir = _start(tmp_path)
    # Execute: SIGKILL the SuperLink alone (not its process group): a crash, the OOM killer
    (superlink,) = _named(workdir, "flower-superlink")
    os.kill(superlink, signal.SIGKILL)
    _, err = deploy.communicate(timeout=60)
    left = processes_using(workdir)
    # Assert: deploy local reports the lost SuperLink and nothing it started still runs
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert deploy.returncode == 1, err[-3000:]
    assert "superlink-exited" in err
    assert not left, f"processes left running after deploy local returned: {left}"


def test_killed_deploy_local_takes_its_federation_with_it(tmp_path):
    # Prepare
    deploy, _, workdir = _start(tmp_path)
    # Execute: SIGKILL deploy local (no chance to stop anything)
    deploy.kill()
    deploy.communicate(timeout=10)
    t0 = time.monotonic()
    gone = None
    while time.monotonic() - t0 < 30:
        if not processes_using(workdir):
            gone = time.monotonic() - t0
            break
        time.sleep(0.2)
    left = _described(processes_using(workdir))
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    # Assert: SuperLink, SuperNodes and everything they started are gone within seconds
    assert gone is not None, f"processes still running 30 s after deploy local was killed: {left}"
    print(f"federation gone {gone:.1f} s after deploy local was killed")
