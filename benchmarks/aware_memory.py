"""FedAWARE server memory and time per round, by memory option and storage type.

For each model (``cnn-fmnist``, ``cnn-cifar``), memory option (``full``,
``last-layers`` with the classification layer's weight and bias), momentum dtype
(float32, float16, bfloat16) and N (1,000 and 10,000 clients) it builds the real
:class:`strategies.fedaware.AwareCore` and reports the bytes of the arrays it allocated:
the [N, d] momentum store (plus float16/bfloat16 row scales) and the [N, N] float64 Gram
matrix, per client and in total.

Timing (``round s``): one aggregation with K = 10 uploads once every client has a
momentum: momentum update, the K Gram rows (K x N x d), best-pair start + Frank-Wolfe,
and the direction. ``solve s``: the Frank-Wolfe solve alone. The store is filled with
synthetic momenta s_i (u + e_i / 2) (u shared, e_i random, s_i in [0.5, 2]) and the
Gram matrix with their expected inner products, so timings are representative, not
results. Configurations whose store exceeds ``--max-fill-gb`` are allocated and measured
but not filled or timed (the machine is shared).

    OPENBLAS_NUM_THREADS=1 python benchmarks/aware_memory.py [--clients 1000 10000] [--max-fill-gb 1.5]

(On a shared machine one BLAS thread gives steadier times: a multi-threaded BLAS that
competes for cores can be many times slower.) Times are the best of two.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedflex.config import ModelConfig  # noqa: E402
from fedflex.models import build_model  # noqa: E402
from fedflex.strategies.fedaware import AwareCore, min_norm_weights  # noqa: E402
from fedflex.strategies.parts import ClientUpdate  # noqa: E402

MODELS = {"cnn-fmnist": (1, 28, 28), "cnn-cifar": (3, 32, 32)}
GB = 1 << 30


def model_arrays(name: str) -> "OrderedDict[str, np.ndarray]":
    model = build_model(ModelConfig(name=name), MODELS[name], 10)
    return OrderedDict((k, v.detach().cpu().numpy()) for k, v in model.state_dict().items())


def fill(core: AwareCore, rng: np.random.Generator) -> None:
    """Synthetic momenta for every client, and their expected Gram matrix."""
    n, d = core.num_clients, core.store.dim
    u = rng.standard_normal(d)
    s = rng.uniform(0.5, 2.0, n)
    chunk = max(1, (64 << 20) // (8 * d))
    for c0 in range(0, n, chunk):
        idx = np.arange(c0, min(n, c0 + chunk))
        core.store.set(idx, s[idx, None] * (u + 0.5 * rng.standard_normal((idx.size, d))))
    core.has[:] = True
    core.warm = True
    core.gram[:] = np.outer(s, s) * d
    core.gram[np.diag_indices(n)] *= 1.25  # E<u + e/2, u + e/2> = 1.25 d


def measure(name: str, arrays, memory: str, dtype: str, n: int, max_fill_gb: float, rng) -> dict:
    core = AwareCore(n, memory=memory, dtype=dtype, warmup=False)
    core._setup(arrays)  # allocates the store and the Gram matrix
    row = {
        "model": name,
        "memory": memory,
        "dtype": dtype,
        "N": n,
        "d": core.store.dim,
        "momenta_B": core.store.nbytes,
        "gram_B": int(core.gram.nbytes),
    }
    row["round_s"] = row["solve_s"] = None
    if core.store.nbytes <= max_fill_gb * GB:
        fill(core, rng)
        ups = []
        for c in rng.choice(n, size=10, replace=False):
            client = OrderedDict(
                (k, (a - 1e-3 * rng.standard_normal(a.shape)).astype(a.dtype)) for k, a in arrays.items()
            )
            ups.append(ClientUpdate(int(c), 100, client))
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            core.direction(arrays, sorted(ups, key=lambda u: u.client))
            times.append(time.perf_counter() - t0)
        row["round_s"] = min(times)
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            min_norm_weights(core.gram, core.iters, core.tol)
            times.append(time.perf_counter() - t0)
        row["solve_s"] = min(times)
    del core
    gc.collect()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--max-fill-gb", type=float, default=1.5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    threads = {k: os.environ.get(k, "unset") for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    print(f"# FedAWARE server memory and time per round; {threads}")
    head = (
        f"{'model':<11} {'memory':<11} {'dtype':<8} {'N':>6} {'d':>7} {'momenta/cl':>11} {'gram/cl':>8} "
        f"{'total MB':>9} {'round s':>8} {'solve s':>8}"
    )
    print(head)
    print("-" * len(head))
    for name in args.models:
        arrays = model_arrays(name)
        for memory in ("full", "last-layers"):
            for dtype in ("float32", "float16", "bfloat16"):
                for n in args.clients:
                    r = measure(name, arrays, memory, dtype, n, args.max_fill_gb, rng)
                    per_m, per_g = r["momenta_B"] / n, r["gram_B"] / n
                    total = (r["momenta_B"] + r["gram_B"]) / 1e6
                    rs = f"{r['round_s']:.3f}" if r["round_s"] is not None else "-"
                    ss = f"{r['solve_s']:.3f}" if r["solve_s"] is not None else "-"
                    print(
                        f"{name:<11} {memory:<11} {dtype:<8} {n:>6} {r['d']:>7} {per_m:>9.0f} B {per_g:>6.0f} B "
                        f"{total:>9.1f} {rs:>8} {ss:>8}",
                        flush=True,
                    )
    print(
        "momenta/cl: bytes of the [N, d] store (+ row scales) per client; gram/cl: the [N, N] float64 Gram "
        "matrix per client (8 N bytes); '-': store above --max-fill-gb, allocated and measured, not timed"
    )


if __name__ == "__main__":
    main()
