"""Reproduce the churn paper's FMNIST rows (v2 Table 3) with fedflex.

Runs scenarios/session_init_fmnist.yaml for every combination of label-set overlap,
Dirichlet alpha, base method (FedAvg = local rule sgd, SCAFFOLD) and initializer
(session-aware, previous, average) over several seeds, then prints, per transition, the
mean accuracy on the online clients' labels over the first 10 rounds after it
(mean +- sample std over seeds), next to the paper's FedAvg figures.

    python scripts/reproduce_session_init.py --out runs/repro-session-init [--seeds 0 1 2] [--jobs 1]

Finished runs (a summary.json in their directory) are reused, so an interrupted
reproduction continues where it stopped.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "session_init_fmnist.yaml"
INITS = ("session-aware", "previous", "average")
METHODS = {"fedavg": ["strategy.local_rule.name=sgd"], "scaffold": ["strategy.local_rule.name=scaffold"]}
# v2 Table 3, FedAvg, FMNIST, 20 clients: (first, second) transition, proposed / previous / average
PAPER = {
    (0.0, 0.3): ((88.16, 79.52, 87.95), (85.06, 82.70, 81.63)),
    (0.2, 0.3): ((85.50, 79.51, 85.62), (84.73, 81.61, 79.63)),
}


def run_one(out: Path, overrides: list[str]) -> Path:
    if (out / "summary.json").is_file():
        return out
    if out.exists():  # an interrupted run: start it again
        for p in sorted(out.iterdir()):
            p.unlink()
        out.rmdir()
    cmd = [
        sys.executable,
        "-m",
        "fedflex",
        "run",
        str(SCENARIO),
        *overrides,
        "output.progress=off",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    return out


def fmt(values: list[float]) -> str:
    if not values:
        return "-"
    m = 100 * statistics.mean(values)
    s = 100 * statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{m:.2f} ± {s:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/repro-session-init")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--overlaps", type=float, nargs="+", default=[0.0, 0.2])
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.3, 0.7])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--inits", nargs="+", default=list(INITS), choices=list(INITS))
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("extra", nargs="*", help="further overrides for every run, e.g. rounds=100")
    args = parser.parse_args()
    out = Path(args.out)
    grid = list(itertools.product(args.overlaps, args.alphas, args.methods, args.inits, args.seeds))
    jobs = {}
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for overlap, alpha, method, init, seed in grid:
            d = out / f"ov{overlap}-a{alpha}-{method}-{init}-s{seed}"
            ov = [
                f"partition.overlap={overlap}",
                f"partition.alpha={alpha}",
                *METHODS[method],
                f"strategy.initializer.name={init}",
                f"seed={seed}",
                *args.extra,
            ]
            jobs[(overlap, alpha, method, init, seed)] = pool.submit(run_one, d, ov)
        results = {k: json.loads((f.result() / "summary.json").read_text()) for k, f in jobs.items()}

    lines = [
        "| overlap | alpha | method | transition | session-aware | previous | average | paper (FedAvg) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for overlap, alpha, method in itertools.product(args.overlaps, args.alphas, args.methods):
        n_trans = max(
            len(results[(overlap, alpha, method, i, s)]["transitions"]) for i in args.inits for s in args.seeds
        )
        for t in range(n_trans):
            cells = []
            for init in INITS:
                vals = [
                    results[(overlap, alpha, method, init, s)]["transitions"][t]["mean_online_accuracy"]
                    for s in args.seeds
                    if (overlap, alpha, method, init, s) in results
                ]
                cells.append(fmt([v for v in vals if v is not None]))
            paper = PAPER.get((overlap, alpha))
            ref = "/".join(f"{x:.2f}" for x in paper[t]) if paper and method == "fedavg" and t < 2 else ""
            label = f"{t + 1}" + (" (return)" if t >= 1 else " (new labels)")
            lines.append(f"| {overlap} | {alpha} | {method} | {label} | " + " | ".join(cells) + f" | {ref} |")
    table = "\n".join(lines)
    print(table)
    (out / "table.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
