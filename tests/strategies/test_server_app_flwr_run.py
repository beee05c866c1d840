"""The ServerApp under ``flwr run``: ``out=`` never overwrites earlier results; a
checkpoint every round by default; what ``resume=`` refuses."""

from __future__ import annotations

import json
import os
import pickle
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

from fedflex.launch.server import (
    RunConfigError,
    flwr_run_scenario,
    load_checkpoint,
    results_dir,
    resume_point,
    save_checkpoint,
)
from fedflex.results import read_metrics


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
    with pytest.raises(RunConfigError, match=r"resume=.* no checkpoint.npz there: not a fedflex run directory"):
        resume_point(tmp_path)


def test_resume_of_a_run_stopped_before_its_first_checkpoint_names_the_command_that_starts_it_over(tmp_path):
    # Prepare: what a second Ctrl-C before the first checkpoint leaves (config, 2 rows)
    (tmp_path / "config.yaml").write_text("name: s\n")
    (tmp_path / "metrics.jsonl").write_text('{"round": 1}\n{"round": 2}\n')
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    # Execute / Assert: refused in one line naming fedflex run --resume (which runs it
    # again in place), and nothing touched
    with pytest.raises(RunConfigError) as refused:
        resume_point(tmp_path)
    assert "\n" not in str(refused.value)
    assert f"start it over in place with: fedflex run --resume {tmp_path}" in str(refused.value)
    assert "checkpoint_every 0?" not in str(refused.value)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_resume_of_a_damaged_checkpoint_is_refused_and_left_alone(tmp_path):
    (tmp_path / "config.yaml").write_text("name: s\n")
    (tmp_path / "checkpoint.npz").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(RunConfigError, match="is damaged"):
        resume_point(tmp_path)
    assert (tmp_path / "checkpoint.npz").read_bytes() == b"PK\x03\x04 truncated"


class _State:
    """A strategy whose state_dict() is given."""

    def __init__(self, state):
        self.state = state

    def state_dict(self):
        return self.state


def _finished_run(out, rounds=2, summary=True, model=True, status="completed"):
    """A run directory whose checkpoint is of its last round (summary / model optional)."""
    (out / "config.yaml").write_text(f"name: s\nrounds: {rounds}\n")
    save_checkpoint(out, rounds, _State({"global_arrays": {"w": np.zeros(2, dtype=np.float32)}}))
    if summary:
        (out / "summary.json").write_text(json.dumps({"status": status, "last_round": rounds}))
    if model:
        np.savez(out / "model.npz", w=np.zeros(2, dtype=np.float32))


def test_resume_of_a_finished_run_is_refused(tmp_path):
    _finished_run(tmp_path)
    with pytest.raises(RunConfigError, match="already finished its 2 rounds"):
        resume_point(tmp_path)


@pytest.mark.parametrize(
    "missing",
    [{"summary": False}, {"model": False}, {"status": "failed"}, {"status": "interrupted"}],
    ids=["summary", "model", "failed", "interrupted-in-the-last-round"],
)
def test_resume_of_a_run_whose_last_files_are_missing_is_accepted(tmp_path, missing):
    # Prepare: every round ran, but the disk filled up before the summary / the model
    _finished_run(tmp_path, **missing)
    # Execute
    cfg, checkpoint = resume_point(tmp_path)
    # Assert: resumed after its last round (it runs none and writes the missing files)
    assert (cfg.rounds, checkpoint["round"]) == (2, 2)


class _RunsCode:
    """Unpickling it creates the folder ``marker``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def test_an_old_pickle_checkpoint_is_refused_without_unpickling_it(tmp_path):
    # Prepare: a crafted checkpoint.pkl whose loading would create a folder
    marker = tmp_path / "ran"
    (tmp_path / "config.yaml").write_text("name: s\nrounds: 5\n")
    (tmp_path / "checkpoint.pkl").write_bytes(pickle.dumps({"round": 2, "strategy": _RunsCode(marker)}))
    # Execute / Assert
    with pytest.raises(RunConfigError, match=r"checkpoint.pkl is a pickle checkpoint of an older fedflex"):
        resume_point(tmp_path)
    assert not marker.exists()


def test_a_checkpoint_round_trips_the_strategy_state_exactly(tmp_path):
    # Prepare: state as the parts keep it (RNG state, arrays, tuples, int keys, NaN)
    rng = np.random.default_rng(7)
    rng.random(3)
    state = {
        "global_arrays": OrderedDict([("w", np.arange(6, dtype=np.float32).reshape(2, 3)), ("n", np.int64(4))]),
        "parts": {"UniformSampler": {"rng": rng.bit_generator.state, "sizes": {0: 10, 3: 7}}},
        "last": (1, OrderedDict([("w", np.ones(2))])),
        "loss": float("nan"),
    }
    # Execute
    save_checkpoint(tmp_path, 3, _State(state), run_wall_s=1.5)
    back = load_checkpoint(tmp_path)
    # Assert
    assert (back["round"], back["run_wall_s"]) == (3, 1.5)
    got = back["strategy"]
    assert isinstance(got["global_arrays"], OrderedDict) and list(got["global_arrays"]) == ["w", "n"]
    assert got["global_arrays"]["w"].dtype == np.float32
    np.testing.assert_array_equal(got["global_arrays"]["w"], state["global_arrays"]["w"])
    assert type(got["global_arrays"]["n"]) is np.int64 and got["global_arrays"]["n"] == 4
    assert got["parts"]["UniformSampler"]["sizes"] == {0: 10, 3: 7}
    again = np.random.default_rng()
    again.bit_generator.state = got["parts"]["UniformSampler"]["rng"]
    assert again.random() == rng.random()
    assert isinstance(got["last"], tuple) and got["last"][0] == 1
    np.testing.assert_array_equal(got["last"][1]["w"], np.ones(2))
    assert np.isnan(got["loss"])


# ------------------------------------------------------------------ federation size
@pytest.mark.slow  # Ray starts and stops: about 20 s here
def test_a_simulation_with_fewer_supernodes_than_clients_stops_at_once_naming_the_fix(tmp_path):
    # Prepare: what plain `flwr run .` does: Flower's default federation of 2 simulated
    # SuperNodes for the quickstart scenario's 20 clients (Flower registers them while
    # the ServerApp already runs)
    from flwr.simulation import run_simulation

    from fedflex.clients.client_app import app as client_app
    from fedflex.launch.runner import backend_config
    from fedflex.launch.server import make_server_app
    from fedflex.loader import load_scenario

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


def test_the_flwr_run_lock_is_taken_once_held_for_the_block_and_released(tmp_path, monkeypatch):
    # Prepare: no waiting for the holder (this very block) to let go
    from fedflex.launch import server as server_app
    from fedflex.launch.server import _locked

    monkeypatch.setattr(server_app, "FLWR_RUN_LOCK_WAIT", 0.0)

    out = tmp_path / "out"
    # Execute / Assert: the block runs holding the lock (a second run is refused) ...
    with _locked(out, new=True, option="out="):
        assert (out / ".fedflex.lock").is_file()
        (out / "config.yaml").write_text("name: x\n")  # the run writes its files
        busy = r"resume= .* is in use by another fedflex run \(pid \d+: this process"
        with pytest.raises(RunConfigError, match=busy):
            with _locked(out, new=False, option="resume="):
                pass
    # ... and afterwards the directory can be resumed into
    with _locked(out, new=False, option="resume="):
        pass
    assert not (out / ".fedflex.lock").exists()


def _flwr_run(grid, run_config: dict) -> None:
    """The ServerApp's entry point as ``flwr run`` calls it."""
    from flwr.app import Context, RecordDict

    from fedflex.launch.server import main

    main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))


def test_a_flwr_runs_run_log_ends_with_how_it_ended_and_its_resume_continues_the_history(tmp_path):
    # Prepare: the quickstart scenario, 4 clients, 2 rounds, on fedflex's in-process grid
    from fedflex.clients.client_app import app as client_app
    from fedflex.launch.local_grid import LocalGrid

    out = tmp_path / "run"
    overrides = "num_clients=4 rounds=2 dataset.samples_per_client=40 strategy.sampler.clients_per_round=4"
    first = {"scenario": "scenarios/quickstart.yaml", "overrides": overrides, "out": str(out)}
    first["git-commit"] = "0123abcd+dirty"  # what fedflex deploy local passes: the app bundle has no .git
    _flwr_run(LocalGrid(client_app, 4), first)
    # Execute: the run extended to 3 rounds in its config.yaml, then resumed with resume=
    config = out / "config.yaml"
    config.write_text(config.read_text().replace("rounds: 2", "rounds: 3", 1))
    _flwr_run(LocalGrid(client_app, 4), {"resume": str(out), "git-commit": "0123abcd+dirty"})
    # Assert: starting, its end, resuming, its end: in order, one line each
    lines = (out / "run.log").read_text().splitlines()
    ends = [line for line in lines if "completed after round" in line or ": starting " in line or ": resuming " in line]
    assert [e.split(": ", 1)[1] for e in ends] == [
        f"fedflex {__import__('fedflex').__version__}: starting quickstart (seed 0, 2 rounds)",
        f"completed after round 2; results: {out}",
        f"fedflex {__import__('fedflex').__version__}: resuming quickstart (seed 0, 3 rounds)",
        f"completed after round 3; results: {out}",
    ]
    # and the run records the commit it was given, not the one of the folder it runs from
    provenance = json.loads((out / "summary.json").read_text())["provenance"]
    assert (provenance["git_commit"], provenance["git_dirty"]) == ("0123abcd", True)


def _simulation_grid(num_nodes: int):
    """fedflex's in-process grid dressed as Flower's simulation grid (``InMemoryGrid``:
    what ``flwr run`` on a simulation federation hands the ServerApp)."""
    from types import SimpleNamespace

    from fedflex.clients.client_app import app as client_app
    from fedflex.launch.local_grid import LocalGrid

    class InMemoryGrid(LocalGrid):
        def __init__(self) -> None:
            super().__init__(client_app, num_nodes)
            self.state = SimpleNamespace(nodes=dict.fromkeys(self.registration_order()))  # registration order

    return InMemoryGrid()


def _train_messages(grid) -> list:
    return [m for m in grid.sent if m.metadata.message_type == "train"]


@pytest.mark.parametrize("vectorize", ["on", "off"])
def test_flwr_run_on_a_simulation_trains_each_round_in_one_cohort_message_per_worker(tmp_path, vectorize):
    # Prepare: 8 SuperNodes, 6 sampled a round (no churn), workers=2
    from fedflex.clients.client_app import app as client_app
    from fedflex.launch.local_grid import LocalGrid

    overrides = "num_clients=8 rounds=2 churn.kind=none dataset.samples_per_client=40 output.plots=false"
    overrides += f" strategy.sampler.clients_per_round=6 simulation.vectorize={vectorize}"
    grid = _simulation_grid(8)
    # Execute: under flwr run, and the same scenario on a grid that is no simulation's
    _flwr_run(
        grid,
        {"scenario": "scenarios/quickstart.yaml", "overrides": overrides, "out": str(tmp_path / "a"), "workers": 2},
    )
    plain = LocalGrid(client_app, 8)
    _flwr_run(plain, {"scenario": "scenarios/quickstart.yaml", "overrides": overrides, "out": str(tmp_path / "b")})
    # Assert: 2 cohort messages a round naming 3 clients each, whether the workers train
    # them batched ("on") or one after another ("off"); the plain grid gets one message
    # per client; the same clients train the same examples, to the same accuracy (float
    # rounding apart: "off" bit for bit)
    sent = _train_messages(grid)
    assert len(sent) == 2 * 2 and len(_train_messages(plain)) == 2 * 6
    packed = [json.loads(m.content["config"]["cohort-clients"]) for m in sent]
    assert [len(c) for c in packed] == [3, 3, 3, 3]
    assert [m.content["config"]["cohort-vectorize"] for m in sent] == [vectorize] * 4
    rows, ref = (read_metrics(tmp_path / d) for d in ("a", "b"))
    assert [(r["sampled"], r["num_examples"]) for r in rows] == [(r["sampled"], r["num_examples"]) for r in ref]
    assert [r["test_accuracy"] for r in rows] == pytest.approx([r["test_accuracy"] for r in ref], abs=1e-3)
    if vectorize == "off":
        assert [r["train_loss"] for r in rows] == [r["train_loss"] for r in ref]


def test_a_bad_workers_value_is_refused_in_one_line(tmp_path):
    overrides = "num_clients=4 rounds=1 dataset.samples_per_client=40 strategy.sampler.clients_per_round=2"
    run_config = {"scenario": "scenarios/quickstart.yaml", "overrides": overrides, "workers": "two"}
    with pytest.raises(RunConfigError, match=r"workers='two': must be a whole number"):
        _flwr_run(_simulation_grid(4), {**run_config, "out": str(tmp_path / "a")})
