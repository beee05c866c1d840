"""Build a :class:`~strategies.fedflex.FedFlex` strategy from a scenario's config.

The registries map the names of ``fedflex.config`` (``strategy.sampler.name`` and so on)
to part constructors; a method is a choice of one name per part. :func:`check_parts`
refuses, at config load, names this version does not provide and combinations that
cannot work together.
"""

from __future__ import annotations

from dataclasses import dataclass
from logging import WARNING
from typing import Callable, Mapping, Optional, cast

from flwr.common import log

from fedflex.churn import Availability, SessionTracker
from fedflex.config import ROBUST_AGGREGATORS, ConfigError, ScenarioConfig
from fedflex.strategies.basic import ExploreFirstSampler, FedAvgAggregator, PreviousInitializer, UniformSampler
from fedflex.strategies.bherd import BHerdAggregator
from fedflex.strategies.clustered import ClusteredSampler
from fedflex.strategies.divfl import DivFLSampler
from fedflex.strategies.fedaware import AWARE_BASES, make_fedaware, with_aware
from fedflex.strategies.fedcm import FedCMServer
from fedflex.strategies.fedcor import FedCorSampler
from fedflex.strategies.feddyn import FedDynServer
from fedflex.strategies.fedflex import FedFlex
from fedflex.strategies.fednova import FedNovaServer
from fedflex.strategies.hics import hics_from_config
from fedflex.strategies.optimizers import FedAdagrad, FedAdam, FedAMS, FedAvgM, FedYogi
from fedflex.strategies.parts import Aggregator, Initializer, Sampler, ServerRule
from fedflex.strategies.powd import PowDSampler
from fedflex.strategies.replies import MB, ReplyLimits
from fedflex.strategies.robust import BulyanAggregator, KrumAggregator, MedianAggregator, TrimmedMeanAggregator
from fedflex.strategies.scaffold import ScaffoldServer
from fedflex.strategies.session_init import AverageInitializer, SessionAwareInitializer


@dataclass(frozen=True)
class ModelInfo:
    """What parts may need to know about the model (the server builds it)."""

    output_bias_key: Optional[str] = None  # state-dict key of the classification layer's bias
    num_classes: int = 0
    input_shape: tuple[int, ...] = ()


def _reset(cfg: ScenarioConfig) -> bool:
    return cfg.strategy.aggregator.on_model_switch == "reset"


def _opt_kwargs(cfg: ScenarioConfig) -> dict:
    a = cfg.strategy.aggregator
    return {"server_lr": a.server_lr, "weighted": a.weighted, "reset_on_switch": _reset(cfg)}


def _adaptive(cls):
    def make(cfg: ScenarioConfig):
        a = cfg.strategy.aggregator
        return cls(beta1=a.beta1, beta2=a.beta2, tau=a.tau, **_opt_kwargs(cfg))

    return make


#: the model of the strategy being built (see :func:`build_strategy`)
MODEL_INFO = ModelInfo()

SAMPLERS: dict[str, Callable[[ScenarioConfig], Sampler]] = {
    "uniform": lambda cfg: UniformSampler(seed=cfg.seed + 1, weighted=cfg.strategy.sampler.weighted),
    "hics": lambda cfg: hics_from_config(cfg, MODEL_INFO.output_bias_key),
    "pow-d": lambda cfg: PowDSampler(
        seed=cfg.seed + 12, d=cfg.strategy.sampler.d, clients_per_round=cfg.strategy.sampler.clients_per_round
    ),
    "clustered": lambda cfg: ClusteredSampler(seed=cfg.seed + 13, ward=cfg.strategy.sampler.ward),
    "divfl": lambda cfg: DivFLSampler(
        seed=cfg.seed + 15,
        proxies=cfg.strategy.sampler.divfl_proxies,
        probe_steps=cfg.strategy.sampler.divfl_probe_steps,
    ),
    "fedcor": lambda cfg: FedCorSampler(
        seed=cfg.seed + 16,
        warmup=cfg.strategy.sampler.fedcor_warmup,
        refresh=cfg.strategy.sampler.fedcor_refresh,
        rank=cfg.strategy.sampler.fedcor_rank,
        history=cfg.strategy.sampler.fedcor_history,
        discount=cfg.strategy.sampler.fedcor_discount,
    ),
}

AGGREGATORS: dict[str, Callable[[ScenarioConfig], Aggregator]] = {
    # with_aware: `strategy.aggregator.aware: true` wraps the base in the AWARE plug-in
    "fedavg": with_aware(
        lambda cfg: FedAvgAggregator(
            weighted=cfg.strategy.aggregator.weighted, server_lr=cfg.strategy.aggregator.server_lr
        )
    ),
    "fedavgm": with_aware(lambda cfg: FedAvgM(momentum=cfg.strategy.aggregator.server_momentum, **_opt_kwargs(cfg))),
    "fedadam": with_aware(_adaptive(FedAdam)),
    "fedyogi": with_aware(_adaptive(FedYogi)),
    "fedadagrad": with_aware(_adaptive(FedAdagrad)),
    "fedams": with_aware(
        lambda cfg: FedAMS(
            beta1=cfg.strategy.aggregator.beta1,
            beta2=cfg.strategy.aggregator.beta2,
            tau=cfg.strategy.aggregator.tau,
            epsilon_at=cfg.strategy.aggregator.ams_epsilon_at,
            **_opt_kwargs(cfg),
        )
    ),
    "fedaware": make_fedaware,
    "bherd": lambda cfg: _bherd_aggregator(cfg),
    # Byzantine-robust (strategies/robust.py: Flower's FedMedian, FedTrimmedAvg, Krum, MultiKrum, Bulyan)
    "median": lambda cfg: MedianAggregator(server_lr=cfg.strategy.aggregator.server_lr),
    "trimmed-mean": lambda cfg: TrimmedMeanAggregator(
        cfg.strategy.aggregator.trim_beta, server_lr=cfg.strategy.aggregator.server_lr
    ),
    "krum": lambda cfg: KrumAggregator(
        cfg.strategy.aggregator.num_malicious, select=1, server_lr=cfg.strategy.aggregator.server_lr
    ),
    "multikrum": lambda cfg: KrumAggregator(
        cfg.strategy.aggregator.num_malicious,
        select=cfg.strategy.aggregator.num_krum_selected,
        weighted=cfg.strategy.aggregator.weighted,
        server_lr=cfg.strategy.aggregator.server_lr,
    ),
    "bulyan": lambda cfg: BulyanAggregator(
        cfg.strategy.aggregator.num_malicious, server_lr=cfg.strategy.aggregator.server_lr
    ),
}

INITIALIZERS: dict[str, Callable[[ScenarioConfig], Initializer]] = {
    "previous": lambda cfg: PreviousInitializer(),
    "average": lambda cfg: AverageInitializer(),
    "session-aware": lambda cfg: SessionAwareInitializer(
        pilot_sessions=cfg.strategy.initializer.pilot_sessions,
        gradient_rounds=cfg.strategy.initializer.gradient_rounds,
        similarity_scale=cfg.strategy.initializer.similarity_scale,
        distance=cfg.strategy.initializer.distance,
        clients_per_round=cast(int, cfg.strategy.sampler.clients_per_round),  # filled by validate
        seed=cfg.seed + 3,
    ),
}


def _bherd_aggregator(cfg: ScenarioConfig) -> BHerdAggregator:
    """BHerd's step with the divisor of the local rule: configured alpha (bherd),
    reported alpha_t (grab) or FedNova's tau_eff / k_i (bherd on fednova).
    """
    r, a = cfg.strategy.local_rule, cfg.strategy.aggregator
    divisor = "reported" if r.name == "grab" else ("fednova" if r.bherd_base == "fednova" else "alpha")
    if cfg.client.momentum > 0:
        log(
            WARNING,
            "bherd: client.momentum=%s: the server steps with the raw mini-batch gradients, "
            "not the momentum steps the clients took (alpha=1 is then not FedAvg)",
            cfg.client.momentum,
        )
    if r.name == "bherd" and r.bherd_alpha == 1.0:
        log(
            WARNING,
            "bherd with bherd_alpha=1 uploads every gradient: it is %s",
            {"fedavg": "FedAvg", "fednova": "FedNova", "scaffold": "SCAFFOLD"}[r.bherd_base],
        )
    return BHerdAggregator(
        lr=cfg.client.lr, alpha=r.bherd_alpha, divisor=divisor, weighted=a.weighted, server_lr=a.server_lr
    )


def _scaffold(cfg: ScenarioConfig) -> ScaffoldServer:
    return ScaffoldServer(cfg.num_clients, reset_on_switch=_reset(cfg), options=cfg.strategy.local_rule)


#: server halves of local rules: each sends its rule's options with the train messages
SERVER_RULES: dict[str, Callable[[ScenarioConfig], ServerRule]] = {
    "sgd": lambda cfg: ServerRule(cfg.strategy.local_rule),
    "fedprox": lambda cfg: ServerRule(cfg.strategy.local_rule),
    "scaffold": _scaffold,
    "fednova": lambda cfg: FedNovaServer(weighted=cfg.strategy.aggregator.weighted, options=cfg.strategy.local_rule),
    "bherd": lambda cfg: (
        _scaffold(cfg) if cfg.strategy.local_rule.bherd_base == "scaffold" else ServerRule(cfg.strategy.local_rule)
    ),
    "grab": lambda cfg: ServerRule(cfg.strategy.local_rule),
    "feddyn": lambda cfg: FedDynServer(cfg.num_clients, reset_on_switch=_reset(cfg), options=cfg.strategy.local_rule),
    "fedcm": lambda cfg: FedCMServer(cfg.client.lr, reset_on_switch=_reset(cfg), options=cfg.strategy.local_rule),
}

#: local rules that upload a selected-gradient sum for aggregator ``bherd``
HERDING_RULES = ("bherd", "grab")


def _check_herding(cfg: ScenarioConfig) -> None:
    """BHerd / GraB / FedNova combinations that cannot work, and the binary SVM."""
    s, rule = cfg.strategy, cfg.strategy.local_rule
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
    if rule.name == "grab" and rule.bherd_base != "fedavg":
        raise ConfigError(
            "strategy.local_rule.bherd_base", rule.bherd_base, "local rule grab is GraB-FedAvg: only fedavg"
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
    if a.name in ROBUST_AGGREGATORS and s.local_rule.name not in ROBUST_RULES:
        raise ConfigError(
            "strategy.local_rule.name",
            s.local_rule.name,
            f"aggregator {a.name} takes local rule {' or '.join(ROBUST_RULES)}: the server half of "
            f"{s.local_rule.name} averages what every client sends outside the aggregator, so one hostile "
            "reply would still steer the model",
        )
    if a.clip_norm is not None and (a.name == "bherd" or s.local_rule.name == "fednova"):
        if a.name == "bherd":
            part = "aggregator bherd steps with the clients' gradient sums"
        else:
            part = "local rule fednova rebuilds every model from its fednova-d record"
        raise ConfigError("strategy.aggregator.clip_norm", a.clip_norm, f"{part}, not the clipped model; leave it null")
    need = {"krum": 2 * a.num_malicious + 3, "multikrum": 2 * a.num_malicious + 3, "bulyan": 4 * a.num_malicious + 3}
    if a.name in need and k < need[a.name]:
        rule = "4f + 3" if a.name == "bulyan" else "2f + 3"
        raise ConfigError(
            "strategy.sampler.clients_per_round",
            k,
            f"aggregator {a.name} with num_malicious={a.num_malicious} needs at least {rule} = {need[a.name]} replies",
        )
    if a.name == "multikrum" and a.num_krum_selected is not None and a.num_krum_selected > k - a.num_malicious:
        raise ConfigError(
            "strategy.aggregator.num_krum_selected",
            a.num_krum_selected,
            f"must be <= clients_per_round - num_malicious = {k - a.num_malicious}",
        )
    if a.name == "trimmed-mean" and int(a.trim_beta * k) == 0:
        log(
            WARNING,
            "trimmed-mean with trim_beta=%s trims nothing from %d replies: it is the plain mean",
            a.trim_beta,
            k,
        )
    if a.name in ("multikrum", "bulyan") and a.num_malicious == 0 and a.num_krum_selected is None:
        log(WARNING, "%s with num_malicious=0 keeps every reply: it is the plain mean", a.name)


def check_parts(cfg: ScenarioConfig) -> None:
    """Refuse names this version lacks and combinations that cannot work.

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
            raise ConfigError(key, name, "not available in this version; available: " + ", ".join(registry))
    if s.aggregator.aware and s.aggregator.name not in AWARE_BASES:
        raise ConfigError(
            "strategy.aggregator.aware",
            True,
            f"the AWARE plug-in wraps {', '.join(AWARE_BASES)}, not {s.aggregator.name}"
            + (" (fedaware is AWARE already)" if s.aggregator.name == "fedaware" else ""),
        )
    _check_herding(cfg)
    _check_robust(cfg)


def _sampler(cfg: ScenarioConfig) -> Sampler:
    base = SAMPLERS[cfg.strategy.sampler.name](cfg)
    if cfg.strategy.sampler.explore_first:
        return ExploreFirstSampler(base, seed=cfg.seed + 14)
    return base


def reply_limits(cfg: ScenarioConfig, client_sizes: Optional[Mapping[int, int]] = None) -> ReplyLimits:
    """Return the limits of ``strategy.replies``: ``num-examples`` bounded by ``client_sizes``
    (client id -> examples it holds) or by ``max_num_examples``; the local rule's own
    records are added by the strategy.
    """
    r = cfg.strategy.replies
    return ReplyLimits(
        sizes=dict(client_sizes or {}),
        cap=r.max_num_examples,
        max_bytes=None if r.max_reply_mb is None else int(r.max_reply_mb * MB),
    )


def build_parts(
    cfg: ScenarioConfig, model_info: Optional[ModelInfo] = None
) -> tuple[Sampler, Aggregator, Initializer, ServerRule]:
    """Return the four parts a scenario names (checked by :func:`check_parts` first).

    Factories take ``(cfg)``; parts that need the model's shape read
    :data:`MODEL_INFO`, set here before the factories run.
    """
    check_parts(cfg)
    global MODEL_INFO
    MODEL_INFO = model_info or ModelInfo()
    s = cfg.strategy
    return (
        _sampler(cfg),
        AGGREGATORS[s.aggregator.name](cfg),
        INITIALIZERS[s.initializer.name](cfg),
        SERVER_RULES[s.local_rule.name](cfg),
    )


def build_strategy(
    cfg: ScenarioConfig,
    availability: Optional[Availability],
    model_info: Optional[ModelInfo] = None,
    client_sizes: Optional[Mapping[int, int]] = None,
) -> FedFlex:
    """Return the strategy a scenario describes (its parts looked up by name,
    :func:`build_parts`). ``client_sizes``: client id -> the examples it holds (its
    partition), the bound of its ``num-examples``.
    """
    sampler, aggregator, initializer, server_rule = build_parts(cfg, model_info)
    s = cfg.strategy
    return FedFlex(
        sampler=sampler,
        aggregator=aggregator,
        initializer=initializer,
        server_rule=server_rule,
        num_clients=cfg.num_clients,
        clients_per_round=s.sampler.clients_per_round,
        min_clients=s.sampler.min_clients,
        availability=availability,
        tracker=SessionTracker(cast(int, cfg.churn.min_session_rounds), cast(float, cfg.churn.change_threshold)),
        on_too_few=cfg.churn.on_too_few,
        local_rule=s.local_rule.name,
        query_timeout=cfg.deployment.query_timeout,
        client_lr=None if cfg.client.lr_schedule == "constant" else cfg.client.lr_at,
        reply_limits=reply_limits(cfg, client_sizes),
        clip_norm=s.aggregator.clip_norm,
        identify="partition-id",  # fedflex's ClientApp says its partition id
    )
