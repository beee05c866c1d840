"""End to end: a real few-round Flower simulation on the Ray backend, with churn.

Runs the ``fedflex`` console command as a user would (one process: Flower's simulation
runtime, Ray workers running the ClientApp) and checks the results contract.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[1]

pytestmark = pytest.mark.slow

# 8 clients; sessions of 2 rounds: {0,1,2,3} then {4,5,6,7}, cycling; 3 per round
OVERRIDES = [
    "name=it",
    "num_clients=8",
    "rounds=5",
    "dataset.samples_per_client=40",
    "churn.kind=sessions",
    "churn.sessions=[[0,1,2,3],[4,5,6,7]]",
    "churn.rounds_per_session=2",
    "strategy.sampler.clients_per_round=3",
    "strategy.sampler.min_clients=1",
    "evaluation.every=2",
    "simulation.backend=ray",
    "simulation.num_cpus=1",
    "output.progress=lines",
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedflex",
            "run",
            str(ROOT / "scenarios" / "quickstart.yaml"),
            *OVERRIDES,
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_results_files_are_written(run_dir):
    names = {p.name for p in run_dir.iterdir()}
    assert {"config.yaml", "metrics.jsonl", "summary.json", "accuracy.png", "churn.png"} <= names


def test_online_set_follows_the_schedule(run_dir):
    expected = [[0, 1, 2, 3], [0, 1, 2, 3], [4, 5, 6, 7], [4, 5, 6, 7], [0, 1, 2, 3]]
    assert [r["online"] for r in _rows(run_dir)] == expected


def test_sampled_clients_are_online_and_counted(run_dir):
    for row in _rows(run_dir):
        assert len(row["sampled"]) == 3
        assert set(row["sampled"]) <= set(row["online"])


def test_sessions_advance_when_the_online_set_changes(run_dir):
    rows = _rows(run_dir)
    assert [r["session"] for r in rows] == [0, 0, 1, 1, 2]
    assert [r["session_started"] for r in rows] == [True, False, True, False, True]


def test_evaluation_cadence_and_last_round(run_dir):
    # every 2 rounds, and always the last one
    evaluated = [r["round"] for r in _rows(run_dir) if r["test_accuracy"] is not None]
    assert evaluated == [2, 4, 5]


def test_rows_carry_the_contract_fields(run_dir):
    for row in _rows(run_dir):
        assert {"round", "session", "online", "sampled", "test_accuracy", "test_loss", "train_loss", "wall_s"} <= set(
            row
        )
        assert row["train_loss"] > 0


def test_config_yaml_is_the_resolved_scenario(run_dir):
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert cfg["num_clients"] == 8
    assert cfg["churn"]["sessions"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert cfg["client"]["lr"] == 0.01  # from the scenario file, untouched


def test_summary_counts_rounds_and_sessions(run_dir):
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert (summary["rounds"], summary["sessions"]) == (5, 3)
    assert 0.0 <= summary["final_test_accuracy"] <= 1.0
