"""The Python API: fedflex.run / fedflex.load_run, configs built in code, a light import."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import fedflex
from fedflex.config import ChurnConfig, ConfigError, ScenarioConfig

ROOT = Path(__file__).parents[2]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
# a seconds-long quickstart: 6 clients of 40 examples, 3 per round, 2 rounds, no Ray
TINY = [
    "rounds=2",
    "num_clients=6",
    "dataset.samples_per_client=40",
    "strategy.sampler.clients_per_round=3",
    "simulation.backend=local",
    "output.progress=off",
]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An empty working directory; the partition cache elsewhere."""
    monkeypatch.setenv("FEDFLEX_CACHE", str(tmp_path / "cache"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def test_run_without_out_returns_rows_summary_and_model_and_writes_nothing(workdir):
    # Execute
    run = fedflex.run(QUICKSTART, TINY)

    # Assert: two rounds, the summary of a completed run, synthetic(1, 1)'s logreg: 60 features -> 10 classes
    assert [r["round"] for r in run.rows] == [1, 2]
    assert run.status == "completed"
    assert run.summary["rounds"] == 2
    assert run.summary["final_test_accuracy"] == run.rows[-1]["test_accuracy"]
    assert run.model["fc_out.weight"].shape == (10, 60)
    assert run.config["num_clients"] == 6
    assert run.out is None
    assert list(workdir.iterdir()) == []  # no runs/, no files


def test_a_run_kept_in_memory_equals_the_same_run_written_and_loaded_back(workdir):
    # Prepare
    in_memory = fedflex.run(QUICKSTART, TINY)

    # Execute
    written = fedflex.run(QUICKSTART, TINY, out="o")
    loaded = fedflex.load_run("o")

    # Assert: same seed, same rows and model; load_run reads what the run wrote
    assert written.out == Path("o")
    assert [r["test_accuracy"] for r in in_memory.rows] == [r["test_accuracy"] for r in loaded.rows]
    assert loaded.rows == [json.loads(line) for line in Path("o/metrics.jsonl").read_text().splitlines()]
    assert loaded.summary == json.loads(Path("o/summary.json").read_text())
    np.testing.assert_array_equal(loaded.model["fc_out.weight"], in_memory.model["fc_out.weight"])
    assert loaded.config["rounds"] == 2


def test_run_takes_a_config_built_in_code_and_a_dict(workdir):
    # Prepare: everything else at its defaults (synthetic data, logreg, FedAvg)
    cfg = ScenarioConfig(name="in-code", rounds=1, num_clients=4)
    cfg.dataset.samples_per_client = 40
    cfg.simulation.backend = "local"
    as_dict = {"name": "as-dict", "rounds": 1, "num_clients": 4, "simulation": {"backend": "local"}}

    # Execute
    from_cfg = fedflex.run(cfg)
    from_dict = fedflex.run(as_dict, ["dataset.samples_per_client=40"])

    # Assert
    assert from_cfg.summary["scenario"] == "in-code" and from_cfg.summary["rounds"] == 1
    assert from_dict.summary["scenario"] == "as-dict" and from_dict.summary["rounds"] == 1


def test_a_config_built_in_code_is_completed_at_construction():
    # Execute
    cfg = ScenarioConfig(churn=ChurnConfig(kind="markov"))

    # Assert: the Markov defaults of ChurnConfig's docstring, 5 clients per round (min(5, 20))
    assert cfg.churn.min_session_rounds == 5
    assert cfg.churn.change_threshold == 0.3
    assert cfg.strategy.sampler.clients_per_round == 5


@pytest.mark.parametrize(
    "kwargs, key, allowed",
    [
        ({"rounds": 0}, "rounds", "must be >= 1"),
        ({"rounds": "ten"}, "rounds", "must be a number"),
        ({"churn": ChurnConfig(kind="often")}, "churn.kind", "must be one of"),
    ],
)
def test_a_bad_value_in_code_raises_config_error_naming_the_key(kwargs, key, allowed):
    with pytest.raises(ConfigError) as err:
        ScenarioConfig(**kwargs)
    assert err.value.key == key
    assert allowed in err.value.allowed


def test_a_config_changed_after_construction_is_checked_again_by_run(workdir):
    # Prepare
    cfg = ScenarioConfig()
    cfg.client.lr = -1.0

    # Execute / Assert: refused before anything runs or is written
    with pytest.raises(ConfigError) as err:
        fedflex.run(cfg, out="o")
    assert err.value.key == "client.lr"
    assert not Path("o").exists()


def test_run_refuses_a_bad_override_and_a_used_out_dir_naming_them(workdir):
    # Prepare
    Path("used").mkdir()
    Path("used/old.txt").write_text("another run")

    # Execute / Assert
    with pytest.raises(ConfigError) as bad_key:
        fedflex.run(QUICKSTART, ["client.lrr=1"], out="o")
    with pytest.raises(ConfigError) as used:
        fedflex.run(QUICKSTART, TINY, out="used")
    assert bad_key.value.key == "client.lrr"
    assert used.value.key == "out" and "not an empty directory" in str(used.value)
    assert sorted(p.name for p in workdir.iterdir()) == ["used"]
    assert [p.name for p in Path("used").iterdir()] == ["old.txt"]


def test_trackers_without_out_are_refused(workdir):
    pytest.importorskip("tensorboard")
    with pytest.raises(ConfigError) as err:
        fedflex.run(QUICKSTART, [*TINY, "output.trackers=[tensorboard]"])
    assert err.value.key == "output.trackers"


def _python(code: str, cwd: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FEDFLEX_CACHE": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_import_fedflex_is_light(tmp_path):
    # Execute: what `import fedflex` loads, and the lazy names
    proc = _python(
        "import sys, fedflex\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'flwr')"
        " or m.startswith(('fedflex.launch', 'fedflex.strategies', 'fedflex.clients')))\n"
        "print(heavy)\n"
        "print(callable(fedflex.run), callable(fedflex.load_run), fedflex.ScenarioConfig.__name__)\n",
        tmp_path,
        tmp_path,
    )

    # Assert
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["[]", "True True ScenarioConfig"]


def test_run_works_from_a_directory_with_its_own_strategies_package(tmp_path):
    # Prepare: a user's project with a `strategies` package of its own, first on sys.path
    project = tmp_path / "project"
    (project / "strategies").mkdir(parents=True)
    (project / "strategies" / "__init__.py").write_text("raise ImportError('the user project strategies package')\n")
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(project)!r})
        import fedflex
        run = fedflex.run({str(QUICKSTART)!r}, {TINY!r})
        print(len(run.rows), run.status)
        """
    )

    # Execute
    proc = _python(code, project, tmp_path)

    # Assert
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-1] == "2 completed"


def test_compare_is_exported_as_the_study_function():
    # Execute
    import fedflex
    from fedflex.study.compare import compare

    # Assert: the table as data, from the package's top level
    assert fedflex.compare is compare
