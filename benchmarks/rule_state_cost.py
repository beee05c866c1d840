"""Cost of the local rules that keep state: server half per round, client state in total.

FedDyn keeps g_k on every client that has trained (``feddyn-grad``) and h on the server;
SCAFFOLD keeps c_i per client and c on the server; FedCM keeps only the server's Delta.
For each rule and N, in its own process: the server half's ``observe()`` for K replies
(median seconds per round over ``--rounds``; FedDyn's h update divides by N but costs
O(K x model)), and the memory of N client node states as Flower holds them (one
``RecordDict`` with the rule's ``ArrayRecord`` per client, measured with tracemalloc:
what a simulation's nodes hold once every client has trained). Shapes: the FMNIST CNN of
HiCS-FL / FedAWARE (``cnn-fmnist``, 18,378 parameters).

    python benchmarks/rule_state_cost.py --clients 1000 10000 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections import OrderedDict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.sampler_cost import SHAPES  # noqa: E402

#: rule -> the node-state record it keeps per client (None: no client state)
STATE = {"feddyn": "feddyn-grad", "scaffold": "scaffold-ci", "fedcm": None}


class Ctx:
    def __init__(self, n: int, global_arrays) -> None:
        self.num_clients = n
        self.global_arrays = global_arrays


def server_half(rule: str, n: int):
    from fedflex.config import LocalRuleConfig
    from fedflex.strategies.fedcm import FedCMServer
    from fedflex.strategies.feddyn import FedDynServer
    from fedflex.strategies.scaffold import ScaffoldServer

    options = LocalRuleConfig(name=rule)
    if rule == "feddyn":
        return FedDynServer(n, options=options)
    if rule == "scaffold":
        return ScaffoldServer(n, options=options)
    return FedCMServer(lr=0.01, options=options)


def replies(rule: str, k: int, g, rng):
    from fedflex import keys
    from fedflex.strategies.parts import ClientUpdate

    out = []
    for i in range(k):
        arrays = OrderedDict(
            (key, (v + rng.normal(scale=1e-3, size=v.shape)).astype(np.float32)) for key, v in g.items()
        )
        extras = {keys.SCAFFOLD_DC: arrays} if rule == "scaffold" else {}
        out.append(ClientUpdate(client=i, num_examples=600, arrays=arrays, metrics={keys.NUM_STEPS: 30}, extras=extras))
    return out


def one(rule: str, n: int, k: int, rounds: int) -> dict:
    import torch
    from flwr.app import ArrayRecord, RecordDict

    rng = np.random.default_rng(0)
    g = OrderedDict((key, np.zeros(shape, dtype=np.float32)) for key, shape in SHAPES.items())
    server = server_half(rule, n)
    server.bind(Ctx(n, g))
    server.train_payload(1)
    times = []
    for t in range(1, rounds + 1):
        batch = replies(rule, k, g, rng)  # built before the clock starts
        t0 = time.perf_counter()
        server.observe(t, batch, g)
        times.append(time.perf_counter() - t0)
    state_mib = 0.0
    if STATE[rule] is not None:
        tracemalloc.start()
        nodes = []
        for _ in range(n):
            state = RecordDict()
            state[STATE[rule]] = ArrayRecord(OrderedDict((key, torch.zeros(s)) for key, s in SHAPES.items()))
            nodes.append(state)
        state_mib = tracemalloc.get_traced_memory()[0] / 2**20
        tracemalloc.stop()
    return {"rule": rule, "clients": n, "k": k, "round_s": statistics.median(times), "client_state_mib": state_mib}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--rules", nargs="+", default=list(STATE), choices=list(STATE))
    parser.add_argument("--k", type=int, default=10, help="replies per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--one", nargs=2, metavar=("RULE", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), args.k, args.rounds)))
        return
    params = sum(int(np.prod(s)) for s in SHAPES.values())
    print(f"model: {params} parameters ({params * 4 / 2**10:.1f} KiB as float32); K = {args.k}")
    print(f"{'rule':>9} {'N':>6} {'server s/round':>15} {'client states MiB':>18}")
    for n in args.clients:
        for rule in args.rules:
            cmd = [sys.executable, __file__, "--one", rule, str(n), "--k", str(args.k), "--rounds", str(args.rounds)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"{rule:>9} {n:>6}  failed: {proc.stderr.strip().splitlines()[-1:]}", flush=True)
                continue
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"{rule:>9} {n:>6} {r['round_s']:>15.4f} {r['client_state_mib']:>18.1f}", flush=True)


if __name__ == "__main__":
    main()
