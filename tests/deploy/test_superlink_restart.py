"""A SuperLink of an authenticated federation crashes mid-run and is restarted on its
state file (real Flower processes on loopback).

2 SuperNodes with registered keys (TLS + node authentication) run a long scenario; the
SuperLink is SIGKILLed (with everything it started: its SuperExec and the run's
ServerApp) after the first round and started again on the same port with the same
``--database``. Expected:

- every SuperNode reconnects by itself within 60 s (registrations survive the restart:
  without the state file they would be refused with 401 and exit);
- the run in flight is lost: its ServerApp died with the SuperLink, so the restarted
  SuperLink marks it failed; its checkpoint (every round) is what ``resume=`` continues;
- the same SuperNodes serve a new run to its end.
"""

from __future__ import annotations

import time

import pytest
from deploy_helpers import QUICKSTART, read_rows, tiny_overrides, wait_for

from fedflex.launch.deploy import make_certificates

pytestmark = pytest.mark.slow

RECONNECT_BOUND = 60.0
# a SuperNode that talked to the restarted SuperLink: it reconnected after failed
# attempts, or it pulled / pushed a message (one that was training while the SuperLink
# was down logs no failed attempt)
TALKED = ("Connection successful after", "Receiving:", "Sent successfully")


def test_killed_superlink_restarted_on_its_database_gets_its_nodes_back(tmp_path, federation):
    # Prepare: an authenticated federation with a long run under way
    tls = make_certificates(tmp_path / "certs", num_keys=2)
    fed = federation(2, tls=tls, auth=True, keys_dir=tmp_path / "certs" / "keys")
    fed.start()
    out = tmp_path / "out"
    run_id = fed.submit(str(QUICKSTART), [*tiny_overrides(2, rounds=30), "output.checkpoint_every=1"], out)
    wait_for(lambda: read_rows(out), 120, "the first round", fed)

    # Execute: crash the SuperLink, restart it on its state file, submit a new run
    fed.kill_superlink()
    killed_at = time.monotonic()
    fed.restart_superlink()
    since = {i: len(node.output()) for i, node in fed.nodes.items()}
    # the new run waits for both SuperNodes before round 1 (deployment.wait_for_nodes), as a
    # run submitted right after a restart must: without it, round 1 starts with whoever has
    # reconnected by then, which on a loaded machine was nobody (a CI run on 2 cores)
    new_run = fed.submit(
        str(QUICKSTART), [*tiny_overrides(2, rounds=1), "deployment.wait_for_nodes=2"], tmp_path / "after"
    )

    # Assert: both nodes (registered before the crash) talk to the new SuperLink in time
    def back():
        return all(any(m in node.output()[since[i] :] for m in TALKED) for i, node in fed.nodes.items())

    wait_for(back, RECONNECT_BOUND - (time.monotonic() - killed_at), "both SuperNodes back", fed)
    back_s = time.monotonic() - killed_at
    assert all(node.alive() for node in fed.nodes.values())
    # ... they serve the new run to its end
    result = fed.wait_run(new_run, 180, tmp_path / "after")
    assert result.ok, (result.status, result.details)
    assert read_rows(tmp_path / "after")[0]["sampled"] == [0, 1]
    # ... and the run in flight is failed (its ServerApp died with the SuperLink); its
    # checkpoint is what resume= continues
    status, details = wait_for(
        lambda: (lambda s: s if s[0].startswith("finished") else None)(fed.run_status(run_id)),
        180,
        "the lost run's end",
        fed,
    )
    assert status == "finished:failed", (status, details)
    assert (out / "checkpoint.npz").is_file()
    print(
        f"nodes back {back_s:.1f} s after the SuperLink was killed; new run {result.wall_s:.0f} s; "
        f"lost run {status} ({details}) {time.monotonic() - killed_at:.0f} s after the kill"
    )
