"""fedflex sweep: planning, run states, CPU shares, and real sweeps that are interrupted,
resumed and left alone; study files with variants, a base and reference numbers."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedflex.config import ConfigError
from fedflex.launch.cli import main
from fedflex.loader import load_scenario, to_yaml
from fedflex.study import runs
from fedflex.study.sweep import (
    StudyError,
    check_existing,
    cpu_slots,
    member_name,
    parse_grid,
    plan,
    read_study,
    split_values,
)

ROOT = Path(__file__).parents[2]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
STUDY = ROOT / "scenarios" / "studies" / "quickstart_samplers.yaml"


def _summary(path, **body):
    path.mkdir(parents=True, exist_ok=True)
    (path / "summary.json").write_text(json.dumps(body))


# ---------------------------------------------------------------------------- planning
def test_grid_values_split_on_commas_outside_brackets():
    assert split_values("0.1,0.01") == ["0.1", "0.01"]
    assert split_values("[1,2],[3]") == ["[1,2]", "[3]"]
    assert parse_grid(["client.lr=0.1,0.01", "partition.alpha=0.3"]) == {
        "client.lr": ["0.1", "0.01"],
        "partition.alpha": ["0.3"],
    }


@pytest.mark.parametrize("item", ["client.lr", "client.lr=", "=1,2", "client.lr=0.1,"])
def test_a_malformed_grid_axis_is_refused(item):
    with pytest.raises(StudyError, match="expected key=value1,value2"):
        parse_grid([item])


def test_member_names_are_safe_directory_names():
    assert member_name([("strategy.sampler.name", "hics"), ("seed", "1")]) == "strategy.sampler.name=hics,seed=1"
    assert member_name([("dataset.root", "/data/x y"), ("seed", "0")]) == "dataset.root=_data_x_y,seed=0"
    long = member_name([("churn.sessions", "[" + ",".join(["[0,1,2]"] * 60) + "]"), ("seed", "0")])
    assert len(long) == 200 and "/" not in long


def test_plan_is_every_grid_point_times_every_seed_in_order(tmp_path):
    # Execute
    sweep = plan(QUICKSTART, ["rounds=2"], {"strategy.sampler.name": ["uniform", "hics"]}, [0, 1], tmp_path)
    # Assert
    assert [m.name for m in sweep.members] == [
        "strategy.sampler.name=uniform,seed=0",
        "strategy.sampler.name=uniform,seed=1",
        "strategy.sampler.name=hics,seed=0",
        "strategy.sampler.name=hics,seed=1",
    ]
    assert sweep.members[3].overrides == ["strategy.sampler.name=hics", "seed=1"]


def test_without_seeds_the_scenario_seed_is_the_one_seed(tmp_path):
    sweep = plan(QUICKSTART, ["seed=7"], {}, None, tmp_path)
    assert [m.name for m in sweep.members] == ["seed=7"]


def test_a_bad_grid_value_names_the_member_and_starts_nothing(tmp_path, capsys):
    # Execute
    code = main(["sweep", str(QUICKSTART), "--grid", "client.lr=0.1,-1", "--out", str(tmp_path / "s")])
    # Assert
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert err == "fedflex: config error: client.lr = -1.0: must be > 0 (in sweep member client.lr=-1,seed=0)"
    assert not (tmp_path / "s").exists()


def test_a_grid_over_the_seed_is_refused(tmp_path):
    with pytest.raises(StudyError, match="give the seeds with --seeds"):
        plan(QUICKSTART, [], {"seed": ["0", "1"]}, None, tmp_path)


def test_sweep_of_a_scenario_needs_out(capsys):
    assert main(["sweep", str(QUICKSTART), "--grid", "client.lr=0.1,0.2"]) == 2
    assert "sweep needs --out DIR" in capsys.readouterr().err


def test_the_shipped_study_file_plans_two_samplers_by_two_seeds(tmp_path):
    # Execute
    study = read_study(STUDY)
    sweep = plan(study["scenario"], study["overrides"], study["grid"], study["seeds"], tmp_path)
    # Assert
    assert study["scenario"] == QUICKSTART
    assert study["overrides"] == ["rounds=10", "simulation.backend=local"]
    assert len(sweep.members) == 4


def test_a_study_file_with_an_unknown_key_is_refused(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("scenario: x.yaml\ngrids: {}\n")
    with pytest.raises(StudyError, match="unknown key 'grids'"):
        read_study(path)


def test_study_keys_may_be_numbers_but_not_lists(tmp_path):
    # a variant named 0.1 is a study's usual lr axis; a scenario file refuses number keys
    path = tmp_path / "s.yaml"
    path.write_text("scenario: x.yaml\nvariants:\n  lr:\n    0.1: [client.lr=0.1]\n")
    assert read_study(path)["variants"] == {"lr": {"0.1": ["client.lr=0.1"]}}
    path.write_text("scenario: x.yaml\n[1, 2]: 3\n")
    with pytest.raises(ConfigError, match=r"a list as a key \(line 2 column 1\)"):
        read_study(path)


def test_a_member_directory_with_another_configuration_is_refused(tmp_path):
    # Prepare: the member's directory holds a 5-round run; the sweep asks for 3 rounds
    sweep = plan(QUICKSTART, ["rounds=3"], {}, [0], tmp_path)
    old = tmp_path / sweep.members[0].name
    old.mkdir()
    (old / "config.yaml").write_text(to_yaml(load_scenario(QUICKSTART, ["rounds=5"])))
    # Execute / Assert
    with pytest.raises(StudyError, match="holds a run of another configuration \\(rounds: 5 there, 3 planned\\)"):
        check_existing(sweep)


def test_an_option_added_after_the_run_reads_as_its_default(tmp_path):
    """A run made before an option existed has no such key in its config.yaml: it matches a
    sweep that plans the option's default, and not one that plans another value."""
    import yaml

    sweep = plan(QUICKSTART, ["rounds=3"], {}, [0], tmp_path)
    old = tmp_path / sweep.members[0].name
    old.mkdir()
    saved = yaml.safe_load(to_yaml(load_scenario(QUICKSTART, ["rounds=3"])))
    del saved["strategy"]["initializer"]["session_aware"]["switch_margin"]  # as before the option
    (old / "config.yaml").write_text(yaml.safe_dump(saved))
    check_existing(sweep)  # the default (null): no error
    other = plan(QUICKSTART, ["rounds=3", "strategy.initializer.session_aware.switch_margin=0.5"], {}, [0], tmp_path)
    with pytest.raises(StudyError, match="switch_margin: None there, 0.5 planned"):
        check_existing(other)


def test_execution_settings_do_not_make_another_configuration(tmp_path):
    # Prepare: the same run with other progress / CPU settings
    sweep = plan(QUICKSTART, ["rounds=3"], {}, [0], tmp_path)
    old = tmp_path / sweep.members[0].name
    old.mkdir()
    saved = load_scenario(QUICKSTART, ["rounds=3", "output.progress=lines", "simulation.num_cpus=0.5"])
    (old / "config.yaml").write_text(to_yaml(saved))
    # Execute / Assert: no error
    check_existing(sweep)


# ---------------------------------------------------------------------------- states and shares
@pytest.mark.parametrize(
    "status, state, finished, completed",
    [
        ("completed", "completed", True, True),
        ("diverged", "diverged", True, False),
        ("interrupted", "interrupted", False, False),
        ("failed", "failed", False, False),
    ],
)
def test_a_summary_alone_does_not_make_a_run_finished(tmp_path, status, state, finished, completed):
    _summary(tmp_path / "r", status=status)
    assert runs.run_state(tmp_path / "r") == state
    assert runs.is_finished(tmp_path / "r") is finished
    assert runs.is_completed(tmp_path / "r") is completed


def test_missing_and_killed_runs(tmp_path):
    assert runs.run_state(tmp_path / "nothing") == "missing"
    (tmp_path / "killed").mkdir()
    (tmp_path / "killed" / "metrics.jsonl").write_text('{"round": 1}\n')
    assert runs.run_state(tmp_path / "killed") == "incomplete"
    (tmp_path / "killed" / "summary.json").write_text("{trunc")
    assert runs.run_state(tmp_path / "killed") == "incomplete"


def test_cpu_shares_are_disjoint_and_wrap_when_jobs_exceed_cpus():
    assert cpu_slots(2, [0, 1, 2, 3]) == [[0, 1], [2, 3]]
    assert cpu_slots(3, [0, 1, 2, 3, 4, 5, 6]) == [[0, 1], [2, 3], [4, 5]]
    assert cpu_slots(3, [0, 1]) == [[0], [1], [0]]


def test_the_runner_bounds_ray_to_the_process_affinity(monkeypatch):
    from fedflex.launch import runner

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {4, 5, 6}, raising=False)
    cfg = load_scenario(QUICKSTART)
    assert runner.backend_config(cfg)["init_args"]["num_cpus"] == 3
    assert runner.ray_workers(cfg) == 3


# ---------------------------------------------------------------------------- variants, base, reference
def _study(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


VARIANTS = f"""scenario: {QUICKSTART}
overrides: {{rounds: 2}}
variants:
  method:
    plain: {{strategy.aggregator.name: fedavg}}
    momentum: {{strategy.aggregator.name: fedavgm, strategy.aggregator.fedavgm.momentum: 0.7}}
grid:
  method: [plain, momentum]
  client.lr: [0.1]
seeds: [3]
"""


def test_a_variant_axis_stands_for_its_overrides_and_names_the_directory(tmp_path):
    # Prepare
    study = read_study(_study(tmp_path, "s.yaml", VARIANTS))
    # Execute
    sweep = plan(study["scenario"], study["overrides"], study["grid"], study["seeds"], tmp_path, 1, study["variants"])
    # Assert: names carry the variant's name, overrides its settings
    assert [m.name for m in sweep.members] == [
        "method=plain,client.lr=0.1,seed=3",
        "method=momentum,client.lr=0.1,seed=3",
    ]
    assert sweep.members[1].overrides == [
        "strategy.aggregator.name=fedavgm",
        "strategy.aggregator.fedavgm.momentum=0.7",
        "client.lr=0.1",
        "seed=3",
    ]
    assert dict(sweep.members[1].point) == {"method": "momentum", "client.lr": "0.1", "seed": "3"}


def test_a_scenario_warning_is_said_once_however_many_members_repeat_it(tmp_path, caplog):
    # Prepare: an option the members' local rule does not read (fedprox's mu with sgd), so
    # every load of every member's config warns; planning loads each several times
    text = VARIANTS.replace("{rounds: 2}", "{rounds: 2, strategy.local_rule.fedprox.mu: 0.5}")
    path = _study(tmp_path, "s.yaml", text)
    # Execute
    code = main(["sweep", str(path), "--dry-run", "--out", str(tmp_path / "o")])
    # Assert: 2 members, one warning line
    assert code == 0
    said = [r.getMessage() for r in caplog.records if "does nothing for" in r.getMessage()]
    assert said == ["strategy.local_rule.fedprox.mu=0.5 does nothing for local rule sgd (read by: fedprox)"]


def test_the_command_line_grid_picks_among_the_variants_and_refuses_an_unknown_one(tmp_path, capsys):
    # Prepare
    path = _study(tmp_path, "s.yaml", VARIANTS)
    # Execute
    code = main(["sweep", str(path), "--grid", "method=momentum", "--dry-run", "--out", str(tmp_path / "o")])
    # Assert: one member, printed with its overrides; nothing started
    out = capsys.readouterr().out
    assert code == 0 and "1 runs (1 grid point x 1 seed)" in out
    assert "method=momentum,client.lr=0.1,seed=3: strategy.aggregator.name=fedavgm" in out
    assert not (tmp_path / "o").exists()
    # Execute / Assert: a name that is no variant
    assert main(["sweep", str(path), "--grid", "method=nesterov", "--dry-run"]) == 2
    assert capsys.readouterr().err.strip() == (
        "fedflex: --grid method=nesterov: not a variant of method; there are: plain, momentum"
    )


def test_a_variant_axis_named_like_a_config_key_is_refused(tmp_path):
    with pytest.raises(StudyError, match="axis 'rounds' is a config key"):
        plan(QUICKSTART, [], {"rounds": ["short"]}, None, tmp_path, 1, {"rounds": {"short": ["rounds=2"]}})


def test_a_study_extends_its_base(tmp_path):
    # Prepare: the base's variants and overrides, a second variant and another grid on top
    _study(tmp_path, "base.yaml", VARIANTS)
    child = _study(
        tmp_path,
        "child.yaml",
        "base: base.yaml\noverrides: [client.lr=0.2]\n"
        "variants:\n  method:\n    prox: {strategy.local_rule.name: fedprox}\n"
        "grid:\n  method: [plain, prox]\n",
    )
    # Execute
    study = read_study(child)
    # Assert: scenario and seeds from the base; overrides appended; variants merged; the
    # grid axis replaced, the other kept
    assert study["scenario"] == QUICKSTART and study["seeds"] == [3]
    assert study["overrides"] == ["rounds=2", "client.lr=0.2"]
    assert list(study["variants"]["method"]) == ["plain", "momentum", "prox"]
    assert study["grid"] == {"method": ["plain", "prox"], "client.lr": ["0.1"]}


def test_a_reference_naming_an_unknown_variant_is_refused(tmp_path):
    text = VARIANTS + "reference:\n  source: x\n  groups:\n    method=nesterov: {paper: 1}\n"
    with pytest.raises(StudyError, match="'nesterov' is not a variant of method; there are: plain, momentum"):
        read_study(_study(tmp_path, "s.yaml", text))


# ---------------------------------------------------------------------------- real sweeps
def _env(tmp_path):
    return {**os.environ, "PYTHONPATH": str(ROOT), "FEDFLEX_CACHE": str(tmp_path / "cache")}


SWEEP = [
    "simulation.backend=local",
    "rounds=5",
    "output.plots=false",
    "dataset.samples_per_client=2000",
    "--grid",
    "strategy.sampler.name=uniform,hics",
    "--seeds",
    "0,1",
    "--jobs",
    "2",
]


def _sweep(tmp_path, out):
    return [sys.executable, "-m", "fedflex", "sweep", str(QUICKSTART), *SWEEP, "--out", str(out)]


def _index(out):
    return {m["name"]: m for m in json.loads((out / "sweep.json").read_text())["members"]}


@pytest.mark.slow
def test_an_interrupted_sweep_resumes_its_members_and_a_finished_one_starts_nothing(tmp_path):
    # Prepare: a sweep going; Ctrl-C once its first member has two rounds
    out = tmp_path / "sweep"
    proc = subprocess.Popen(
        _sweep(tmp_path, out), cwd=ROOT, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    first = out / "strategy.sampler.name=uniform,seed=0" / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if first.is_file() and len(first.read_text().splitlines()) >= 2:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    stdout, _ = proc.communicate(timeout=180)
    # Assert: exit 130; the running members stopped at a round boundary, nothing else started
    assert proc.returncode == 130, stdout
    index = _index(out)
    stopped = [n for n, m in index.items() if m["status"] == "interrupted"]
    assert "strategy.sampler.name=uniform,seed=0" in stopped
    assert index["strategy.sampler.name=hics,seed=1"]["point"] == {"strategy.sampler.name": "hics", "seed": "1"}
    assert all(m["status"] in ("interrupted", "completed", "pending") for m in index.values())
    assert "start strategy.sampler.name=hics,seed=1" not in stdout
    rows_before = len(first.read_text().splitlines())
    assert 2 <= rows_before < 5

    # Execute: the second invocation
    again = subprocess.run(_sweep(tmp_path, out), cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True)
    # Assert: every member completed, the interrupted ones resumed (not restarted)
    assert again.returncode == 0, again.stdout + again.stderr
    index = _index(out)
    assert {m["status"] for m in index.values()} == {"completed"}
    for name in stopped:
        assert f"resume {name}" in again.stdout
        assert index[name]["action"] == "resume"
    rows = [json.loads(line) for line in first.read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3, 4, 5]
    assert (out / "logs" / "strategy.sampler.name=uniform,seed=0.log").read_text().count("=== ") == 2
    mtimes = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file() and p.name != "sweep.json"}

    # Execute: the third invocation
    third = subprocess.run(_sweep(tmp_path, out), cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True)
    # Assert: nothing started, no run file touched
    assert third.returncode == 0, third.stderr
    assert third.stdout.count("kept ") == 4 and "start" not in third.stdout and "resume" not in third.stdout
    assert {m["action"] for m in _index(out).values()} == {"kept"}
    assert {p: p.stat().st_mtime_ns for p in mtimes if p.exists()} == mtimes

    # ... and compare reads the sweep
    cmp = subprocess.run(
        [sys.executable, "-m", "fedflex", "compare", str(out)], cwd=ROOT, env=_env(tmp_path), capture_output=True
    )
    assert cmp.returncode == 0
    assert (out / "compare" / "test_accuracy.png").is_file()


@pytest.mark.slow
def test_a_failed_member_is_moved_aside_and_run_again(tmp_path):
    # Prepare: a member directory whose run failed
    out = tmp_path / "sweep"
    name = "seed=0"
    failed = out / name
    failed.mkdir(parents=True)
    (failed / "config.yaml").write_text(to_yaml(load_scenario(QUICKSTART, ["simulation.backend=local", "rounds=2"])))
    (failed / "metrics.jsonl").write_text("")
    (failed / "summary.json").write_text(json.dumps({"status": "failed"}))
    # Execute
    proc = subprocess.run(
        [sys.executable, "-m", "fedflex", "sweep", str(QUICKSTART), "simulation.backend=local", "rounds=2"]
        + ["--seeds", "0", "--out", str(out)],
        cwd=ROOT,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
    )
    # Assert
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert runs.run_state(out / name) == "completed"
    (moved,) = (out / ".replaced").iterdir()
    assert moved.name.startswith("seed=0.failed-")
    assert json.loads((moved / "summary.json").read_text()) == {"status": "failed"}
    assert "earlier run moved to" in proc.stdout


def test_a_member_on_a_ray_node_drops_the_workers_ray_settings_and_gets_its_cpus(tmp_path):
    # Prepare: a Ray worker's environment
    from fedflex.study.ray_executor import member_env

    worker = {"RAY_ADDRESS": "10.0.0.1:6379", "RAY_JOB_ID": "01000000", "RAY_RAYLET_PID": "7", "HOME": "/h"}
    worker |= {"PYTHONPATH": "/site", "OMP_NUM_THREADS": "16", "RAY_USAGE_STATS_ENABLED": "0"}
    # Execute
    env = member_env(worker, "/repo", 2)
    # Assert: no Ray worker settings (the member's own Ray must not attach to the cluster), the
    # sweep's fedflex first, two threads
    assert env == {
        "HOME": "/h",
        "PYTHONPATH": os.pathsep.join(["/repo", "/site"]),
        "OMP_NUM_THREADS": "2",
        "MKL_NUM_THREADS": "2",
        "OPENBLAS_NUM_THREADS": "2",
        "RAY_USAGE_STATS_ENABLED": "0",
    }


def test_a_ray_member_on_the_ray_backend_asks_for_no_more_than_its_cpus(tmp_path):
    # Prepare: one run (jobs=1) whose clients ask for 4 CPUs each
    from fedflex.study.sweep import execution_overrides

    sweep = plan(QUICKSTART, ["simulation.backend=ray", "simulation.num_cpus=4"], {}, [0], tmp_path)
    # Execute: on this machine alone, and bounded to 2 CPUs (a Ray task's share)
    alone = execution_overrides(sweep, sweep.members[0], 2)
    bounded = execution_overrides(sweep, sweep.members[0], 2, bounded=True)
    # Assert
    assert alone == ["output.progress=lines"]
    assert bounded == ["output.progress=lines", "simulation.num_cpus=2"]
