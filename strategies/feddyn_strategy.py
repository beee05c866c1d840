"""FedDyn as a Flower strategy: :class:`FedDyn`, the server half of FedDyn
(:mod:`strategies.feddyn`) in FedAvg's round.
"""

from __future__ import annotations

from typing import Any, Optional

from fedflex.config import LocalRuleConfig
from fedflex.options import FedDynOptions
from fedflex.strategies.feddyn import FedDynServer
from fedflex.strategies.flower_strategy import Federation, FlowerStrategy
from fedflex.strategies.parts import ServerRule


class FedDyn(FlowerStrategy):
    """FedDyn (Acar et al., 2021, https://arxiv.org/abs/2111.04263), the server half: the
    state h and the shifted average ``mean - h / alpha``.

    Clients: the dynamic regulariser (fedflex's ClientApp with local rule feddyn, or
    :class:`fedflex.clients.helpers.FedDynClient`); a plain client's replies are taken,
    and the server half alone is FedAvg with h's correction.

    Parameters
    ----------
    options : FedDynOptions, optional
        The method's options (``strategy.local_rule.feddyn``, sent to the clients with
        every train message): ``alpha``. None: the defaults.
    num_clients : int, optional
        N (h moves by the mean change over N); None: the nodes connected when the run starts.
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

    OPTIONS = {FedDynOptions: "strategy.local_rule.feddyn"}
    LOCAL_RULE = "feddyn"

    def __init__(
        self,
        *,
        options: Optional[FedDynOptions] = None,
        num_clients: Optional[int] = None,
        rounds: Optional[int] = None,
        seed: int = 0,
        lr: Optional[float] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(options=options, num_clients=num_clients, rounds=rounds, seed=seed, lr=lr, **kwargs)

    def build_server_rule(self, federation: Federation) -> ServerRule:
        """Return FedDyn's server half."""
        rule = LocalRuleConfig(name="feddyn", feddyn=self.option(FedDynOptions))
        return FedDynServer(federation.num_clients, reset_on_switch=False, options=rule)
