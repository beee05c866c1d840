"""The Ray simulation attached to an existing Ray cluster, and a sweep whose members run as
tasks on one: a head and a worker node on loopback (``ray start``), then ``fedflex run ...
simulation.ray_address=HOST:PORT`` or ``fedflex sweep ... --ray-address HOST:PORT``. Each
test ends with ``ray stop --force``, which stops every Ray process of this machine."""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
RAY = Path(sys.executable).parent / "ray"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.skipif(not RAY.exists() and shutil.which("ray") is None, reason="no ray CLI")
def test_run_attaches_to_a_two_node_ray_cluster(tmp_path):
    # Prepare: a head node and a worker node, one CPU each, on 127.0.0.1
    ray = str(RAY if RAY.exists() else shutil.which("ray"))
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "FEDFLEX_CACHE": str(tmp_path / "cache"),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    start = [ray, "start", "--num-cpus=1", "--node-ip-address=127.0.0.1", "--disable-usage-stats"]
    try:
        subprocess.run(
            [*start, "--head", f"--port={port}", "--include-dashboard=false"],
            check=True,
            env=env,
            capture_output=True,
            timeout=120,
        )
        subprocess.run([*start, f"--address=127.0.0.1:{port}"], check=True, env=env, capture_output=True, timeout=120)
        # Execute
        out = tmp_path / "out"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "fedflex",
                "run",
                str(QUICKSTART),
                "rounds=3",
                "output.progress=off",
                "output.plots=false",
                f"simulation.ray_address=127.0.0.1:{port}",
                "--out",
                str(out),
                "--verbose",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        nodes = subprocess.run([ray, "status", f"--address=127.0.0.1:{port}"], env=env, capture_output=True, text=True)
    finally:
        subprocess.run([ray, "stop", "--force"], env=env, capture_output=True, timeout=120)
    # Assert: the run completed on the cluster (2 CPUs: 2 cohort messages per round)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "attached to Ray cluster" in proc.stderr
    assert "'CPU': 2.0" in proc.stderr
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
    assert nodes.stdout.count("node_") >= 2, nodes.stdout


@pytest.mark.slow
@pytest.mark.skipif(not RAY.exists() and shutil.which("ray") is None, reason="no ray CLI")
def test_sweep_runs_its_members_as_tasks_on_a_two_node_ray_cluster(tmp_path):
    # Prepare: a head node and a worker node, one CPU each, on 127.0.0.1
    ray = str(RAY if RAY.exists() else shutil.which("ray"))
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "FEDFLEX_CACHE": str(tmp_path / "cache"),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    start = [ray, "start", "--num-cpus=1", "--node-ip-address=127.0.0.1", "--disable-usage-stats"]
    out = tmp_path / "sweep"
    sweep = [sys.executable, "-m", "fedflex", "sweep", str(QUICKSTART), "simulation.backend=local", "rounds=2"]
    sweep += ["output.plots=false", "dataset.samples_per_client=500", "--seeds", "0,1", "--out", str(out)]
    sweep += [f"--ray-address=127.0.0.1:{port}"]
    try:
        subprocess.run(
            [*start, "--head", f"--port={port}", "--include-dashboard=false"],
            check=True,
            env=env,
            capture_output=True,
            timeout=120,
        )
        subprocess.run([*start, f"--address=127.0.0.1:{port}"], check=True, env=env, capture_output=True, timeout=120)
        # Execute: the sweep, then the same sweep again
        first = subprocess.run(sweep, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        index = json.loads((out / "sweep.json").read_text())
        second = subprocess.run(sweep, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    finally:
        subprocess.run([ray, "stop", "--force"], env=env, capture_output=True, timeout=120)
    # Assert: both members completed as Ray tasks (1 CPU each), logs in DIR/logs; nothing started again
    assert first.returncode == 0, first.stdout + first.stderr[-3000:]
    assert "as tasks on the Ray cluster at 127.0.0.1" in first.stdout
    assert [(m["name"], m["status"], m["exit_code"]) for m in index["members"]] == [
        ("seed=0", "completed", 0),
        ("seed=1", "completed", 0),
    ]
    assert index["ray_address"] == f"127.0.0.1:{port}" and index["cpus_per_run"] == 1
    for name in ("seed=0", "seed=1"):
        assert json.loads((out / name / "summary.json").read_text())["status"] == "completed"
        assert "=== " in (out / "logs" / f"{name}.log").read_text()
    assert second.returncode == 0, second.stdout + second.stderr[-3000:]
    assert second.stdout.count("kept ") == 2 and "start " not in second.stdout
