"""The registries name the parts: the server's (strategies/build.py) and the client's
(clients/rules.py) agree, the core config lists no names, an unknown name is refused at
load with the names there are, and a new part is its module plus one registry line per
side (the exercise, run below). A local rule's options reach the client through its
server half."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord

from fedflex import config
from fedflex.checks import ConfigError, number
from fedflex.clients import rules
from fedflex.clients.client_app import app as client_app
from fedflex.clients.node import rule_options
from fedflex.clients.rules import LOCAL_RULES as CLIENT_RULES
from fedflex.clients.rules import SGD, RuleOutput, RuleStart, RuleSteps
from fedflex.launch.local_grid import LocalGrid
from fedflex.launch.server import run_server
from fedflex.loader import load_scenario
from fedflex.options import MethodOptions
from fedflex.results import read_metrics
from fedflex.strategies import build
from fedflex.strategies.build import (
    AGGREGATORS,
    INITIALIZERS,
    SAMPLERS,
    SERVER_RULES,
    build_strategy,
)
from fedflex.strategies.combinations import check_parts
from fedflex.strategies.flower_strategy import SamplerStrategy
from fedflex.strategies.hics_strategy import HiCSFL
from fedflex.strategies.parts import Sampler, ServerRule

BASE = ["num_clients=4", "dataset.samples_per_client=20", "churn.kind=none", "output.progress=off"]


def test_the_server_and_the_client_name_the_same_local_rules():
    assert set(SERVER_RULES) == set(CLIENT_RULES)


def test_the_core_config_names_no_part():
    for name in ("SAMPLERS", "AGGREGATORS", "PLAIN_AGGREGATORS", "ROBUST_AGGREGATORS", "INITIALIZERS", "LOCAL_RULES"):
        assert not hasattr(config, name), name


@pytest.mark.parametrize(
    "part, registry",
    [("sampler", SAMPLERS), ("aggregator", AGGREGATORS), ("initializer", INITIALIZERS), ("local_rule", SERVER_RULES)],
)
def test_an_unknown_name_is_refused_at_load_with_the_names_there_are(part, registry):
    cfg = load_scenario(None, [*BASE, f"strategy.{part}.name=nope"])  # the core alone does not know the names
    with pytest.raises(ConfigError) as info:
        check_parts(cfg)  # what the composition root runs right after loading
    assert info.value.key == f"strategy.{part}.name"
    assert str(info.value) == f"strategy.{part}.name = 'nope': must be one of " + ", ".join(registry)


# ---------------------------------------------------------------------------- the exercise
# A new part is its module (here: the classes in this test) plus one registry line per
# side (here: monkeypatch.setitem); nothing else is edited, and a scenario naming it (and
# setting its option) loads, passes the load-time check and runs real rounds through the
# real ClientApp; a sampler is then also a named Flower strategy (SamplerStrategy).
EXERCISE = [*BASE, "rounds=2", "strategy.sampler.clients_per_round=2", "output.plots=false"]


@dataclass
class FirstOptions(MethodOptions):
    """The toy sampler's one option: how many of the lowest online ids to pass over."""

    PARTS: ClassVar[tuple[str, ...]] = ("first",)

    skip: int = 0

    def validate(self, path: str) -> None:
        number(path, "skip", self.skip, ge=0)


class _FirstClients(Sampler):
    """The toy sampler's module: the lowest online ids after the first ``skip``."""

    name = "first"
    OPTIONS = FirstOptions

    def __init__(self, seed: int, options: FirstOptions) -> None:
        self.skip = options.skip

    def sample(self, server_round: int, online: np.ndarray, num: int) -> np.ndarray:
        return np.sort(online)[self.skip : self.skip + num].astype(np.int64)


def test_a_new_sampler_is_its_module_plus_one_registry_line(tmp_path, monkeypatch, isolated_cache):
    with pytest.raises(ConfigError, match="must be one of uniform"):
        check_parts(load_scenario(None, [*EXERCISE, "strategy.sampler.name=first"]))
    with pytest.raises(ConfigError, match="strategy.sampler.first"):
        load_scenario(None, [*EXERCISE, "strategy.sampler.first.skip=1"])

    monkeypatch.setitem(build.SAMPLERS, "first", _FirstClients)  # the one line

    # from YAML: its name and its option, checked by its own validate, warned about when unread
    cfg = load_scenario(None, [*EXERCISE, "strategy.sampler.name=first", "strategy.sampler.first.skip=1"])
    check_parts(cfg)
    run_server(LocalGrid(client_app, cfg.num_clients), cfg, tmp_path / "out")
    rows = [r for r in read_metrics(tmp_path / "out") if r["phase"] == "train"]
    assert [r["sampled"] for r in rows] == [[1, 2], [1, 2]]
    with pytest.raises(ConfigError, match=r"strategy.sampler.first.skip = -1: must be >= 0"):
        load_scenario(None, [*EXERCISE, "strategy.sampler.name=first", "strategy.sampler.first.skip=-1"])
    assert [
        o for o, _, _ in load_scenario(None, [*EXERCISE, "strategy.sampler.first.skip=2"]).strategy.sampler.unused()
    ] == ["first.skip"]


@pytest.mark.usefixtures("quickstart_example")  # tests/conftest.py: Flower's quickstart app
def test_the_new_sampler_is_a_named_strategy_by_the_same_registry_line(monkeypatch):
    from flowerquickstart.client_app import app
    from flowerquickstart.task import Net

    with pytest.raises(ConfigError, match="must be one of uniform"):
        SamplerStrategy(sampler="first")
    monkeypatch.setitem(build.SAMPLERS, "first", _FirstClients)  # the one line
    # Execute: Flower's own loop, its quickstart ClientApp, the toy's options object
    strategy = SamplerStrategy(sampler="first", options=FirstOptions(skip=2), clients_per_round=2)
    grid = LocalGrid(app, 4)
    for context in grid.contexts.values():
        context.run_config.update({"examples": 40})
    strategy.start(
        grid=grid, initial_arrays=ArrayRecord(Net().state_dict()), num_rounds=1, train_config=ConfigRecord({"lr": 0.05})
    )
    # Assert
    assert strategy.record is not None and strategy.record.sampled == [2, 3]
    with pytest.raises(ConfigError, match=r"strategy.sampler.first.skip = -1"):
        SamplerStrategy(sampler="first", options=FirstOptions(skip=-1))
    with pytest.raises(TypeError, match="unexpected keyword argument 'sampler'"):
        HiCSFL(sampler="first")  # a named strategy's sampler is its own


TOY_C = "toy-c"  # the toy rule's server -> client record


def _toy_start(inp, x):
    return RuleStart(context=float(sum(t.sum() for t in inp.payload[TOY_C].values())))


def _toy_finish(inp, start, x, y, result):
    return RuleOutput(result, metrics={"toy-seen": start.context, "toy-named": float(inp.options.name == "toy")})


#: the toy rule's client module: plain local training that reads its server half's record
TOY = RuleSteps(_toy_start, _toy_finish)


class _ToyServer(ServerRule):
    """The toy rule's server module: sends round x ones, sees what the clients read."""

    name = "toy"
    rule = "toy"

    def __init__(self, options) -> None:
        super().__init__(options)
        self.seen: list[tuple[int, float, float]] = []

    def train_payload(self, server_round: int):
        return {TOY_C: OrderedDict(c=np.full(3, float(server_round), dtype=np.float32))}

    def observe(self, server_round, updates, global_arrays) -> None:
        self.seen += [(server_round, u.metrics["toy-seen"], u.metrics["toy-named"]) for u in updates]


def test_a_new_local_rule_is_its_two_modules_plus_one_registry_line_per_side(tmp_path, monkeypatch, isolated_cache):
    servers: list[_ToyServer] = []

    def make(cfg, model):
        servers.append(_ToyServer(cfg.strategy.local_rule))
        return servers[-1]

    monkeypatch.setitem(rules.LOCAL_RULES, "toy", TOY.run)  # the client side's line
    monkeypatch.setitem(build.SERVER_RULES, "toy", make)  # the server side's line

    cfg = load_scenario(None, [*EXERCISE, "strategy.local_rule.name=toy"])
    check_parts(cfg)
    run_server(LocalGrid(client_app, cfg.num_clients), cfg, tmp_path / "out")
    assert sorted(servers[-1].seen) == sorted([(r, 3.0 * r, 1.0) for r in (1, 2) for _ in range(2)])


@pytest.mark.parametrize("rule, expected_mu", [("fedprox", 0.3), ("sgd", 0.0)])
def test_fedprox_mu_travels_from_the_scenario_to_the_clients_step(rule, expected_mu):
    # Prepare: the scenario sets mu; only fedprox reads it
    cfg = load_scenario(None, BASE + [f"strategy.local_rule.name={rule}", "strategy.local_rule.fedprox.mu=0.3"])
    sent = ConfigRecord(build_strategy(cfg, None).server_rule.train_config(1))

    # Execute: what the client reads back, and the term its first step adds
    options = rule_options(sent)
    terms = SGD.start(_Input(options), OrderedDict()).terms

    # Assert
    assert options.name == rule
    assert terms.prox_mu == expected_mu


class _Input:
    """The one field of RuleInput that SGD's start reads."""

    def __init__(self, options) -> None:
        self.options = options


def test_a_toy_aggregator_is_its_class_and_one_registry_line(monkeypatch, tmp_path):
    # issue 44: an aggregator is its own spec (name, build from strategy.aggregator), as a sampler is
    from fedflex.strategies.baseline import FedAvgAggregator

    class _HalfStep(FedAvgAggregator):
        name = "half-step"
        DP_NOTE = None

        @classmethod
        def build(cls, options, federation):
            return cls(weighted=options.weighted, server_lr=0.5 * options.server_lr)

    monkeypatch.setitem(build.AGGREGATORS, "half-step", _HalfStep)  # the one line
    cfg = load_scenario(None, [*BASE, "strategy.aggregator.name=half-step", "strategy.aggregator.server_lr=0.8"])
    check_parts(cfg)
    strategy = build_strategy(cfg, None)
    assert type(strategy.aggregator) is _HalfStep and strategy.aggregator.server_lr == 0.4
