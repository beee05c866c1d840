"""scripts/composition_table.py: a composition against its parts, paired by seed, on
hand-made runs whose outcome is known."""

import importlib.util
import json
from pathlib import Path

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
