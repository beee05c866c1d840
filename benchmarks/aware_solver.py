"""FedAWARE's min-norm solve: Frank-Wolfe (capped, the authors') against away steps.

For N clients, momenta m_i = s_i (u + e_i / 2) with a shared u, random e_i and scales
s_i in [0.5, 2] (as ``benchmarks/aware_memory.py`` fills its store), solved normalised
(m_i / ||m_i||, the authors' code) as AwareCore solves them. Per solver: iterations,
seconds, the value lambda.M.lambda, its excess over the best value found (relative), and
the relative duality gap the solver reports (``aware_gap`` in metrics.jsonl; the excess
is at most twice it).

    OPENBLAS_NUM_THREADS=1 python benchmarks/aware_solver.py --clients 100 10000 --dim 256
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedflex.strategies.fedaware import min_norm_away_steps, min_norm_weights  # noqa: E402


def gram_matrix(n: int, dim: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    u = rng.normal(size=dim)
    m = rng.uniform(0.5, 2.0, size=(n, 1)) * (u + rng.normal(size=(n, dim)) / 2)
    return m @ m.T


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[100, 10000])
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    solvers = {
        "frank-wolfe, 250 (default)": lambda g, s: min_norm_weights(g, 250, 1e-5, s),
        "frank-wolfe, 1000": lambda g, s: min_norm_weights(g, 1000, 1e-5, s),
        "away-steps, cap 250, gap 1e-6": lambda g, s: min_norm_away_steps(g, 250, 1e-6, s),
        "away-steps, gap 1e-6 (default)": lambda g, s: min_norm_away_steps(g, 10_000, 1e-6, s),
        "away-steps, gap 1e-9, cap 5000": lambda g, s: min_norm_away_steps(g, 5000, 1e-9, s),
    }
    print(f"{'N':>6} {'solver':>32} {'iters':>6} {'seconds':>8} {'value':>12} {'excess':>9} {'rel. gap':>9}")
    for n in args.clients:
        gram = gram_matrix(n, args.dim, args.seed)
        norms = np.sqrt(np.diag(gram))
        scale = 1.0 / norms
        results = {}
        for name, solve in solvers.items():
            t0 = time.perf_counter()
            res = solve(gram, scale)
            results[name] = (res, time.perf_counter() - t0)
        best = min(r.value for r, _ in results.values())
        for name, (res, dt) in results.items():
            excess = (res.value - best) / best if best > 0 else 0.0
            print(
                f"{n:>6} {name:>32} {res.iterations:>6} {dt:>8.3f} {res.value:>12.6g} "
                f"{excess:>9.2e} {res.relative_gap:>9.2e}",
                flush=True,
            )


if __name__ == "__main__":
    main()
