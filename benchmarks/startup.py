"""Start-up: seconds from the command to round 1, per path, and where they go.

For each path the whole command is started and timed until its first round's progress
line (``round 1/N``) appears: ``local`` and ``ray`` are ``fedflex run`` on the in-process
and the Ray backend, ``flwr`` is ``flwr run . --stream`` on a local simulation federation
of ``num_clients`` SuperNodes (Flower's local SuperLink is started by the first one and
left running; stop it by its PID afterwards; run no other ``flwr run`` meanwhile). The
round-1 line of ``local`` and ``ray`` is printed at the end of round 1, so the figure is
start-up plus one round; the round's own time (``(0.48s)`` on the line) is given apart.

Then the phases of the in-process path are timed one after another in a fresh process
(each import is what the phase adds to the ones before): Python with fedflex's CLI,
torch, Flower, the data set, the partition, the model, and Ray's start (``ray.init``:
what the Ray backend adds before its first message).

    python benchmarks/startup.py [--paths local ray flwr] [--runs 3] [overrides ...]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "quickstart.yaml"
ROUND_1 = re.compile(r"round 1/\d+ .*\((\d+\.\d+)s\)")

PHASES = r"""
import sys, time, json
t = time.perf_counter(); marks = {}
def mark(name):
    global t
    now = time.perf_counter(); marks[name] = round(now - t, 3); t = now
import fedflex.launch.cli; mark("python + fedflex CLI")
import torch; mark("torch")
import flwr.app, flwr.serverapp; mark("Flower (flwr.app, flwr.serverapp)")
from fedflex.loader import load_scenario
from fedflex.data import load_dataset
from fedflex.partition import partition_data
from fedflex.models import build_model
import fedflex.launch.server, fedflex.clients.client_app; mark("fedflex's apps and strategies")
cfg = load_scenario(sys.argv[1], sys.argv[2:]); mark("scenario (load, check)")
data = load_dataset(cfg.dataset, cfg.num_clients, cfg.seed); mark("data set")
partition = partition_data(cfg.partition, data, cfg.num_clients, cfg.seed); mark("partition")
build_model(cfg.model, data.train.input_shape, data.train.num_classes); mark("model")
import ray; mark("ray import (Ray backend only)")
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False); mark("ray.init (Ray backend only)")
ray.shutdown()
print(json.dumps(marks))
"""


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def command(path: str, overrides: list[str], out: str) -> list[str]:
    if path in ("local", "ray"):
        return [
            sys.executable,
            "-m",
            "fedflex",
            "run",
            str(SCENARIO),
            *overrides,
            f"simulation.backend={path}",
            "output.progress=lines",
            "--out",
            out,
        ]
    clients = [o.split("=", 1)[1] for o in overrides if o.startswith("num_clients=")] or ["20"]
    run_config = f'scenario="{SCENARIO}" overrides="{" ".join([*overrides, "output.progress=lines"])}" out="{out}"'
    return [
        str(Path(sys.executable).with_name("flwr")),
        "run",
        str(ROOT),
        "--stream",
        "--federation-config",
        f"num-supernodes={clients[-1]}",
        "--run-config",
        run_config,
    ]


def to_round_1(cmd: list[str]) -> tuple[float, float]:
    """Seconds from start to the round-1 line, and round 1's own seconds (from the line)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    seen = None
    for line in proc.stdout:
        found = ROUND_1.search(line)
        if found and seen is None:
            seen = (time.perf_counter() - t0, float(found.group(1)))
    proc.wait()
    if proc.returncode != 0 or seen is None:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}")
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paths", nargs="+", default=["local", "ray", "flwr"], choices=["local", "ray", "flwr"])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("overrides", nargs="*", help="fedflex dotlist overrides (key=value)")
    args = parser.parse_args()
    overrides = ["rounds=1", *args.overrides]
    print(f"scenario {SCENARIO.name} {' '.join(overrides)}; medians of {args.runs} runs, paths alternating")
    got: dict[str, list[tuple[float, float]]] = {p: [] for p in args.paths}
    for i in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            for path in args.paths if i % 2 == 0 else list(reversed(args.paths)):
                got[path].append(to_round_1(command(path, overrides, f"{tmp}/{path}")))
    print(f"\n{'path':>6} {'to round 1, s':>14} {'round 1, s':>11} {'start-up, s':>12}   runs")
    for path, runs in got.items():
        whole, first = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        print(f"{path:>6} {whole:>14.2f} {first:>11.2f} {whole - first:>12.2f}   {[round(r[0], 2) for r in runs]}")
    proc = subprocess.run(
        [sys.executable, "-c", PHASES, str(SCENARIO), *overrides],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    import json

    print("\nphases of the in-process path, one fresh process, s:")
    for name, secs in json.loads(proc.stdout.strip().splitlines()[-1]).items():
        print(f"  {secs:>6.2f}  {name}")


if __name__ == "__main__":
    main()
