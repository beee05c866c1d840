"""Peak memory and per-round wall time of whole simulations at 1,000 and 10,000 clients.

Runs ``fedflex run scenarios/scale_10k.yaml`` (FMNIST, Markov churn, 100 sampled per
round) with ``num_clients`` set, for two strategies: uniform sampling + FedAvg, and
HiCS-FL + FedAWARE (momenta of the last layers in float16). Memory is the peak of the
summed resident set of the run's whole process tree (the driver, Ray's processes and
its workers), sampled every 0.2 s; round times come from metrics.jsonl (round 1, which
includes Ray's start and identifying every node, is reported apart).

    python benchmarks/scale.py --clients 1000 10000 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = {
    "uniform+fedavg": [],
    "hics+fedaware": [
        "strategy.sampler.name=hics",
        "strategy.sampler.ward=scalable",
        "strategy.aggregator.name=fedaware",
        "strategy.aggregator.aware_memory=last-layers",
        "strategy.aggregator.aware_dtype=float16",
    ],
}


def _tree_rss(root_pid: int) -> int:
    """Summed RSS (bytes) of ``root_pid`` and every process in its session."""
    total = 0
    try:
        sid = os.getsid(root_pid)
    except OSError:
        return 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getsid(int(entry)) != sid:
                continue
            with open(f"/proc/{entry}/statm") as fh:
                total += int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
    return total


def run(num_clients: int, rounds: int, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        cmd = [
            sys.executable,
            "-m",
            "fedflex",
            "run",
            str(ROOT / "scenarios" / "scale_10k.yaml"),
            f"num_clients={num_clients}",
            f"rounds={rounds}",
            "evaluation.every=1000",
            "output.plots=false",
            "output.progress=off",
            "output.checkpoint_every=0",
            *extra,
            "--out",
            str(out),
        ]
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        peak = 0
        while proc.poll() is None:
            peak = max(peak, _tree_rss(proc.pid))
            time.sleep(0.2)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr.read()[-2000:]}")
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        train = [r for r in rows if r.get("phase", "train") == "train"]
        return {
            "wall_s": wall,
            "peak_mib": peak / 2**20,
            "round1_s": train[0]["wall_s"],
            "round_s": statistics.median(r["wall_s"] for r in train[1:]) if len(train) > 1 else float("nan"),
            "online": statistics.mean(len(r["online"]) for r in train),
            "trained": statistics.mean(len(r["sampled"]) for r in train),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES))
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    print(
        f"{'strategy':>15} {'N':>6} {'peak MiB':>9} {'round 1 s':>10} {'round s':>8} "
        f"{'online':>7} {'trained':>8} {'wall s':>7}"
    )
    for name in args.strategies:
        for n in args.clients:
            r = run(n, args.rounds, STRATEGIES[name] + list(args.overrides))
            print(
                f"{name:>15} {n:>6} {r['peak_mib']:>9.0f} {r['round1_s']:>10.1f} {r['round_s']:>8.2f} "
                f"{r['online']:>7.0f} {r['trained']:>8.0f} {r['wall_s']:>7.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
