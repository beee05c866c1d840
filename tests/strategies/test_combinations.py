"""Every sampler x aggregator x initializer x local rule either runs real rounds end to
end (real ClientApp through the in-process grid) or is refused at config load by name.

The default (fast) run checks every combination through the config check alone (the
refusals, by name) and runs for real an all-pairs set of the allowed ones: every pair of
part values that any allowed combination contains runs together at least once
(``pairwise`` below, greedy and deterministic; its coverage is a test). The ``slow``
tests run the full product for real.

The Byzantine-robust aggregators (strategies.build.ROBUST_AGGREGATORS) share one code path
(strategies/robust.py): in the slow run each runs with every initializer and local rule
(or is refused), and every sampler runs with one of them, instead of the full product."""

import copy
import functools
import itertools
from collections.abc import Callable, Sequence

import pytest

import fedflex.clients.runtime as runtime
from fedflex.clients.client_app import app as client_app
from fedflex.config import ConfigError
from fedflex.launch.local_grid import LocalGrid
from fedflex.launch.server import run_server
from fedflex.loader import load_scenario
from fedflex.results import read_metrics
from fedflex.strategies import build
from fedflex.strategies.combinations import ROBUST_AGGREGATORS, ROBUST_RULES, check_parts

# the part names: the registries' (the one place that names the parts)
SAMPLERS, AGGREGATORS, INITIALIZERS = tuple(build.SAMPLERS), tuple(build.AGGREGATORS), tuple(build.INITIALIZERS)
LOCAL_RULES = tuple(build.SERVER_RULES)
PLAIN_AGGREGATORS = tuple(a for a in AGGREGATORS if a not in ROBUST_AGGREGATORS)

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


FACTORS = (SAMPLERS, AGGREGATORS, INITIALIZERS, LOCAL_RULES)
ALL = list(itertools.product(*FACTORS))


def pairwise(factors: Sequence[Sequence[str]], allowed: Callable[[tuple[str, ...]], bool]) -> list[tuple[str, ...]]:
    """An all-pairs set of the allowed combinations: every pair of values (of two factors)
    that some allowed combination contains is in at least one chosen combination.

    Greedy: repeatedly take the allowed combination that covers the most pairs not yet
    covered (the first such in product order, so the result is deterministic)."""
    candidates = [c for c in itertools.product(*factors) if allowed(c)]
    pairs = {c: {(i, c[i], j, c[j]) for i, j in itertools.combinations(range(len(c)), 2)} for c in candidates}
    uncovered = set().union(*pairs.values())
    chosen = []
    while uncovered:
        best = max(candidates, key=lambda c: len(pairs[c] & uncovered))
        chosen.append(best)
        uncovered -= pairs[best]
    return chosen


def _overrides(combo: tuple[str, ...]) -> list[str]:
    return BASE + (ROBUST if combo[1] in ROBUST_AGGREGATORS else []) + _parts(*combo)


@functools.cache
def _loaded(robust: bool):
    return load_scenario(None, BASE + (ROBUST if robust else []))


def _refusal(combo: tuple[str, ...]) -> ConfigError | None:
    """The config check (validate + check_parts) of one combination, without reloading
    the scenario (OmegaConf takes ~0.1 s a load); the slow product checks that
    load_scenario agrees for every combination."""
    cfg = copy.deepcopy(_loaded(combo[1] in ROBUST_AGGREGATORS))
    s = cfg.strategy
    s.sampler.name, s.aggregator.name, s.initializer.name, s.local_rule.name = combo
    try:
        cfg.validate()
        check_parts(cfg)
    except ConfigError as exc:
        return exc
    return None


@functools.cache
def _verdicts() -> dict[tuple[str, ...], ConfigError | None]:
    return {c: _refusal(c) for c in ALL}


PAIRWISE = pairwise(FACTORS, lambda c: _verdicts()[c] is None)


def test_pairwise_covers_every_pair_that_an_allowed_combination_contains():
    allowed = {c for c, exc in _verdicts().items() if exc is None}
    assert set(PAIRWISE) <= allowed and len(set(PAIRWISE)) == len(PAIRWISE)
    for i, j in itertools.combinations(range(len(FACTORS)), 2):
        assert {(c[i], c[j]) for c in PAIRWISE} == {(c[i], c[j]) for c in allowed}, (i, j)
    assert len(PAIRWISE) < len(allowed) / 4
    # three two-valued factors, nothing refused: 4 combinations cover the 12 pairs
    toy = pairwise([("a", "b")] * 3, lambda c: True)
    assert len(toy) == 4 and toy == pairwise([("a", "b")] * 3, lambda c: True)
    assert {(c[i], c[j]) for c in toy for i, j in ((0, 1), (0, 2), (1, 2))} == set(itertools.product("ab", "ab"))
    # a refused combination is never chosen, a pair only it contains is not required
    assert ("a", "a", "a") not in pairwise([("a", "b")] * 3, lambda c: c != ("a", "a", "a"))


def test_every_combination_is_allowed_or_refused_by_name_at_the_config_check():
    verdicts = _verdicts()
    for combo, exc in verdicts.items():
        if exc is not None:
            assert exc.key.startswith("strategy.") or exc.key.startswith("client."), (combo, str(exc))
    allowed = [c for c, exc in verdicts.items() if exc is None]
    for i, values in enumerate(FACTORS):  # every part value runs with something
        assert {c[i] for c in allowed} == set(values)
    # every sampler with every aggregator
    assert {(c[0], c[1]) for c in allowed} == set(itertools.product(SAMPLERS, AGGREGATORS))
    # a robust aggregator takes exactly the rules whose server half averages nothing
    for combo, exc in verdicts.items():
        if combo[1] in ROBUST_AGGREGATORS:
            assert (exc is None) == (combo[3] in ROBUST_RULES), combo


@pytest.mark.parametrize("sampler, aggregator, init, rule", PAIRWISE, ids=["-".join(c) for c in PAIRWISE])
def test_all_pairs_of_parts_run(tmp_path, sampler, aggregator, init, rule):
    combo = (sampler, aggregator, init, rule)
    assert _runs_or_is_refused(tmp_path / "out", _overrides(combo), rule), combo


@pytest.mark.slow
@pytest.mark.parametrize("sampler, aggregator", list(itertools.product(SAMPLERS, PLAIN_AGGREGATORS)))
def test_every_combination_runs_or_is_refused_by_name(tmp_path, sampler, aggregator):
    ran = 0
    for init, rule in itertools.product(INITIALIZERS, LOCAL_RULES):
        overrides = BASE + _parts(sampler, aggregator, init, rule)
        runs = _runs_or_is_refused(tmp_path / f"{init}-{rule}", overrides, rule)
        assert runs == (_verdicts()[(sampler, aggregator, init, rule)] is None), overrides  # the fast check agrees
        ran += runs
    assert ran > 0


@pytest.mark.slow
@pytest.mark.parametrize("aggregator", ROBUST_AGGREGATORS)
def test_every_robust_aggregator_runs_with_each_initializer_and_rule_or_is_refused(tmp_path, aggregator):
    ran = []
    for init, rule in itertools.product(INITIALIZERS, LOCAL_RULES):
        overrides = BASE + ROBUST + _parts("uniform", aggregator, init, rule)
        runs = _runs_or_is_refused(tmp_path / f"{init}-{rule}", overrides, rule)
        assert runs == (_verdicts()[("uniform", aggregator, init, rule)] is None), overrides
        if runs:
            ran.append(rule)
    assert sorted(set(ran)) == ["fedprox", "sgd"]  # the rules whose server half averages nothing


@pytest.mark.slow
@pytest.mark.parametrize("sampler", SAMPLERS)
def test_every_sampler_runs_with_a_robust_aggregator(tmp_path, sampler):
    overrides = BASE + ROBUST + _parts(sampler, "krum", "previous", "sgd")
    assert _runs_or_is_refused(tmp_path / "out", overrides, "sgd")
