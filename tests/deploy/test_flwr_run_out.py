"""``flwr run`` on a federation with an ``out=`` that holds earlier results: the run
fails at once, says why, and leaves the results alone (real processes on loopback)."""

from __future__ import annotations

import pytest
from deploy_helpers import QUICKSTART, tiny_overrides

pytestmark = pytest.mark.slow


def test_flwr_run_into_earlier_results_fails_and_leaves_them_alone(tmp_path, federation):
    # Prepare: earlier results in out
    out = tmp_path / "earlier"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"round": 1}\n')
    fed = federation(1)
    fed.start()
    # Execute
    result = fed.run(str(QUICKSTART), tiny_overrides(1, rounds=1), out, timeout=180)
    # Assert: failed, the reason in the run's status details; the file is untouched
    assert result.status == "finished:failed", (result.status, result.details)
    assert "exists and is not an empty directory" in result.details  # what flwr ls shows
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl"]
    assert (out / "metrics.jsonl").read_text() == '{"round": 1}\n'
    print(f"refused after {result.wall_s:.1f} s: {result.details}")
