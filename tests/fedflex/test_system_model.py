"""The system model on a simulated clock (fedflex.launch.system_grid, ``system:``): each
client's round time, who a deadline or keep_first drops, dropouts, and the clock."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import fedflex
from fedflex.launch import system_grid
from fedflex.launch.system_grid import round_outcome

QUICKSTART = Path(__file__).parents[2] / "scenarios" / "quickstart.yaml"
# 4 clients (iid) of the 178 examples Synthetic(1, 1) draws for seed 0: 45, 45, 44, 44;
# batches of 10, one epoch: 5 local steps of 0.1 s at speed 1; a bandwidth so large that
# the messages take no measurable time (< 1e-7 s)
BASE = [
    "rounds=2",
    "num_clients=4",
    "dataset.samples_per_client=40",
    "partition.scheme=iid",
    "churn.kind=none",
    "strategy.sampler.clients_per_round=4",
    "client.batch_size=10",
    "client.epochs=1",
    "system.kind=lognormal",
    "system.step_s=0.1",
    "system.bandwidth=1e12",
    "output.progress=off",
]


def test_the_round_closes_with_the_last_reply_the_deadline_or_the_kth_reply():
    times = {0: 0.4, 1: 0.2, 2: 0.8, 3: 0.1}
    assert round_outcome(times, set(), 0.0, 0) == ([0, 1, 2, 3], [], 0.8)  # waits for all
    assert round_outcome(times, set(), 0.5, 0) == ([0, 1, 3], [2], 0.5)  # 2 misses the deadline
    assert round_outcome(times, set(), 0.0, 2) == ([1, 3], [0, 2], 0.2)  # closes at the 2nd reply
    assert round_outcome(times, {3}, 0.0, 0) == ([0, 1, 2], [], 0.8)  # a dropout never arrives
    assert round_outcome(times, {2}, 0.5, 0) == ([0, 1, 3], [], 0.5)  # missing: wait to the deadline
    assert round_outcome(times, set(), 0.05, 0) == ([], [0, 1, 2, 3], 0.05)  # nobody in time


@pytest.fixture
def speeds(monkeypatch):
    """A hand-made profile: speeds 1, 2, 0.5, 4 (0.1 s a step over them) -> round times 0.5,
    0.25, 1.0, 0.125 s."""

    def profile(cfg):
        return 0.1 / np.array([1.0, 2.0, 0.5, 4.0]), np.full(cfg.num_clients, cfg.system.bandwidth)

    monkeypatch.setattr(system_grid, "client_profiles", profile)


def test_each_clients_time_and_the_clock_to_the_millisecond(speeds):
    run = fedflex.run(QUICKSTART, BASE)
    for row in run.rows:
        assert row["sim_round_s"] == pytest.approx(1.0, abs=1e-3)  # the slowest, client 2
        assert row["stragglers"] == [] and row["dropouts"] == [] and sorted(row["sampled"]) == [0, 1, 2, 3]
    assert [r["sim_clock_s"] for r in run.rows] == pytest.approx([1.0, 2.0], abs=1e-3)


def test_a_deadline_drops_the_straggler_and_ends_the_round(speeds):
    run = fedflex.run(QUICKSTART, [*BASE, "system.deadline_s=0.6"])
    row = run.rows[0]
    # client 2 (1.0 s) misses the 0.6 s deadline: its reply is missing, not rejected
    assert row["stragglers"] == [2] and row["rejected"] == [] and sorted(row["sampled"]) == [0, 1, 3]
    assert row["sim_round_s"] == pytest.approx(0.6, abs=1e-3)
    assert row["num_examples"] == 45 + 45 + 44


def test_keep_first_closes_the_round_at_the_kth_reply(speeds):
    run = fedflex.run(QUICKSTART, [*BASE, "system.keep_first=2"])
    row = run.rows[0]
    assert sorted(row["sampled"]) == [1, 3] and row["stragglers"] == [0, 2]
    assert row["sim_round_s"] == pytest.approx(0.25, abs=1e-3)


def test_dropouts_are_drawn_from_the_seed_and_their_replies_are_missing():
    first = fedflex.run(QUICKSTART, [*BASE, "system.dropout=0.5", "rounds=3"])
    again = fedflex.run(QUICKSTART, [*BASE, "system.dropout=0.5", "rounds=3"])
    dropped = [r["dropouts"] for r in first.rows]
    assert dropped == [r["dropouts"] for r in again.rows] and any(dropped)
    for row in first.rows:
        assert not set(row["dropouts"]) & set(row["sampled"])


def test_without_a_system_model_rows_have_no_clock_and_bad_values_are_refused():
    run = fedflex.run(QUICKSTART, ["rounds=1", "output.progress=off"])
    assert "sim_clock_s" not in run.rows[0]
    with pytest.raises(fedflex.ConfigError, match="system.dropout"):
        fedflex.run(QUICKSTART, ["system.dropout=1.0"])


def test_a_clients_messages_over_its_bandwidth_count_on_the_clock():
    # Prepare: no compute time to speak of, every client at 1,000 bytes/s (log-sigmas 0)
    overrides = [*BASE, "system.step_s=1e-9", "system.bandwidth=1000", "system.speed_sigma=0"]
    run = fedflex.run(QUICKSTART, [*overrides, "system.bandwidth_sigma=0"])
    row = run.rows[1]  # round 2: train messages only (round 1 also holds the queries)
    # Assert: each client's time is its share of the round's bytes over 1,000 bytes/s (the
    # train messages are alike; the replies differ by a byte or two of metrics)
    per_client = (row["bytes_down"] + row["bytes_up"]) / 4 / 1000
    assert row["sim_round_s"] == pytest.approx(per_client, abs=2e-3)


def test_a_resumed_run_draws_the_same_dropouts_as_an_uninterrupted_one(tmp_path):
    import json

    from fedflex.launch.cli import main

    # Prepare: the uninterrupted run, and the same run stopped after round 2
    args = [str(QUICKSTART), *BASE, "system.dropout=0.4", "rounds=4"]
    assert main(["run", *args, "--out", str(tmp_path / "full")]) == 0
    assert main(["run", *args, "rounds=2", "--out", str(tmp_path / "r")]) == 0
    config = tmp_path / "r" / "config.yaml"
    config.write_text(config.read_text().replace("\nrounds: 2\n", "\nrounds: 4\n"))
    (tmp_path / "r" / "summary.json").unlink()
    # Execute
    assert main(["run", "--resume", str(tmp_path / "r")]) == 0

    # Assert: the dropouts and the clock of every round are the uninterrupted run's
    def rows(run):
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        return [(r["dropouts"], r["sim_clock_s"]) for r in map(json.loads, lines)]

    assert rows("r") == rows("full") and any(d for d, _ in rows("full"))


class _RunsCode:
    """Pickles as a call of os.system: what an unpickler must not run."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_a_fedscale_device_profile_times_each_client_as_fedscale_does(tmp_path):
    import pickle

    from fedflex.config import ConfigError
    from fedflex.loader import load_scenario

    # Prepare: two profiles, cycled over the 4 clients (0, 2 -> id 1; 1, 3 -> id 2). A step
    # of 10 examples is 3 x 10 x ms / 1000 s: 0.06 s at 2 ms, 0.24 s at 8 ms; 5 steps each:
    # 0.3 s and 1.2 s. 8 kbps is 1,024 bytes/s; 1e12 kbps makes the messages free
    profile = tmp_path / "client_device_capacity"
    profile.write_bytes(
        pickle.dumps({2: {"computation": 8.0, "communication": 1e12}, 1: {"computation": 2.0, "communication": 1e12}})
    )
    overrides = [*BASE, "system.kind=fedscale", f"system.profile={profile}"]
    cfg = load_scenario(QUICKSTART, overrides)
    steps, _ = system_grid.client_profiles(cfg)
    assert steps == pytest.approx([0.06, 0.24, 0.06, 0.24])
    eight = tmp_path / "eight.json"
    eight.write_text('{"7": {"computation": 1, "communication": 8}}')
    _, bandwidth = system_grid.client_profiles(
        load_scenario(QUICKSTART, [*BASE, "system.kind=fedscale", f"system.profile={eight}"])
    )
    assert list(bandwidth) == [1024.0] * 4
    # Execute: a 0.5 s deadline
    run = fedflex.run(QUICKSTART, [*overrides, "system.deadline_s=0.5"])
    # Assert: clients 1 and 3 (1.2 s) straggle, every round closes at the deadline
    assert [r["stragglers"] for r in run.rows] == [[1, 3], [1, 3]]
    assert [sorted(r["sampled"]) for r in run.rows] == [[0, 2], [0, 2]]
    assert [r["sim_clock_s"] for r in run.rows] == pytest.approx([0.5, 1.0], abs=1e-3)
    assert fedflex.run(QUICKSTART, overrides).rows[0]["sim_round_s"] == pytest.approx(1.2, abs=1e-3)
    # and a profile that is not one, or a pickle that would run code, is refused at load
    eight.write_text('{"7": {"computation": -1, "communication": 8}}')
    with pytest.raises(ConfigError, match=r"client '7': expected \{'computation'"):
        load_scenario(QUICKSTART, [*BASE, "system.kind=fedscale", f"system.profile={eight}"])
    profile.write_bytes(pickle.dumps({1: _RunsCode(tmp_path / "ran")}))
    with pytest.raises(ConfigError, match="names posix.system; only plain data"):
        load_scenario(QUICKSTART, overrides)
    assert not (tmp_path / "ran").exists()
    with pytest.raises(ConfigError, match="system.profile"):
        load_scenario(QUICKSTART, [*BASE, "system.kind=fedscale"])


def test_a_scenario_files_profile_path_is_relative_to_the_file(tmp_path, monkeypatch):
    from fedflex.loader import load_scenario

    (tmp_path / "cap.json").write_text('{"1": {"computation": 1, "communication": 8}}')
    (tmp_path / "s.yaml").write_text("system: {kind: fedscale, profile: cap.json}\n")
    monkeypatch.chdir(Path(__file__).parent)
    assert load_scenario(tmp_path / "s.yaml").system.profile == str((tmp_path / "cap.json").resolve())


@pytest.mark.parametrize("vectorize", ["off", "on"])
def test_partial_work_cuts_a_slow_clients_steps_to_the_deadline(speeds, vectorize):
    # Prepare: steps of 0.1, 0.05, 0.2, 0.025 s, 5 planned each (0.5, 0.25, 1.0, 0.125 s);
    # a 0.45 s deadline fits 4 of client 0's steps (0.4 s) and 2 of client 2's (0.4 s)
    overrides = [*BASE, "system.deadline_s=0.45", f"simulation.vectorize={vectorize}"]
    # Execute
    partial = fedflex.run(QUICKSTART, [*overrides, "system.partial=true"]).rows[0]
    whole = fedflex.run(QUICKSTART, overrides).rows[0]
    # Assert: with partial work every reply counts and the round closes at 0.4 s, which
    # only cut work explains (a whole round of client 0 or 2 would arrive after 0.45 s)
    assert partial["partial"] == [0, 2] and partial["stragglers"] == [] and sorted(partial["sampled"]) == [0, 1, 2, 3]
    assert partial["sim_round_s"] == pytest.approx(0.4, abs=1e-3)
    assert whole["stragglers"] == [0, 2] and "partial" not in whole
    assert whole["sim_round_s"] == pytest.approx(0.45, abs=1e-3)


def test_the_clock_reads_the_steps_a_client_reports(speeds):
    # client.steps=3 (not epochs x batches = 5): 3 x 0.2 s for the slowest, client 2
    run = fedflex.run(QUICKSTART, [*BASE, "client.steps=3", "rounds=1"])
    assert run.rows[0]["sim_round_s"] == pytest.approx(0.6, abs=1e-3)


def test_partial_work_needs_a_deadline():
    with pytest.raises(fedflex.ConfigError, match="system.partial"):
        fedflex.run(QUICKSTART, [*BASE, "system.partial=true"])
