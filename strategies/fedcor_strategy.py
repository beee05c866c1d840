"""FedCor as a Flower strategy: :class:`FedCor`, FedAvg with the FedCor sampler
(:mod:`strategies.fedcor`).
"""

from __future__ import annotations

from fedflex.strategies.fedcor import FedCorSampler
from fedflex.strategies.flower_strategy import SamplerMethod


class FedCor(SamplerMethod):
    """FedCor (Tang et al., 2022, https://arxiv.org/abs/2103.13822): a Gaussian process
    over the clients' loss changes picks who trains, the rest of the round FedAvg's.
    Clients: loss reports as for :class:`~strategies.powd_strategy.PowerOfChoice`.

    Parameters
    ----------
    options : FedCorOptions, optional
        The method's options (``strategy.sampler.fedcor``): ``warmup``, ``refresh``,
        ``rank``, ``history``, ``discount``. None: the defaults.
    explore_first : bool, default False
        Online clients that never trained are drawn first (``strategy.sampler.explore_first``).
    num_clients : int, optional
        N; None: the nodes connected when the run starts.
    rounds : int, optional
        The run's round count under a loop that does not say it (unused by this method).
    seed : int, default 0
        Seeds the sampler (as a scenario's ``seed``).
    lr : float, optional
        The clients' learning rate (unused by this method's server half).
    **kwargs
        Flower's FedAvg options and FedFlex's (``clients_per_round``, ``availability``,
        ...): see :class:`~strategies.flower_strategy.FlowerStrategy`.
    """

    SAMPLER = FedCorSampler
