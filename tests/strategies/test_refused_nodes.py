"""Every refusal is visible (issue 45, item 3): a node the key binding refuses gets one
ERROR line on Flower's logger (the one a deployment's run log, ``flwr log`` and the
console carry, and ``run.log``), is listed with its reason by
``NodeDirectory.refusals()`` (summary.json's ``refused_nodes``), and a run whose bound
nodes did not all train says so (``NodeDirectory.shortfall``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.proto.node_pb2 import NodeInfo

from fedflex import keys
from fedflex.clients.client_app import app as client_app
from fedflex.launch.local_grid import LocalGrid
from fedflex.launch.server import run_server
from fedflex.loader import load_scenario
from fedflex.node_keys import fingerprint, read_binding
from fedflex.results import read_metrics
from fedflex.strategies.nodes import NodeDirectory


def _who_am_i(msg: Message, context) -> Message:
    pid = int(context.node_config["partition-id"])
    return Message(RecordDict({keys.CONFIG: ConfigRecord({keys.PARTITION_ID: pid})}), reply_to=msg)


def _pem(key) -> bytes:
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


class _KeyedGrid(LocalGrid):
    """An authenticated SuperLink's view: each node's public key (node id -> PEM bytes)."""

    def __init__(self, client_app, num_nodes):
        super().__init__(client_app, num_nodes)
        self.keys: dict[int, bytes] = {}

    def node_of(self, partition_id: int) -> int:
        return next(n for n, c in self.contexts.items() if c.node_config["partition-id"] == partition_id)

    def get_nodes(self):
        return [NodeInfo(node_id=n, public_key=self.keys.get(n, b"")) for n in self.contexts]


def _swapped(tmp_path, app, n=3):
    """A binding of n keys to partitions 0..n-1 and a grid whose nodes 1 and 2 swapped keys."""
    private = [ec.generate_private_key(ec.SECP384R1()) for _ in range(n)]
    for i, key in enumerate(private):
        (tmp_path / f"{i}.pub").write_bytes(
            key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        )
    binding = tmp_path / "node-keys.json"
    binding.write_text(json.dumps({str(i): f"{i}.pub" for i in range(n)}))
    grid = _KeyedGrid(app, n)
    owner = {0: 0, 1: 2, 2: 1}  # partition -> the key its node authenticated with
    grid.keys = {grid.node_of(p): _pem(private[owner[p]].public_key()) for p in range(n)}
    return grid, binding, [fingerprint(_pem(k.public_key())) for k in private]


def test_a_node_refused_by_the_key_binding_is_one_error_on_flowers_logger_and_listed(tmp_path, flower_records):
    # Prepare: nodes 1 and 2 swapped their keys
    grid, binding, prints = _swapped(tmp_path, _who_am_i)
    nodes = NodeDirectory(3)
    nodes.bindings = read_binding(binding, 3)
    # Execute: three refreshes (three rounds)
    for _ in range(3):
        nodes.refresh(grid)
    # Assert: one ERROR line per refused node, on Flower's logger, naming node, claim and keys
    errors = sorted(r.getMessage() for r in flower_records if r.levelno == logging.ERROR)
    assert len(errors) == 2, [r.getMessage() for r in flower_records]
    first = next(e for e in errors if e.startswith(f"node {grid.node_of(1)} "))
    assert first.startswith(
        f"node {grid.node_of(1)} claims client id 1: refused, it authenticated with key {prints[2]}, "
    )
    assert sorted(nodes.refusals(), key=lambda r: r["client"]) == [
        {
            "node": grid.node_of(1),
            "client": 1,
            "reason": f"it authenticated with key {prints[2]}, but partition id 1 is bound to {prints[1]}",
        },
        {
            "node": grid.node_of(2),
            "client": 2,
            "reason": f"it authenticated with key {prints[1]}, but partition id 2 is bound to {prints[2]}",
        },
    ]
    assert nodes.shortfall([0]).startswith(
        "1 of the 3 partition ids bound to node keys had their node (never: partition id 1, 2); node "
    )
    assert nodes.shortfall([0, 1, 2]) is None


def test_without_a_binding_there_is_no_shortfall():
    assert NodeDirectory(3).shortfall([]) is None


def test_a_second_node_on_one_client_id_is_listed_as_refused(flower_records):
    grid = LocalGrid(_who_am_i, 1)
    nodes = NodeDirectory(1)
    nodes.refresh(grid)
    first, second = nodes.client_to_node[0], grid.add_node(0)
    nodes.refresh(grid)
    nodes.refresh(grid)
    assert [r.levelname for r in flower_records if r.levelno >= logging.WARNING] == ["ERROR"]
    assert nodes.refusals()[0]["node"] == second
    assert nodes.refusals()[0]["reason"].startswith(f"node {first} serves it")


def _bound_run(tmp_path, grid, binding, per_round: int = 3) -> Path:
    """Run 2 rounds of 3 clients (no churn, ``per_round`` sampled) bound to the node keys."""
    overrides = ["num_clients=3", "rounds=2", "churn.kind=none", f"strategy.sampler.clients_per_round={per_round}"]
    overrides += ["dataset.samples_per_client=30", "output.progress=off", "output.plots=false"]
    run_server(grid, load_scenario(None, overrides), tmp_path / "run", node_keys=binding)
    return tmp_path / "run"


@pytest.mark.usefixtures("isolated_cache")
def test_a_run_with_swapped_node_keys_says_each_refusal_once_lists_them_and_is_degraded(tmp_path):
    # Prepare: a 3-node federation bound to keys; nodes 1 and 2 swapped theirs
    grid, binding, _ = _swapped(tmp_path, client_app)
    # Execute
    out = _bound_run(tmp_path, grid, binding)
    # Assert: only client 0 trained; run.log holds one ERROR line per refused node
    assert [row["sampled"] for row in read_metrics(out)] == [[0], [0]]
    lines = (out / "run.log").read_text().splitlines()
    refused = [line for line in lines if " ERROR " in line and "refused" in line]
    assert len(refused) == 2, lines
    assert sorted(line.split("claims client id ")[1][:10] for line in refused) == ["1: refused", "2: refused"]
    # summary.json lists both refusals with their reasons, and the run is not completed:
    # 1 of the 3 bound partition ids had its node (1 and 2 never had one)
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(r["client"] for r in summary["refused_nodes"]) == [1, 2]
    assert all("authenticated with key" in r["reason"] for r in summary["refused_nodes"])
    assert summary["status"] == "degraded"
    expected = "1 of the 3 partition ids bound to node keys had their node (never: partition id 1, 2)"
    assert summary["degraded"].startswith(expected)


@pytest.mark.usefixtures("isolated_cache")
def test_a_bound_run_whose_nodes_all_connected_is_completed_though_some_were_never_sampled(tmp_path):
    # Prepare: the same federation with every node on its own key; 1 client sampled a
    # round, so over 2 rounds at least one bound id never trains
    grid, binding, _ = _swapped(tmp_path, client_app)
    one, two = grid.node_of(1), grid.node_of(2)
    grid.keys[one], grid.keys[two] = grid.keys[two], grid.keys[one]
    # Execute
    out = _bound_run(tmp_path, grid, binding, per_round=1)
    # Assert: every bound id had its node: completed, nothing refused
    assert len({c for row in read_metrics(out) for c in row["sampled"]}) < 3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and "refused_nodes" not in summary
