"""Whole-process wall time: ``fedflex run`` against a plain sequential PyTorch loop.

Both processes do the same local work (scenarios/bench_fmnist.yaml: FMNIST, the small
CNN, 1 local epoch, batch 32, SGD momentum 0.9) and are timed from process start to
exit, start-up included, alternating, several pairs; medians and ratios to the plain
loop are printed side by side, one block per case:

- ``k5``: 50 clients, 5 per round;
- ``k100``: 1,000 clients, 100 per round;
- ``k100of10k``: 10,000 clients, 100 per round (plain loop too: same work).

Variants (``backend:vectorize``): ``local:off`` (in-process, one client at a time),
``local:on`` / ``local:auto`` / ``local:rule`` (in-process cohorts, :mod:`clients.cohort`), ``ray:off``
(Flower's Ray simulation, one cohort message per Ray worker whose clients train one by
one; before issue 46 one message per client) and ``ray:on`` / ``ray:auto`` (the same
messages, trained batched / as timed); ``flwr:off`` / ``flwr:rule`` / ``flwr:on`` run the same
scenario as a Flower user does (``flwr1:rule``: with ``client-resources-num-cpus=1``, one
ClientApp per CPU; Flower's default is 2 CPUs a ClientApp),
``flwr run . --stream`` on a local simulation federation of
``num_clients`` SuperNodes (Flower's own simulation engine, one cohort message per CPU;
before issue 46 one message and one ClientApp call per sampled SuperNode). Flower's local
SuperLink (127.0.0.1:39091, one per machine) is started by the first ``flwr run`` and left
running: run no other ``flwr run`` meanwhile, and stop it by its PID afterwards.
``--device cuda`` puts data and model of the plain loop
on the GPU and runs fedflex with ``client.device=cuda`` (and ``simulation.num_gpus``
1/workers on Ray).

    python benchmarks/overhead.py --cases k5 k100 --rounds 10 --pairs 2 \\
        --variants local:off local:on ray:off ray:on [--device cuda] [overrides ...]

Overrides (``key=value``, fedflex's dotlist) may stand anywhere, also right after
``--cases`` or ``--variants``: ``--variants local:off model.name=mlp`` runs the variant
``local:off`` with ``model.name=mlp``. A variant is ``local|ray|flwr:off|on|auto|rule``.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import cast

ROOT = Path(__file__).resolve().parents[1]

CASES = {
    "k5": ["num_clients=50", "strategy.sampler.clients_per_round=5"],
    "k100": ["num_clients=1000", "strategy.sampler.clients_per_round=100"],
    "k100of10k": ["num_clients=10000", "strategy.sampler.clients_per_round=100", "partition.min_size=2"],
}


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return dt


def flwr_run_command(scenario: str, overrides: list[str], out: str, cpus: str = "") -> list[str]:
    """``flwr run`` of this repository's app on a local simulation federation of the
    scenario's ``num_clients`` SuperNodes, waiting for the run to end (``--stream``);
    ``cpus``: Flower's ``client-resources-num-cpus`` (empty: Flower's default, 2)."""
    clients = [o.split("=", 1)[1] for o in overrides if o.startswith("num_clients=")]
    if not clients:
        sys.exit("a flwr variant needs num_clients=N among the case's overrides")
    run_config = f'scenario="{scenario}" overrides="{" ".join(overrides)}" out="{out}"'
    flwr = str(Path(sys.executable).with_name("flwr"))
    return [
        flwr,
        "run",
        str(ROOT),
        "--stream",
        "--federation-config",
        f"num-supernodes={clients[-1]}" + (f" client-resources-num-cpus={cpus}" if cpus else ""),
        "--run-config",
        run_config,
    ]


def check_finished(out: str) -> None:
    """``flwr run --stream`` exits 0 whatever the run did: read its summary.json."""
    try:
        status = json.loads((Path(out) / "summary.json").read_text()).get("status")
    except (OSError, ValueError):
        status = None
    if status != "completed":
        sys.exit(f"the flwr run into {out} did not complete (status {status})")


def variant_overrides(variant: str, device: str) -> list[str]:
    backend, vectorize = variant.split(":")
    ov = [f"simulation.vectorize={vectorize}", f"client.device={device}"]
    if not backend.startswith("flwr"):  # under flwr run Flower's engine runs the clients
        ov.insert(0, f"simulation.backend={backend}")
    if device == "cuda" and backend == "ray":
        ov.append(f"simulation.num_gpus={1 / max(1, os.cpu_count() or 1):.4f}")
    return ov


VARIANT = re.compile(r"(local|ray|flwr(\d*)):(off|on|auto|rule)")


def split_overrides(argv: list[str]) -> tuple[list[str]]:
    """``argv`` with every ``key=value`` token (a fedflex override, not an option's
    ``--name=value``) moved to the end, where the positional overrides are read, so that
    an override after ``--variants`` or ``--cases`` is not taken as one of their values."""
    options = [a for a in argv if a.startswith("-") or "=" not in a]
    overrides = [a for a in argv if not a.startswith("-") and "=" in a]
    return (options + (["--", *overrides] if overrides else []),)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=["k5", "k100"], choices=sorted(CASES))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--variants", nargs="+", default=["local:off", "local:on", "ray:off", "ray:on"])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--scenario", default=str(ROOT / "scenarios" / "bench_fmnist.yaml"))
    parser.add_argument("overrides", nargs="*", help="fedflex dotlist overrides (key=value), anywhere")
    args = parser.parse_args(*split_overrides(sys.argv[1:]))
    bad = [v for v in args.variants if not VARIANT.fullmatch(v)]
    if bad:
        parser.error(f"--variants {' '.join(bad)}: a variant is BACKEND:VECTORIZE, e.g. local:off, ray:auto, flwr:rule")
    if any(v.startswith("flwr") for v in args.variants):
        # flwr run starts flower-superlink from PATH and must use this environment as is
        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        os.environ["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    print(f"device {args.device}; {args.rounds} rounds; medians of {args.pairs} runs each, alternating", flush=True)
    for case in args.cases:
        ov = [f"rounds={args.rounds}", *CASES[case], *args.overrides]
        times: dict[str, list[float]] = {"plain": [], **{v: [] for v in args.variants}}
        for i in range(args.pairs):
            with tempfile.TemporaryDirectory() as tmp:
                cmds = [
                    (
                        "plain",
                        [
                            sys.executable,
                            str(ROOT / "benchmarks" / "plain_loop.py"),
                            args.scenario,
                            *ov,
                            "--device",
                            args.device,
                        ],
                    )
                ]
                outs = {}
                for v in args.variants:
                    out = outs[v] = f"{tmp}/out-{v.replace(':', '-')}"
                    if v.startswith("flwr"):
                        cpus = cast(re.Match, VARIANT.fullmatch(v)).group(2)
                        cmd = flwr_run_command(args.scenario, [*ov, *variant_overrides(v, args.device)], out, cpus)
                    else:
                        cmd = [sys.executable, "-m", "fedflex", "run", args.scenario, *ov]
                        cmd += [*variant_overrides(v, args.device), "--out", out]
                    cmds.append((v, cmd))
                if i % 2:
                    cmds.reverse()
                for name, cmd in cmds:
                    times[name].append(timed(cmd))
                    if name.startswith("flwr"):
                        check_finished(outs[name])
        plain = statistics.median(times["plain"])
        print(f"\ncase {case} ({' '.join(CASES[case])})", flush=True)
        print(f"{'variant':>10} {'wall s':>8} {'/ plain':>8}   runs")
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"{name:>10} {med:>8.1f} {med / plain:>8.2f}   {[round(t, 1) for t in ts]}", flush=True)


if __name__ == "__main__":
    main()
