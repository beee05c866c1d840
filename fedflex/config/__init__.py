"""Scenario configuration: the dataclass schema of a scenario.

A scenario is one YAML file (see ``scenarios/``) merged over the defaults below, then
over command-line overrides in OmegaConf dotlist form (``client.lr=0.05``), by
:func:`fedflex.loader.load_scenario`. Each method's own options are declared in
:mod:`fedflex.options` and nested here under their part (``strategy.sampler.hics``).
Unknown keys, wrong types and out-of-range values raise :class:`ConfigError`, whose
message names the dotted key, the value and what is allowed. Nothing here knows a
strategy or a client: the parts are named by strings that the runner resolves.

One module per section: :mod:`~fedflex.config.data` (``dataset``, ``partition``),
:mod:`~fedflex.config.model`, :mod:`~fedflex.config.client`, :mod:`~fedflex.config.strategy`,
:mod:`~fedflex.config.churn`, :mod:`~fedflex.config.run` (``evaluation``, ``simulation``,
``system``, ``deployment``, ``output``) and :mod:`~fedflex.config.scenario`, which holds
the whole scenario and the rules between its sections. Every name is importable from
here. Behaviour lives outside the schema: the client learning-rate schedule is
:func:`fedflex.lr_schedule.client_lr`.
"""

from fedflex.checks import ConfigError
from fedflex.config.churn import CHURN_KINDS, ChurnConfig
from fedflex.config.client import LR_SCHEDULES, LR_SHAPES, ClientConfig
from fedflex.config.data import (
    DATASETS,
    LABEL_MAPS,
    LABEL_SET_PATTERNS,
    PARTITIONS,
    SIDES,
    TOKEN_UNITS,
    TOKENIZERS,
    DatasetConfig,
    PartitionConfig,
)
from fedflex.config.model import LOSSES, MODELS, TEXT_MODELS, ModelConfig
from fedflex.config.run import (
    TRACKERS,
    DeploymentConfig,
    EvaluationConfig,
    OutputConfig,
    SimulationConfig,
    SystemConfig,
)
from fedflex.config.scenario import ScenarioConfig
from fedflex.config.strategy import (
    AggregatorConfig,
    InitializerConfig,
    LocalRuleConfig,
    ReplyConfig,
    SamplerConfig,
    StrategyConfig,
)

__all__ = [
    "ConfigError",
    "DATASETS",
    "DatasetConfig",
    "LABEL_MAPS",
    "LABEL_SET_PATTERNS",
    "PARTITIONS",
    "PartitionConfig",
    "SIDES",
    "TOKENIZERS",
    "TOKEN_UNITS",
    "LOSSES",
    "MODELS",
    "ModelConfig",
    "TEXT_MODELS",
    "ClientConfig",
    "LR_SCHEDULES",
    "LR_SHAPES",
    "AggregatorConfig",
    "InitializerConfig",
    "LocalRuleConfig",
    "ReplyConfig",
    "SamplerConfig",
    "StrategyConfig",
    "CHURN_KINDS",
    "ChurnConfig",
    "DeploymentConfig",
    "EvaluationConfig",
    "OutputConfig",
    "SimulationConfig",
    "SystemConfig",
    "TRACKERS",
    "ScenarioConfig",
]
