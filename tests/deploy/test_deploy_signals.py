"""``fedflex deploy local`` on SIGHUP / SIGTERM: the federation is stopped, never orphaned.

The fast tests stand a recording fake in for :class:`LocalFederation` and send the
signal to this process; the slow one closes the "terminal" of a real federation.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from deploy_helpers import QUICKSTART, ROOT, processes_using, tiny_overrides

from fedflex.launch import cli
from fedflex.launch.deploy import command


class _Federation:
    """Records start / stop; ``run`` sends ``signum`` to this process and waits for it."""

    signum = signal.SIGHUP
    signal_in_stop = None
    calls: list[str] = []

    def __init__(self, workdir, num_nodes, **kwargs):
        self.address, self.logs = "127.0.0.1:1", workdir / "logs"
        _Federation.calls = []

    def start(self):
        self.calls.append("start")

    def run(self, *args, **kwargs):
        self.calls.append("run")
        os.kill(os.getpid(), self.signum)
        time.sleep(5)  # the handler interrupts this
        self.calls.append("run ended without the signal")

    def stop(self):
        self.calls.append("stop")
        if self.signal_in_stop is not None:
            os.kill(os.getpid(), self.signal_in_stop)
            time.sleep(0.2)  # a handler that raised would cut the stop short here
        self.calls.append("stopped")

    def leftovers(self):
        return []


def _deploy(tmp_path, monkeypatch, signum, signal_in_stop=None) -> int:
    monkeypatch.setattr(command, "LocalFederation", _Federation)
    monkeypatch.setattr(_Federation, "signum", signum)
    monkeypatch.setattr(_Federation, "signal_in_stop", signal_in_stop)
    args = ["deploy", "local", str(QUICKSTART), *tiny_overrides(2, 1)]
    return cli.main([*args, "--out", str(tmp_path / "out"), "--workdir", str(tmp_path / "w")])


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGTERM, signal.SIGINT])
def test_stop_signal_stops_the_federation_and_exits_128_plus_its_number(tmp_path, monkeypatch, capsys, signum):
    # Execute
    code = _deploy(tmp_path, monkeypatch, signum)
    # Assert
    assert code == 128 + signum
    assert _Federation.calls == ["start", "run", "stop", "stopped"]
    assert f"interrupted by {signal.Signals(signum).name}: stopping the federation" in capsys.readouterr().err


def test_signal_while_stopping_does_not_cut_the_stop_short(tmp_path, monkeypatch):
    code = _deploy(tmp_path, monkeypatch, signal.SIGHUP, signal_in_stop=signal.SIGTERM)
    assert code == 129
    assert _Federation.calls[-2:] == ["stop", "stopped"]


def test_handlers_are_restored_afterwards(tmp_path, monkeypatch):
    before = {s: signal.getsignal(s) for s in command.STOP_SIGNALS}
    _deploy(tmp_path, monkeypatch, signal.SIGTERM)
    assert {s: signal.getsignal(s) for s in command.STOP_SIGNALS} == before


@pytest.mark.slow
def test_sighup_stops_every_process_of_a_real_federation(tmp_path):
    # Prepare: a run that would take minutes, its output on a pipe (no terminal)
    workdir, out = tmp_path / "work", tmp_path / "out"
    cmd = [sys.executable, "-m", "fedflex", "deploy", "local", str(QUICKSTART), *tiny_overrides(2, rounds=50)]
    cmd += ["--out", str(out), "--workdir", str(workdir)]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 90
        while not list(workdir.glob("logs/run-*.log")) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
        assert proc.poll() is None, proc.stdout.read()
        assert list(workdir.glob("logs/run-*.log")), "the run did not start within 90 s"
        running = processes_using(workdir)
        # Execute: what a closed terminal / dropped SSH session sends
        os.kill(proc.pid, signal.SIGHUP)
        t0 = time.monotonic()
        output, _ = proc.communicate(timeout=60)
        stop_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # Assert: everything stopped by SIGTERM within the grace period (none needed SIGKILL)
    assert proc.returncode == 129, output
    assert len(running) >= 4  # SuperLink, its SuperExec, 2 SuperNodes (+ their SuperExecs)
    assert processes_using(workdir) == []
    assert "did not stop within" not in output, output
    print(f"{len(running)} processes stopped {stop_s:.1f} s after SIGHUP")
