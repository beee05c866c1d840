"""fedflex server side: the FedFlex strategy, its parts, the ServerApp, and the named
Flower strategies (one module per method, gathered in :mod:`strategies.named`),
importable from here: ``from fedflex.strategies import HiCSFL``.
"""

from fedflex.strategies.bherd_strategy import BHerd
from fedflex.strategies.clustered_strategy import ClusteredSampling
from fedflex.strategies.divfl_strategy import DivFL
from fedflex.strategies.fedams_strategy import FedAMS
from fedflex.strategies.fedaware_strategy import AWARE, FedAWARE
from fedflex.strategies.fedcm_strategy import FedCM
from fedflex.strategies.fedcor_strategy import FedCor
from fedflex.strategies.feddyn_strategy import FedDyn
from fedflex.strategies.fednova_strategy import FedNova
from fedflex.strategies.flower_strategy import FlowerStrategy, SamplerStrategy
from fedflex.strategies.hics_strategy import HiCSFL
from fedflex.strategies.powd_strategy import PowerOfChoice
from fedflex.strategies.scaffold_strategy import SCAFFOLD
from fedflex.strategies.session_init_strategy import SessionAware
from fedflex.strategies.strategy import FedFlex

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
    "SamplerStrategy",
    "SessionAware",
]
