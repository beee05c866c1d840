"""A run stopped on a federation continues there (``flwr run ... resume=DIR``) and ends
with the same model as an uninterrupted run (real Flower processes on loopback; the
nodes train deterministically: seeds from the scenario, the round and the client id).

Also: under ``flwr run`` a checkpoint is saved after every round by default, and
``fedflex deploy local --resume`` refuses what it cannot continue.
"""

from __future__ import annotations

import numpy as np
import pytest
from deploy_helpers import QUICKSTART, read_rows, tiny_overrides, wait_for

from fedflex.launch import cli
from fedflex.launch.server import CheckpointError, load_checkpoint

ROUNDS = 4


def _checkpoint_round(out):
    try:
        return load_checkpoint(out)["round"]
    except CheckpointError:
        return None


@pytest.mark.slow
def test_stopped_run_resumed_on_the_federation_ends_with_the_uninterrupted_model(tmp_path, federation):
    # Prepare: one federation; the reference run goes through uninterrupted
    fed = federation(2)
    fed.start()
    overrides = tiny_overrides(2, rounds=ROUNDS)  # no output.checkpoint_every: the default
    reference = fed.run(str(QUICKSTART), overrides, tmp_path / "reference", timeout=300)
    assert reference.ok, (reference.status, reference.details)

    # Execute: the same run, stopped once round 2 is checkpointed, then resumed
    out = tmp_path / "stopped"
    run_id = fed.submit(str(QUICKSTART), overrides, out)
    wait_for(lambda: (_checkpoint_round(out) or 0) >= 1, 180, "the checkpoint of round 1", fed)
    first_checkpoint = _checkpoint_round(out)
    wait_for(lambda: (_checkpoint_round(out) or 0) >= 2, 180, "the checkpoint of round 2", fed)
    fed.stop_run(run_id)
    wait_for(lambda: fed.run_status(run_id)[0].startswith("finished"), 60, "the stopped run's end", fed)
    stopped_at = _checkpoint_round(out)
    assert stopped_at < ROUNDS, "the run ended before it could be stopped: nothing to resume"
    resumed = fed.run("", out=out, resume=out, timeout=300)

    # Assert: a checkpoint after every round by default; the resumed run completes all
    # rounds once each, with the reference's accuracies and final model
    assert first_checkpoint == 1
    assert resumed.ok, (resumed.status, resumed.details)
    rows, ref_rows = read_rows(out), read_rows(tmp_path / "reference")
    assert [r["round"] for r in rows] == list(range(1, ROUNDS + 1))
    assert [r["test_accuracy"] for r in rows] == [r["test_accuracy"] for r in ref_rows]
    final, ref_final = np.load(out / "model.npz"), np.load(tmp_path / "reference" / "model.npz")
    assert sorted(final.files) == sorted(ref_final.files)
    for key in ref_final.files:
        assert np.array_equal(final[key], ref_final[key]), key
    print(f"stopped after round {stopped_at}; resumed run {resumed.wall_s:.0f} s, reference {reference.wall_s:.0f} s")


def test_deploy_resume_without_a_checkpoint_is_refused(tmp_path, capsys):
    (tmp_path / "r").mkdir()
    code = cli.main(["deploy", "local", "--resume", str(tmp_path / "r")])
    assert code == 2
    assert "no checkpoint.npz there" in capsys.readouterr().err


def test_deploy_resume_takes_no_scenario(tmp_path, capsys):
    code = cli.main(["deploy", "local", str(QUICKSTART), "--resume", str(tmp_path)])
    assert code == 2
    assert "--resume DIR takes no scenario" in capsys.readouterr().err
