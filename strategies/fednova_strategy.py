"""FedNova as a Flower strategy: :class:`FedNova`, the server half of FedNova
(:mod:`strategies.fednova`) in FedAvg's round.
"""

from __future__ import annotations

from typing import Any, Optional

from fedflex.config import AggregatorConfig, LocalRuleConfig
from fedflex.strategies.fednova import FedNovaServer
from fedflex.strategies.flower_strategy import Federation, FlowerStrategy
from fedflex.strategies.parts import ServerRule


class FedNova(FlowerStrategy):
    """FedNova (Wang et al., 2020, https://arxiv.org/abs/2007.07481), the server half:
    normalised averaging of the clients' updates by their local step counts.

    Clients: must send ``fednova-d`` and ``fednova-a-norm`` (fedflex's ClientApp with
    local rule fednova, :class:`fedflex.clients.helpers.FedNovaClient` or
    :func:`fedflex.clients.helpers.fednova_mod`); a plain reply is rejected in one line.

    Parameters
    ----------
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
    """

    LOCAL_RULE = "fednova"

    def __init__(
        self,
        *,
        num_clients: Optional[int] = None,
        rounds: Optional[int] = None,
        seed: int = 0,
        lr: Optional[float] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_clients=num_clients, rounds=rounds, seed=seed, lr=lr, **kwargs)

    def build_server_rule(self, federation: Federation) -> ServerRule:
        """Return FedNova's server half (weighted as the FedAvg aggregator)."""
        return FedNovaServer(weighted=AggregatorConfig.weighted, options=LocalRuleConfig(name="fednova"))
