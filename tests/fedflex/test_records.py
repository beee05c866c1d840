"""One to/from-record pair carries a typed options object from the scenario to the
client (fedflex.records); options a part ignores are warned about at load."""

from __future__ import annotations

import logging

from fedflex.config import ClientConfig, LocalRuleConfig
from fedflex.loader import load_scenario, warn_unused
from fedflex.options import BHerdOptions, FedProxOptions
from fedflex.records import from_record, to_record


def test_rule_options_become_kebab_case_entries_under_the_prefix():
    # Prepare
    options = LocalRuleConfig(name="bherd", bherd=BHerdOptions(alpha=0.3, base="scaffold"))

    # Execute
    entries = to_record(options, "local-rule", only=options.sent())

    # Assert: bherd reads its section (alpha, dtype, max_stored, base) and the batch order; not mu
    assert entries == {
        "local-rule.name": "bherd",
        "local-rule.fixed-order": False,
        "local-rule.bherd.alpha": 0.3,
        "local-rule.bherd.dtype": "float32",
        "local-rule.bherd.max-stored": 0,
        "local-rule.bherd.base": "scaffold",
    }
    assert from_record(LocalRuleConfig, entries, "local-rule") == options


def test_a_record_reads_back_as_the_object_that_wrote_it():
    # Prepare
    client = ClientConfig(epochs=3, steps=7, batch_size=10, optimizer="adam", lr=0.2, momentum=0.5)

    # Execute
    back = from_record(ClientConfig, to_record(client, "client"), "client")

    # Assert
    assert back == client


def test_missing_entries_take_the_class_defaults_and_none_is_not_sent():
    # Prepare: steps=None means "use epochs" and must survive as None
    entries = to_record(ClientConfig(steps=None, lr=0.5), "client")

    # Execute
    back = from_record(ClientConfig, {"client.lr": 0.5}, "client")

    # Assert
    assert "client.steps" not in entries
    assert back == ClientConfig(lr=0.5)


def test_values_are_cast_to_the_field_type():
    # an int in a float field (a YAML "1") and a float-typed count come back typed
    back = from_record(ClientConfig, {"client.lr": 1, "client.epochs": 2.0}, "client")
    assert isinstance(back.lr, float) and back.lr == 1.0
    assert isinstance(back.epochs, int) and back.epochs == 2


def test_worker_settings_stay_out_of_the_train_record():
    entries = to_record(ClientConfig(), "client", only=ClientConfig().training_fields())
    assert "client.device" not in entries and "client.num-threads" not in entries
    assert "client.lr" in entries


def test_an_option_the_chosen_rule_ignores_is_warned_about(caplog):
    # Prepare / Execute
    with caplog.at_level(logging.WARNING, logger="fedflex.config"):
        load_scenario("scenarios/quickstart.yaml", ["strategy.local_rule.fedprox.mu=0.5"])

    # Assert
    assert "strategy.local_rule.fedprox.mu=0.5 does nothing for local rule sgd (read by: fedprox)" in caplog.text


def test_an_option_the_chosen_part_reads_is_not_warned_about():
    cfg = load_scenario(
        "scenarios/quickstart.yaml",
        [
            "strategy.local_rule.name=fedprox",
            "strategy.local_rule.fedprox.mu=0.5",
            "strategy.aggregator.aware.enabled=true",
            "strategy.aggregator.aware.momentum=0.3",
            "strategy.sampler.name=hics",
            "strategy.sampler.hics.temperature=0.01",
        ],
    )
    assert warn_unused(cfg) == []


def test_aware_options_without_aware_are_warned_about():
    cfg = load_scenario("scenarios/quickstart.yaml", ["strategy.aggregator.aware.momentum=0.3"])
    assert warn_unused(cfg) == [
        "strategy.aggregator.aware.momentum=0.3 does nothing for aggregator fedavg "
        "(read by: fedaware, aware.enabled=true)"
    ]


def test_an_option_left_at_its_default_is_not_warned_about():
    # the scenario sets mu to its default explicitly: nothing to say
    cfg = load_scenario("scenarios/quickstart.yaml", [f"strategy.local_rule.fedprox.mu={FedProxOptions.mu}"])
    assert warn_unused(cfg) == []
