"""Server-side cost of a sampler per round: ``sample()`` + ``observe()`` at N clients.

Every (sampler, N, ward) runs in its own process, so that its peak resident memory is
its own. The sampler first sees one update from every client (not timed: the state a
long run reaches), then ``--rounds`` rounds of ``sample(K)`` + ``observe(K replies)``
are timed; one more round runs under ``tracemalloc`` for the peak of Python/numpy
allocations during a round. The updates have the shapes of the HiCS-FL FMNIST CNN
(``cnn-fmnist``, 18,378 parameters): HiCS reads only the 10 output biases, clustered
and DivFL sketch the whole update (``strategies.clustered.CountSketch``).

DivFL's timed rounds are its selection with stale proxies (with ``ideal`` proxies the
server does the same work on fresh proxies; the extra cost, every online client
training, is on the clients). FedCor first runs its 15 warm-up rounds (loss queries
answered instantly by the benchmark's context, so only the server's work is timed; the
GP is refitted after every query from the 2nd on); the timed rounds are selection
rounds, and ``refit s`` is one GP fit on the 15 warm-up loss-change vectors (what a
refresh round adds).

    python benchmarks/sampler_cost.py --clients 100 1000 10000 --rounds 3

Columns: median seconds per round, tracemalloc peak of one round (MiB), process peak
RSS (MiB, includes the interpreter, numpy/scipy/flwr imports and the sampler's state).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = OrderedDict(
    [
        ("body.0.weight", (16, 1, 5, 5)),
        ("body.0.bias", (16,)),
        ("body.3.weight", (32, 16, 5, 5)),
        ("body.3.bias", (32,)),
        ("fc_out.weight", (10, 512)),
        ("fc_out.bias", (10,)),
    ]
)


class Ctx:
    """The part of RoundContext the samplers read."""

    def __init__(self, n: int, global_arrays) -> None:
        self.num_clients = n
        self.global_arrays = global_arrays
        self.sizes = {c: 1000 + (c % 7) * 100 for c in range(n)}

    def data_sizes(self):
        return self.sizes

    def query(self, server_round, clients, arrays):
        """Losses for FedCor: two groups of clients whose losses move together, plus noise."""
        rng = np.random.default_rng(server_round)
        shared = rng.normal(size=2)
        noise = rng.normal(scale=0.1, size=len(clients))
        return {
            int(c): {"eval-loss": 2.0 + shared[int(c) % 2] + noise[i], "num-examples": self.sizes[int(c)]}
            for i, c in enumerate(clients)
        }


def make_sampler(name: str, n: int, ward: str, rounds: int):
    from fedflex.strategies.basic import UniformSampler
    from fedflex.strategies.clustered import ClusteredSampler
    from fedflex.strategies.divfl import DivFLSampler
    from fedflex.strategies.fedcor import FedCorSampler
    from fedflex.strategies.hics import HiCSSampler

    if name == "uniform":
        return UniformSampler(seed=0)
    if name == "hics":
        return HiCSSampler(bias_key="fc_out.bias", num_clients=n, rounds=rounds, seed=0, ward=ward)
    if name == "clustered":
        return ClusteredSampler(seed=0, ward=ward)
    if name == "divfl":
        return DivFLSampler(seed=0)
    if name == "fedcor":
        return FedCorSampler(seed=0, warmup=15, refresh=0)
    raise SystemExit(f"unknown sampler {name}")


def fake_update(client: int, rng: np.random.Generator, global_arrays):
    from fedflex.strategies.parts import ClientUpdate

    arrays = OrderedDict()
    labels = rng.dirichlet(np.full(10, 0.1))
    for key, g in global_arrays.items():
        if key == "fc_out.bias":
            arrays[key] = (g + 0.01 * (labels - 0.1) + rng.normal(scale=1e-4, size=g.shape)).astype(np.float32)
        else:
            arrays[key] = (g + rng.normal(scale=1e-3, size=g.shape)).astype(np.float32)
    return ClientUpdate(client=client, num_examples=1000, arrays=arrays)


def one(name: str, n: int, ward: str, k: int, rounds: int) -> dict:
    """Measure one configuration in this process."""
    rng = np.random.default_rng(0)
    g = OrderedDict((key, np.zeros(shape, dtype=np.float32)) for key, shape in SHAPES.items())
    total_rounds = 10**6
    sampler = make_sampler(name, n, ward, total_rounds)
    sampler.bind(Ctx(n, g))
    online = np.arange(n)
    sampler.sample(1, online, k)  # learns K
    t0 = time.perf_counter()
    for a in range(0, n, 500):
        sampler.observe(1, [fake_update(c, rng, g) for c in range(a, min(n, a + 500))], g)
    refit_s = None
    if name == "fedcor":  # the warm-up: a loss query each round, a fit from the 2nd change on
        for t in range(1, sampler.warmup + 1):
            sampler.sample(t, online, k)
        t1 = time.perf_counter()
        sampler._fit()
        refit_s = time.perf_counter() - t1
    prefill_s = time.perf_counter() - t0
    start = getattr(sampler, "warmup_rounds", 0) + getattr(sampler, "warmup", 0) + 1
    if name == "fedcor":
        start += 1  # round warmup + 1 still queries (it completes the last loss change)
    pool = [fake_update(i, rng, g) for i in range(k)]  # replies, made before the clock starts
    times = []
    for i in range(rounds + 1):
        t = start + i
        traced = i == rounds
        if traced:
            tracemalloc.start()
        t0 = time.perf_counter()
        picks = sampler.sample(t, online, k)
        sampler.observe(t, [replace(pool[j], client=int(c)) for j, c in enumerate(picks)], g)
        dt = time.perf_counter() - t0
        if traced:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        else:
            times.append(dt)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    return {
        "sampler": name,
        "clients": n,
        "ward": ward if name not in ("uniform", "divfl", "fedcor") else "-",
        "k": k,
        "round_s": statistics.median(times),
        "traced_peak_mib": peak / 2**20,
        "rss_mib": rss_mib,
        "prefill_s": prefill_s,
        "refit_s": refit_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--samplers", nargs="+", default=["uniform", "hics", "clustered", "divfl", "fedcor"])
    parser.add_argument("--ward", nargs="+", default=["exact", "scalable"])
    parser.add_argument("--k", type=int, default=10, help="clients per round")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per configuration")
    parser.add_argument("--one", nargs=3, metavar=("SAMPLER", "N", "WARD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        name, n, ward = args.one
        print(json.dumps(one(name, int(n), ward, args.k, args.rounds)))
        return
    print(
        f"{'sampler':>10} {'N':>6} {'ward':>9} {'s/round':>9} {'round peak MiB':>15} {'RSS MiB':>8} "
        f"{'prefill s':>9} {'refit s':>8}"
    )
    for n in args.clients:
        for name in args.samplers:
            for ward in ["-"] if name in ("uniform", "divfl", "fedcor") else args.ward:
                if name != "uniform" and ward == "scalable" and n <= 1000:
                    continue  # identical to exact below the 1000-client subsample
                cmd = [sys.executable, __file__, "--one", name, str(n), ward]
                cmd += ["--k", str(args.k), "--rounds", str(args.rounds)]
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0:
                    print(f"{name:>10} {n:>6} {ward:>9}  failed: {proc.stderr.strip().splitlines()[-1:]}", flush=True)
                    continue
                r = json.loads(proc.stdout.strip().splitlines()[-1])
                print(
                    f"{name:>10} {n:>6} {r['ward']:>9} {r['round_s']:>9.4f} {r['traced_peak_mib']:>15.1f} "
                    f"{r['rss_mib']:>8.0f} {r['prefill_s']:>9.2f} "
                    f"{'-' if r['refit_s'] is None else format(r['refit_s'], '.3f'):>8}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
