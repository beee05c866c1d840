"""A SuperNode crashes mid-run and comes back (real Flower processes on loopback).

3 SuperNodes run the quickstart scenario without scripted churn, so the online set is
the set of live nodes. SuperNode 2 is SIGKILLed (with everything it started) while it
holds a train message. Expected:

- the run goes on with nodes 0 and 1: a round with online == [0, 1] follows within a
  bounded delay (the SuperLink notices the dead node after two missed heartbeats;
  the SuperNodes here beat every ~4 s with a 10 s interval, see
  ``fast_heartbeat_supernode.py``; the round waits at most ``simulation.timeout``);
- the departure is a new session in metrics.jsonl;
- SuperNode 2 restarted with the same partition id is identified again and trains;
  its return is another session.

Every wait is bounded; the run is stopped with ``flwr stop`` once the return is seen.
"""

from __future__ import annotations

import time

import pytest
from deploy_helpers import FAST_HEARTBEAT, QUICKSTART, read_rows, tiny_overrides, wait_for

pytestmark = pytest.mark.slow

ROUND_TIMEOUT = 60.0  # not reached: the dead node's message gets an error reply first
DETECTION_BOUND = 75.0  # kill -> end of the first round without the node: <= 20 s + 2 rounds


def test_killed_supernode_leaves_and_comes_back(tmp_path, federation):
    # Prepare
    t0 = time.monotonic()
    out = tmp_path / "out"
    fed = federation(3, supernode_prefix=FAST_HEARTBEAT)
    fed.start()
    run_id = fed.submit(str(QUICKSTART), tiny_overrides(3, rounds=12, round_timeout=ROUND_TIMEOUT), out)
    fed.follow_run(run_id)

    # Execute 1: SIGKILL node 2 (and all it started) while it works on its first train message
    wait_for(lambda: "Receiving: train message" in fed.nodes[2].output(), 90, "train message at supernode-2", fed)
    fed.kill_supernode(2)
    killed_at = time.monotonic()

    # Assert 1: the round in flight ends once the SuperLink noticed (the dead node's
    # message returns an error reply, long before the round timeout) ...
    first = wait_for(lambda: read_rows(out)[:1], DETECTION_BOUND, "end of the round that lost node 2", fed)[0]
    noticed = time.monotonic() - killed_at
    assert first["online"] == [0, 1, 2] and first["sampled"] == [0, 1] and first["failed"], first
    assert noticed < ROUND_TIMEOUT - 5, "the round waited for its timeout: the dead node was not noticed"

    # Execute 2: node 2 comes back at once (same partition id, a new Flower node id); it
    # connects within seconds, after the next round was configured without it
    fed.start_supernode(2, wait=False)

    # Assert 2: the next round runs with 0 and 1 as a new session; then 2 trains again,
    # in another session
    def row(predicate):
        return lambda: next((r for r in read_rows(out) if predicate(r)), None)

    gone = wait_for(row(lambda r: r["round"] > first["round"]), 60, "round after the departure", fed)
    assert gone["online"] == [0, 1] and gone["sampled"] == [0, 1], gone
    assert gone["session_started"] and gone["session"] > first["session"]
    back = wait_for(
        row(lambda r: r["round"] > gone["round"] and 2 in r["sampled"]), 75, "round where client 2 trains again", fed
    )
    assert back["online"] == [0, 1, 2]
    assert back["session"] > gone["session"]
    assert all(r["online"] for r in read_rows(out)), "a round with nobody online"
    fed.stop_run(run_id)
    print(
        f"kill at {killed_at - t0:.0f} s; noticed after {noticed:.1f} s; rounds: lost node 2 in {first['round']}, "
        f"without it {gone['round']}, back in {back['round']}; total {time.monotonic() - t0:.0f} s"
    )
