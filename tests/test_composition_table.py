"""scripts/composition_table.py: a composition against its parts, paired by seed, on
hand-made runs whose outcome is known."""

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

spec = importlib.util.spec_from_file_location("composition_table", Path("scripts/composition_table.py"))
ct = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ct)


def _run(root: Path, method: str, seed: int, accs: list[float]) -> None:
    d = root / f"method={method},seed={seed}"
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump({"seed": seed, "num_clients": 4}))
    rows = [
        {
            "round": t + 1,
            "phase": "train",
            "test_accuracy": a,
            "test_loss": 1.0,
            "wall_s": 1.0,
            "online": [0, 1, 2, 3],
            "sampled": [t % 4],
            "session": 0,
        }
        for t, a in enumerate(accs)
    ]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "summary.json").write_text(json.dumps({"status": "completed"}))


def test_parts_of_a_name():
    assert ct.parts("hics+fedaware") == ("hics", "fedaware")
    assert ct.parts("hics+fedaware-age10") == ("hics", "fedaware")
    assert ct.parts("all4") == ("hics", "fedaware", "session", "fedprox")
    assert ct.parts("all4-age10") == ("hics", "fedaware", "session", "fedprox")
    assert ct.parts("fedaware") == ("fedaware",)
    # a hyphenated method that ran alone is a part, not a part with a mechanism
    assert ct.parts("hics+fedavgm-aware", {"hics", "fedavgm-aware"}) == ("hics", "fedavgm-aware")
    assert ct.parts("hics+fedavgm-aware") == ("hics", "fedavgm")
    assert ct.parts("fedavgm-aware+session", {"fedavgm-aware"}) == ("fedavgm-aware", "session")
    assert ct.parts("fedaware+session-reset", {"fedaware", "session"}) == ("fedaware", "session")


def test_a_composition_against_its_parts_paired_by_seed(tmp_path, capsys):
    # 10 rounds; target 0.5. seed 0: the pair reaches 0.5 at round 3, hics at 5, fedaware
    # never -> the pair beats both; its last-10% (the last round) 0.8 vs best part 0.7: +0.1.
    # seed 1: hics reaches at round 2, before the pair (3) -> not every part beaten;
    # last round 0.6 vs 0.7: -0.1.
    ramp = lambda r, top: [min(top, 0.5 * (t + 1) / r) for t in range(10)]  # noqa: E731
    _run(tmp_path, "hics+fedaware", 0, ramp(3, 0.8))
    _run(tmp_path, "hics", 0, ramp(5, 0.7))
    _run(tmp_path, "fedaware", 0, [0.4] * 10)
    _run(tmp_path, "hics+fedaware", 1, ramp(3, 0.6))
    _run(tmp_path, "hics", 1, ramp(2, 0.7))
    _run(tmp_path, "fedaware", 1, [0.4] * 10)
    assert ct.main([str(tmp_path), "--target", "0.5", "--order", "hics,fedaware,hics+fedaware"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| hics+fedaware | hics, fedaware"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "0,1"
    assert cells[3].split(" / ")[0] == "1/2"  # raw rounds: seed 0 only
    assert cells[3].split(" / ")[2] == "1/2"  # last-10%: seed 0 only
    assert cells[4] == "+0.100, -0.100"


def test_sustain_counts_rounds_held_at_the_target_and_how_often_the_first_touch_holds(tmp_path, capsys):
    # 12 rounds, target 0.5. The pair: a spike at round 2, then at 0.5 from round 6 on ->
    # raw 2, sustained (3 in a row) 6; of the 10 evaluations after round 2 (rounds 3-12)
    # 7 are at the target (6-12): 0.7.
    # hics: at the target from round 4 on -> raw 4, sustained 4, share 1.0 (rounds 5-12, 8 of 8).
    # fedaware: spikes at rounds 1, 3, 5, 7, 9, 11 -> raw 1, never sustained (counts 13),
    # share 5/10 (rounds 2-11).
    pair = [0.1, 0.6, 0.1, 0.1, 0.1] + [0.6] * 7
    hics = [0.1, 0.1, 0.1] + [0.55] * 9
    aware = [0.6, 0.1] * 6
    _run(tmp_path, "hics+fedaware", 0, pair)
    _run(tmp_path, "hics", 0, hics)
    _run(tmp_path, "fedaware", 0, aware)
    assert ct.main([str(tmp_path), "--target", "0.5", "--sustain", "3", "--order", "hics+fedaware,hics,fedaware"]) == 0
    lines = capsys.readouterr().out.splitlines()

    def cells(prefix):
        return [c.strip() for c in next(x for x in lines if x.startswith(prefix)).strip("|").split("|")]

    # (the mean smoothed rounds, the middle figure, are fedflex compare's and tested there)
    means = {m: cells(f"| {m} | 0 |")[8].split(" / ") for m in ("hics+fedaware", "hics", "fedaware")}
    assert cells("| hics+fedaware | 0 |")[7] == "6" and cells("| hics+fedaware | 0 |")[9] == "0.70"
    assert (means["hics+fedaware"][0], means["hics+fedaware"][2]) == ("2.0", "6.0")
    assert cells("| hics | 0 |")[7] == "4" and cells("| hics | 0 |")[9] == "1.00"
    assert (means["hics"][0], means["hics"][2]) == ("4.0", "4.0")
    assert cells("| fedaware | 0 |")[7] == "-" and cells("| fedaware | 0 |")[9] == "0.50"
    assert (means["fedaware"][0], means["fedaware"][2]) == ("1.0", "13.0")
    # against its parts: raw lost (2 vs fedaware's 1), sustained lost (6 vs hics' 4)
    assert cells("| hics+fedaware | hics, fedaware")[3] == "0/1 / 0/1 / 0/1 / 1/1"
    with pytest.raises(SystemExit):
        ct.main([str(tmp_path), "--target", "0.5", "--sustain", "3", "--sessions"])


def _session_run(root: Path, name: str, online: list[list[float]], transitions: list[float]) -> None:
    """A run of 5-round sessions with these online accuracies (test accuracy 0.1 throughout,
    so a figure taken from it shows)."""
    d = root / name
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump({"seed": 0, "num_clients": 4}))
    rows = []
    for k, session in enumerate(online):
        for i, a in enumerate(session):
            t = len(rows)
            rows.append(
                {
                    "round": t + 1,
                    "phase": "train",
                    "test_accuracy": 0.1,
                    "online_accuracy": a,
                    "test_loss": 1.0,
                    "wall_s": 1.0,
                    "online": [0, 1],
                    "sampled": [t % 2],
                    "session": k,
                    "session_started": i == 0,
                }
            )
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"status": "completed", "transitions": [{"mean_online_accuracy": a} for a in transitions]}
    (d / "summary.json").write_text(json.dumps(summary))


def test_sessions_figures_are_per_session_on_the_online_labels(tmp_path, capsys):
    # Four sessions of 5 rounds, target 0.8; the figures count sessions 2 and 3 (0-based).
    # Rounds to 0.8 from a session start: the pair 2 and 2 (mean 2.0); hics 3 and 4 (3.5);
    # session 1 and never (5 + 1 = 6; mean 3.5) -> the pair beats both.
    # Transition accuracy, the transitions into sessions 2 and 3 (the second and third of
    # summary.json's): the pair 0.8, hics 0.7 (its first transition, 0.95, is not counted),
    # session 0.75 -> the pair beats both.
    # Last-10% (the last 2 of 20 rounds, online accuracy): the pair 0.85, hics 0.9 -> not
    # beaten; session 0.7.
    low = [0.2] * 5
    pair = [low, low, [0.5, 0.8, 0.9, 0.9, 0.9], [0.5, 0.85, 0.9, 0.85, 0.85]]
    hics = [low, low, [0.5, 0.6, 0.8, 0.9, 0.9], [0.5, 0.6, 0.7, 0.9, 0.9]]
    sess = [low, low, [0.8, 0.8, 0.8, 0.8, 0.8], [0.7, 0.7, 0.7, 0.7, 0.7]]
    w = "partition.overlap=0.0"
    _session_run(tmp_path, f"{w},method=hics+session,seed=0", pair, [0.1, 0.8, 0.8])
    _session_run(tmp_path, f"{w},method=hics,seed=0", hics, [0.95, 0.7, 0.7])
    _session_run(tmp_path, f"{w},method=session,seed=0", sess, [0.1, 0.9, 0.6])
    # another point of the other axes, which --where leaves out: it would beat the pair
    _session_run(tmp_path, "partition.overlap=0.2,method=hics,seed=0", [[1.0] * 5] * 4, [1.0, 1.0, 1.0])

    data = ct.load(tmp_path, 0.8, where=w, sessions=True)
    assert sorted(data) == ["hics", "hics+session", "session"]
    assert data["hics+session"][0]["rounds_to_target_sessions"] == [2, 2]
    assert data["session"][0]["rounds_to_target_sessions"] == [1, 6]
    assert data["hics"][0]["transition_accuracy"] == 0.7
    assert abs(data["hics+session"][0]["last10_accuracy"] - 0.85) < 1e-12
    assert abs(data["hics"][0]["last10_accuracy"] - 0.9) < 1e-12
    assert abs(data["session"][0]["last10_accuracy"] - 0.7) < 1e-12

    assert ct.main([str(tmp_path), "--target", "0.8", "--sessions", "--where", w]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| hics+session | hics, session"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3] == "1/1 / 1/1 / 0/1"
    assert cells[4] == "-0.050"
    # a mechanism's rounds are the per-session means: session-drop 1 and 6 -> 3.5
    _session_run(tmp_path, f"{w},method=hics+session-drop,seed=0", sess, [0.1, 0.9, 0.6])
    assert ct.main([str(tmp_path), "--target", "0.8", "--sessions", "--where", w]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| hics+session-drop | hics+"))
    assert [c.strip() for c in row.strip("|").split("|")][3] == "3.5 vs 2.0"


def test_a_hyphenated_part_is_not_read_as_a_mechanism():
    def run(rounds, acc):
        return {"rounds_to_target": rounds, "rounds_to_target_smoothed": rounds, "last10_accuracy": acc, "rounds": 10}

    data = {
        "fedavgm-aware": {0: run(5, 0.70)},
        "hics": {0: run(4, 0.72)},
        "hics+fedavgm-aware": {0: run(3, 0.75)},
        "fedavgm": {0: run(6, 0.69)},
        "fedavgm-exclude": {0: run(7, 0.68)},
    }
    order = list(data)
    table = ct.mechanism_table(data, order)
    # fedavgm-exclude is fedavgm with a mechanism: 7 vs 6 rounds, 0.68 - 0.69
    assert "| fedavgm-exclude | fedavgm | 0 | 7 vs 6 | -0.010 | -0.010 |" in table
    # fedavgm-aware ran alone (against fedavgm, a mechanism row), and hics+fedavgm-aware is a
    # pair of it, not hics+fedavgm with a mechanism
    assert "| fedavgm-aware | fedavgm | 0 | 5 vs 6 | +0.010 | +0.010 |" in table
    assert "| hics+fedavgm-aware |" not in table
    pairs = ct.versus_parts_table(data, order)
    # against hics and fedavgm-aware: 3 < 4, 5 rounds and 0.75 > 0.72, 0.70
    assert "| hics+fedavgm-aware | hics, fedavgm-aware | 0 | 1/1 / 1/1 / 1/1 | +0.030 |" in pairs
