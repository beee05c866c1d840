"""Compare two behaviour snapshots (scripts/snapshot_runs.sh): per scenario, whether every
metrics.jsonl row field of the old run is equal in the new one (timing fields aside);
fields only the new rows have are listed.

    python scripts/snapshot_compare.py /tmp/snap_old /tmp/snap_new
"""

import json
import sys
from pathlib import Path

TIMING = {"wall_s", "aware_solve_s", "sample_s", "train_s", "aggregate_s", "evaluate_s"}  # wall-clock figures


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def compare(old: Path, new: Path) -> str:
    if not (new / "metrics.jsonl").is_file():
        return "no new run"
    a, b = rows(old), rows(new)
    diffs, added = ([] if len(a) == len(b) else [f"rows {len(a)} vs {len(b)}"]), set()
    for ra, rb in zip(a, b):
        added |= set(rb) - set(ra)
        diffs += [
            f"round {ra.get('round')}: {k} {ra[k]!r} -> {rb.get(k)!r}"
            for k in ra
            if k not in TIMING and ra[k] != rb.get(k)
        ]
    text = f"{len(a)} rows, " + ("identical" if not diffs else f"{len(diffs)} differences: " + "; ".join(diffs[:3]))
    return text + (f" (new fields: {sorted(added)})" if added else "")


def main() -> int:
    old, new = Path(sys.argv[1]), Path(sys.argv[2])
    runs = sorted(p for p in old.iterdir() if (p / "metrics.jsonl").is_file())
    for run in runs:
        print(f"{run.name}: {compare(run, new / run.name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
