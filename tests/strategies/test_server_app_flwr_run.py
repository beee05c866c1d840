"""The ServerApp under ``flwr run``: ``out=`` never overwrites earlier results; a
checkpoint every round by default; what ``resume=`` refuses."""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import pytest

from strategies.server_app import RunConfigError, flwr_run_scenario, results_dir, resume_point


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


# ------------------------------------------------------------------ checkpoints, resume
QUICKSTART = Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.yaml"


def test_flwr_run_checkpoints_every_round_by_default():
    cfg = flwr_run_scenario({"scenario": str(QUICKSTART), "overrides": "rounds=3"})
    assert cfg.output.checkpoint_every == 1


def test_flwr_run_keeps_an_explicit_checkpoint_every_from_the_overrides():
    cfg = flwr_run_scenario({"scenario": str(QUICKSTART), "overrides": "output.checkpoint_every=0"})
    assert cfg.output.checkpoint_every == 0


def test_flwr_run_keeps_an_explicit_checkpoint_every_from_the_scenario(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: s\noutput:\n  checkpoint_every: 5\n")
    cfg = flwr_run_scenario({"scenario": str(scenario), "overrides": ""})
    assert cfg.output.checkpoint_every == 5


def test_resume_without_a_checkpoint_is_refused(tmp_path):
    with pytest.raises(RunConfigError, match=r"resume=.* no checkpoint.pkl there"):
        resume_point(tmp_path)


def test_resume_of_a_damaged_checkpoint_is_refused_and_left_alone(tmp_path):
    (tmp_path / "config.yaml").write_text("name: s\n")
    (tmp_path / "checkpoint.pkl").write_bytes(b"\x80\x04 truncated")
    with pytest.raises(RunConfigError, match="is damaged"):
        resume_point(tmp_path)
    assert (tmp_path / "checkpoint.pkl").read_bytes() == b"\x80\x04 truncated"


def test_resume_of_a_finished_run_is_refused(tmp_path):
    (tmp_path / "config.yaml").write_text("name: s\nrounds: 2\n")
    (tmp_path / "checkpoint.pkl").write_bytes(pickle.dumps({"round": 2, "strategy": {}}))
    with pytest.raises(RunConfigError, match="already finished its 2 rounds"):
        resume_point(tmp_path)


# ------------------------------------------------------------------ federation size
@pytest.mark.slow  # Ray starts and stops: about 20 s here
def test_a_simulation_with_fewer_supernodes_than_clients_stops_at_once_naming_the_fix(tmp_path):
    # Prepare: what plain `flwr run .` does: Flower's default federation of 2 simulated
    # SuperNodes for the quickstart scenario's 20 clients (Flower registers them while
    # the ServerApp already runs)
    from flwr.simulation import run_simulation

    from clients.client_app import app as client_app
    from fedflex.config import load_scenario
    from fedflex.launch.runner import backend_config
    from strategies.server_app import make_server_app

    cfg = load_scenario(QUICKSTART, ["output.progress=off", "output.plots=false", "simulation.num_cpus=1"])
    out = tmp_path / "out"
    # Execute
    t0 = time.monotonic()
    with pytest.raises(RunConfigError) as raised:
        run_simulation(make_server_app(cfg, out), client_app, num_supernodes=2, backend_config=backend_config(cfg))
    elapsed = time.monotonic() - t0
    # Assert: one line with the flwr run option, well before deployment.wait_timeout (300 s); nothing written
    assert str(raised.value) == (
        "the simulation runs 2 SuperNode(s) but scenario 'quickstart' has num_clients=20: "
        'run it with flwr run . --federation-config "num-supernodes=20" (or a scenario with num_clients=2)'
    )
    assert elapsed < 30
    assert not out.exists()
