"""The rules between a scenario's parts, in one place, run once per load.

A scenario's sections check their own values, and :class:`fedflex.config.ScenarioConfig`
the rules between sections that name no part, when it is made. What needs the
registries (:mod:`strategies.build`): part names no registry has, and combinations of
parts that cannot work together (herding, robust aggregation, the AWARE plug-in,
optimiser state), is :func:`check_parts`. :func:`load_checked` is how every entry point
(the CLI, the Python API, ``flwr run``'s ServerApp, deployments, sweeps) loads a
scenario: loaded, checked, once; building the parts does not check again.
"""

from __future__ import annotations

from logging import WARNING
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, cast

from flwr.common import log

from fedflex.config import ConfigError, ScenarioConfig
from fedflex.loader import load_scenario
from fedflex.options import AWARE_BASES
from fedflex.strategies.build import AGGREGATORS, INITIALIZERS, SAMPLERS, SERVER_RULES
from fedflex.strategies.robust import clip_refusal


def load_checked(path: Optional[str | Path | Mapping[str, Any]], overrides: Iterable[str] = ()) -> ScenarioConfig:
    """Load a scenario (:func:`fedflex.loader.load_scenario`) and check its parts (:func:`check_parts`)."""
    cfg = load_scenario(path, list(overrides))
    check_parts(cfg)
    return cfg


#: the Byzantine-robust aggregators (Flower's FedMedian, FedTrimmedAvg, Krum, MultiKrum,
#: Bulyan): they take only the local rules in :data:`ROBUST_RULES`
ROBUST_AGGREGATORS = ("median", "trimmed-mean", "krum", "multikrum", "bulyan")


#: local rules that upload a selected-gradient sum for aggregator ``bherd``
HERDING_RULES = ("bherd", "grab")


def _check_herding(cfg: ScenarioConfig) -> None:
    """BHerd / GraB / FedNova combinations that cannot work, and the binary SVM."""
    s, rule = cfg.strategy, cfg.strategy.local_rule
    if cfg.client.keep_optimizer_state and rule.name in HERDING_RULES:
        raise ConfigError(
            "client.keep_optimizer_state",
            True,
            f"local rule {rule.name} runs its own per-step loop with plain SGD and "
            "keeps no optimiser state; use it with sgd, fedprox, scaffold, fednova, feddyn or fedcm",
        )
    if s.aggregator.name == "bherd" and rule.name not in HERDING_RULES:
        raise ConfigError(
            "strategy.aggregator.name",
            "bherd",
            f"needs strategy.local_rule.name bherd or grab (they upload the selected gradient sum); "
            f"local rule {rule.name} sends only a model",
        )
    if rule.name in HERDING_RULES and s.aggregator.name != "bherd":
        raise ConfigError(
            "strategy.local_rule.name",
            rule.name,
            f"needs strategy.aggregator.name=bherd (w - eta/alpha sum_i p_i g_i); "
            f"{s.aggregator.name} would ignore the selected gradients",
        )
    if rule.name == "grab" and rule.bherd.base != "fedavg":
        raise ConfigError(
            "strategy.local_rule.bherd.base", rule.bherd.base, "local rule grab is GraB-FedAvg: only fedavg"
        )
    if rule.name in HERDING_RULES + ("fednova", "fedcm") and cfg.client.optimizer != "sgd":
        raise ConfigError(
            "client.optimizer",
            cfg.client.optimizer,
            f"local rule {rule.name} needs sgd (its server step assumes plain SGD steps)",
        )
    binary = cfg.dataset.label_map == "even-odd" or (cfg.dataset.name == "synthetic" and cfg.dataset.num_classes == 2)
    if cfg.model.name == "svm" and not binary:
        raise ConfigError(
            "dataset.label_map",
            cfg.dataset.label_map,
            "model svm is a binary classifier: use even-odd (or synthetic data with num_classes=2)",
        )


#: local rules whose replies a robust aggregator takes: the others' server halves average
#: what every client sends outside the aggregator (SCAFFOLD's control variates, FedNova's
#: a-norms, FedDyn's h, FedCM's momentum, BHerd's gradient sums), so one hostile reply
#: would still steer the model
ROBUST_RULES = ("sgd", "fedprox")


def _check_robust(cfg: ScenarioConfig) -> None:
    """Robust aggregators and clipping: refuse what cannot work or would not be robust,
    warn about what amounts to something plainer.
    """
    s, a, k = cfg.strategy, cfg.strategy.aggregator, cast(int, cfg.strategy.sampler.clients_per_round)
    f, selected = a.krum.num_malicious, a.krum.num_selected
    if a.name in ROBUST_AGGREGATORS and s.local_rule.name not in ROBUST_RULES:
        raise ConfigError(
            "strategy.local_rule.name",
            s.local_rule.name,
            f"aggregator {a.name} takes local rule {' or '.join(ROBUST_RULES)}: the server half of "
            f"{s.local_rule.name} averages what every client sends outside the aggregator, so one hostile "
            "reply would still steer the model",
        )
    unprotected = clip_refusal(a.name, s.local_rule.name)  # clip_norm also clips SCAFFOLD's records
    if a.clip_norm is not None and unprotected:
        raise ConfigError("strategy.aggregator.clip_norm", a.clip_norm, f"{unprotected}; leave it null")
    need = {"krum": 2 * f + 3, "multikrum": 2 * f + 3, "bulyan": 4 * f + 3}
    if a.name in need and k < need[a.name]:
        rule = "4f + 3" if a.name == "bulyan" else "2f + 3"
        raise ConfigError(
            "strategy.sampler.clients_per_round",
            k,
            f"aggregator {a.name} with krum.num_malicious={f} needs at least {rule} = {need[a.name]} replies",
        )
    if a.name == "multikrum" and selected is not None and selected > k - f:
        raise ConfigError(
            "strategy.aggregator.krum.num_selected",
            selected,
            f"must be <= clients_per_round - krum.num_malicious = {k - f}",
        )
    if a.name == "trimmed-mean" and int(a.trimmed_mean.beta * k) == 0:
        log(
            WARNING,
            "trimmed-mean with trimmed_mean.beta=%s trims nothing from %d replies: it is the plain mean",
            a.trimmed_mean.beta,
            k,
        )
    if a.name in ("multikrum", "bulyan") and f == 0 and selected is None:
        log(WARNING, "%s with num_malicious=0 keeps every reply: it is the plain mean", a.name)


def check_parts(cfg: ScenarioConfig) -> None:
    """Refuse names no registry has and combinations that cannot work (:func:`load_checked`
    runs it right after loading a scenario; run it on a scenario built in code).

    Raises
    ------
    ConfigError
        Naming the key, the value and what is available.
    """
    s = cfg.strategy
    for key, name, registry in (
        ("strategy.sampler.name", s.sampler.name, SAMPLERS),
        ("strategy.aggregator.name", s.aggregator.name, AGGREGATORS),
        ("strategy.initializer.name", s.initializer.name, INITIALIZERS),
        ("strategy.local_rule.name", s.local_rule.name, SERVER_RULES),
    ):
        if name not in registry:
            raise ConfigError(key, name, "must be one of " + ", ".join(registry))
    if s.aggregator.aware.enabled and s.aggregator.name not in AWARE_BASES:
        raise ConfigError(
            "strategy.aggregator.aware.enabled",
            True,
            f"the AWARE plug-in wraps {', '.join(AWARE_BASES)}, not {s.aggregator.name}"
            + (" (fedaware is AWARE already)" if s.aggregator.name == "fedaware" else ""),
        )
    _check_herding(cfg)
    _check_robust(cfg)
