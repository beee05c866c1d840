"""DivFL as a Flower strategy: :class:`DivFL`, FedAvg with the DivFL sampler
(:mod:`strategies.divfl`).
"""

from __future__ import annotations

from fedflex.strategies.divfl import DivFLSampler
from fedflex.strategies.flower_strategy import SamplerMethod


class DivFL(SamplerMethod):
    """DivFL (Balakrishnan et al., 2022, https://openreview.net/forum?id=nwKXyFvaUm):
    greedy facility location over the clients' update proxies, the rest of the round
    FedAvg's. Clients: any (``proxies="ideal"`` sends extra TRAIN messages every round).

    Parameters
    ----------
    options : DivFLOptions, optional
        The method's options (``strategy.sampler.divfl``): ``proxies`` (``stale`` or
        ``ideal``), ``probe_steps``. None: the defaults.
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

    SAMPLER = DivFLSampler
