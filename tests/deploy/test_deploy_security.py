"""``fedflex deploy local``: the warning about an unauthenticated SuperLink, keys that do
not outlive a failed run, and processes that do not outlive their parent (fast: the
runs fail on a busy port before any Flower process starts, or use tiny stand-ins)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest
from deploy_helpers import QUICKSTART, tiny_overrides

from fedflex.launch import cli
from fedflex.launch.deploy import wait_until
from fedflex.launch.deploy.command import UNAUTHENTICATED


def _deploy_on_a_busy_port(tmp_path, *extra):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        args = ["deploy", "local", str(QUICKSTART), *tiny_overrides(2, 1), "--port", str(port)]
        return cli.main([*args, "--out", str(tmp_path / "out"), *extra])


def test_deploy_without_auth_warns_once_what_is_exposed(tmp_path, capsys):
    # Execute
    code = _deploy_on_a_busy_port(tmp_path, "--workdir", str(tmp_path / "w"))
    # Assert
    err = capsys.readouterr().err
    assert code == 1
    assert err.count(UNAUTHENTICATED) == 1
    assert "any local user" in UNAUTHENTICATED and "--auth" in UNAUTHENTICATED


@pytest.mark.skipif(subprocess.run(["which", "openssl"], capture_output=True).returncode != 0, reason="no openssl")
def test_failed_auth_run_removes_its_keys_but_keeps_its_logs(tmp_path, capsys, monkeypatch):
    # Prepare: the temporary work directory lands under tmp_path
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    # Execute
    code = _deploy_on_a_busy_port(tmp_path, "--auth")
    # Assert: no warning with --auth; the work directory is kept, without certs/ (CA,
    # SuperLink and SuperNode private keys)
    err = capsys.readouterr().err
    (workdir,) = tmp_path.glob("fedflex-deploy-*")
    assert code == 1
    assert UNAUTHENTICATED not in err
    assert f"logs kept in {workdir} (its certificates and keys removed)" in err
    assert (workdir / "logs").is_dir()
    assert not (workdir / "certs").exists()
    assert not [p for p in workdir.rglob("*") if p.suffix == ".key" or p.name.startswith("supernode-")]


@pytest.mark.skipif(subprocess.run(["which", "openssl"], capture_output=True).returncode != 0, reason="no openssl")
def test_failed_auth_run_keeps_the_keys_of_a_given_workdir(tmp_path, capsys):
    # Execute
    code = _deploy_on_a_busy_port(tmp_path, "--auth", "--workdir", str(tmp_path / "w"))
    # Assert: the user chose the directory: everything stays
    assert code == 1
    assert (tmp_path / "w" / "certs" / "ca.key").is_file()
    assert (tmp_path / "w" / "certs" / "keys" / "supernode-0").is_file()


PARENT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from fedflex.launch.deploy.processes import ManagedProcess
    proc = ManagedProcess("sleeper", [sys.executable, "-c", "import time; time.sleep(120)"], {}, Path(sys.argv[1]))
    print(proc.pid, flush=True)
    time.sleep(120)
    """
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_managed_process_dies_with_the_process_that_started_it(tmp_path):
    # Prepare: a parent that starts a long sleeper as a ManagedProcess (its own session)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path / "sleeper.log")], stdout=subprocess.PIPE, text=True, env=env
    )
    child = int(parent.stdout.readline())
    assert _alive(child)
    # Execute: SIGKILL the parent (it cannot stop anything)
    parent.kill()
    parent.wait()
    # Assert: the sleeper follows at once
    assert wait_until(lambda: not _alive(child), 5.0), f"pid {child} outlived its parent"


ORPHAN = textwrap.dedent(
    """
    import os, subprocess, sys, time
    if sys.argv[1] == "parent":
        child = subprocess.Popen([sys.executable, "-c", sys.argv[2], "child", sys.argv[2]])
        print(child.pid, flush=True)
        time.sleep(120)
    else:
        from fedflex.orphans import exit_when_orphaned
        exit_when_orphaned(grace=0.5, interval=0.1)
        time.sleep(120)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_exit_when_orphaned_ends_the_process_after_its_parent_died():
    # Prepare: parent -> child; the child (a ServerApp stand-in) watches for orphaning
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    parent = subprocess.Popen(
        [sys.executable, "-c", ORPHAN, "parent", ORPHAN], stdout=subprocess.PIPE, text=True, env=env
    )
    child = int(parent.stdout.readline())
    time.sleep(1.0)  # the child's watcher runs
    assert _alive(child)
    # Execute
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    # Assert: the child exits about grace (0.5 s) after it was re-parented
    assert wait_until(lambda: not _alive(child), 5.0), f"pid {child} still runs after its parent died"
