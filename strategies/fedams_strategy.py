"""FedAMS as a Flower strategy: :class:`FedAMS`, FedAvg's round with the FedAMS server
optimiser (:mod:`strategies.optimizers`).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

from fedflex.config import AggregatorConfig
from fedflex.options import AdaptiveOptions, FedAMSOptions
from fedflex.strategies.flower_strategy import Federation, FlowerStrategy, check_aggregation
from fedflex.strategies.optimizers import FedAMSAggregator
from fedflex.strategies.parts import Aggregator


class FedAMS(FlowerStrategy):
    """FedAMS (Wang et al., 2022, https://arxiv.org/abs/2205.02719): AMSGrad on the
    server, on FedAvg's pseudo-gradient; the rest of the round FedAvg's. Clients: any.

    Parameters
    ----------
    options : AdaptiveOptions or FedAMSOptions or list, optional
        The server optimiser's :class:`~fedflex.options.AdaptiveOptions` (``beta1``,
        ``beta2``, ``tau``; ``strategy.aggregator.adaptive``) and FedAMS's
        :class:`~fedflex.options.FedAMSOptions` (``epsilon_at``;
        ``strategy.aggregator.fedams``): one object or a list of both. None: the defaults.
    server_lr : float, default 1.0
        eta of the server step (``strategy.aggregator.server_lr``).
    weighted : bool, default True
        The mean weighs the replies by their example counts (``strategy.aggregator.weighted``).
    num_clients : int, optional
        N; None: the nodes connected when the run starts.
    rounds : int, optional
        The run's round count under a loop that does not say it (unused by this method).
    seed : int, default 0
        Seeds the uniform sampler (as a scenario's ``seed``).
    lr : float, optional
        The clients' learning rate (unused by this method's server half).
    **kwargs
        Flower's FedAvg options and FedFlex's (``clients_per_round``, ``availability``,
        ...): see :class:`~strategies.flower_strategy.FlowerStrategy`.

    Examples
    --------
    >>> strategy = FedAMS(server_lr=0.1, options=[AdaptiveOptions(beta1=0.5), FedAMSOptions("denominator")])
    """

    OPTIONS = {AdaptiveOptions: "strategy.aggregator.adaptive", FedAMSOptions: "strategy.aggregator.fedams"}

    def __init__(
        self,
        *,
        options: Union[AdaptiveOptions, FedAMSOptions, Sequence[Union[AdaptiveOptions, FedAMSOptions]], None] = None,
        server_lr: float = AggregatorConfig.server_lr,
        weighted: bool = AggregatorConfig.weighted,
        num_clients: Optional[int] = None,
        rounds: Optional[int] = None,
        seed: int = 0,
        lr: Optional[float] = None,
        **kwargs: Any,
    ) -> None:
        check_aggregation(server_lr, weighted)
        self.server_lr, self.weighted = server_lr, weighted
        super().__init__(options=options, num_clients=num_clients, rounds=rounds, seed=seed, lr=lr, **kwargs)

    def build_aggregator(self, federation: Federation) -> Aggregator:
        """Return the FedAMS server optimiser."""
        options = AggregatorConfig(
            name="fedams",
            server_lr=self.server_lr,
            weighted=self.weighted,
            adaptive=self.option(AdaptiveOptions),
            fedams=self.option(FedAMSOptions),
        )
        return FedAMSAggregator.build(options, federation)
