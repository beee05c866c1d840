"""The ServerApp under ``flwr run``: ``out=`` never overwrites earlier results."""

from __future__ import annotations

import pytest

from strategies.server_app import RunConfigError, results_dir


def test_out_with_earlier_results_is_refused_and_left_alone(tmp_path):
    # Prepare: a directory holding an earlier run's metrics
    out = tmp_path / "earlier"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"round": 1}\n')
    # Execute / Assert
    with pytest.raises(RunConfigError, match=r"out= .*earlier exists and is not an empty directory"):
        results_dir({"out": str(out)}, "quickstart")
    assert (out / "metrics.jsonl").read_text() == '{"round": 1}\n'


def test_out_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(RunConfigError, match="not an empty directory"):
        results_dir({"out": str(tmp_path / "f")}, "quickstart")


def test_new_out_is_accepted_and_not_created_yet(tmp_path):
    out = tmp_path / "a" / "b"
    assert results_dir({"out": str(out)}, "quickstart") == out
    assert not (tmp_path / "a").exists()


def test_empty_out_is_the_default_under_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = results_dir({"out": ""}, "quickstart")
    assert path.parent.as_posix() == "runs" and path.name.startswith("quickstart-")
