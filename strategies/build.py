"""Build a :class:`~strategies.strategy.FedFlex` strategy from a scenario's config.

The registries :data:`SAMPLERS`, :data:`AGGREGATORS`, :data:`INITIALIZERS` and
:data:`SERVER_RULES` are the one place that names the server's parts: each maps the
value of ``strategy.<part>.name`` to the part (the core config lists no names).
:data:`SAMPLERS` holds sampler classes, each its own spec (name, options class and
section, seed offset, DP note, :meth:`~strategies.parts.Sampler.build`): the seed
offsets, the options sections a scenario may hold (:func:`extra_sections`) and the named
strategy :class:`~strategies.flower_strategy.SamplerStrategy` are derived from it.
:data:`AGGREGATORS` and :data:`INITIALIZERS` hold classes as well (each builds itself
from its ``strategy.<part>`` section); :data:`SERVER_RULES` maps a name to a
constructor. A method is a choice of one name per part; a new part is its module plus
one line here (a local rule's client half has its line in ``clients/rules.py``
``LOCAL_RULES``). Names no registry has and combinations that cannot work together are
refused by :mod:`strategies.combinations`, once per load.
"""

from __future__ import annotations

import functools
from dataclasses import fields
from typing import Callable, Mapping, Optional, TypeVar, cast

from fedflex.churn import Availability, SessionTracker
from fedflex.config import SamplerConfig, ScenarioConfig
from fedflex.loader import SECTION_SOURCES
from fedflex.lr_schedule import client_lr
from fedflex.strategies.baseline import ExploreFirstSampler, FedAvgAggregator, PreviousInitializer, UniformSampler
from fedflex.strategies.bherd import BHerdAggregator
from fedflex.strategies.clustered import ClusteredSampler
from fedflex.strategies.divfl import DivFLSampler
from fedflex.strategies.fedaware import AwarePlugin, FedAwareAggregator
from fedflex.strategies.fedcm import FedCMServer
from fedflex.strategies.fedcor import FedCorSampler
from fedflex.strategies.feddyn import FedDynServer
from fedflex.strategies.fednova import FedNovaServer
from fedflex.strategies.hics import HiCSSampler
from fedflex.strategies.optimizers import (
    FedAdagradAggregator,
    FedAdamAggregator,
    FedAMSAggregator,
    FedAvgMAggregator,
    FedYogiAggregator,
)
from fedflex.strategies.parts import (
    PART_SEED_OFFSETS,
    Aggregator,
    Federation,
    Initializer,
    ModelInfo,
    Part,
    Sampler,
    ServerRule,
)
from fedflex.strategies.powd import PowDSampler
from fedflex.strategies.replies import MB, ReplyLimits
from fedflex.strategies.robust import (
    BulyanAggregator,
    KrumAggregator,
    MedianAggregator,
    MultiKrumAggregator,
    TrimmedMeanAggregator,
)
from fedflex.strategies.scaffold import ScaffoldServer
from fedflex.strategies.session_init import AverageInitializer, SessionAwareInitializer
from fedflex.strategies.strategy import FedFlex


def _reset(cfg: ScenarioConfig) -> bool:
    return cfg.strategy.aggregator.on_model_switch == "reset"


P = TypeVar("P", bound=Part)


def registry(*classes: type[P]) -> dict[str, type[P]]:
    """Return the classes by their names (``strategy.<part>.name`` values)."""
    return {cls.name: cls for cls in classes}


SAMPLERS: dict[str, type[Sampler]] = registry(
    UniformSampler, HiCSSampler, PowDSampler, ClusteredSampler, DivFLSampler, FedCorSampler
)

#: each part's random generator is seeded with the scenario's seed plus its offset (kept as
#: the first release had them: a common SeedSequence would change every run's draws): the
#: samplers' own (``SEED_OFFSET``), and those of the parts no registry holds as a class
SEED_OFFSETS = {**{name: cls.seed_offset() for name, cls in SAMPLERS.items()}, **PART_SEED_OFFSETS}


def seed(cfg: ScenarioConfig, part: str) -> int:
    """Return the seed of part ``part``'s generator."""
    return cfg.seed + SEED_OFFSETS[part]


def federation(cfg: ScenarioConfig, model: ModelInfo) -> Federation:
    """Return what a scenario's parts are built for (:meth:`Sampler.build`)."""
    return Federation(
        num_clients=cfg.num_clients,
        rounds=cfg.rounds,
        clients_per_round=cast(int, cfg.strategy.sampler.clients_per_round),  # filled by validate
        seed=cfg.seed,
        lr=cfg.client.lr,
        model=model,
        local_rule=cfg.strategy.local_rule,
        momentum=cfg.client.momentum,
    )


def extra_sections() -> dict[str, type]:
    """Return the options sections of registered samplers that ``strategy.sampler`` does not
    declare (a sampler added by its module and its registry line): section -> options class.
    The scenario loader reads them (:data:`fedflex.loader.SECTION_SOURCES`).
    """
    declared = {f.name for f in fields(SamplerConfig)}
    return {
        cls.section(): cls.OPTIONS
        for cls in SAMPLERS.values()
        if cls.OPTIONS is not None and cls.section() not in declared
    }


SECTION_SOURCES.append(extra_sections)


AGGREGATORS: dict[str, type[Aggregator]] = registry(
    FedAvgAggregator,
    FedAvgMAggregator,
    FedAdamAggregator,
    FedYogiAggregator,
    FedAdagradAggregator,
    FedAMSAggregator,
    FedAwareAggregator,  # `strategy.aggregator.aware.enabled` wraps the others in the AWARE plug-in
    BHerdAggregator,
    # Byzantine-robust (strategies/robust.py: Flower's FedMedian, FedTrimmedAvg, Krum, MultiKrum, Bulyan)
    MedianAggregator,
    TrimmedMeanAggregator,
    KrumAggregator,
    MultiKrumAggregator,
    BulyanAggregator,
)
INITIALIZERS: dict[str, type[Initializer]] = registry(PreviousInitializer, AverageInitializer, SessionAwareInitializer)


def _aggregator(cfg: ScenarioConfig, model: ModelInfo) -> Aggregator:
    a = cfg.strategy.aggregator
    base = AGGREGATORS[a.name].build(a, federation(cfg, model))
    if a.aware.enabled:  # the AWARE plug-in around a server optimiser
        return AwarePlugin(base, cfg.num_clients, a.aware, reset_on_switch=_reset(cfg))
    return base


def _scaffold(cfg: ScenarioConfig) -> ScaffoldServer:
    return ScaffoldServer(cfg.num_clients, reset_on_switch=_reset(cfg), options=cfg.strategy.local_rule)


#: server halves of local rules: each sends its rule's options with the train messages
SERVER_RULES: dict[str, Callable[[ScenarioConfig, ModelInfo], ServerRule]] = {
    "sgd": lambda cfg, model: ServerRule(cfg.strategy.local_rule),
    "fedprox": lambda cfg, model: ServerRule(cfg.strategy.local_rule),
    "scaffold": lambda cfg, model: _scaffold(cfg),
    "fednova": lambda cfg, model: FedNovaServer(
        weighted=cfg.strategy.aggregator.weighted, options=cfg.strategy.local_rule
    ),
    "bherd": lambda cfg, model: (
        _scaffold(cfg) if cfg.strategy.local_rule.bherd.base == "scaffold" else ServerRule(cfg.strategy.local_rule)
    ),
    "grab": lambda cfg, model: ServerRule(cfg.strategy.local_rule),
    "feddyn": lambda cfg, model: FedDynServer(
        cfg.num_clients, reset_on_switch=_reset(cfg), options=cfg.strategy.local_rule
    ),
    "fedcm": lambda cfg, model: FedCMServer(
        cfg.client.lr, reset_on_switch=_reset(cfg), options=cfg.strategy.local_rule
    ),
}


def _sampler(cfg: ScenarioConfig, model: ModelInfo) -> Sampler:
    cls = SAMPLERS[cfg.strategy.sampler.name]
    options = getattr(cfg.strategy.sampler, cls.section(), None) if cls.OPTIONS is not None else None
    base = cls.build(options, federation(cfg, model))
    if cfg.strategy.sampler.explore_first:
        return ExploreFirstSampler(base, seed=seed(cfg, "explore-first"))
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
    """Return the four parts a scenario names (a scenario checked by
    :func:`strategies.combinations.check_parts`, which :func:`~strategies.combinations.load_checked`
    runs once per load); each factory gets the scenario and the model's description.
    """
    model = model_info or ModelInfo()
    s = cfg.strategy
    return (
        _sampler(cfg, model),
        _aggregator(cfg, model),
        INITIALIZERS[s.initializer.name].build(s.initializer, federation(cfg, model)),
        SERVER_RULES[s.local_rule.name](cfg, model),
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
        client_lr=None if cfg.client.lr_schedule == "constant" else functools.partial(client_lr, cfg.client),
        lr=cfg.client.lr,
        model=model_info,
        reply_limits=reply_limits(cfg, client_sizes),
        clip_norm=s.aggregator.clip_norm,
        identify="partition-id",  # fedflex's ClientApp says its partition id
    )
