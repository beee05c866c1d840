"""fedflex server side: the FedFlex strategy, its parts, the ServerApp, and the named
Flower strategies (:mod:`strategies.named`), importable from here:
``from fedflex.strategies import HiCSFL``.
"""

from fedflex.strategies.fedflex import FedFlex
from fedflex.strategies.named import (
    AWARE,
    SCAFFOLD,
    BHerd,
    ClusteredSampling,
    DivFL,
    FedAMS,
    FedAWARE,
    FedCM,
    FedCor,
    FedDyn,
    FedNova,
    FlowerStrategy,
    HiCSFL,
    PowerOfChoice,
    SessionAware,
)

__all__ = [
    "AWARE",
    "SCAFFOLD",
    "BHerd",
    "ClusteredSampling",
    "DivFL",
    "FedAMS",
    "FedAWARE",
    "FedCM",
    "FedCor",
    "FedDyn",
    "FedFlex",
    "FedNova",
    "FlowerStrategy",
    "HiCSFL",
    "PowerOfChoice",
    "SessionAware",
]
