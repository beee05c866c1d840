"""SCAFFOLD as a Flower strategy: :class:`SCAFFOLD`, the server half of SCAFFOLD
(:mod:`strategies.scaffold`) in FedAvg's round.
"""

from __future__ import annotations

from typing import Any, Optional

from fedflex.config import LocalRuleConfig
from fedflex.strategies.flower_strategy import Federation, FlowerStrategy
from fedflex.strategies.parts import ServerRule
from fedflex.strategies.scaffold import ScaffoldServer


class SCAFFOLD(FlowerStrategy):
    """SCAFFOLD (Karimireddy et al., 2020, https://arxiv.org/abs/1910.06378), the server
    half: the server control variate c, sent with every train message and moved by the
    clients' variate changes.

    Clients: must send ``scaffold-dc`` (fedflex's ClientApp with local rule scaffold, or
    :class:`fedflex.clients.helpers.SCAFFOLDClient`); a plain reply is rejected in one line.

    Parameters
    ----------
    num_clients : int, optional
        N (c moves by each change / N); None: the nodes connected when the run starts.
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

    LOCAL_RULE = "scaffold"

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
        """Return SCAFFOLD's server half."""
        return ScaffoldServer(federation.num_clients, reset_on_switch=False, options=LocalRuleConfig(name="scaffold"))
