"""fedflex's methods as Flower strategies that drop into any Flower ServerApp.

Each is a :class:`~strategies.flower_strategy.FlowerStrategy` (so a Flower
:class:`~flwr.serverapp.strategy.FedAvg`) whose parts are one published method, in its
own module beside the method's part (``hics_strategy.py`` beside ``hics.py``); this
module only gathers them. In a Flower app the strategy line is the only change::

    strategy = HiCSFL(fraction_train=0.5)  # was: FedAvg(fraction_train=0.5)

See ``docs/flower-strategies.md``.
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

#: every named strategy, by class name
NAMED: dict[str, type[FlowerStrategy]] = {
    "HiCSFL": HiCSFL,
    "PowerOfChoice": PowerOfChoice,
    "ClusteredSampling": ClusteredSampling,
    "DivFL": DivFL,
    "FedCor": FedCor,
    "FedAWARE": FedAWARE,
    "FedAMS": FedAMS,
    "AWARE": AWARE,
    "BHerd": BHerd,
    "SCAFFOLD": SCAFFOLD,
    "FedNova": FedNova,
    "FedDyn": FedDyn,
    "FedCM": FedCM,
    "SessionAware": SessionAware,
}

__all__ = ["NAMED", "FlowerStrategy", "SamplerStrategy", *NAMED]
