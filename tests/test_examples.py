"""The scripts under examples/ run as a user runs them."""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # three tiny simulations in one process
def test_python_api_example_runs_and_leaves_nothing_behind(tmp_path):
    # Execute: from an empty directory, as `python examples/python_api.py`
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "python_api.py")],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "FEDFLEX_CACHE": str(tmp_path / "cache")},
        capture_output=True,
        text=True,
        timeout=300,
    )

    # Assert
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert [line.split()[:2] for line in lines[:2]] == [["uniform", "status=completed"], ["pow-d", "status=completed"]]
    assert "Markov churn: min_session_rounds filled in as 5" in lines
    assert "refused: rounds = 0: must be >= 1" in lines
    files = [
        *("accuracy.png", "checkpoint.npz", "churn.png", "config.yaml", "confusion.png"),
        *("metrics.jsonl", "model.npz", "run.log"),
    ]
    assert f"files: {[*files, 'summary.json']}" in lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]


# ------------------------------------------------------------------ examples/flower-quickstart under flwr run
QUICKSTART_EXAMPLE = ROOT / "examples" / "flower-quickstart"
DEBIAN_FMNIST = Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout


def _example_state() -> tuple[str, dict[str, bytes]]:
    """``git status --porcelain`` of the example folder and the bytes of the files git
    sees there (tracked or not ignored): what running the example must leave as it found
    (a file that was edited before the run must not be rewritten either)."""
    folder = str(QUICKSTART_EXAMPLE)
    status = _git("status", "--porcelain", "--untracked-files=all", "--", folder)
    names = _git("ls-files", "--cached", "--others", "--exclude-standard", "--full-name", "--", folder).split()
    return status, {name: (ROOT / name).read_bytes() for name in names if (ROOT / name).is_file()}


def _stop_processes_of(home: Path) -> list[str]:
    """Stop (by pid) what ``flwr run`` left running with FLWR_HOME=home: the local
    SuperLink it starts detached, and its SuperExec / app / Ray processes. Returns the
    command lines of those that needed a SIGKILL."""
    sys.path.insert(0, str(ROOT / "tests" / "deploy"))
    from deploy_helpers import processes_using

    def command_line(pid: int) -> str:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
        except OSError:
            return str(pid)

    for pid in processes_using(home):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while processes_using(home) and time.monotonic() < deadline:
        time.sleep(0.2)
    killed = []
    for pid in processes_using(home):
        killed.append(command_line(pid))
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return killed


def _local_superlink_port_in_use() -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", 39091)) == 0


@pytest.mark.slow  # a local SuperLink, a Ray simulation of 4 SuperNodes, 2 rounds: about a minute
def test_flower_quickstart_example_runs_under_flwr_run_quietly_and_leaves_the_checkout_clean(tmp_path):
    # Prepare: as its README says (flwr run . --stream in the example folder), with a fresh
    # FLWR_HOME, the installed environment (no runtime dependency installation) and the
    # interpreter's bin on PATH (flwr starts flower-superlink by name); small and quick
    if _local_superlink_port_in_use():
        pytest.fail("127.0.0.1:39091 is in use (a local SuperLink left running?): flwr run would use it")
    home = tmp_path / "flwr-home"
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "FLWR_HOME": str(home),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
        "PYTHONUNBUFFERED": "1",
        "TERM": "dumb",
        "NO_COLOR": "1",
    }
    if not DEBIAN_FMNIST.is_file() and not os.environ.get("FEDFLEX_DATA"):
        env["QUICKSTART_SYNTHETIC"] = "1"  # no Fashion-MNIST on this machine (scripts/setup.sh installs it as root)
    before = _example_state()
    flwr = [str(Path(bin_dir) / "flwr")]
    # Execute
    try:
        proc = subprocess.run(
            [
                *flwr,
                "run",
                ".",
                "--stream",
                "--federation-config",
                "num-supernodes=4",
                "--run-config",
                "num-server-rounds=2 examples=100",
            ],
            cwd=QUICKSTART_EXAMPLE,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        log = proc.stdout + proc.stderr
        (tmp_path / "flwr-run.log").write_text(log)
        started = re.search(r"Successfully started run (\d+)", log)
        listed = subprocess.run(
            [*flwr, "ls", "--run-id", started.group(1), "--format", "json"] if started else ["true"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        killed = _stop_processes_of(home)  # the local SuperLink stays up after flwr run
    after = _example_state()

    # Assert: exit 0; the run finished; not one ERROR line; nothing in the example changed
    assert proc.returncode == 0, log[-4000:]
    assert started, log[-4000:]
    runs = json.loads(listed.stdout[listed.stdout.index("{") :])["runs"] if "{" in listed.stdout else []
    assert [run.get("status") for run in runs] == ["finished:completed"], listed.stdout + listed.stderr
    errors = [line for line in log.splitlines() if "ERROR" in line]
    assert not errors, f"{len(errors)} ERROR line(s), e.g.:\n" + "\n".join(errors[:10])
    assert after[0] == before[0], f"git status of the example before:\n{before[0]}after:\n{after[0]}"
    changed = sorted(name for name in {*before[1], *after[1]} if before[1].get(name) != after[1].get(name))
    assert not changed, f"files of the example written by the run: {changed}"
    print(f"flwr run: {len(log.splitlines())} log lines; stopped by SIGKILL: {killed or 'nothing'}")
