"""Each method's options are declared once (fedflex.options), nested under their part in a
scenario; old flat keys are read through one alias table with a warning."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from fedflex import config
from fedflex.checks import ConfigError
from fedflex.loader import load_scenario, warn_unused
from fedflex.options import ALIASES, HiCSOptions, MethodOptions
from fedflex.strategies import build  # its registries name the parts


def _sections():
    for part_cls, names in (
        (config.SamplerConfig, build.SAMPLERS),
        (config.AggregatorConfig, build.AGGREGATORS),
        (config.InitializerConfig, build.INITIALIZERS),
        (config.LocalRuleConfig, build.SERVER_RULES),
    ):
        for options in part_cls().sections().values():
            yield part_cls, names, options


def test_every_options_class_names_parts_of_its_part_type():
    for part_cls, names, options in _sections():
        assert options.PARTS and set(options.PARTS) <= set(names), (part_cls.__name__, type(options).__name__)
        for field_name, readers in options.FIELD_PARTS.items():
            assert field_name in {f.name for f in dataclasses.fields(options)}
            assert set(readers) <= set(options.PARTS)


def test_each_sampler_class_is_the_spec_of_its_scenario_section():
    # name, options class, section and seed offset come from the class; the scenario's
    # strategy.sampler declares a section of that very class for every built-in sampler
    declared = {f.name: f.type for f in dataclasses.fields(config.SamplerConfig)}
    for name, cls in build.SAMPLERS.items():
        assert cls.name == name and cls.OPTIONS is not None
        assert declared[cls.section()] in (cls.OPTIONS, cls.OPTIONS.__name__)
        assert name in cls.OPTIONS.PARTS
        assert build.SEED_OFFSETS[name] == cls.seed_offset()
    assert build.extra_sections() == {}
    # the first release's seed streams are kept
    assert {n: build.SEED_OFFSETS[n] for n in ("uniform", "hics", "pow-d", "clustered", "divfl", "fedcor")} == {
        "uniform": 1,
        "hics": 11,
        "pow-d": 12,
        "clustered": 13,
        "divfl": 15,
        "fedcor": 16,
    }


def test_every_alias_names_an_existing_new_key():
    cfg = config.ScenarioConfig()
    for old, new in ALIASES.items():
        for key in new:
            node = cfg
            for part in key.split("."):
                assert hasattr(node, part), (old, key)
                node = getattr(node, part)


def test_old_keys_load_as_the_new_ones_with_a_warning(caplog):
    old = ["strategy.sampler.name=hics", "strategy.sampler.hics_lambda=3", "strategy.sampler.temperature=0.1"]
    new = [
        "strategy.sampler.name=hics",
        "strategy.sampler.hics.entropy_weight=3",
        "strategy.sampler.hics.temperature=0.1",
    ]
    with caplog.at_level(logging.WARNING, logger="fedflex.loader"):
        a = load_scenario(None, old)
    assert config.ScenarioConfig.__eq__(a, load_scenario(None, new))
    assert "strategy.sampler.hics_lambda is deprecated (read for one more release): write " in caplog.text
    assert "strategy.sampler.hics.entropy_weight" in caplog.text


def test_old_keys_in_a_file_and_the_aware_switch(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(
        "strategy:\n  aggregator: {name: fedavgm, aware: true, aware_momentum: 0.2, server_momentum: 0.5}\n"
    )
    cfg = load_scenario(path)
    a = cfg.strategy.aggregator
    assert (a.aware.enabled, a.aware.momentum, a.fedavgm.momentum) == (True, 0.2, 0.5)


def test_an_option_in_both_spellings_is_refused():
    with pytest.raises(ConfigError, match="keep only strategy.local_rule.feddyn.alpha"):
        load_scenario({"strategy": {"local_rule": {"feddyn_alpha": 0.1, "feddyn": {"alpha": 0.2}}}})


def test_a_section_of_another_part_is_warned_about():
    cfg = load_scenario(None, ["strategy.sampler.hics.temperature=0.1"])
    assert warn_unused(cfg) == [
        "strategy.sampler.hics.temperature=0.1 does nothing for sampler uniform (read by: hics)"
    ]


def test_a_part_constructor_takes_the_options_object_or_its_fields():
    from fedflex.strategies.hics import HiCSSampler

    a = HiCSSampler(bias_key="b", num_clients=2, rounds=1, seed=0, options=HiCSOptions(entropy_weight=3.0))
    b = HiCSSampler(bias_key="b", num_clients=2, rounds=1, seed=0, entropy_weight=3.0)
    assert a.options == b.options and a.hics_lambda == 3.0
    with pytest.raises(ConfigError, match="strategy.sampler.hics.departed"):
        HiCSSampler(bias_key="b", num_clients=2, rounds=1, seed=0, departed="forget")


def test_shipped_scenarios_use_no_old_key():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "scenarios"
    for path in sorted(root.glob("**/*.yaml")):
        text = path.read_text()
        for old in ALIASES:
            leaf = old.rsplit(".", 1)[1]
            assert f"{old}:" not in text and f"{old}=" not in text or leaf == "aware", (path.name, old)


def test_options_classes_are_method_options():
    assert all(isinstance(o, MethodOptions) for _, _, o in _sections())


def test_aware_max_age_has_its_old_spelling_too():
    cfg = load_scenario(None, ["strategy.aggregator.name=fedaware", "strategy.aggregator.aware_max_age=10"])
    assert cfg.strategy.aggregator.aware.max_age == 10


def test_an_old_key_naming_two_sections_takes_the_chosen_parts():
    from fedflex.loader import alias_mapping

    out = alias_mapping({"strategy": {"sampler": {"name": "clustered", "ward": "scalable"}}}, warn=False)
    assert out == {"strategy": {"sampler": {"name": "clustered", "clustered": {"ward": "scalable"}}}}


def test_a_saved_config_of_the_first_release_reads_as_the_new_one():
    # what sweep and compare do with the config.yaml of an earlier run
    from fedflex.loader import alias_mapping

    old = {"strategy": {"aggregator": {"name": "fedavg", "aware": False, "aware_momentum": 0.5, "trim_beta": 0.2}}}
    assert alias_mapping(old, warn=False) == {
        "strategy": {
            "aggregator": {
                "name": "fedavg",
                "aware": {"enabled": False, "momentum": 0.5},
                "trimmed_mean": {"beta": 0.2},
            }
        }
    }


def test_fedaware_keeping_offline_sessions_momenta_is_warned_about():
    from fedflex.loader import warn_measured

    sessions = ["churn.kind=sessions", "churn.sessions=[[0,1],[2,3]]", "num_clients=4"]
    cfg = load_scenario(None, [*sessions, "strategy.aggregator.name=fedaware"])
    (said,) = warn_measured(cfg)
    assert said.startswith("strategy.aggregator.aware.departed=keep")
    # the plug-in solves over the same momenta
    plug = ["strategy.aggregator.name=fedavgm", "strategy.aggregator.aware.enabled=true"]
    assert len(warn_measured(load_scenario(None, [*sessions, *plug]))) == 1
    # left out while offline, other churn, or no AWARE: nothing to say
    exclude = "strategy.aggregator.aware.departed=exclude"
    assert warn_measured(load_scenario(None, [*sessions, "strategy.aggregator.name=fedaware", exclude])) == []
    assert warn_measured(load_scenario(None, ["strategy.aggregator.name=fedaware", "churn.kind=markov"])) == []
    assert warn_measured(load_scenario(None, sessions)) == []
