"""A SuperNode whose ClientApp sends NaN weights or NaN ``num-examples``, on a real
loopback federation.

All SuperNodes of a deployment run the same app, so the broken client is made by fault
injection in that one node's processes (``faulty/sitecustomize.py``, enabled by
``FEDFLEX_FAULT=nan`` in its environment; clients/client_app.py is unchanged). The
strategy must reject its replies every round, log the client as failed, aggregate the
healthy node's replies only, and finish the run with a finite model.
"""

from __future__ import annotations

import json
import math
import os

import pytest
from deploy_helpers import FAULTY_SITE, QUICKSTART, read_rows, tiny_overrides

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "fault, reason",
    [("nan", "NaN or Inf values"), ("nan-examples", "num-examples is nan, not a finite number")],
)
def test_nan_replies_of_one_supernode_are_rejected(tmp_path, federation, fault, reason):
    # Prepare: node 1 is broken
    out = tmp_path / "out"
    pythonpath = os.pathsep.join(p for p in (str(FAULTY_SITE), os.environ.get("PYTHONPATH", "")) if p)
    fed = federation(2, node_env={1: {"PYTHONPATH": pythonpath, "FEDFLEX_FAULT": fault}})
    fed.start()
    # Execute
    result = fed.run(str(QUICKSTART), tiny_overrides(2, rounds=2), out, timeout=100)
    # Assert
    assert result.ok, (result.status, result.details)
    assert f"FEDFLEX_FAULT={fault}:" in fed.nodes[1].output()  # the fault was really injected
    rows = read_rows(out)
    assert [r["round"] for r in rows] == [1, 2]
    for r in rows:
        assert r["online"] == [0, 1] and r["sampled"] == [0] and r["failed"] == [1], r
        assert len(r["rejected"]) == 1 and r["rejected"][0][0] == 1 and reason in r["rejected"][0][1], r
        assert math.isfinite(r["test_loss"]) and math.isfinite(r["train_loss"])
    run_log = result.log_path.read_text(errors="replace")
    assert reason in run_log
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
