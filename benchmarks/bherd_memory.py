"""Memory of BHerd's stored gradients: tau x d values per training client.

BHerd (Luo et al., 2024, https://arxiv.org/abs/2403.16557) keeps every mini-batch
gradient of a round until the herding selection. For every model of the registry
(:data:`fedflex.models.MODELS`, on its natural input) this prints d and the bytes of
the store for several tau in float32 / float16 / bfloat16, and the bound that
``bherd_max_stored = M`` gives (M rows whatever tau). The paper's setting is E = 1,
B = 100, n_i = 12000 (60000 MNIST images over 5 clients): tau = 120.

``--measure`` also allocates the store for real (CPU, :class:`clients.bherd.GradientStore`),
fills it, runs the herding selection and reports the resident-memory growth of the
process and the selection time, for models whose float32 store fits ``--measure-mb``.

    python benchmarks/bherd_memory.py [--taus 120 12 60 600] [--max-stored 32] [--measure]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from fedflex.clients.bherd import GradientStore, herd_k  # noqa: E402
from fedflex.config import ModelConfig  # noqa: E402
from fedflex.models import MODELS, build_model, num_parameters  # noqa: E402

#: each model on the input of the paper it comes from: (input shape, classes)
NATURAL = {
    "logreg": ((60,), 10),
    "linear": ((1, 28, 28), 10),
    "mlp": ((1, 28, 28), 10),
    "cnn-fmnist": ((1, 28, 28), 10),
    "cnn-bherd": ((1, 28, 28), 10),
    "cnn-cifar": ((3, 32, 32), 10),
    "cnn-svhn": ((3, 32, 32), 10),
    "resnet18": ((3, 32, 32), 10),
    "svm": ((1, 28, 28), 2),
}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc)."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def model_dims() -> dict[str, int]:
    dims = {}
    for name in MODELS:
        shape, classes = NATURAL[name]
        loss = "squared-hinge" if name == "svm" else "cross-entropy"
        torch.manual_seed(0)
        dims[name] = num_parameters(build_model(ModelConfig(name=name, loss=loss), shape, classes))
    return dims


def measure(d: int, tau: int, dtype: torch.dtype, max_rows: int = 0) -> tuple[int, int, float]:
    """(store bytes, RSS growth, selection seconds) of a filled store on the CPU."""
    gc.collect()
    before = rss_bytes()
    store = GradientStore(tau, d, dtype, torch.device("cpu"), max_rows)
    gen = torch.Generator().manual_seed(0)
    for step in range(tau):
        store.add(step, torch.randn(d, generator=gen))
    grown = rss_bytes() - before
    t0 = time.perf_counter()
    store.select(0.5)
    dt = time.perf_counter() - t0
    nbytes = store.nbytes
    del store
    gc.collect()
    return nbytes, grown, dt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--taus", type=int, nargs="+", default=[120, 12, 60, 600])
    parser.add_argument("--max-stored", type=int, default=32, help="the bound shown in the last column")
    parser.add_argument("--measure", action="store_true", help="allocate and herd for real (CPU)")
    parser.add_argument("--measure-mb", type=float, default=256.0, help="largest float32 store to allocate")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dims = model_dims()
    print("BHerd stored gradients per training client: tau x d values (paper: E=1, B=100, n_i=12000 -> tau=120)")
    head = (
        f"{'model':<11} {'d':>10} {'tau':>5} "
        + " ".join(f"{n:>10}" for n in DTYPES)
        + f" {'M=' + str(args.max_stored) + ' bf16':>11}"
    )
    print(head)
    print("-" * len(head))
    for name, d in dims.items():
        for tau in args.taus:
            sizes = [tau * d * torch.empty(0, dtype=t).element_size() for t in DTYPES.values()]
            bounded = min(tau, args.max_stored) * d * 2
            print(
                f"{name:<11} {d:>10,} {tau:>5} " + " ".join(f"{human(s):>10}" for s in sizes) + f" {human(bounded):>11}"
            )
    if not args.measure:
        return
    tau = args.taus[0]
    print(
        f"\nmeasured on the CPU (tau={tau}, k={herd_k(0.5, tau)}, {args.threads} thread(s)): "
        "store bytes, resident-memory growth, herding time (Gram + greedy + sum)"
    )
    print(f"{'model':<11} {'dtype':>9} {'rows':>5} {'store':>10} {'RSS +':>10} {'select s':>9}")
    for name, d in dims.items():
        if tau * d * 4 > args.measure_mb * 2**20:
            rows = args.max_stored
            cases = [("bfloat16", rows)]
        else:
            cases = [("float32", 0), ("bfloat16", 0)]
        for dtype, rows in cases:
            nbytes, grown, dt = measure(d, tau, DTYPES[dtype], rows)
            shown = min(tau, rows) if rows else tau
            print(f"{name:<11} {dtype:>9} {shown:>5} {human(nbytes):>10} {human(grown):>10} {dt:>9.3f}")


if __name__ == "__main__":
    main()
