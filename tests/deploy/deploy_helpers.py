"""Helpers of the loopback deployment tests: scenario overrides for a tiny fast run,
readers of the results a run writes, bounded waits, and a check for left-over
processes. (Imported by path: the tests run with --import-mode=importlib.)"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import pytest

from fedflex.launch.deploy import LocalFederation

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
FAST_HEARTBEAT = [sys.executable, str(HERE / "fast_heartbeat_supernode.py")]
FAULTY_SITE = HERE / "faulty"


def tiny_overrides(num_nodes: int, rounds: int, round_timeout: float = 60.0) -> list[str]:
    """The quickstart scenario cut down for a federation of ``num_nodes`` processes:
    every node is a client, no scripted churn (the live nodes are the online set),
    every online client trains every round, small data, no plots."""
    return [
        f"num_clients={num_nodes}",
        f"rounds={rounds}",
        "churn.kind=none",
        f"strategy.sampler.clients_per_round={num_nodes}",
        "strategy.sampler.min_clients=1",
        "dataset.samples_per_client=60",
        f"simulation.timeout={round_timeout}",
        "output.plots=false",
        "output.progress=lines",
    ]


def read_rows(out: Path) -> list[dict]:
    """The complete lines of ``out/metrics.jsonl`` written so far."""
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            break
    return rows


def wait_for(
    predicate: Callable[[], object],
    timeout: float,
    what: str,
    fed: Optional[LocalFederation] = None,
    interval: float = 0.5,
):
    """Poll until ``predicate()`` is truthy (returned) or fail the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if fed is not None and fed.superlink is not None and not fed.superlink.alive():
            pytest.fail(f"the SuperLink exited while waiting for {what}:\n{fed.superlink.tail()}")
        if time.monotonic() >= deadline:
            pytest.fail(f"no {what} within {timeout:.0f} s")
        time.sleep(interval)


def processes_using(workdir: Path) -> list[int]:
    """Pids of processes whose FLWR_HOME lies under ``workdir`` (what a
    ``fedflex deploy local --workdir`` started), zombies excluded."""
    found = []
    marker = f"FLWR_HOME={Path(workdir).resolve()}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker not in (entry / "environ").read_bytes():
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.append(int(entry.name))
    return found
