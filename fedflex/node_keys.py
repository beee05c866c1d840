"""Binding client (partition) ids to SuperNode authentication keys.

A SuperNode says its partition id itself (``--node-config partition-id=i``). In an
authenticated deployment (TLS, ``flower-superlink --enable-supernode-auth``, keys
registered with ``flwr supernode register``) the SuperLink knows which public key every
node authenticated with: Flower 1.41 signs each Fleet request with the node's private key,
ties the node id to that public key, and hands the key to the ServerApp in
``Grid.get_nodes()`` (``NodeInfo.public_key``). A binding file maps each partition id to
one key; with it, a node whose claimed partition id is bound to another key is refused.

The file is JSON, partition id -> a public key file (OpenSSH ``.pub`` or PEM, relative
to the file) or its fingerprint (``SHA256:`` and the hex SHA-256 of the DER
SubjectPublicKeyInfo, what :func:`fingerprint` returns)::

    {"0": "keys/supernode-0.pub", "1": "SHA256:3f1c..."}
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Mapping

from cryptography.hazmat.primitives import serialization

PREFIX = "SHA256:"


class KeyBindingError(ValueError):
    """A binding file that cannot be used (missing, not JSON, bad ids or keys)."""


def fingerprint(public_key: bytes) -> str:
    """``SHA256:<hex>`` of a public key given as PEM (as Flower's NodeInfo holds it) or
    OpenSSH (a ``.pub`` file) bytes: the same key gives the same fingerprint either way.

    Raises
    ------
    ValueError
        When the bytes are neither.
    """
    data = bytes(public_key).strip()
    if data.startswith(b"-----BEGIN"):
        key = serialization.load_pem_public_key(data)
    else:
        key = serialization.load_ssh_public_key(data)
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return PREFIX + hashlib.sha256(der).hexdigest()


def read_binding(path: Path, num_clients: int) -> dict[int, str]:
    """Return partition id -> key fingerprint, from a binding file.

    Raises
    ------
    KeyBindingError
        A file that is missing or not a JSON object, an id outside ``0..num_clients-1``,
        a key file that is missing or no public key, a malformed fingerprint, or one key
        bound to two ids.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise KeyBindingError(f"node-keys {path}: cannot be read ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise KeyBindingError(f"node-keys {path}: not JSON ({exc})") from None
    if not isinstance(data, dict) or not data:
        raise KeyBindingError(f"node-keys {path}: expected an object partition id -> key file or fingerprint")
    binding: dict[int, str] = {}
    for key, value in data.items():
        if not str(key).isdigit() or not 0 <= int(key) < num_clients:
            raise KeyBindingError(f"node-keys {path}: partition id {key!r} is not in 0..{num_clients - 1}")
        binding[int(key)] = _fingerprint_of(path.parent, value, f"node-keys {path}: partition {key}")
    seen: dict[str, int] = {}
    for pid, fp in sorted(binding.items()):
        if fp in seen:
            raise KeyBindingError(f"node-keys {path}: partitions {seen[fp]} and {pid} are bound to one key {fp}")
        seen[fp] = pid
    return binding


def write_binding(path: Path, public_keys: Mapping[int, Path]) -> Path:
    """Write a binding file of fingerprints for ``partition id -> public key file``."""
    data = {str(pid): _fingerprint_of(Path("."), str(key), f"partition {pid}") for pid, key in public_keys.items()}
    path = Path(path)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def _fingerprint_of(base: Path, value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise KeyBindingError(f"{what}: expected a key file or a {PREFIX} fingerprint, got {value!r}")
    if value.startswith(PREFIX):
        digest = value[len(PREFIX) :]
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise KeyBindingError(f"{what}: {value!r} is not {PREFIX} and 64 lower-case hex digits")
        return value
    key_file = base / value
    try:
        return fingerprint(key_file.read_bytes())
    except OSError as exc:
        raise KeyBindingError(f"{what}: key file {key_file} cannot be read ({exc.strerror or exc})") from None
    except (ValueError, TypeError) as exc:  # cryptography: not a key, unsupported type
        raise KeyBindingError(f"{what}: {key_file} is not a public key ({exc})") from None
