"""Reproduce BHerd's Figures 2a / 3a (Luo et al., 2024, arXiv 2403.16557) with fedflex.

Runs scenarios/bherd_<dataset>_<model>.yaml (N = 5 clients, all train every round,
E = 1, B = 100, plain SGD) for every case, model and method over several seeds, each as
``python -m fedflex run <scenario> <overrides> --out DIR``; then, per case and model,
plots the test loss and accuracy per round of every method (mean over seeds;
``<out>/bherd-<dataset>-case<c>-<model>.png``) and prints a table of the first round
that reaches ``--target`` test accuracy (mean over the seeds that reach it, and how
many did) with the final accuracy; the table is also written to ``<out>/summary.md``.

Methods: FedAvg, GraB-FedAvg and BHerd-FedAvg for every ``--alphas``; with
``--extensions`` also FedNova, BHerd-FedNova, SCAFFOLD and BHerd-SCAFFOLD (alpha 0.5;
the paper's Figure 2b). Cases: 1 = IID; 2 = every client holds two digits {0,5}, {1,6},
{2,7}, {3,8}, {4,9} (the SVM splits on the digits, then maps them to even/odd); 2b (SVM
only) = every client holds one binary class: clients 0, 2, 4 the even digits, 1, 3 the
odd ones; 3 = digits 0-4 IID over clients 0-2, digits {5,6,7} and {8,9} on clients 3 and
4 (``partition.pattern=half-iid``). See docs/bherd.md.

    python scripts/reproduce_bherd.py --out runs/repro-bherd [--rounds 200] [--seeds 0 1 2]
        [--cases 1 2 2b] [--models svm cnn] [--alphas 0.1 0.3 0.5 0.7 1.0] [--target 0.95]
        [--dataset fmnist|mnist] [--extensions] [--jobs 1] [--baselines FedAvg GraB-FedAvg] [extra.key=value ...]

Completed runs (``"status": "completed"`` in their summary.json,
:func:`fedflex.study.runs.is_completed`, as ``fedflex sweep`` reads it) are reused; an
interrupted, failed or killed run is started again, so an interrupted reproduction
continues where it stopped; change ``--out`` when changing ``--rounds``.
"""

from __future__ import annotations

import argparse
import itertools
import math
import shutil
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedflex.study.runs import is_completed  # noqa: E402

MODELS = ("svm", "cnn")
DIGIT_GROUPS = "partition.label_groups=[[0,5],[1,6],[2,7],[3,8],[4,9]]"
#: (model, case) -> partition overrides. Case 2 (the spec's): each client holds two digits
#: {0,5}, {1,6}, ...; the SVM partitions on the digits before the even/odd map, so each of
#: its clients holds one even and one odd digit. Case 2b (SVM only): every client holds a
#: single binary class (clients 0, 2, 4 even, 1, 3 odd), a harsher skew.
CASES = {
    ("svm", "1"): ["partition.scheme=iid"],
    ("cnn", "1"): ["partition.scheme=iid"],
    ("svm", "2"): ["partition.scheme=label-groups", DIGIT_GROUPS, "partition.labels=source"],
    ("cnn", "2"): ["partition.scheme=label-groups", DIGIT_GROUPS],
    ("svm", "2b"): ["partition.scheme=label-groups", "partition.label_groups=[[0],[1]]"],
    # Case 3: digits 0-4 IID over clients 0-2, digits {5,6,7} and {8,9} on clients 3 and 4
    ("svm", "3"): ["partition.scheme=label-sets", "partition.pattern=half-iid", "partition.labels=source"],
    ("cnn", "3"): ["partition.scheme=label-sets", "partition.pattern=half-iid"],
}
#: default --target per (dataset, model): within reach in ~100 rounds, above the first rounds
TARGETS = {("fmnist", "svm"): 0.95, ("fmnist", "cnn"): 0.85, ("mnist", "svm"): 0.88, ("mnist", "cnn"): 0.97}
BHERD = ["strategy.local_rule.name=bherd", "strategy.aggregator.name=bherd"]
BASELINES = {
    "FedAvg": ["strategy.local_rule.name=sgd", "strategy.aggregator.name=fedavg"],
    "GraB-FedAvg": ["strategy.local_rule.name=grab", "strategy.aggregator.name=bherd"],
}
EXTENSIONS = {
    "FedNova": ["strategy.local_rule.name=fednova", "strategy.aggregator.name=fedavg"],
    "BHerd-FedNova": [*BHERD, "strategy.local_rule.bherd_alpha=0.5", "strategy.local_rule.bherd_base=fednova"],
    "SCAFFOLD": ["strategy.local_rule.name=scaffold", "strategy.aggregator.name=fedavg"],
    "BHerd-SCAFFOLD": [*BHERD, "strategy.local_rule.bherd_alpha=0.5", "strategy.local_rule.bherd_base=scaffold"],
}


def methods(
    alphas: list[float], extensions: bool, baselines: tuple[str, ...] = tuple(BASELINES)
) -> dict[str, list[str]]:
    out = {name: BASELINES[name] for name in baselines}
    for a in alphas:
        out[f"BHerd a={a:g}"] = [
            *BHERD,
            f"strategy.local_rule.bherd_alpha={a}",
            "strategy.local_rule.bherd_base=fedavg",
        ]
    if extensions:
        out.update(EXTENSIONS)
    return out


def run_one(scenario: Path, out: Path, overrides: list[str]) -> Path:
    """One ``fedflex run`` (skipped when ``out`` holds a completed run)."""
    if is_completed(out):
        return out
    if out.exists():  # an interrupted, failed or killed run: start it again
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "fedflex",
        "run",
        str(scenario),
        *overrides,
        "output.progress=off",
        "output.plots=false",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    return out


def curves(run_dirs: list[Path]) -> dict[str, list[list[float]]]:
    """Per metric, one list of per-round values per run (training rounds only)."""
    from fedflex.results import read_metrics

    out: dict[str, list[list[float]]] = {"test_accuracy": [], "test_loss": []}
    for d in run_dirs:
        rows = [r for r in read_metrics(d) if r.get("phase", "train") == "train"]
        for key in out:
            out[key].append([float(r[key]) if r.get(key) is not None else math.nan for r in rows])
    return out


def mean_curve(runs: list[list[float]]) -> list[float]:
    length = min(len(r) for r in runs)
    return [statistics.fmean(r[t] for r in runs) for t in range(length)]


def rounds_to(acc: list[float], target: float) -> int | None:
    """First round (1-based) whose accuracy reaches ``target``."""
    return next((t + 1 for t, a in enumerate(acc) if a >= target), None)


def plot(path: Path, title: str, per_method: dict[str, dict[str, list[float]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, c in per_method.items():
        rounds = range(1, len(c["test_loss"]) + 1)
        style = "--" if name in BASELINES or name in EXTENSIONS and not name.startswith("BHerd") else "-"
        axes[0].plot(rounds, c["test_loss"], style, label=name)
        axes[1].plot(rounds, c["test_accuracy"], style, label=name)
    for ax, label in zip(axes, ("test loss", "test accuracy")):
        ax.set_xlabel("round")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/repro-bherd")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument(
        "--cases",
        nargs="+",
        default=["1", "2"],
        choices=sorted({c for _, c in CASES}),
        help="1 IID, 2 two digits per client, 2b (SVM only) one binary class per client, "
        "3 digits 0-4 IID over clients 0-2, {5,6,7} and {8,9} on clients 3 and 4",
    )
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.1, 0.3, 0.5, 0.7, 1.0])
    parser.add_argument(
        "--target",
        type=float,
        default=None,
        help="test accuracy for the rounds-to-target table (default per dataset and model: "
        + ", ".join(f"{d} {m} {t}" for (d, m), t in TARGETS.items())
        + ")",
    )
    parser.add_argument("--dataset", default="fmnist", choices=["fmnist", "mnist"])
    parser.add_argument("--extensions", action="store_true", help="also FedNova / SCAFFOLD with and without BHerd")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time")
    parser.add_argument(
        "--baselines",
        nargs="*",
        default=list(BASELINES),
        choices=list(BASELINES),
        help="baselines to run next to BHerd (default: all; e.g. --baselines FedAvg)",
    )
    parser.add_argument("extra", nargs="*", help="further overrides for every run, e.g. client.lr=1e-4")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    todo = methods(args.alphas, args.extensions, args.baselines)
    pairs = [(c, m) for c, m in itertools.product(args.cases, args.models) if (m, c) in CASES]
    grid = [(c, m, method, seed) for c, m in pairs for method in todo for seed in args.seeds]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {}
        for case, model, method, seed in grid:
            scenario = ROOT / "scenarios" / f"bherd_{args.dataset}_{model}.yaml"
            slug = method.replace(" ", "-").replace("=", "")
            d = out / f"case{case}-{model}-{slug}-s{seed}"
            ov = [f"rounds={args.rounds}", f"seed={seed}", *CASES[(model, case)], *todo[method], *args.extra]
            futures[(case, model, method, seed)] = pool.submit(run_one, scenario, d, ov)
        dirs = {k: f.result() for k, f in futures.items()}
    lines = [f"# BHerd reproduction ({args.dataset}, {args.rounds} rounds, seeds {args.seeds})", ""]
    for case, model in pairs:
        per_method = {}
        target = args.target if args.target is not None else TARGETS[(args.dataset, model)]
        lines += [
            f"## Case {case}, {model}: rounds to {target:.0%} test accuracy",
            "",
            "| method | rounds to target (mean) | per seed | seeds reaching it | final accuracy | final loss |",
            "|---|---|---|---|---|---|",
        ]
        for method in todo:
            c = curves([dirs[(case, model, method, s)] for s in args.seeds])
            per_method[method] = {k: mean_curve(v) for k, v in c.items()}
            hits = [rounds_to(acc, target) for acc in c["test_accuracy"]]
            reached = [r for r in hits if r is not None]
            mean_r = f"{statistics.fmean(reached):.1f}" if reached else "-"
            per_seed = ", ".join("-" if r is None else str(r) for r in hits)
            final = per_method[method]
            lines.append(
                f"| {method} | {mean_r} | {per_seed} | {len(reached)}/{len(args.seeds)} | "
                f"{final['test_accuracy'][-1]:.4f} | {final['test_loss'][-1]:.4f} |"
            )
        lines.append("")
        png = out / f"bherd-{args.dataset}-case{case}-{model}.png"
        plot(png, f"BHerd, {args.dataset}, case {case}, {model} (mean of {len(args.seeds)} seed(s))", per_method)
        lines += [f"![case {case} {model}]({png.name})", ""]
    text = "\n".join(lines)
    (out / "summary.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
