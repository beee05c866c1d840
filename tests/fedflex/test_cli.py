"""CLI contract: bad input exits 2 with one line naming the key, and writes nothing."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedflex.launch.cli import main

ROOT = Path(__file__).parents[2]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"


@pytest.mark.parametrize(
    "override, key",
    [
        ("client.lr=-1", "client.lr"),
        ("client.lrr=1", "client.lrr"),
        ("rounds=abc", "rounds"),
        ("churn.kind=x", "churn.kind"),
    ],
)
def test_bad_override_exits_2_with_one_line(tmp_path, capsys, override, key):
    out = tmp_path / "out"
    code = main(["run", str(QUICKSTART), override, "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1
    assert err.startswith(f"fedflex: config error: {key} = ")
    assert not out.exists()


def test_missing_scenario_file_exits_2(tmp_path, capsys):
    code = main(["run", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "o")])
    assert code == 2
    assert "no such file" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_non_empty_out_dir_is_refused(tmp_path, capsys):
    (tmp_path / "old.txt").write_text("results of another run")
    code = main(["run", str(QUICKSTART), "--out", str(tmp_path)])
    assert code == 2
    assert "not an empty directory" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.txt"]


def test_missing_data_exits_1_with_where_it_looked(tmp_path, capsys, monkeypatch):
    import fedflex.data as data

    monkeypatch.setattr(data, "DEBIAN_FMNIST_DIR", tmp_path / "no-debian")
    code = main(
        [
            "run",
            str(QUICKSTART),
            "dataset.name=fmnist",
            "partition.scheme=iid",
            "model.name=cnn-fmnist",
            f"dataset.root={tmp_path / 'empty'}",
            "dataset.download=false",
            "--out",
            str(tmp_path / "o"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 1
    assert str(tmp_path / "empty") in err
    assert not (tmp_path / "o").exists()


def test_process_exit_code_and_no_traceback(tmp_path):
    # the real console entry point, as a user runs it
    proc = subprocess.run(
        [sys.executable, "-m", "fedflex", "run", str(QUICKSTART), "strategy.sampler.clients_per_round=0"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "fedflex: config error: strategy.sampler.clients_per_round = 0: must be >= 1"
    ]
    assert not (tmp_path / "runs").exists()


def test_local_backend_runs_in_process_and_overrides_may_follow_out(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FEDFLEX_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "o"
    code = main(
        ["run", str(QUICKSTART), "--out", str(out), "simulation.backend=local", "rounds=2", "output.progress=off"]
    )
    assert code == 0
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2


def test_unknown_option_is_a_usage_error(tmp_path):
    with pytest.raises(SystemExit) as info:
        main(["run", str(QUICKSTART), "--bogus"])
    assert info.value.code == 2


def test_stop_at_accuracy_ends_after_the_first_round_that_reaches_it(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDFLEX_CACHE", str(tmp_path / "cache"))
    common = [str(QUICKSTART), "simulation.backend=local", "rounds=8", "output.progress=off", "output.plots=false"]
    assert main(["run", *common, "--out", str(tmp_path / "full")]) == 0
    full = [json.loads(line) for line in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    accs = [r["test_accuracy"] for r in full]
    # a target first reached mid-run (the run is seeded, so the stopped run repeats it)
    first = next(i for i in range(2, 7) if accs[i] > max(accs[:i]))
    target = accs[first]
    stopped = tmp_path / "stopped"
    args = [*common, f"evaluation.stop_at_accuracy={target}", "output.checkpoint_every=100", "--out", str(stopped)]
    assert main(["run", *args]) == 0
    rows = [json.loads(line) for line in (stopped / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == list(range(1, first + 2))
    assert [r["test_accuracy"] for r in rows] == accs[: first + 1]
    summary = json.loads((stopped / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["stopped_early"] is True
    assert summary["rounds"] == first + 1
    assert (stopped / "model.npz").is_file() and (stopped / "checkpoint.npz").is_file()
    assert "stopped_early" not in json.loads((tmp_path / "full" / "summary.json").read_text())


def test_a_command_run_inside_another_checkout_says_whose_code_runs(tmp_path, monkeypatch, capsys):
    # Prepare: a second fedflex checkout (its marker files), and this one
    other = tmp_path / "clone"
    (other / "fedflex").mkdir(parents=True)
    (other / "strategies").mkdir()
    (other / "fedflex" / "__init__.py").write_text("")
    (other / "pyproject.toml").write_text("")
    (other / "scenarios").mkdir()
    bad = ["run", str(Path(__file__).parents[2] / "scenarios" / "quickstart.yaml"), "rounds=0"]
    # Execute: a bad override (exit 2 at once) from inside the other checkout, then from this one
    monkeypatch.chdir(other / "scenarios")
    assert main(bad) == 2
    inside_other = capsys.readouterr().err
    monkeypatch.chdir(Path(__file__).parents[2])
    assert main(bad) == 2
    inside_this = capsys.readouterr().err
    # Assert: the warning names both folders, and only where they differ
    assert f"runs the code of {Path(__file__).parents[2]}, not of the checkout you are in ({other})" in inside_other
    assert "not of the checkout you are in" not in inside_this
