"""Every sampler x aggregator x initializer x local rule either runs real rounds end to
end (real ClientApp through the in-process grid) or is refused at config load by name.

The Byzantine-robust aggregators (fedflex.config.ROBUST_AGGREGATORS) share one code path
(strategies/robust.py): each runs with every initializer and local rule (or is refused),
and every sampler runs with one of them, instead of the full product."""

import itertools

import pytest

import fedflex.clients.runtime as runtime
from fedflex.clients.client_app import app as client_app
from fedflex.config import INITIALIZERS, LOCAL_RULES, PLAIN_AGGREGATORS, ROBUST_AGGREGATORS, SAMPLERS, ConfigError
from fedflex.launch.local_grid import LocalGrid
from fedflex.launch.server import run_server
from fedflex.loader import load_scenario
from fedflex.results import read_metrics
from fedflex.strategies.build import check_parts

# 2 rounds, a new session each round: round 2 is a session start after the pilot
# session, so session-aware runs its gradient round there
BASE = [
    "num_clients=4",
    "rounds=2",
    "dataset.samples_per_client=20",
    "client.batch_size=5",
    "strategy.sampler.clients_per_round=2",
    "strategy.sampler.powd.d=3",
    "churn.kind=sessions",
    "churn.sessions=[[0,1,2],[1,2,3]]",
    "churn.rounds_per_session=1",
    "output.progress=off",
    "output.plots=false",
    "output.checkpoint_every=0",
]


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDFLEX_CACHE", str(tmp_path / "cache"))
    runtime.get_task.cache_clear()


def _runs_or_is_refused(out, overrides, rule) -> bool:
    """True: the combination ran two real rounds; False: it was refused by name."""
    try:
        cfg = load_scenario(None, overrides)
        check_parts(cfg)
    except ConfigError as exc:
        assert exc.key.startswith("strategy.") or exc.key.startswith("client."), str(exc)
        return False
    run_server(LocalGrid(client_app, cfg.num_clients), cfg, out)
    rows = [r for r in read_metrics(out) if r["phase"] == "train"]
    assert [r["round"] for r in rows] == [1, 2], overrides
    # every train round aggregated at least one reply (GraB may select nothing on
    # tiny data: its round keeps the model and says so, see docs/bherd.md)
    if rule != "grab":
        assert all(r["sampled"] for r in rows), (overrides, rows)
    return True


def _parts(sampler, aggregator, init, rule):
    return [
        f"strategy.sampler.name={sampler}",
        f"strategy.aggregator.name={aggregator}",
        f"strategy.initializer.name={init}",
        f"strategy.local_rule.name={rule}",
    ]


# krum / bulyan need 2f + 3 / 4f + 3 replies: f = 0 and 3 of the 4 clients
ROBUST = ["strategy.aggregator.krum.num_malicious=0", "strategy.sampler.clients_per_round=3"]


@pytest.mark.parametrize("sampler, aggregator", list(itertools.product(SAMPLERS, PLAIN_AGGREGATORS)))
def test_every_combination_runs_or_is_refused_by_name(tmp_path, sampler, aggregator):
    ran = 0
    for init, rule in itertools.product(INITIALIZERS, LOCAL_RULES):
        overrides = BASE + _parts(sampler, aggregator, init, rule)
        ran += _runs_or_is_refused(tmp_path / f"{init}-{rule}", overrides, rule)
    assert ran > 0


@pytest.mark.parametrize("aggregator", ROBUST_AGGREGATORS)
def test_every_robust_aggregator_runs_with_each_initializer_and_rule_or_is_refused(tmp_path, aggregator):
    ran = []
    for init, rule in itertools.product(INITIALIZERS, LOCAL_RULES):
        overrides = BASE + ROBUST + _parts("uniform", aggregator, init, rule)
        if _runs_or_is_refused(tmp_path / f"{init}-{rule}", overrides, rule):
            ran.append(rule)
    assert sorted(set(ran)) == ["fedprox", "sgd"]  # the rules whose server half averages nothing


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_every_sampler_runs_with_a_robust_aggregator(tmp_path, sampler):
    overrides = BASE + ROBUST + _parts(sampler, "krum", "previous", "sgd")
    assert _runs_or_is_refused(tmp_path / "out", overrides, "sgd")
