"""Reproduce the FedAWARE comparison (Zeng et al., arXiv:2310.02702, Table 2 setting).

Runs each method for each seed as ``python -m fedflex run SCENARIO ... --out DIR``
(one subprocess per run; finished runs are skipped when the script is run again), then
prints and writes (``OUT/results.md``) per method: the mean test accuracy over the last
10% of rounds and e-LUDD (mean e-LUD over the rounds), mean +- std over the seeds, next to
the paper's CIFAR-10 figures (5-layer CNN, 500 rounds, 3 seeds). On FMNIST the paper has
no numbers: compare the ordering, not the digits.

    python scripts/reproduce_fedaware.py [--scenario scenarios/fedaware_fmnist.yaml]
        [--rounds 200] [--seeds 3] [--methods fedavg fedaware ...] [--out runs/fedaware-repro]
        [--set key=value ...] [--report-only]

Server learning rates (FMNIST; see docs/fedaware.md, "Reproduction"): FedAvg, FedProx,
FedAWARE and FedAvgM use eta_g = 1 as in the paper; FedAvgM's momentum is 0.7, the
smallest of the paper's grid {0.7, 0.9, 0.97, 0.997} (effective step eta_g / (1 - beta)
= 3.3 FedAvg steps); FedYogi uses beta1 = 0.9, beta2 = 0.99, tau = 1e-4 (the paper's)
and eta_g = 10^-2.5, the point of the paper's grid {10^-3, 10^-2.5, ..., 10} closest to
the root-mean-square coordinate of a FedAvg update on this task, so that Yogi's first
steps (each coordinate moves at most eta_g) are about as long as FedAvg's.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]

FEDAVGM = [
    "strategy.aggregator.name=fedavgm",
    "strategy.aggregator.server_lr=1.0",
    "strategy.aggregator.server_momentum=0.7",
]
FEDYOGI = [
    "strategy.aggregator.name=fedyogi",
    f"strategy.aggregator.server_lr={10**-2.5:.6g}",
    "strategy.aggregator.beta1=0.9",
    "strategy.aggregator.beta2=0.99",
    "strategy.aggregator.tau=1e-4",
]
# FedAMS: the same a-priori eta_g and betas as FedYogi; eps sits in the max (the paper's
# v_hat = max(v_hat, v, eps)), so eps = 1e-8 floors the denominator at 1e-4 = FedYogi's tau
FEDAMS = [
    "strategy.aggregator.name=fedams",
    f"strategy.aggregator.server_lr={10**-2.5:.6g}",
    "strategy.aggregator.beta1=0.9",
    "strategy.aggregator.beta2=0.99",
    "strategy.aggregator.tau=1e-8",
    "strategy.aggregator.ams_epsilon_at=max",
]
FEDPROX = ["strategy.aggregator.name=fedavg", "strategy.local_rule.name=fedprox", "strategy.local_rule.mu=0.01"]
AWARE = ["strategy.aggregator.aware=true"]
# FedCM's alpha and FedDyn's alpha: the defaults of their papers (FedAWARE tuned them on
# the grids {0.1, 0.3, ..., 0.9} and {0.1, 0.01, 0.001}); FedDyn averages plainly
FEDCM = ["strategy.aggregator.name=fedavg", "strategy.local_rule.name=fedcm", "strategy.local_rule.fedcm_alpha=0.1"]
FEDDYN = [
    "strategy.aggregator.name=fedavg",
    "strategy.aggregator.weighted=false",
    "strategy.local_rule.name=feddyn",
    "strategy.local_rule.feddyn_alpha=0.01",
]

#: method -> (overrides, paper CIFAR-10 accuracy %, paper CIFAR-10 e-LUDD)
METHODS: dict[str, tuple[list[str], Optional[float], Optional[float]]] = {
    "fedavg": (["strategy.aggregator.name=fedavg"], 42.78, 2.58),
    "fedavgm": (FEDAVGM, 50.07, 2.17),
    "fedprox": (FEDPROX, 46.33, 2.81),
    "fedcm": (FEDCM, 47.84, 2.99),
    "feddyn": (FEDDYN, 54.87, None),
    "fedyogi": (FEDYOGI, 54.62, 2.47),
    "fedaware": (["strategy.aggregator.name=fedaware"], 59.78, 2.90),
    "fedavg-aware": (["strategy.aggregator.name=fedavg", *AWARE], 49.25, 3.08),
    "fedavgm-aware": ([*FEDAVGM, *AWARE], 59.58, 2.92),
    # not in the default list
    "fedprox-aware": ([*FEDPROX, *AWARE], 49.40, 2.87),
    "fedcm-aware": ([*FEDCM, *AWARE], 49.13, 3.09),
    "fedyogi-aware": ([*FEDYOGI, *AWARE], 54.92, 2.66),
    "fedams": (FEDAMS, None, None),
    "fedams-aware": ([*FEDAMS, *AWARE], None, None),
    "fedaware-raw": (["strategy.aggregator.name=fedaware", "strategy.aggregator.aware_normalize=false"], None, None),
    "fedaware-rescale": (["strategy.aggregator.name=fedaware", "strategy.aggregator.aware_rescale=true"], None, None),
}
DEFAULT_METHODS = ["fedavg", "fedavgm", "fedprox", "fedyogi", "fedaware", "fedavg-aware", "fedavgm-aware"]


def _skipped(run_dir: Path) -> int:
    return int(json.loads((run_dir / "summary.json").read_text()).get("skipped_rounds", 0))


def _completed(run_dir: Path) -> bool:
    summary = run_dir / "summary.json"
    return summary.is_file() and json.loads(summary.read_text()).get("status") == "completed"


def run_one(scenario: str, method: str, seed: int, rounds: int, out: Path, extra: list[str], retries: int = 1) -> Path:
    """One run (kept when its summary says completed); its results directory.

    The FedAWARE scenarios have no churn, so a skipped round (no client online) means the
    simulation's nodes were not up yet: such a run is started again up to ``retries`` times.
    """
    run_dir = out / method / f"seed{seed}"
    if _completed(run_dir):
        if not _skipped(run_dir) or retries <= 0:
            print(f"  {method} seed {seed}: done before, kept", flush=True)
            return run_dir
        print(f"  {method} seed {seed}: {_skipped(run_dir)} round(s) skipped (no client online): run again", flush=True)
    if run_dir.exists():  # an unfinished run: start it again
        for f in sorted(run_dir.rglob("*"), reverse=True):
            f.unlink() if f.is_file() else f.rmdir()
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "fedflex",
        "run",
        scenario,
        *METHODS[method][0],
        f"seed={seed}",
        f"rounds={rounds}",
        "output.progress=lines",
        *extra,
        "--out",
        str(run_dir),
    ]
    log = out / method / f"seed{seed}.log"
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        sys.exit(f"{method} seed {seed} failed (exit {proc.returncode}); see {log}\n  {' '.join(cmd)}")
    print(f"  {method} seed {seed}: {time.perf_counter() - t0:.0f} s", flush=True)
    if _skipped(run_dir) and retries > 0:
        return run_one(scenario, method, seed, rounds, out, extra, retries - 1)
    return run_dir


def run_figures(run_dir: Path, rounds: int) -> tuple[Optional[float], Optional[float]]:
    """(mean test accuracy % over the last 10% of rounds, e-LUDD) of one run."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("phase", "train") == "train"]
    first = rounds - max(1, math.ceil(0.1 * rounds)) + 1
    accs = [r["test_accuracy"] for r in rows if r["round"] >= first and r.get("test_accuracy") is not None]
    summary = json.loads((run_dir / "summary.json").read_text())
    if summary.get("skipped_rounds"):
        print(f"  warning: {run_dir} has {summary['skipped_rounds']} skipped round(s)", flush=True)
    return (100 * sum(accs) / len(accs) if accs else None), summary.get("e_ludd")


def mean_std(values: list[Optional[float]]) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    m = sum(vals) / len(vals)
    if len(vals) == 1:  # no spread from one seed
        return f"{m:.2f}"
    s = math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1))
    return f"{m:.2f} ± {s:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="scenarios/fedaware_fmnist.yaml")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..S-1")
    parser.add_argument("--methods", nargs="+", default=DEFAULT_METHODS, choices=list(METHODS))
    parser.add_argument("--out", default="runs/fedaware-repro")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for every run")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: tabulate the completed runs in --out (a method may have fewer seeds)",
    )
    args = parser.parse_args()
    out = Path(args.out).resolve()
    print(f"{len(args.methods)} methods x {args.seeds} seeds, {args.rounds} rounds -> {out}", flush=True)
    table = {}
    for method in args.methods:
        if args.report_only:
            dirs = [out / method / f"seed{s}" for s in range(args.seeds)]
            dirs = [d for d in dirs if _completed(d)]
        else:
            dirs = [run_one(args.scenario, method, s, args.rounds, out, args.set) for s in range(args.seeds)]
        table[method] = [run_figures(d, args.rounds) for d in dirs]
    last = max(1, math.ceil(0.1 * args.rounds))
    lines = [
        f"Scenario `{args.scenario}`, {args.rounds} rounds, seeds 0..{args.seeds - 1}; accuracy: mean test "
        f"accuracy (%) over the last {last} round(s); mean ± std over seeds.",
        "",
        "| method | accuracy % | e-LUDD | seeds | paper CIFAR-10 acc % | paper CIFAR-10 e-LUDD |",
        "|---|---|---|---|---|---|",
    ]
    for method, figures in table.items():
        _, paper_acc, paper_lud = METHODS[method]
        lines.append(
            f"| {method} | {mean_std([a for a, _ in figures])} | {mean_std([e for _, e in figures])} "
            f"| {len(figures)} | "
            f"{paper_acc if paper_acc is not None else '-'} | {paper_lud if paper_lud is not None else '-'} |"
        )
    text = "\n".join(lines) + "\n"
    print()
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(text)
    print(f"written: {out / 'results.md'}")


if __name__ == "__main__":
    main()
