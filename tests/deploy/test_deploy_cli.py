"""``fedflex deploy local``: argument checks (fast) and Ctrl-C (slow, real processes)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from deploy_helpers import QUICKSTART, ROOT, processes_using, tiny_overrides

from fedflex.launch import cli
from fedflex.launch.deploy import DeployError, find_executable, node_config, run_config, superlink_command


def test_nodes_must_match_the_scenarios_clients(capsys):
    code = cli.main(["deploy", "local", "--nodes", "3", str(QUICKSTART)])
    assert code == 2
    assert "num_clients=20" in capsys.readouterr().err


def test_bad_override_is_a_config_error(capsys, tmp_path):
    code = cli.main(["deploy", "local", str(QUICKSTART), "client.lrr=1", "--workdir", str(tmp_path / "w")])
    assert code == 2
    assert "config error: client.lrr" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


def test_port_in_use_is_refused_before_anything_starts(capsys, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code = cli.main(
            [
                "deploy",
                "local",
                str(QUICKSTART),
                *tiny_overrides(2, 1),
                "--port",
                str(port),
                "--out",
                str(tmp_path / "out"),
                "--workdir",
                str(tmp_path / "w"),
            ]
        )
    err = capsys.readouterr().err
    assert code == 1
    assert f"127.0.0.1:{port} is in use" in err
    assert not list((tmp_path / "w").glob("logs/*.log"))


def test_out_must_be_new_or_empty(capsys, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("")
    code = cli.main(["deploy", "local", str(QUICKSTART), *tiny_overrides(2, 1), "--out", str(tmp_path / "out")])
    assert code == 2
    assert "not an empty directory" in capsys.readouterr().err


def test_missing_flower_executable_is_named(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(DeployError, match="flower-nowhere not found"):
        find_executable("flower-nowhere")


def test_node_config_and_run_config_strings():
    assert node_config(2, 3) == "partition-id=2 num-partitions=3"
    assert node_config(0, 3, "/data/fm") == 'partition-id=0 num-partitions=3 data-path="/data/fm"'
    assert run_config("/s.yaml", ["rounds=2", "client.lr=0.1"], "/o") == (
        'scenario="/s.yaml" overrides="rounds=2 client.lr=0.1" out="/o"'
    )
    with pytest.raises(DeployError):
        node_config(0, 1, "/path with space")
    # the checkout's commit travels to the ServerApp, which runs from the app bundle
    assert run_config("", resume="/o", git={"commit": "abc", "dirty": True}) == 'resume="/o" git-commit="abc+dirty"'


def test_auth_without_tls_is_refused():
    from fedflex.launch.deploy import LocalFederation

    with pytest.raises(DeployError, match="needs TLS"):
        LocalFederation(ROOT / "runs" / "never", 1, auth=True)


def test_superlink_command_is_insecure_only_without_tls():
    cmd = superlink_command(9000, executable="flower-superlink")
    assert cmd == [
        "flower-superlink",
        "--host",
        "127.0.0.1",
        "--port",
        "9000",
        "--insecure",
        "--disable-runtime-dependency-installation",
    ]


@pytest.mark.slow
def test_interrupt_stops_every_process(tmp_path):
    # Prepare: a run that would take minutes
    workdir, out = tmp_path / "work", tmp_path / "out"
    cmd = [
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
    ]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        # Execute: Ctrl-C once the run is going (its log stream started)
        deadline = time.monotonic() + 90
        while not list(workdir.glob("logs/run-*.log")) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
        assert proc.poll() is None, proc.stdout.read()
        assert list(workdir.glob("logs/run-*.log")), "the run did not start within 90 s"
        running = processes_using(workdir)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        t0 = time.monotonic()
        output, _ = proc.communicate(timeout=60)
        stop_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # Assert
    assert proc.returncode == 130, output
    assert "interrupted" in output
    assert len(running) >= 4  # SuperLink, its SuperExec, 2 SuperNodes (+ their SuperExecs)
    assert processes_using(workdir) == []
    print(f"{len(running)} processes stopped {stop_s:.1f} s after Ctrl-C")


@pytest.mark.parametrize(
    "summary, expected",
    [
        ({"status": "degraded", "degraded": "1 of the 3 nodes bound trained"}, "1 of the 3 nodes bound trained"),
        ({"status": "completed"}, None),
        ({"status": "degraded"}, "degraded"),
        (["not", "a", "summary"], None),
    ],
)
def test_a_deployments_run_that_ended_degraded_is_not_reported_completed(tmp_path, summary, expected):
    import json

    from fedflex.launch.deploy.command import _degraded

    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert _degraded(tmp_path) == expected
    assert _degraded(tmp_path / "missing") is None
