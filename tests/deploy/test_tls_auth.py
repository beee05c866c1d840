"""TLS and SuperNode authentication on a loopback federation (real Flower processes).

- ``fedflex deploy local --auth`` (TLS with certificates from scripts/make_certs.sh,
  registered EC keys) runs the quickstart scenario on 2 SuperNodes to the end;
- the SuperLink speaks TLS with a certificate for 127.0.0.1 signed by that CA only;
- a SuperNode whose key is not registered, and one without a key, are refused.
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import time

import pytest
from deploy_helpers import QUICKSTART, ROOT, processes_using, read_rows, tiny_overrides

from fedflex.launch.deploy import free_port, make_certificates, supernode_command, wait_until

pytestmark = pytest.mark.slow


def test_deploy_local_with_tls_and_auth_completes_rounds(tmp_path):
    # Prepare
    out, workdir = tmp_path / "out", tmp_path / "work"
    cmd = [
        sys.executable,
        "-m",
        "fedflex",
        "deploy",
        "local",
        "--nodes",
        "2",
        "--auth",
        str(QUICKSTART),
        *tiny_overrides(2, rounds=2),
        "evaluation.per_client=all",
        "--out",
        str(out),
        "--workdir",
        str(workdir),
        "--timeout",
        "100",
    ]
    # Execute
    t0 = time.monotonic()
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=115)
    finally:
        left = processes_using(workdir)
    wall = time.monotonic() - t0
    # Assert
    assert done.returncode == 0, done.stderr[-3000:]
    assert "TLS, node auth" in done.stderr
    assert not left, f"processes left running: {left}"
    rows = read_rows(out)
    assert [r["round"] for r in rows] == [1, 2]
    assert all(r["online"] == [0, 1] and r["sampled"] == [0, 1] and r["failed"] == [] for r in rows)
    assert rows[-1]["test_accuracy"] is not None
    # a deployment evaluates per client and per class as a simulation does: both clients'
    # accuracies, their mean, and one accuracy per class
    pairs = rows[-1]["client_accuracy"]
    assert [c for c, _ in pairs] == [0, 1]
    assert rows[-1]["client_accuracy_mean"] == pytest.approx(sum(a for _, a in pairs) / 2, abs=1e-6)
    assert len(rows[-1]["class_accuracy"]) == 10  # Synthetic(1, 1): 10 classes
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
    lines = (workdir / "logs" / "superlink.log").read_text().splitlines()
    started = [line for line in lines if line.startswith("### ")]
    assert "--enable-supernode-auth" in started[0] and "--ssl-certfile" in started[0]
    assert "--insecure" not in started[0]
    print(f"deploy local --auth, 2 nodes, 2 rounds: {wall:.1f} s")


def test_unregistered_supernode_is_refused(tmp_path, federation):
    # Prepare: TLS + auth SuperLink, key 0 registered, keys 1 and 2 made but not registered
    tls = make_certificates(tmp_path / "certs", num_keys=3)
    fed = federation(1, tls=tls, auth=True, keys_dir=tmp_path / "certs" / "keys")
    fed.start()  # registers key 0, starts supernode-0 with it: accepted
    # Execute
    unregistered = fed.start_supernode(1, wait=False, auth_key=fed.key_path(1))
    keyless = fed.start_extra(
        "keyless", supernode_command(fed.address, 2, 3, free_port(), ca_cert=tls.ca_cert, max_wait_time=20)
    )
    refused = wait_until(lambda: not unregistered.alive() and not keyless.alive(), 60)
    # Assert
    assert refused, "a SuperNode without a registered key is still running after 60 s"
    assert unregistered.returncode != 0 and keyless.returncode != 0
    assert "Failed to initialize the connection to the SuperLink" in unregistered.output()
    assert "Failed to initialize the connection to the SuperLink" in keyless.output()
    assert "SuperNode ID:" not in unregistered.output() + keyless.output()
    assert fed.nodes[0].alive(), "the registered SuperNode should still be connected"


def test_superlink_serves_tls_with_the_ca_certificate(tmp_path, federation):
    # Prepare
    tls = make_certificates(tmp_path / "certs")
    fed = federation(1, tls=tls)
    fed.start_superlink()
    good = ssl.create_default_context(cafile=str(tls.ca_cert))
    foreign = ssl.create_default_context()  # system CAs only
    # Execute / Assert: the handshake succeeds with our CA (hostname 127.0.0.1 is in the SAN) ...
    with socket.create_connection(("127.0.0.1", fed.superlink_port), timeout=10) as raw:
        with good.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
            assert conn.version() in ("TLSv1.2", "TLSv1.3")
    # ... and fails without it
    with socket.create_connection(("127.0.0.1", fed.superlink_port), timeout=10) as raw:
        with pytest.raises(ssl.SSLCertVerificationError):
            foreign.wrap_socket(raw, server_hostname="127.0.0.1")
