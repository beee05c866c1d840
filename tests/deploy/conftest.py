"""Fixtures of the loopback deployment tests: a federation factory that always stops
what it started (and fails the test if a process survives)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # deploy_helpers (importlib import mode)

from fedflex.launch.deploy import LocalFederation  # noqa: E402


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture
def federation(tmp_path, request):
    """``federation(num_nodes, **kwargs)`` -> a :class:`LocalFederation` under tmp_path.

    Every federation made here is stopped at teardown, even when the test failed; the
    test then fails if any process it started still runs. On failure the tails of the
    logs are printed."""
    made: list[LocalFederation] = []

    def make(num_nodes: int, **kwargs) -> LocalFederation:
        fed = LocalFederation(tmp_path / f"fed{len(made)}", num_nodes, **kwargs)
        made.append(fed)
        return fed

    yield make
    for fed in made:
        fed.stop()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        for fed in made:
            for log in sorted(fed.logs.glob("*.log")):
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
                print(f"\n===== {log.name} =====\n{tail}")
    left = [pid for fed in made for pid in fed.leftovers()]
    assert not left, f"processes still running after stop: {left}"
