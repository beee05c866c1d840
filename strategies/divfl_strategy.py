"""DivFL as a Flower strategy: :class:`DivFL`, FedAvg with the DivFL sampler
(:mod:`strategies.divfl`).
"""

from __future__ import annotations

from typing import Any, Optional

from fedflex.config import SamplerConfig
from fedflex.options import DivFLOptions
from fedflex.strategies.divfl import DivFLSampler
from fedflex.strategies.flower_strategy import Federation, FlowerStrategy, check_bool
from fedflex.strategies.parts import Sampler


class DivFL(FlowerStrategy):
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

    OPTIONS = {DivFLOptions: "strategy.sampler.divfl"}

    def __init__(
        self,
        *,
        options: Optional[DivFLOptions] = None,
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
        """Return the DivFL sampler (behind the explore-first draw when asked)."""
        sampler = DivFLSampler(seed=federation.seed_of("divfl"), options=self.option(DivFLOptions))
        return self.with_explore_first(sampler, federation, self.explore_first)
