"""What a Ray backend costs before it runs anything of fedflex's: the floor under any
whole-process ratio of a Ray run to a plain PyTorch loop.

Two fresh processes, timed from start to exit, alternating, medians of ``--runs``:

- ``torch``: Python importing torch (what a plain loop pays too);
- ``ray``: the same, then ``ray.init`` with fedflex's settings (the CPUs, no dashboard),
  one Ray actor per CPU that imports torch (what every Ray worker of a run does before
  its first message), and ``ray.shutdown``.

Their difference is the fixed cost a Ray run adds to a plain loop with no fedflex and no
Flower code at all. A whole-process ratio ``(plain + extra) / plain`` cannot go under
``1 + floor / plain`` (on a machine whose cores the plain loop already uses).

    python benchmarks/ray_floor.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

TORCH = "import torch\n"
RAY = r"""
import logging, os, torch, ray
cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
ray.init(address="local", num_cpus=cpus, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)

@ray.remote(num_cpus=1)
class Worker:
    def ready(self):
        import torch  # noqa: F401  # what each worker of a run imports before its first message
        return os.getpid()

workers = [Worker.remote() for _ in range(int(cpus))]
ray.get([w.ready.remote() for w in workers])
ray.shutdown()
"""


def timed(code: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"torch": [], "ray": []}
    for _ in range(args.runs):
        times["torch"].append(timed(TORCH))
        times["ray"].append(timed(RAY))
    torch_s, ray_s = statistics.median(times["torch"]), statistics.median(times["ray"])
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"CPUs {cpus}; medians of {args.runs}")
    rows = [
        ("python + torch", torch_s, times["torch"]),
        ("+ ray.init, a worker per CPU importing torch, shutdown", ray_s, times["ray"]),
    ]
    for name, median, runs in rows:
        print(f"{name:<56} {median:6.2f} s   {[round(t, 2) for t in runs]}")
    print(f"{'floor a Ray run adds to a plain loop':<56} {ray_s - torch_s:6.2f} s")


if __name__ == "__main__":
    main()
