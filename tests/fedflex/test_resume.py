"""Checkpoint / resume: a run killed mid-way and resumed ends with the same model as an
uninterrupted run with the same seed."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fedflex.launch.cli import main

ROOT = Path(__file__).parents[2]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
# slow enough rounds to kill one mid-run; server momentum and Markov churn make the
# restored state matter (sampler RNG, momentum buffer, session tracker)
OVERRIDES = [
    "simulation.backend=local",
    "rounds=8",
    "output.checkpoint_every=2",
    "output.progress=off",
    "output.plots=false",
    "dataset.samples_per_client=4000",
    "strategy.aggregator.name=fedavgm",
    "strategy.aggregator.fedavgm.momentum=0.5",
]


def _cmd(out, *extra):
    return [sys.executable, "-m", "fedflex", "run", str(QUICKSTART), *OVERRIDES, *extra, "--out", str(out)]


def _env(tmp_path):
    return {**os.environ, "PYTHONPATH": str(ROOT), "FEDFLEX_CACHE": str(tmp_path / "cache")}


@pytest.mark.slow
@pytest.mark.parametrize("vectorize", ["off", "on", "rule"])  # one at a time, cohorts, the rule's choice
def test_killed_and_resumed_run_ends_with_the_uninterrupted_model(tmp_path, vectorize):
    env = _env(tmp_path)
    subprocess.run(
        _cmd(tmp_path / "full", f"simulation.vectorize={vectorize}"), check=True, cwd=ROOT, env=env, capture_output=True
    )
    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        _cmd(killed, f"simulation.vectorize={vectorize}"),
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    metrics = killed / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= 5:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = len(metrics.read_text().splitlines())
    assert 5 <= done < 8, "the run must be killed mid-way"
    assert not (killed / "model.npz").exists()
    resumed = subprocess.run(
        [sys.executable, "-m", "fedflex", "run", "--resume", str(killed)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a, b = np.load(tmp_path / "full" / "model.npz"), np.load(killed / "model.npz")
    assert sorted(a.files) == sorted(b.files)
    for key in a.files:
        np.testing.assert_array_equal(a[key], b[key])
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["round"] for r in rows] == list(range(1, 9))  # rows after the checkpoint were replaced
    full = [json.loads(line) for line in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    assert [r["sampled"] for r in rows] == [r["sampled"] for r in full]
    assert [r["test_accuracy"] for r in rows] == [r["test_accuracy"] for r in full]


def test_resume_refuses_a_directory_without_checkpoint(tmp_path, capsys):
    assert main(["run", "--resume", str(tmp_path)]) == 2
    assert "no checkpoint.npz" in capsys.readouterr().err


def test_resume_takes_no_overrides(tmp_path, capsys):
    assert main(["run", "--resume", str(tmp_path), "rounds=3"]) == 2
    assert "takes no scenario" in capsys.readouterr().err
