"""Results you can trust (issue 45): a checkpoint belongs to its run, every I/O failure of
the results directory ends in one line, a stop always leaves a directory that resumes, and
the smaller items (``seeds: []``, divergence causes, ``run.log``'s history).

Each case is one of the issue's: checkpoints edited as a user would (``state.json``'s
``round``, another run's checkpoint, float64 weights), errnos injected into fedflex's
writers, a second Ctrl-C before the first checkpoint. A refused resume must leave every
file of the directory byte for byte as it was.
"""

from __future__ import annotations

import builtins
import errno
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import fedflex.atomic
import fedflex.results
from fedflex import interrupts
from fedflex.launch.cli import main
from fedflex.results import CHECKPOINT_FILE, summarize
from fedflex.statefile import read_state, write_state

ROOT = Path(__file__).parents[2]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
FAST = ["output.progress=off", "output.plots=false", "simulation.backend=local"]
# server momentum: a resumed run must restore the server state to end with the same model
STATEFUL = ["strategy.aggregator.name=fedavgm", "strategy.aggregator.fedavgm.momentum=0.5"]


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


#: the row fields that time a round: they differ from run to run
TIMING = ("wall_s", "sample_s", "train_s", "aggregate_s", "evaluate_s")


def _timeless(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def _same_model(a: Path, b: Path) -> bool:
    with np.load(a / "model.npz") as x, np.load(b / "model.npz") as y:
        return sorted(x.files) == sorted(y.files) and all(np.array_equal(x[k], y[k]) for k in x.files)


def _last_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err, err
    return err.splitlines()[-1]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def _edit_checkpoint(out: Path, edit) -> None:
    state = read_state(out / CHECKPOINT_FILE)
    edit(state)
    write_state(out / CHECKPOINT_FILE, state)


@pytest.fixture(autouse=True)
def _signals_restored():
    """A test that stops a run in-process leaves no handler or received signal behind."""
    yield
    interrupts.uninstall()
    interrupts.reset()


# ---------------------------------------------------------------------------- 1. a checkpoint belongs to its run
@pytest.fixture(scope="module")
def resumable(tmp_path_factory):
    """A 20-client run that stopped after round 4 of 8 (checkpoint after round 4), and a
    5-client run of the same scenario; each test works on a copy.
    """
    base = tmp_path_factory.mktemp("binding")
    out = base / "run"
    assert main(["run", str(QUICKSTART), *FAST, *STATEFUL, "rounds=4", "--out", str(out)]) == 0
    (out / "summary.json").unlink()  # stopped after its checkpoint, before the end
    (out / "model.npz").unlink()
    config = (out / "config.yaml").read_text()
    assert "\nrounds: 4\n" in config
    (out / "config.yaml").write_text(config.replace("\nrounds: 4\n", "\nrounds: 8\n"))
    other = base / "five"
    five = ["num_clients=5", "strategy.sampler.clients_per_round=2"]
    assert main(["run", str(QUICKSTART), *FAST, *STATEFUL, *five, "rounds=4", "--out", str(other)]) == 0
    return out, other


def _copy(resumable, tmp_path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(resumable[0], out)
    return out


def test_a_checkpoint_records_its_config_rows_and_model(resumable, tmp_path):
    out = _copy(resumable, tmp_path)
    binding = read_state(out / CHECKPOINT_FILE)["binding"]
    assert binding["rows"] == 4 and len(binding["rows_sha256"]) == 64
    assert binding["config"]["num_clients"] == 20 and "rounds" not in binding["config"]
    assert binding["model"] == [["fc_out.weight", [10, 60], "float32"], ["fc_out.bias", [10], "float32"]]


@pytest.mark.parametrize(
    "round_, says",
    [
        (5, "says round 5, but the 4 rows it covers end at round 4"),
        (99, "is of round 99, but config.yaml plans 8 rounds"),
        (-3, "its round -3 is not a round number"),
    ],
)
def test_an_edited_round_is_refused_and_nothing_is_touched(resumable, tmp_path, capsys, round_, says):
    # Prepare: state.json's round edited, as in the issue
    out = _copy(resumable, tmp_path)
    _edit_checkpoint(out, lambda s: s.update(round=round_))
    before = _files(out)
    capsys.readouterr()
    # Execute
    code = main(["run", "--resume", str(out)])
    # Assert: one line naming what differs, exit 2, every file as it was
    err = _one_line(capsys)
    assert code == 2 and says in err and "nothing was changed" in err, err
    assert _files(out) == before


def test_another_runs_checkpoint_is_refused_naming_what_differs(resumable, tmp_path, capsys):
    # Prepare: the 5-client run's checkpoint copied into the 20-client run
    out = _copy(resumable, tmp_path)
    shutil.copyfile(resumable[1] / CHECKPOINT_FILE, out / CHECKPOINT_FILE)
    before = _files(out)
    capsys.readouterr()
    # Execute
    code = main(["run", "--resume", str(out)])
    # Assert
    err = _one_line(capsys)
    assert code == 2 and "does not belong to the run" in err
    assert "num_clients = 20 (the checkpoint's run: 5)" in err
    assert _files(out) == before


def test_float64_weights_are_refused(resumable, tmp_path, capsys):
    out = _copy(resumable, tmp_path)

    def to_float64(state):
        arrays = state["strategy"]["global_arrays"]
        for key in list(arrays):
            arrays[key] = arrays[key].astype(np.float64)

    _edit_checkpoint(out, to_float64)
    before = _files(out)
    capsys.readouterr()
    code = main(["run", "--resume", str(out)])
    err = _one_line(capsys)
    assert code == 2 and "fc_out.weight is float64, not float32" in err
    assert _files(out) == before


def test_float64_weights_with_a_matching_record_are_refused_against_the_configs_model(resumable, tmp_path, capsys):
    # Prepare: weights and the checkpoint's own record of them edited alike
    out = _copy(resumable, tmp_path)

    def to_float64(state):
        arrays = state["strategy"]["global_arrays"]
        for key in list(arrays):
            arrays[key] = arrays[key].astype(np.float64)
        state["binding"]["model"] = [[name, shape, "float64"] for name, shape, _ in state["binding"]["model"]]

    _edit_checkpoint(out, to_float64)
    before = _files(out)
    capsys.readouterr()
    # Execute
    code = main(["run", "--resume", str(out)])
    # Assert: the model the config builds decides, before anything is written
    err = _one_line(capsys)
    assert code == 2 and "fc_out.weight is float64, not float32 (the model config.yaml builds)" in err
    assert _files(out) == before


def test_rows_that_are_not_the_checkpoints_are_refused(resumable, tmp_path, capsys):
    out = _copy(resumable, tmp_path)
    rows = (out / "metrics.jsonl").read_text().splitlines(keepends=True)
    rows[1] = rows[1].replace('"round": 2', '"round": 2, "edited": true')
    (out / "metrics.jsonl").write_text("".join(rows))
    before = _files(out)
    capsys.readouterr()
    code = main(["run", "--resume", str(out)])
    err = _one_line(capsys)
    assert code == 2 and "the first 4 rows of metrics.jsonl are not the rows it covers" in err
    assert _files(out) == before


def test_a_checkpoint_that_belongs_to_its_run_still_resumes(resumable, tmp_path, capsys):
    out = _copy(resumable, tmp_path)
    assert main(["run", "--resume", str(out)]) == 0, capsys.readouterr().err
    assert [r["round"] for r in _rows(out)] == list(range(1, 9))
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"


def test_rounds_in_which_every_reply_was_rejected_are_not_completed():
    from fedflex.results import rejected_rounds

    # Prepare: rounds 3 and 4 trained nothing, every reply rejected (float64 weights, say)
    ok = {"phase": "train", "session": 0, "online": [0, 1], "num_examples": 40, "rejected": [], "skipped": False}
    bad = {**ok, "num_examples": 0, "rejected": [[0, "wrong dtype"], [1, "wrong dtype"]]}
    rows = [{**ok, "round": 1}, {**ok, "round": 2}, {**bad, "round": 3}, {**bad, "round": 4}]
    # Execute
    summary = summarize(rows, {"status": "completed"})
    # Assert
    assert summary["status"] == "degraded" and summary["rejected_rounds"] == [3, 4]
    assert summary["degraded"] == rejected_rounds(rows)
    assert summary["degraded"].startswith("2 of 4 rounds trained nothing: every reply was rejected (first: round 3")
    assert summarize(rows[:2], {"status": "completed"})["status"] == "completed"


def test_a_run_whose_late_replies_are_all_rejected_says_so_and_exits_1(tmp_path, monkeypatch, capsys):
    # Prepare: from round 3 on every reply is rejected (5 replies a round, no churn)
    import fedflex.strategies.engine as engine

    real, calls = engine.check_reply, []

    def after_two_rounds(content, *args, **kwargs):
        calls.append(1)
        if len(calls) > 10:
            return None, "float64 arrays, not float32"
        return real(content, *args, **kwargs)

    monkeypatch.setattr(engine, "check_reply", after_two_rounds)
    out = tmp_path / "r"
    # Execute
    code = main(["run", str(QUICKSTART), *FAST, "churn.kind=none", "rounds=4", "--out", str(out)])
    # Assert
    line = _last_line(capsys)
    summary = json.loads((out / "summary.json").read_text())
    assert code == 1
    assert summary["status"] == "degraded" and summary["rejected_rounds"] == [3, 4]
    assert line.startswith("fedflex: the run did not complete: 2 of 4 rounds trained nothing")


# ---------------------------------------------------------------------------- 4. I/O failures of the results directory
class FailingDisk:
    """The results directory starts failing with ``errno`` when ``fails_at`` is written: a
    file whose name contains it, or "row N" (the N-th metrics row from now on); that write
    and every later one fail, as a file system remounted read-only, a dying disk or lost
    permissions do (the open itself fails for a read-only or forbidden directory).
    """

    def __init__(self, monkeypatch, fails_at: str, code: int, skip: int = 0) -> None:
        self.fails_at, self.code, self.failing, self.rows, self.skip = fails_at, code, False, 0, skip
        disk = self

        def fake_open(file, mode="r", *args, **kwargs):
            if any(m in mode for m in "wax") and disk.fails_at in Path(file).name:
                if disk.skip:
                    disk.skip -= 1
                else:
                    disk.failing = True
            if disk.failing and any(m in mode for m in "wax"):
                raise OSError(disk.code, os.strerror(disk.code), str(file))
            return builtins.open(file, mode, *args, **kwargs)

        class Os:
            def __getattr__(self, name):
                return getattr(os, name)

            def write(self, fd, data):
                disk.rows += 1
                if disk.fails_at == f"row {disk.rows}":
                    disk.failing = True
                if disk.failing:
                    raise OSError(disk.code, os.strerror(disk.code))
                return os.write(fd, data)

        monkeypatch.setattr(fedflex.atomic, "open", fake_open, raising=False)
        monkeypatch.setattr(fedflex.results, "open", fake_open, raising=False)
        monkeypatch.setattr(fedflex.results, "os", Os())

    def repair(self) -> None:
        self.fails_at, self.failing = "\0never", False


# a full disk or quota ended in one line before issue 45 too (test_rundir.py): here under --all
IO_ERRNOS = [
    "EROFS",
    "EIO",
    "EACCES",
    *(pytest.param(n, marks=pytest.mark.slow) for n in ("ENOSPC", "EDQUOT", "EFBIG")),
]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("io") / "full"
    assert (
        main(["run", str(QUICKSTART), *FAST, *STATEFUL, "rounds=3", "output.checkpoint_every=1", "--out", str(out)])
        == 0
    )
    return out


@pytest.mark.parametrize("name", IO_ERRNOS)
def test_an_io_error_at_a_checkpoint_ends_in_one_line_and_resumes(uninterrupted, tmp_path, monkeypatch, capsys, name):
    # Prepare: the directory fails at the second checkpoint (after round 2)
    code = getattr(errno, name)
    out = tmp_path / "r"
    disk = FailingDisk(monkeypatch, "checkpoint.npz", code, skip=1)
    capsys.readouterr()
    # Execute
    status = main(
        ["run", str(QUICKSTART), *FAST, *STATEFUL, "rounds=3", "output.checkpoint_every=1", "--out", str(out)]
    )
    # Assert: one line naming the error and a command that works; every file whole
    err = _one_line(capsys)
    assert status == 74, err
    assert f"cannot write the results in {out}: {os.strerror(code)}" in err
    assert f"continue with: fedflex run --resume {out}" in err
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.npz", "config.yaml", "metrics.jsonl", "run.log"]
    assert [r["round"] for r in _rows(out)] == [1, 2]
    assert read_state(out / CHECKPOINT_FILE)["round"] == 1
    # ... and once the directory works again, the command ends with the uninterrupted model
    disk.repair()
    assert main(["run", "--resume", str(out)]) == 0, capsys.readouterr().err
    assert _same_model(out, uninterrupted)
    assert [r["sampled"] for r in _rows(out)] == [r["sampled"] for r in _rows(uninterrupted)]


@pytest.mark.parametrize("name", ["EIO", pytest.param("EROFS", marks=pytest.mark.slow)])
def test_an_io_error_at_a_row_before_the_first_checkpoint_names_a_command_that_works(
    uninterrupted, tmp_path, monkeypatch, capsys, name
):
    # Prepare: no checkpoint yet (every 5 rounds) when the second row fails
    code = getattr(errno, name)
    out = tmp_path / "r"
    disk = FailingDisk(monkeypatch, "row 2", code)
    args = ["run", str(QUICKSTART), *FAST, *STATEFUL, "rounds=3", "output.checkpoint_every=5", "--out", str(out)]
    capsys.readouterr()
    # Execute
    status = main(args)
    # Assert: the hint's command works (the lock refuses the same --out: it is not empty)
    err = _one_line(capsys)
    assert status == 74 and f"start it over in place with: fedflex run --resume {out}" in err, err
    assert [r["round"] for r in _rows(out)] == [1] and not (out / CHECKPOINT_FILE).exists()
    disk.repair()
    assert main(args) == 2  # the original command: --out is not empty
    assert main(["run", "--resume", str(out)]) == 0, capsys.readouterr().err
    assert _same_model(out, uninterrupted)
    assert [r["round"] for r in _rows(out)] == [1, 2, 3]


def test_a_read_only_directory_from_the_start_ends_in_one_line(tmp_path, monkeypatch, capsys):
    out = tmp_path / "a" / "r"
    FailingDisk(monkeypatch, "config.yaml", errno.EROFS)
    code = main(["run", str(QUICKSTART), *FAST, "rounds=2", "--out", str(out)])
    err = _one_line(capsys)
    assert code == 74 and "Read-only file system" in err and "nothing can be resumed" in err
    assert not (tmp_path / "a").exists()


# ---------------------------------------------------------------------------- 6. a stop leaves a directory that resumes
def test_a_second_signal_writes_the_last_round_boundary_first(tmp_path, monkeypatch, capsys):
    # Prepare: a run that keeps no checkpoint (checkpoint_every 0) stopped at once by a
    # second signal in its third round: os._exit is replaced to see what it leaves
    out = tmp_path / "r"
    exits = []

    class Exit(BaseException):
        pass

    def fake_exit(code):
        exits.append(code)
        raise Exit

    monkeypatch.setattr(interrupts.os, "_exit", fake_exit)
    real_log = fedflex.results.RunRecorder.log_round

    def log_round(self, row):
        real_log(self, row)
        if row["round"] == 2:  # the second signal comes as round 3 runs: the handler, twice
            interrupts._handler(signal.SIGINT, None)
            interrupts._handler(signal.SIGINT, None)

    monkeypatch.setattr(fedflex.results.RunRecorder, "log_round", log_round)
    # Execute
    with pytest.raises(Exit):
        main(["run", str(QUICKSTART), *FAST, *STATEFUL, "rounds=4", "output.checkpoint_every=0", "--out", str(out)])
    # Assert: the checkpoint of round 1 (round 2's row was written, its boundary not yet
    # reached), the exit line says how to continue, and so does run.log
    err = capsys.readouterr().err
    assert exits == [130]
    assert f"SIGINT again: exiting now; checkpoint of round 1 written: continue with: fedflex run --resume {out}" in err
    assert read_state(out / CHECKPOINT_FILE)["round"] == 1
    assert "SIGINT again: exiting now; checkpoint of round 1 written" in (out / "run.log").read_text()
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_a_run_that_wrote_no_checkpoint_resumes_from_the_start(tmp_path, capsys):
    # Prepare: the uninterrupted run, and the same run stopped after 2 rows without a
    # checkpoint (as a kill before the first one leaves it)
    full, out = tmp_path / "full", tmp_path / "r"
    args = [*FAST, *STATEFUL, "rounds=3"]
    assert main(["run", str(QUICKSTART), *args, "--out", str(full)]) == 0
    assert main(["run", str(QUICKSTART), *args, "rounds=2", "output.checkpoint_every=0", "--out", str(out)]) == 0
    for name in ("summary.json", "model.npz"):
        (out / name).unlink()
    (out / "config.yaml").write_text((out / "config.yaml").read_text().replace("\nrounds: 2\n", "\nrounds: 3\n"))
    assert not (out / CHECKPOINT_FILE).exists()
    capsys.readouterr()
    # Execute
    code = main(["run", "--resume", str(out)])
    # Assert: run again in place, from round 1, to the uninterrupted run's model
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"resuming {out} from the start: it wrote no checkpoint (its 2 rows run again)" in err
    assert _same_model(out, full)
    assert _timeless(_rows(out)) == _timeless(_rows(full))


def test_a_sweep_member_stopped_at_once_after_its_snapshot_is_resumed_not_rerun(tmp_path):
    from fedflex.study.sweep import Ended, SweepRunner, _Running, plan

    # Prepare: a one-member sweep whose member a second Ctrl-C ended (exit 130): rows and
    # the checkpoint the second signal wrote, no summary.json
    sweep = plan(QUICKSTART, [*FAST, "rounds=6"], {}, [0], tmp_path / "sweep")
    member = sweep.members[0]
    run_dir = sweep.out / member.name
    assert main(["run", str(QUICKSTART), *FAST, "rounds=2", "--out", str(run_dir)]) == 0
    (run_dir / "summary.json").unlink()
    said: list[str] = []
    runner = SweepRunner(sweep, say=said.append, executor=object())
    runner.signal = signal.SIGINT
    job = _Running(member, 1, "run", handle=None, slot=0, started=time.monotonic())
    # Execute
    runner._finish(job, Ended(130))
    todo = runner._todo()
    # Assert: not failed; the next invocation resumes it
    assert runner.records[member.name]["status"] == "incomplete"
    assert "resumes from its checkpoint when the sweep runs again" in said[-1]
    assert [(m.name, action) for m, _, action in todo] == [(member.name, "resume")]


@pytest.mark.slow
def test_a_double_ctrl_c_before_the_first_checkpoint_leaves_a_run_that_resumes(tmp_path):
    # Prepare: the uninterrupted run; then the same run in a process of its own
    slow = [*FAST, *STATEFUL, "rounds=6", "dataset.samples_per_client=3000"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FEDFLEX_CACHE": str(tmp_path / "cache")}
    full, out = tmp_path / "full", tmp_path / "r"
    cmd = [sys.executable, "-m", "fedflex", "run", str(QUICKSTART), *slow]
    assert subprocess.run([*cmd, "--out", str(full)], cwd=ROOT, env=env, capture_output=True).returncode == 0
    proc = subprocess.Popen([*cmd, "--out", str(out)], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        metrics = out / "metrics.jsonl"
        deadline = time.time() + 300
        while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2):
            assert time.time() < deadline and proc.poll() is None, "no 2 rows"
            time.sleep(0.02)
        # Execute: Ctrl-C, and again once the first one is seen
        proc.send_signal(signal.SIGINT)
        first = ""
        while "stopping after the round in flight" not in first:
            line = proc.stderr.readline()
            assert line, "the run ended before it saw the first signal"
            first += line
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    # Assert: exit 130, a checkpoint of a round boundary; --resume ends with the uninterrupted model
    assert proc.returncode == 130, err
    assert "continue with: fedflex run --resume" in err and "Traceback" not in first + err
    assert read_state(out / CHECKPOINT_FILE)["round"] >= 1
    resumed = subprocess.run(
        [sys.executable, "-m", "fedflex", "run", "--resume", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert _same_model(out, full)
    assert [r["round"] for r in _rows(out)] == list(range(1, 7))


# ---------------------------------------------------------------------------- 7. smaller
def test_a_study_with_no_seeds_is_refused_in_one_line(tmp_path, capsys):
    study = tmp_path / "s.yaml"
    study.write_text(f"scenario: {QUICKSTART}\noverrides: {{rounds: 2}}\nseeds: []\n")
    code = main(["sweep", str(study), "--out", str(tmp_path / "out"), "--dry-run"])
    err = _one_line(capsys)
    assert code == 2 and "seeds: [] names no seed" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "overrides, first",
    [
        (
            ["strategy.aggregator.server_lr=1e300"],
            "the server step: strategy.aggregator.name = fedavg, server_lr = 1e+300",
        ),
        (["model.name=mlp", "client.lr=1e6"], "client.lr = 1e+06 too large for this model"),
    ],
    ids=["server-step", "client-lr"],
)
def test_a_diverged_run_names_the_cause_its_evidence_points_to_first(tmp_path, capsys, caplog, overrides, first):
    out = tmp_path / "r"
    with caplog.at_level(logging.ERROR, logger="fedflex.launch.observers"):
        code = main(["run", str(QUICKSTART), *FAST, "rounds=20", *overrides, "--out", str(out)])
    summary = json.loads((out / "summary.json").read_text())
    assert code == 3 and summary["status"] == "diverged"
    assert summary["divergence_causes"][0].startswith(first), summary
    assert f"likely causes, most likely first: {first}" in caplog.text
    assert f"likely: {first}" in _last_line(capsys)


def test_run_log_keeps_the_history_of_a_stopped_and_resumed_run(tmp_path, monkeypatch, capsys):
    # Prepare: a run that a signal stops after round 2 (its handler, called in-process)
    out = tmp_path / "r"
    real_log = fedflex.results.RunRecorder.log_round

    def log_round(self, row):
        real_log(self, row)
        if row["round"] == 2 and interrupts.installed():
            interrupts._handler(signal.SIGINT, None)

    monkeypatch.setattr(fedflex.results.RunRecorder, "log_round", log_round)
    assert main(["run", str(QUICKSTART), *FAST, "rounds=4", "--out", str(out)]) == 130
    monkeypatch.setattr(fedflex.results.RunRecorder, "log_round", real_log)
    interrupts.uninstall()
    # Execute
    assert main(["run", "--resume", str(out)]) == 0, capsys.readouterr().err
    # Assert: starting, the stop and its reason, resuming, the end, in that order
    log = (out / "run.log").read_text()
    marks = [
        "starting quickstart",
        f"interrupted by SIGINT after round 2; continue with: fedflex run --resume {out}",
        "resuming quickstart",
        f"results: {out}",
    ]
    where = [log.find(m) for m in marks]
    assert all(w >= 0 for w in where) and where == sorted(where), log
