"""Clustered Sampling as a Flower strategy: :class:`ClusteredSampling`, FedAvg with the
Clustered Sampling sampler (:mod:`strategies.clustered`).
"""

from __future__ import annotations

from fedflex.strategies.clustered import ClusteredSampler
from fedflex.strategies.flower_strategy import SamplerMethod


class ClusteredSampling(SamplerMethod):
    """Clustered Sampling (Fraboni et al., 2021, https://arxiv.org/abs/2105.05883) on the
    similarity of the clients' updates, the rest of the round FedAvg's. Clients: any.

    Parameters
    ----------
    options : ClusteredOptions, optional
        The method's options (``strategy.sampler.clustered``): ``ward`` (``exact`` or
        ``scalable``). None: the defaults.
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

    SAMPLER = ClusteredSampler
