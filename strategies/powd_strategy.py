"""Power-of-Choice as a Flower strategy: :class:`PowerOfChoice`, FedAvg with the
Power-of-Choice sampler (:mod:`strategies.powd`).
"""

from __future__ import annotations

from fedflex.strategies.flower_strategy import SamplerMethod
from fedflex.strategies.powd import PowDSampler


class PowerOfChoice(SamplerMethod):
    """Power-of-Choice (Cho et al., 2020, https://arxiv.org/abs/2010.01243), the rest of
    the round FedAvg's.

    Asks ``d`` online candidates for their loss on the global model and trains the K with
    the highest. Clients: fedflex's ClientApp answers a loss QUERY; any other ClientApp is
    sent an EVALUATE message and its ``eval-loss`` (or Flower's ``eval_loss``) metric is read.

    Parameters
    ----------
    options : PowDOptions, optional
        The method's options (``strategy.sampler.powd``): ``d``, the candidates per round
        (0: every online client). None: the defaults.
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

    Examples
    --------
    >>> strategy = PowerOfChoice(clients_per_round=2, options=PowDOptions(d=4))
    """

    SAMPLER = PowDSampler
