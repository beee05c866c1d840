"""A run directory's run.log and provenance, and ``fedflex --version``."""

import json
import logging
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy
import pytest
import torch

import fedflex
from fedflex import runinfo
from fedflex.launch.cli import main

ROOT = Path(__file__).parents[2]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
TINY = [
    "rounds=2",
    "num_clients=6",
    "dataset.samples_per_client=40",
    "strategy.sampler.clients_per_round=3",
    "simulation.backend=local",
    "output.progress=off",
    "output.plots=false",
]


def test_run_log_copies_the_runs_log_lines_and_is_removed_after(tmp_path):
    # Prepare
    before = {name: list(logging.getLogger(name).handlers) for name in runinfo.RUN_LOGGERS}
    (tmp_path / "config.yaml").write_text("name: quickstart\n")  # the run got as far as its config

    # Execute
    with runinfo.run_log(tmp_path, "starting quickstart"):
        logging.getLogger("fedflex.something").warning("round %d: a warning", 3)
        logging.getLogger("fedflex.launch.observers").error("an error")
        logging.getLogger("flwr").warning("Flower says")
        logging.getLogger("elsewhere").warning("not the run's")
    logging.getLogger("fedflex.something").warning("after the run")

    # Assert: "<time> LEVEL name: message" lines, in order, only during the run
    lines = [line.split(" ", 2)[2] for line in (tmp_path / "run.log").read_text().splitlines()]
    assert lines == [
        "INFO fedflex.runinfo: starting quickstart",
        "WARNING fedflex.something: round 3: a warning",
        "ERROR fedflex.launch.observers: an error",
        "WARNING flwr: Flower says",
    ]
    assert {name: list(logging.getLogger(name).handlers) for name in runinfo.RUN_LOGGERS} == before


def test_a_run_that_wrote_no_config_leaves_no_run_log(tmp_path):
    # Execute: the run fails before config.yaml is written (a full disk, say)
    with pytest.raises(OSError):
        with runinfo.run_log(tmp_path, "starting"):
            logging.getLogger("fedflex.results").error("no space")
            raise OSError("No space left on device")
    # Assert: the directory is as empty as before, so the same --out can be used again
    assert list(tmp_path.iterdir()) == []


def test_a_resumed_run_appends_to_run_log(tmp_path):
    (tmp_path / "config.yaml").write_text("name: s\n")
    # Execute
    with runinfo.run_log(tmp_path, "starting"):
        pass
    with runinfo.run_log(tmp_path, "resuming"):
        pass

    # Assert
    lines = (tmp_path / "run.log").read_text().splitlines()
    assert [line.rsplit(": ", 1)[1] for line in lines] == ["starting", "resuming"]


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_a_run_directory_has_run_log_and_provenance(tmp_path, monkeypatch):
    # Prepare
    monkeypatch.setenv("FEDFLEX_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"

    # Execute
    fedflex.run(QUICKSTART, TINY, out=out)

    # Assert
    first = (out / "run.log").read_text().splitlines()[0]
    assert first.endswith(
        f"INFO fedflex.runinfo: fedflex {fedflex.__version__}: starting quickstart (seed 0, 2 rounds)"
    )
    info = json.loads((out / "summary.json").read_text())["provenance"]
    expected = {
        "fedflex": fedflex.__version__,
        "flwr": metadata.version("flwr"),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
        "device": f"cuda ({torch.cuda.get_device_name(0)})" if torch.cuda.is_available() else "cpu",
    }
    if (ROOT / ".git").exists():  # run from this checkout
        expected["git_commit"] = _git("rev-parse", "HEAD")
        expected["git_dirty"] = bool(_git("status", "--porcelain", "--untracked-files=no"))
    assert info == expected


def test_provenance_has_no_commit_outside_a_checkout(monkeypatch, tmp_path):
    # Prepare: fedflex as if installed from a wheel; a directory that is no git repository
    monkeypatch.setattr(runinfo, "checkout", lambda: None)

    # Execute
    info = runinfo.provenance("cpu")

    # Assert
    assert "git_commit" not in info and "git_dirty" not in info
    assert info["device"] == "cpu"
    assert runinfo.git_commit(tmp_path) is None


def test_provenance_has_no_commit_when_git_hangs(monkeypatch):
    # Prepare
    def slow(*args, **kwargs):
        raise subprocess.TimeoutExpired(args[0], kwargs.get("timeout"))

    monkeypatch.setattr(runinfo.subprocess, "run", slow)

    # Execute / Assert
    assert runinfo.git_commit(ROOT) is None


def test_version_flag_prints_the_version_and_exits_0(capsys):
    # Execute
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])

    # Assert
    line = capsys.readouterr().out.strip()
    assert exit_.value.code == 0
    assert line == runinfo.version_line()
    assert line.startswith(f"fedflex {fedflex.__version__}")


def test_version_flag_of_the_installed_command(tmp_path):
    # the console entry point, as a user runs it
    proc = subprocess.run(
        [sys.executable, "-m", "fedflex", "--version"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )
    assert proc.returncode == 0
    assert proc.stdout.startswith(f"fedflex {fedflex.__version__}")
