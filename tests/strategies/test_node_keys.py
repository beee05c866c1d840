"""Partition ids bound to node keys: a claim counts only with the key bound to it.

The grid plays an authenticated SuperLink: ``get_nodes()`` gives each node's public key
(PEM, as Flower's NodeInfo holds it); the binding file names OpenSSH ``.pub`` files, as
``scripts/make_certs.sh`` writes them.
"""

from __future__ import annotations

import json
import logging

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.proto.node_pb2 import NodeInfo

from fedflex import keys
from fedflex.launch.local_grid import LocalGrid
from fedflex.node_keys import KeyBindingError, fingerprint, read_binding, write_binding
from fedflex.strategies.nodes import NodeDirectory


def _who_am_i(msg: Message, context) -> Message:
    pid = int(context.node_config["partition-id"])
    return Message(RecordDict({keys.CONFIG: ConfigRecord({keys.PARTITION_ID: pid})}), reply_to=msg)


def _key():
    return ec.generate_private_key(ec.SECP384R1()).public_key()


def _pem(key) -> bytes:
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _ssh(key) -> bytes:
    return key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)


class _KeyedGrid(LocalGrid):
    """Nodes that authenticated with a given public key (node id -> PEM bytes)."""

    def __init__(self, client_app, num_nodes):
        super().__init__(client_app, num_nodes)
        self.keys: dict[int, bytes] = {}

    def node_of(self, partition_id: int) -> int:
        return next(n for n, c in self.contexts.items() if c.node_config["partition-id"] == partition_id)

    def get_nodes(self):
        return [NodeInfo(node_id=n, public_key=self.keys.get(n, b"")) for n in self.contexts]


def test_ssh_and_pem_forms_of_one_key_have_one_fingerprint():
    # Prepare
    key, other = _key(), _key()
    # Execute / Assert
    assert fingerprint(_ssh(key)) == fingerprint(_pem(key))
    assert fingerprint(_pem(key)) != fingerprint(_pem(other))
    assert fingerprint(_pem(key)).startswith("SHA256:") and len(fingerprint(_pem(key))) == 7 + 64


def test_node_claiming_a_partition_bound_to_another_key_is_refused(tmp_path, caplog):
    # Prepare: keys A, B, C for partitions 0, 1, 2 in the binding file; the node that says
    # it is partition 1 authenticated with key A (partition 0's), the node of partition 2
    # with a key nobody bound; partition 0's node has its own key
    key_a, key_b, key_c, stray = _key(), _key(), _key(), _key()
    for name, key in (("a", key_a), ("b", key_b), ("c", key_c)):
        (tmp_path / f"{name}.pub").write_bytes(_ssh(key))
    (tmp_path / "node-keys.json").write_text(json.dumps({"0": "a.pub", "1": "b.pub", "2": "c.pub"}))
    grid = _KeyedGrid(_who_am_i, 3)
    grid.keys = {grid.node_of(0): _pem(key_a), grid.node_of(1): _pem(key_a), grid.node_of(2): _pem(stray)}
    nodes = NodeDirectory(3)
    nodes.bindings = read_binding(tmp_path / "node-keys.json", 3)
    # Execute
    flwr_logger = logging.getLogger("flwr")  # the refusals go to Flower's logger (the run log's)
    propagate, flwr_logger.propagate = flwr_logger.propagate, True
    try:
        with caplog.at_level(logging.ERROR):
            nodes.refresh(grid)
            queries = sum(m.metadata.message_type == "query" for m in grid.sent)
            nodes.refresh(grid)
    finally:
        flwr_logger.propagate = propagate
    # Assert: only partition 0 is served; the refused nodes are not asked again
    assert nodes.clients().tolist() == [0]
    assert nodes.refused == {grid.node_of(1): 1, grid.node_of(2): 2}
    assert queries == 3 and sum(m.metadata.message_type == "query" for m in grid.sent) == 3
    assert f"partition id 1 is bound to {fingerprint(_ssh(key_b))}" in caplog.text
    assert f"it authenticated with key {fingerprint(_pem(key_a))}" in caplog.text


def test_node_with_the_bound_key_serves_its_partition_after_an_impostor_left(tmp_path):
    # Prepare: an impostor with key A claims partition 1 first; then it leaves and the
    # node with key B (partition 1's) connects
    key_a, key_b = _key(), _key()
    write_binding(
        tmp_path / "node-keys.json", {0: _write(tmp_path / "a.pub", key_a), 1: _write(tmp_path / "b.pub", key_b)}
    )
    grid = _KeyedGrid(_who_am_i, 2)
    grid.keys = {grid.node_of(0): _pem(key_a), grid.node_of(1): _pem(key_a)}
    nodes = NodeDirectory(2)
    nodes.bindings = read_binding(tmp_path / "node-keys.json", 2)
    nodes.refresh(grid)
    # Execute
    grid.remove_node(1)
    rightful = grid.add_node(1)
    grid.keys[rightful] = _pem(key_b)
    nodes.refresh(grid)
    # Assert
    assert nodes.clients().tolist() == [0, 1]
    assert nodes.nodes_of([1]) == [rightful]
    assert nodes.refused == {}


def test_grid_without_node_keys_serves_nobody_under_a_binding(tmp_path):
    # Prepare: a grid that reports no keys (simulation, an unauthenticated SuperLink)
    key = _key()
    write_binding(tmp_path / "k.json", {0: _write(tmp_path / "a.pub", key)})
    grid = _KeyedGrid(_who_am_i, 1)
    nodes = NodeDirectory(1)
    nodes.bindings = read_binding(tmp_path / "k.json", 1)
    # Execute
    nodes.refresh(grid)
    # Assert
    assert nodes.clients().tolist() == []


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json", "not JSON"),
        ('{"5": "SHA256:' + "0" * 64 + '"}', "partition id '5' is not in 0..1"),
        ('{"0": "missing.pub"}', "cannot be read"),
        ('{"0": "SHA256:abc"}', "64 lower-case hex digits"),
        ('{"0": "SHA256:' + "0" * 64 + '", "1": "SHA256:' + "0" * 64 + '"}', "partitions 0 and 1 are bound to one key"),
    ],
)
def test_bad_binding_files_are_refused_with_the_reason(tmp_path, content, message):
    # Prepare
    (tmp_path / "k.json").write_text(content)
    # Execute / Assert
    with pytest.raises(KeyBindingError, match=message):
        read_binding(tmp_path / "k.json", 2)


def _write(path, key):
    path.write_bytes(_ssh(key))
    return path
