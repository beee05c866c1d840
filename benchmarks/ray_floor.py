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

``--flwr N`` adds ``flwr``: ``flwr run --stream`` of the smallest Flower app that trains
with torch (written to a temporary folder: its ServerApp imports torch and sends one
message to each of one node per CPU, its ClientApp imports torch and answers) on a local
simulation federation of N SuperNodes with one ClientApp per CPU
(``client-resources-num-cpus=1``): what ``flwr run`` costs before any fedflex code,
Flower's local SuperLink already running (the first ``flwr run`` starts it; stop it by
its PID afterwards; run no other ``flwr run`` meanwhile).

    python benchmarks/ray_floor.py [--runs 3] [--flwr 1000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


PYPROJECT = """
[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "floorapp"
version = "0.1.0"
dependencies = []

[tool.flwr.app]
publisher = "floor"

[tool.flwr.app.components]
serverapp = "floorapp:server"
clientapp = "floorapp:client"

[tool.flwr.app.config]
workers = 1
"""

APP = """
import time

import torch  # noqa: F401  # a server that holds a torch model
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

server = ServerApp()
client = ClientApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    workers = int(context.run_config["workers"])
    nodes = []
    while len(nodes) < workers:
        nodes = sorted(grid.get_node_ids())
        time.sleep(0.05)
    content = RecordDict({"config": ConfigRecord({})})
    messages = [Message(content=content, dst_node_id=n, message_type="train") for n in nodes[:workers]]
    replies = list(grid.send_and_receive(messages))
    assert len(replies) == len(messages) and not any(r.has_error() for r in replies), replies


@client.train()
def train(msg: Message, context: Context) -> Message:
    import torch  # noqa: F401  # what each worker of a run imports before its first message

    return Message(content=RecordDict({"config": ConfigRecord({"ok": 1})}), reply_to=msg)
"""


def timed(code: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return time.perf_counter() - t0


def flwr_timed(app: Path, supernodes: int, cpus: int) -> float:
    flwr = str(Path(sys.executable).with_name("flwr"))
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(app), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    config = f"num-supernodes={supernodes} client-resources-num-cpus=1"
    cmd = [flwr, "run", str(app), "--stream", "--federation-config", config, "--run-config", f"workers={cpus}"]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    took = time.perf_counter() - t0
    if out.returncode != 0 or "ERROR" in out.stdout + out.stderr:
        sys.exit(f"the floor app's flwr run failed:\n{(out.stdout + out.stderr)[-3000:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--flwr", type=int, default=0, metavar="N", help="also flwr run at N SuperNodes")
    args = parser.parse_args()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    times: dict[str, list[float]] = {"torch": [], "ray": [], "flwr": []}
    with tempfile.TemporaryDirectory() as tmp:
        app = Path(tmp) / "floor"
        app.mkdir()
        (app / "pyproject.toml").write_text(PYPROJECT)
        (app / "floorapp.py").write_text(APP)
        for _ in range(args.runs):
            times["torch"].append(timed(TORCH))
            times["ray"].append(timed(RAY))
            if args.flwr:
                times["flwr"].append(flwr_timed(app, args.flwr, cpus))
    torch_s, ray_s = statistics.median(times["torch"]), statistics.median(times["ray"])
    print(f"CPUs {cpus}; medians of {args.runs}")
    rows = [
        ("python + torch", torch_s, times["torch"]),
        ("+ ray.init, a worker per CPU importing torch, shutdown", ray_s, times["ray"]),
    ]
    if args.flwr:
        rows.append((f"flwr run, {args.flwr} SuperNodes, a torch app", statistics.median(times["flwr"]), times["flwr"]))
    for name, median, runs in rows:
        print(f"{name:<56} {median:6.2f} s   {[round(t, 2) for t in runs]}")
    print(f"{'floor a Ray run adds to a plain loop':<56} {ray_s - torch_s:6.2f} s")
    if args.flwr:
        print(f"{'floor flwr run adds to a plain loop':<56} {statistics.median(times['flwr']) - torch_s:6.2f} s")


if __name__ == "__main__":
    main()
