"""Scenario config: defaults, overrides and one-line errors naming the key."""

from pathlib import Path

import pytest

from fedflex.config import ConfigError, ScenarioConfig
from fedflex.loader import load_scenario, to_yaml
from fedflex.strategies.combinations import load_checked

SCENARIOS = sorted(p for p in (Path(__file__).parents[2] / "scenarios").rglob("*.yaml") if "studies" not in p.parts)


def test_defaults_load_without_a_file():
    cfg = load_scenario(None)
    assert isinstance(cfg, ScenarioConfig)
    assert cfg.dataset.name == "synthetic"


def test_override_changes_the_value_and_keeps_the_type():
    cfg = load_scenario(None, ["client.lr=0.25", "strategy.sampler.clients_per_round=7"])
    assert cfg.client.lr == 0.25
    assert cfg.strategy.sampler.clients_per_round == 7


def test_file_layer_then_override_layer(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("rounds: 3\nclient:\n  lr: 0.5\n")
    cfg = load_scenario(path, ["client.lr=0.1"])
    assert (cfg.rounds, cfg.client.lr) == (3, 0.1)


@pytest.mark.parametrize(
    "override, key, fragment",
    [
        ("client.lrr=1", "client.lrr", "unknown key"),
        ("bogus=1", "bogus", "unknown key"),
        ("client.lr=abc", "client.lr", "could not be converted"),
        ("client.lr=-1", "client.lr", "must be > 0"),
        ("client.momentum=1.0", "client.momentum", "< 1"),
        ("rounds=0", "rounds", ">= 1"),
        ("strategy.sampler.name=nope", None, None),  # names: check_parts (tests/strategies/test_build.py)
        ("churn.kind=markov", None, None),
        ("churn.p_leave=1.5", "churn.p_leave", "<= 1"),
        ("churn.kind=sessions", "churn.sessions", "needs a list"),
        ("partition.scheme=dirichlet", None, None),
        ("dataset.name=imagenet", "dataset.name", "must be one of"),
        ("evaluation.stop_smoothing=12", "evaluation.stop_smoothing", "odd window"),
        ("evaluation.stop_smoothing_order=-1", "evaluation.stop_smoothing_order", ">= 0"),
    ],
)
def test_bad_values_name_the_key(override, key, fragment):
    if key is None:  # a legal override: no error
        load_scenario(None, [override])
        return
    with pytest.raises(ConfigError) as info:
        load_scenario(None, [override])
    assert info.value.key == key
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_unknown_key_lists_the_known_ones():
    with pytest.raises(ConfigError) as info:
        load_scenario(None, ["client.lrr=1"])
    assert "batch_size" in str(info.value)


def test_session_ids_must_be_client_ids():
    with pytest.raises(ConfigError) as info:
        load_scenario(None, ["num_clients=4", "churn.kind=sessions", "churn.sessions=[[0,1],[2,4]]"])
    assert info.value.key == "churn.sessions[1]"


def test_natural_partition_needs_synthetic():
    with pytest.raises(ConfigError) as info:
        load_scenario(None, ["dataset.name=fmnist"])
    assert info.value.key == "partition.scheme"


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_scenario(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("rounds: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_scenario(bad)


def test_override_without_equals_sign():
    with pytest.raises(ConfigError, match="dotted.key=value"):
        load_scenario(None, ["rounds"])


def test_resolved_yaml_round_trips(tmp_path):
    cfg = load_scenario(None, ["rounds=7", "churn.kind=sessions", "churn.sessions=[[0],[1,2]]"])
    path = tmp_path / "config.yaml"
    path.write_text(to_yaml(cfg))
    again = load_scenario(path)
    assert again == cfg


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.name)
def test_every_shipped_scenario_loads(path):
    load_scenario(path)


def test_smoothing_order_must_be_below_the_window():
    with pytest.raises(ConfigError, match="must be < stop_smoothing"):
        load_scenario(None, ["evaluation.stop_smoothing=3", "evaluation.stop_smoothing_order=3"])


@pytest.mark.parametrize("rule", ["bherd", "grab"])
def test_kept_optimizer_state_is_refused_for_rules_with_their_own_loop(rule):
    with pytest.raises(ConfigError, match="keeps no optimiser state") as info:
        load_checked(None, ["client.keep_optimizer_state=true", f"strategy.local_rule.name={rule}"])
    assert info.value.key == "client.keep_optimizer_state"


def test_batch_norm_models_refuse_forced_cohorts():
    with pytest.raises(ConfigError, match="cnn-fmnist-authors keeps BatchNorm"):
        load_scenario(None, ["model.name=cnn-fmnist-authors", "simulation.vectorize=on"])
