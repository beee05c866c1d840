"""Failing loudly and stopping cleanly: interrupts, divergence and input errors.

One test per case of issue 18's table: signals go to real subprocesses, bad files are
written by the tests. Input errors must exit 2 with one line, before any run directory
exists; a run stopped by a signal or by divergence keeps what it wrote.
"""

import io
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fedflex.config import ConfigError
from fedflex.launch.cli import main
from fedflex.loader import load_scenario

ROOT = Path(__file__).parents[2]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
FAST = ["output.progress=off", "output.plots=false", "simulation.backend=local"]
# rounds of a few hundred ms each: long enough to signal a run mid-way
SLOW = ["rounds=40", "dataset.samples_per_client=3000", "output.checkpoint_every=0", *FAST]


def _env(tmp_path):
    return {**os.environ, "PYTHONPATH": str(ROOT), "FEDFLEX_CACHE": str(tmp_path / "cache")}


_STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_leftover_runs():
    """A test that fails mid-way must not leave its run going (it would load the machine
    for the tests after it)."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _start(tmp_path, out, extra=()):
    cmd = [sys.executable, "-m", "fedflex", "run", str(QUICKSTART), *SLOW, *extra, "--out", str(out)]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    _STARTED.append(proc)
    return proc


def _wait_rows(out, n, proc, timeout=120):
    metrics = out / "metrics.jsonl"
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= n:
            return
        time.sleep(0.02)
    raise AssertionError(f"no {n} rows within {timeout} s: {proc.stderr.read() if proc.poll() is not None else ''}")


def _one_line_error(capsys):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


# ---------------------------------------------------------------------------- interrupts
@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_signal_stops_at_a_round_boundary_and_says_how_to_resume(tmp_path, sig, code):
    # Prepare: a run going
    out = tmp_path / "out"
    proc = _start(tmp_path, out)
    _wait_rows(out, 2, proc)
    # Execute
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    # Assert: exit 128 + N, one resume line, no traceback; summary and checkpoint written
    assert proc.returncode == code, err
    assert "Traceback" not in err
    assert f"fedflex run --resume {out}" in err
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert summary["status"] == "interrupted"
    assert summary["interrupted_by"] == signal.Signals(sig).name
    assert summary["last_round"] == rows[-1]["round"] == len(rows) < 40
    assert (out / "checkpoint.npz").is_file()  # even with checkpoint_every 0: resumable
    # ... and the resumed run continues from the round after it
    resumed = subprocess.run(
        [sys.executable, "-m", "fedflex", "run", "--resume", str(out)],
        cwd=ROOT,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == list(range(1, 41))
    final = json.loads((out / "summary.json").read_text())
    assert final["status"] == "completed" and final["run_wall_s"] > summary["run_wall_s"]


@pytest.mark.slow
def test_ctrl_c_on_the_ray_backend_stops_ray_within_seconds(tmp_path):
    # Ctrl-C in a terminal signals the whole process group (Ray's processes too)
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "fedflex",
        "run",
        str(QUICKSTART),
        "rounds=200",
        "dataset.samples_per_client=3000",
        "simulation.backend=ray",
        "output.progress=off",
        "output.plots=false",
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _wait_rows(out, 2, proc, timeout=180)
        os.killpg(proc.pid, signal.SIGINT)
        t0 = time.time()
        _, err = proc.communicate(timeout=60)
        elapsed = time.time() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-2000:]
    assert elapsed < 15
    assert "Traceback" not in err and f"fedflex run --resume {out}" in err
    assert json.loads((out / "summary.json").read_text())["status"] == "interrupted"


@pytest.mark.slow
def test_sigterm_to_the_process_group_on_the_ray_backend_stops_at_a_round_boundary_and_resumes(tmp_path):
    # Prepare: what SLURM, systemd and `timeout` do: SIGTERM to every process of the run,
    # Ray's included, in the middle of a round; an uninterrupted run as the reference
    ray = ["rounds=8", "dataset.samples_per_client=3000", "output.progress=off", "output.plots=false"]
    ray.append("simulation.backend=ray")
    env = _env(tmp_path)
    full = tmp_path / "full"
    cmd = [sys.executable, "-m", "fedflex", "run", str(QUICKSTART), *ray]
    subprocess.run([*cmd, "--out", str(full)], cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [*cmd, "--out", str(out)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _wait_rows(out, 2, proc, timeout=180)
        # Execute
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # Assert: 143, the two lines of an interrupt, no Ray crash; summary written
    assert proc.returncode == 143, err[-2000:]
    assert err.strip().splitlines() == [
        "fedflex: SIGTERM: stopping after the round in flight (press Ctrl-C again to exit now)",
        f"fedflex: interrupted after round {json.loads((out / 'summary.json').read_text())['last_round']}; "
        f"results so far in {out}; continue with: fedflex run --resume {out}",
    ]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["interrupted_by"] == "SIGTERM"
    assert 2 <= summary["last_round"] < 8
    # ... and --resume ends with the uninterrupted run's model
    resumed = subprocess.run(
        [sys.executable, "-m", "fedflex", "run", "--resume", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a, b = np.load(full / "model.npz"), np.load(out / "model.npz")
    assert sorted(a.files) == sorted(b.files)
    for key in a.files:
        np.testing.assert_array_equal(a[key], b[key])


@pytest.mark.slow
def test_second_interrupt_exits_at_once(tmp_path):
    out = tmp_path / "out"
    proc = _start(tmp_path, out, ["dataset.samples_per_client=20000"])
    _wait_rows(out, 1, proc)
    proc.send_signal(signal.SIGINT)
    # two signals close together can reach Python as one: wait until the first is seen
    first = ""
    while "stopping after the round in flight" not in first:
        line = proc.stderr.readline()
        assert line, "the process ended before acknowledging the first signal"
        first += line
    proc.send_signal(signal.SIGINT)
    t0 = time.time()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert time.time() - t0 < 5
    assert "exiting now" in err and "Traceback" not in first + err


# ---------------------------------------------------------------------------- divergence
DIVERGING = ["model.name=mlp", "client.lr=1e6", *FAST]  # overflows within a few rounds


def test_divergence_stops_the_run_with_its_own_status(tmp_path, capsys):
    # Prepare: an mlp with lr 1e6 overflows within a few rounds
    out = tmp_path / "out"
    code = main(["run", str(QUICKSTART), *DIVERGING, "rounds=20", "output.plots=true", "--out", str(out)])
    err = capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert code == 3
    assert summary["status"] == "diverged"
    assert summary["diverged_round"] == rows[-1]["round"] < 20
    assert "NaN or Inf" in summary["divergence"] or "test loss" in summary["divergence"]
    assert f"diverged in round {rows[-1]['round']}" in err
    assert (out / "accuracy.png").is_file()


def test_divergence_can_be_ignored(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(
        ["run", str(QUICKSTART), *DIVERGING, "rounds=6", "evaluation.stop_on_divergence=false", "--out", str(out)]
    )
    # it runs on to the last round; the rounds whose replies were all NaN trained nothing,
    # so it is not completed (issue 45): degraded, exit 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 6
    assert (code, summary["status"]) == (1, "degraded") and summary["rejected_rounds"]


# ---------------------------------------------------------------------------- no round trained
def _nobody_online(tmp_path):
    """A trace in which no client is ever online."""
    trace = tmp_path / "nobody.csv"
    trace.write_text("client,online_from,online_until\n")
    return ["churn.kind=trace", f"churn.trace={trace}", "rounds=3", *FAST]


def test_a_run_in_which_no_round_trained_fails_with_one_line(tmp_path, capsys):
    # Prepare
    out = tmp_path / "out"
    # Execute
    code = main(["run", str(QUICKSTART), *_nobody_online(tmp_path), "--out", str(out)])
    # Assert: exit 1, the reason as the last line (after the per-round skip warnings) and in summary.json
    err = capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    reason = "no round trained: of 3 round(s), 3 skipped with fewer than strategy.sampler.min_clients=2 clients online"
    assert code == 1
    assert summary["status"] == "failed" and summary["failure"] == reason
    assert summary["skipped_rounds"] == 3
    assert err.strip().splitlines()[-1] == f"fedflex: the run failed: {reason}; results in {out}"
    assert "Traceback" not in err


def test_on_too_few_fail_ends_with_one_line_not_a_traceback(tmp_path, capsys):
    # Prepare
    out = tmp_path / "out"
    # Execute
    code = main(["run", str(QUICKSTART), *_nobody_online(tmp_path), "churn.on_too_few=fail", "--out", str(out)])
    # Assert
    err = _one_line_error(capsys)
    reason = "round 1: 0 client(s) online, fewer than min_clients=2 (churn.on_too_few=fail)"
    assert code == 1
    assert err == f"fedflex: the run failed: {reason}; results in {out}"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["failure"] == reason


# ---------------------------------------------------------------------------- trace CSV at load
TRACE_CASES = {
    "garbage row": ("client,online_from,online_until\n0,1,5\nx,y,z\n", "line 3"),
    "id out of range": ("client,online_from,online_until\n99,1,5\n", "unknown client id 99"),
    "from >= until": ("client,online_from,online_until\n1,5,5\n", "online_from = 5 >= online_until = 5"),
    "no header": ("0,1,5\n1,1,5\n", "missing column"),
}


@pytest.mark.parametrize("case", sorted(TRACE_CASES))
def test_bad_trace_is_a_load_error(tmp_path, capsys, case):
    text, expected = TRACE_CASES[case]
    (tmp_path / "t.csv").write_text(text)
    code = main(
        ["run", str(QUICKSTART), "churn.kind=trace", f"churn.trace={tmp_path / 't.csv'}", "--out", str(tmp_path / "o")]
    )
    err = _one_line_error(capsys)
    assert code == 2 and err.startswith("fedflex: config error: churn.trace = ") and expected in err
    assert not (tmp_path / "o").exists()


def test_missing_trace_file_is_a_load_error(tmp_path, capsys):
    code = main(["run", str(QUICKSTART), "churn.kind=trace", "churn.trace=nope.csv", "--out", str(tmp_path / "o")])
    assert code == 2 and "no such file" in _one_line_error(capsys)


def test_trace_resolves_against_the_scenario_file_and_travels_with_the_results(tmp_path, monkeypatch, capsys):
    # Prepare: a scenario next to its trace, run from another directory
    sc = tmp_path / "exp"
    sc.mkdir()
    (sc / "trace.csv").write_text("client,online_from,online_until\n0,1,\n1,1,\n2,2,4\n")
    (sc / "s.yaml").write_text(
        "name: t\nnum_clients: 3\nrounds: 4\n"
        "dataset: {name: synthetic, samples_per_client: 30}\npartition: {scheme: natural}\nmodel: {name: logreg}\n"
        "strategy: {sampler: {clients_per_round: 2, min_clients: 1}}\nchurn: {kind: trace, trace: trace.csv}\n"
    )
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    # Execute
    assert main(["run", str(sc / "s.yaml"), *FAST, "--out", str(out)]) == 0
    # Assert: the copy is in the results and config.yaml names it; the results re-run
    assert (out / "trace.csv").read_text() == (sc / "trace.csv").read_text()
    cfg = load_scenario(out / "config.yaml")
    assert cfg.churn.trace == str((out / "trace.csv").resolve())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["online"] == [0, 1] and rows[1]["online"] == [0, 1, 2]


# ---------------------------------------------------------------------------- other inputs
@pytest.mark.parametrize("target", ["/proc/fedflex-x", "FILE/sub"])
def test_out_that_cannot_be_created_is_refused(tmp_path, capsys, target):
    (tmp_path / "FILE").write_text("a regular file")
    out = target.replace("FILE", str(tmp_path / "FILE"))
    code = main(["run", str(QUICKSTART), *FAST, "--out", out])
    err = _one_line_error(capsys)
    assert code == 2 and "cannot be created" in err


def _npz_bytes(**arrays):
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


@pytest.mark.parametrize(
    "damage",
    [
        lambda real: b"",
        lambda real: real[: len(real) // 2],
        lambda real: random.Random(103).randbytes(64),
        lambda real: _npz_bytes(x=np.zeros(3)),
        lambda real: _npz_bytes(**{"state.json": np.frombuffer(b'{"round": 1', dtype=np.uint8)}),
    ],
    ids=["empty", "truncated", "random", "not-a-checkpoint", "torn-json"],
)
def test_broken_checkpoint_is_refused_and_left_alone(tmp_path, capsys, damage):
    assert main(["run", str(QUICKSTART), *FAST, "rounds=2", "--out", str(tmp_path / "r")]) == 0
    capsys.readouterr()
    checkpoint = tmp_path / "r" / "checkpoint.npz"
    checkpoint.write_bytes(damage(checkpoint.read_bytes()))
    config = load_scenario(tmp_path / "r" / "config.yaml")
    # the run is finished: shorten it in config.yaml's eyes by asking for more rounds
    (tmp_path / "r" / "config.yaml").write_text(
        (tmp_path / "r" / "config.yaml").read_text().replace(f"rounds: {config.rounds}", "rounds: 5")
    )
    before = {p.name: p.read_bytes() for p in (tmp_path / "r").iterdir()}
    code = main(["run", "--resume", str(tmp_path / "r")])
    err = _one_line_error(capsys)
    assert code == 2 and "checkpoint.npz" in err and "cannot be resumed" in err
    assert {p.name: p.read_bytes() for p in (tmp_path / "r").iterdir()} == before


@pytest.mark.parametrize(
    "text, expected",
    [
        ("- a\n- b\n", "top level must be a mapping"),
        ("name: a\nrounds: 3\nrounds: 4\n", "key 'rounds' given twice (line 2, and line 3"),
        ("name: a\nrounds: [3\n", "line 3, column 1"),
        ("name: a\nstrategy:\n  ~: 1\n", "key None (line 3 column 3) is not a name"),
        ("name: a\n1.5: x\n", "key 1.5 (line 2 column 1) is not a name"),
        ("[1, 2]: 3\n", "a list as a key (line 1 column 1)"),
    ],
    ids=["list", "duplicate", "syntax", "null key", "number key", "list key"],
)
def test_bad_yaml_names_what_and_where(tmp_path, capsys, text, expected):
    (tmp_path / "s.yaml").write_text(text)
    code = main(["run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "o")])
    err = _one_line_error(capsys)
    assert code == 2 and expected in err
    assert not (tmp_path / "o").exists()


def test_wrongly_shaped_override_names_its_key():
    with pytest.raises(ConfigError) as info:
        load_scenario(QUICKSTART, ["churn.kind=sessions", "churn.sessions=[0,1,2]"])
    assert info.value.key == "churn.sessions"


def test_more_clients_per_round_than_clients_is_refused():
    with pytest.raises(ConfigError, match=r"clients_per_round = 50: must be <= num_clients \(6\)"):
        load_scenario(None, ["num_clients=6", "strategy.sampler.clients_per_round=50"])


# ---------------------------------------------------------------------------- nothing silent
def test_every_entry_of_a_session_schedule_starts_a_session(tmp_path):
    # two consecutive entries with the same set: three sessions, not two
    out = tmp_path / "out"
    assert (
        main(
            [
                "run",
                str(QUICKSTART),
                *FAST,
                "num_clients=4",
                "rounds=6",
                "churn.kind=sessions",
                "churn.sessions=[[0,1],[0,1],[2,3]]",
                "churn.rounds_per_session=2",
                "churn.cycle=false",
                "strategy.sampler.clients_per_round=2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["session"] for r in rows] == [0, 0, 1, 1, 2, 2]
    assert [r["session_started"] for r in rows] == [True, False, True, False, True, False]


def test_markov_defaults_give_sessions_of_several_rounds():
    from fedflex.churn import SessionTracker, make_availability

    cfg = load_scenario(None, ["num_clients=20", "churn.kind=markov"])
    assert (cfg.churn.min_session_rounds, cfg.churn.change_threshold) == (5, 0.3)
    availability = make_availability(cfg.churn, cfg.num_clients, 0, None)
    tracker = SessionTracker(cfg.churn.min_session_rounds, cfg.churn.change_threshold)
    for t in range(1, 61):
        tracker.update(t, availability.online(t).tolist())
    assert tracker.session + 1 <= 12  # at least 5 rounds each


def test_explore_first_keeps_the_wrapped_samplers_metrics(tmp_path):
    out = tmp_path / "out"
    assert (
        main(
            [
                "run",
                str(QUICKSTART),
                *FAST,
                "rounds=3",
                "churn.kind=none",
                "strategy.sampler.name=hics",
                "strategy.sampler.explore_first=true",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all("hics_entropy" in r and "explored" in r for r in rows), sorted(rows[0])  # hics's own observe figures
    assert rows[0]["explored"] == len(rows[0]["sampled"])  # nobody known in round 1
