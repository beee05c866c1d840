"""TLS certificates and SuperNode keys for a local federation (``scripts/make_certs.sh``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from fedflex.launch.deploy.processes import DeployError

REPO_ROOT = Path(__file__).resolve().parents[3]


MAKE_CERTS = REPO_ROOT / "scripts" / "make_certs.sh"


@dataclass(frozen=True)
class TlsFiles:
    """The SuperLink's certificate and key and the CA that signed it (PEM files)."""

    ca_cert: Path
    server_cert: Path
    server_key: Path

    @classmethod
    def from_dir(cls, directory: Path) -> "TlsFiles":
        """``ca.crt``, ``server.crt``, ``server.key`` in ``directory`` (as make_certs.sh writes)."""
        directory = Path(directory).resolve()
        files = cls(directory / "ca.crt", directory / "server.crt", directory / "server.key")
        missing = [str(p) for p in (files.ca_cert, files.server_cert, files.server_key) if not p.is_file()]
        if missing:
            raise DeployError(f"missing TLS file(s): {', '.join(missing)} (create them with {MAKE_CERTS})")
        return files


def make_certificates(
    out_dir: Path, num_keys: int = 0, hosts: Iterable[str] = (), script: Path = MAKE_CERTS, timeout: float = 60
) -> TlsFiles:
    """Run ``scripts/make_certs.sh``: CA, SuperLink certificate, ``num_keys`` node key pairs."""
    if not script.is_file():
        raise DeployError(f"{script} not found: --tls needs fedflex's scripts/ (a source checkout)")
    if shutil.which("openssl") is None:
        raise DeployError("openssl is not installed; --tls needs it to create certificates")
    cmd = ["bash", str(script), "-f", "-o", str(out_dir), "-n", str(num_keys), *hosts]
    env = {**os.environ, "PYTHON": sys.executable}  # the fallback key generator needs cryptography
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, env=env)
    if done.returncode != 0:
        raise DeployError(f"make_certs.sh failed ({done.returncode}): {done.stderr.strip()}")
    return TlsFiles.from_dir(out_dir)
