"""The names of fedflex.config, the server's part registries and the client's rule
registry agree; a local rule's options reach the client through its server half."""

from __future__ import annotations

from collections import OrderedDict

import pytest
from flwr.app import ConfigRecord

from fedflex import config
from fedflex.clients.node import rule_options
from fedflex.clients.rules import LOCAL_RULES as CLIENT_RULES
from fedflex.clients.rules import SGD
from fedflex.loader import load_scenario
from fedflex.strategies.build import AGGREGATORS, INITIALIZERS, SAMPLERS, SERVER_RULES, build_strategy

BASE = ["num_clients=4", "dataset.samples_per_client=20", "churn.kind=none", "output.progress=off"]


def test_every_name_the_config_accepts_has_a_server_part_and_a_client_rule():
    assert set(SAMPLERS) == set(config.SAMPLERS)
    assert set(AGGREGATORS) == set(config.AGGREGATORS)
    assert set(INITIALIZERS) == set(config.INITIALIZERS)
    assert set(SERVER_RULES) == set(CLIENT_RULES) == set(config.LOCAL_RULES)


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
