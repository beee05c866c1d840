"""The scripts under examples/ run as a user runs them."""

import os
import subprocess
import sys
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
    files = ["accuracy.png", "checkpoint.npz", "churn.png", "config.yaml", "metrics.jsonl", "model.npz", "run.log"]
    assert f"files: {[*files, 'summary.json']}" in lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]
