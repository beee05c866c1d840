"""The results directory under hard faults (issue 26): one run per directory (a lock for
the run's lifetime), and a full disk (every file whole or absent, one line, exit 74,
``--resume`` finishes the run).

A full disk is simulated: :class:`FullDisk` makes the writes of fedflex.results and
fedflex.atomic (config.yaml, metrics rows, checkpoint, model, summary.json) fail with
``ENOSPC`` from a chosen file on, after writing part of what they were given, as a
real full disk does.
"""

from __future__ import annotations

import builtins
import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fedflex.atomic
import fedflex.results
from fedflex.launch.cli import main
from fedflex.results import RunRecorder, read_metrics
from fedflex.rundir import LOCK_FILE, RunDirError, RunDirLock

ROOT = Path(__file__).parents[2]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
FAST = ["output.progress=off", "output.plots=false", "simulation.backend=local", "rounds=3"]
# server momentum: the resumed run must restore the server state to end with the same model
STATEFUL = ["strategy.aggregator.name=fedavgm", "strategy.aggregator.fedavgm.momentum=0.5", "output.checkpoint_every=1"]


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _same_model(a: Path, b: Path) -> bool:
    with np.load(a / "model.npz") as x, np.load(b / "model.npz") as y:
        return sorted(x.files) == sorted(y.files) and all(np.array_equal(x[k], y[k]) for k in x.files)


# ---------------------------------------------------------------------------- full disk
class FullDisk:
    """The disk fills up when ``fills_at`` is written: a file whose name contains it
    ("config.yaml", "checkpoint.npz", "model.npz", "summary.json") or "row N" (the N-th
    metrics row written from now on). That write and every later one write half of their
    bytes and raise ``OSError(ENOSPC)``; :meth:`free` makes room again."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fills_at: str) -> None:
        self.fills_at, self.full, self.rows = fills_at, False, 0
        disk = self

        class Budgeted:
            def __init__(self, fh, name):
                self._fh, self._name = fh, name

            def write(self, data):
                if not disk.full:
                    return self._fh.write(data)
                self._fh.write(bytes(data)[: len(data) // 2])
                self._fh.flush()
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self._name)

            def __getattr__(self, name):
                return getattr(self._fh, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self._fh.close()

        def fake_open(file, mode="r", *args, **kwargs):
            fh = builtins.open(file, mode, *args, **kwargs)
            if not any(m in mode for m in "wax"):
                return fh
            if disk.fills_at in Path(file).name:
                disk.full = True
            return Budgeted(fh, str(file))

        class Os:
            def __getattr__(self, name):
                return getattr(os, name)

            def write(self, fd, data):
                disk.rows += 1
                if disk.fills_at == f"row {disk.rows}":
                    disk.full = True
                if not disk.full:
                    return os.write(fd, data)
                os.write(fd, bytes(data)[: len(data) // 2])
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(fedflex.atomic, "open", fake_open, raising=False)  # whole files
        monkeypatch.setattr(fedflex.results, "os", Os())

    def free(self) -> None:
        self.fills_at, self.full = "\0never", False


def test_a_row_that_does_not_fit_is_cut_off_whole(tmp_path, monkeypatch):
    # Prepare: one row written; the disk fills up while the second is written
    recorder = RunRecorder(tmp_path, "name: x\n")
    recorder.log_round({"round": 1, "test_accuracy": 0.5})
    FullDisk(monkeypatch, fills_at="row 1")
    # Execute
    with pytest.raises(OSError) as caught:
        recorder.log_round({"round": 2, "test_accuracy": 0.6})
    # Assert: the file holds the first row and nothing of the second
    assert caught.value.errno == errno.ENOSPC
    assert (tmp_path / "metrics.jsonl").read_text() == '{"round": 1, "test_accuracy": 0.5}\n'
    assert recorder.rows == [{"round": 1, "test_accuracy": 0.5}]


def test_a_torn_last_row_is_left_out_with_a_warning(tmp_path, caplog):
    # Prepare: a run killed while writing its third row
    (tmp_path / "metrics.jsonl").write_text('{"round": 1}\n{"round": 2}\n{"round": 3, "samp')
    # Execute
    rows = read_metrics(tmp_path)
    # Assert
    assert rows == [{"round": 1}, {"round": 2}]
    assert "ignoring a torn last line" in caplog.text


def test_a_bad_row_before_the_last_one_is_an_error_naming_its_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"round": 1}\n{"round": 2, "samp\n{"round": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl, line 2: not a JSON row"):
        read_metrics(tmp_path)


def test_resuming_repairs_a_torn_last_row(tmp_path):
    # Prepare
    (tmp_path / "metrics.jsonl").write_text('{"round": 1}\n{"round": 2}\n{"round": 3, "samp')
    # Execute: a resumed run's recorder, checkpoint after round 2
    recorder = RunRecorder(tmp_path, "name: x\n", keep_until=2)
    recorder.log_round({"round": 3})
    recorder.close()
    # Assert: whole rows only, the torn one gone
    assert (tmp_path / "metrics.jsonl").read_text() == '{"round": 1}\n{"round": 2}\n{"round": 3}\n'


def test_a_run_whose_config_does_not_fit_leaves_nothing_behind(tmp_path, monkeypatch, capsys):
    # Prepare
    out = tmp_path / "a" / "run"
    disk = FullDisk(monkeypatch, fills_at="config.yaml")
    # Execute
    code = main(["run", str(QUICKSTART), *FAST, "--out", str(out)])
    err = _one_line_error(capsys)
    # Assert: one line, exit 74; no directory, so the same --out works once there is room
    assert code == 74
    assert f"cannot write the results in {out}: No space left on device" in err
    assert "nothing can be resumed" in err
    assert not (tmp_path / "a").exists()
    disk.free()
    assert main(["run", str(QUICKSTART), *FAST, "--out", str(out)]) == 0, capsys.readouterr().err


def test_a_run_that_fills_the_disk_mid_way_is_resumed_to_the_uninterrupted_model(tmp_path, monkeypatch, capsys):
    # Prepare: the uninterrupted run; then the same run on a disk that fills up at row 3
    assert main(["run", str(QUICKSTART), *FAST, *STATEFUL, "--out", str(tmp_path / "full")]) == 0
    capsys.readouterr()
    out = tmp_path / "r"
    disk = FullDisk(monkeypatch, fills_at="row 3")
    # Execute
    code = main(["run", str(QUICKSTART), *FAST, *STATEFUL, "--out", str(out)])
    err = _one_line_error(capsys)
    # Assert: one line, rows 1-2 whole, no model, a checkpoint after round 2
    assert code == 74 and f"continue with: fedflex run --resume {out}" in err
    assert [r["round"] for r in _rows(out)] == [1, 2]
    assert not (out / "model.npz").exists() and not (out / "summary.json").exists()
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.npz", "config.yaml", "metrics.jsonl", "run.log"]
    # ... and once there is room, --resume ends with the uninterrupted run's model and rows
    disk.free()
    assert main(["run", "--resume", str(out)]) == 0
    assert _same_model(out, tmp_path / "full")
    assert [r["sampled"] for r in _rows(out)] == [r["sampled"] for r in _rows(tmp_path / "full")]
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"


@pytest.mark.parametrize("fills_at", ["model.npz", "summary.json"])
def test_resume_writes_the_model_and_summary_that_did_not_fit(tmp_path, monkeypatch, capsys, fills_at):
    # Prepare: every round ran and was checkpointed; the disk filled up at the last files
    out = tmp_path / "r"
    disk = FullDisk(monkeypatch, fills_at=fills_at)
    assert main(["run", str(QUICKSTART), *FAST, *STATEFUL, "--out", str(out)]) == 74
    assert not (out / "summary.json").exists()
    capsys.readouterr()
    disk.free()
    # Execute
    code = main(["run", "--resume", str(out)])
    # Assert: no round run again, the missing files written
    assert code == 0
    assert "all rounds ran; writing the final model and summary.json" in capsys.readouterr().err
    assert [r["round"] for r in _rows(out)] == [1, 2, 3]
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["status"], summary["last_round"]) == ("completed", 3)
    assert (out / "model.npz").is_file()
    assert main(["run", "--resume", str(out)]) == 2  # and now it is finished


# ---------------------------------------------------------------------------- the lock
def test_a_run_on_a_directory_another_run_holds_is_refused_naming_its_pid(tmp_path, capsys):
    # Prepare: another run holds the (still empty) directory
    out = tmp_path / "r"
    with RunDirLock(out, new=True):
        # Execute
        code = main(["run", str(QUICKSTART), *FAST, "--out", str(out)])
        err = _one_line_error(capsys)
    # Assert: refused, nothing written; the lock file goes with the holder
    assert code == 2
    assert f"--out {out} is in use by another fedflex run (pid {os.getpid()}: this process" in err
    assert not out.exists()


def test_resume_of_a_directory_another_run_holds_is_refused(tmp_path, capsys):
    # Prepare: a resumable run (its checkpoint is of round 2 of 3)
    out = tmp_path / "r"
    assert main(["run", str(QUICKSTART), *FAST, "rounds=2", "--out", str(out)]) == 0
    (out / "config.yaml").write_text((out / "config.yaml").read_text().replace("rounds: 2", "rounds: 3"))
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with RunDirLock(out, new=False):
        # Execute
        code = main(["run", "--resume", str(out)])
        err = _one_line_error(capsys)
    # Assert
    assert code == 2 and f"--resume {out} is in use by another fedflex run (pid {os.getpid()}: this process" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_finished_run_leaves_no_lock_file(tmp_path):
    out = tmp_path / "r"
    assert main(["run", str(QUICKSTART), *FAST, "rounds=1", "--out", str(out)]) == 0
    assert not (out / LOCK_FILE).exists()


def test_the_lock_of_a_killed_run_is_gone_with_it(tmp_path):
    # Prepare: a process holds the lock
    out = tmp_path / "r"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from fedflex.rundir import RunDirLock; RunDirLock({str(out)!r}, new=True).acquire(); "
            "print('locked', flush=True); import time; time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(RunDirError, match=rf"in use by another fedflex run \(pid {holder.pid}: "):
        RunDirLock(out, new=True).acquire()
    # Execute
    holder.kill()
    holder.wait()
    # Assert: its lock file stays, but the lock went with the process
    assert (out / LOCK_FILE).is_file()
    lock = RunDirLock(out, new=True).acquire()
    assert (out / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    lock.release()


def test_a_new_run_still_refuses_a_directory_with_results(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"round": 1}\n')
    with pytest.raises(RunDirError, match="exists and is not an empty directory"):
        RunDirLock(tmp_path, new=True).acquire()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


@pytest.mark.slow
def test_two_runs_started_together_on_one_out_one_is_refused(tmp_path):
    # Prepare
    out = tmp_path / "r"
    cmd = [sys.executable, "-m", "fedflex", "run", str(QUICKSTART), *FAST, "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FEDFLEX_CACHE": str(tmp_path / "cache")}
    # Execute
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = sorted((p.wait(timeout=600), p.stderr.read()) for p in procs)
    # Assert: one ran, the other was refused with one line (busy, or no longer empty)
    (ok, ok_err), (refused, refused_err) = results
    assert ok == 0 and f"results: {out}" in ok_err
    assert refused == 2 and len(refused_err.strip().splitlines()) == 1, refused_err
    assert "is in use by another fedflex run" in refused_err or "not an empty directory" in refused_err
    assert [r["round"] for r in _rows(out)] == [1, 2, 3]
    assert not (out / LOCK_FILE).exists()


def test_a_waiting_lock_gets_the_directory_once_the_holder_lets_go(tmp_path):
    # Prepare: a holder that ends 0.5 s from now (a stopped run's ServerApp still ending)
    out = tmp_path / "r"
    out.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from fedflex.rundir import RunDirLock; import time; "
            f"l = RunDirLock({str(out)!r}, new=False).acquire(); print('held', flush=True); time.sleep(0.5)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert holder.stdout.readline().strip() == "held"
    # Execute / Assert: refused at once without waiting, taken when waiting
    with pytest.raises(RunDirError, match="in use by another fedflex run"):
        RunDirLock(out, new=False).acquire()
    lock = RunDirLock(out, new=False, wait=30).acquire()
    assert holder.wait(timeout=30) == 0
    lock.release()
