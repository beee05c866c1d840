"""Power-of-Choice as a Flower strategy: :class:`PowerOfChoice`, FedAvg with the
Power-of-Choice sampler (:mod:`strategies.powd`).
"""

from __future__ import annotations

from typing import Any, Optional

from fedflex.config import SamplerConfig
from fedflex.options import PowDOptions
from fedflex.strategies.flower_strategy import Federation, FlowerStrategy, check_bool
from fedflex.strategies.parts import Sampler
from fedflex.strategies.powd import PowDSampler


class PowerOfChoice(FlowerStrategy):
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

    OPTIONS = {PowDOptions: "strategy.sampler.powd"}

    def __init__(
        self,
        *,
        options: Optional[PowDOptions] = None,
        explore_first: bool = SamplerConfig.explore_first,
        num_clients: Optional[int] = None,
        rounds: Optional[int] = None,
        seed: int = 0,
        lr: Optional[float] = None,
        **kwargs: Any,
    ) -> None:
        check_bool("strategy.sampler.explore_first", explore_first)
        self.explore_first = explore_first
        super().__init__(options=options, num_clients=num_clients, rounds=rounds, seed=seed, lr=lr, **kwargs)

    def build_sampler(self, federation: Federation) -> Sampler:
        """Return the Power-of-Choice sampler (behind the explore-first draw when asked)."""
        sampler = PowDSampler(
            seed=federation.seed_of("pow-d"),
            options=self.option(PowDOptions),
            clients_per_round=federation.clients_per_round,
        )
        return self.with_explore_first(sampler, federation, self.explore_first)
