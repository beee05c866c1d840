"""FedCM as a Flower strategy: :class:`FedCM`, the server half of FedCM
(:mod:`strategies.fedcm`) in FedAvg's round.
"""

from __future__ import annotations

from typing import Any, Optional

from fedflex.config import LocalRuleConfig
from fedflex.options import FedCMOptions
from fedflex.strategies.fedcm import FedCMServer
from fedflex.strategies.flower_strategy import Federation, FlowerStrategy
from fedflex.strategies.parts import ServerRule


class FedCM(FlowerStrategy):
    """FedCM (Xu et al., 2021, https://arxiv.org/abs/2106.10874), the server half: the
    global momentum Delta, sent as the ``fedcm-delta`` record with every train message.

    Clients: local steps along ``alpha g + (1 - alpha) Delta`` (fedflex's ClientApp with
    local rule fedcm, or :class:`fedflex.clients.helpers.FedCMClient`); a plain client's
    replies are taken, and Delta then stays 0 (FedAvg).

    Parameters
    ----------
    options : FedCMOptions, optional
        The method's options (``strategy.local_rule.fedcm``, sent to the clients with
        every train message): ``alpha``. None: the defaults.
    num_clients : int, optional
        N; None: the nodes connected when the run starts.
    rounds : int, optional
        The run's round count under a loop that does not say it (unused by this method).
    seed : int, default 0
        Seeds the uniform sampler (as a scenario's ``seed``).
    lr : float, optional
        The clients' learning rate, which Delta's update divides by. None: the app's
        ``train_config["lr"]``, else fedflex's default.
    **kwargs
        Flower's FedAvg options and FedFlex's (``clients_per_round``, ``availability``,
        ...): see :class:`~strategies.flower_strategy.FlowerStrategy`.
    """

    OPTIONS = {FedCMOptions: "strategy.local_rule.fedcm"}
    LOCAL_RULE = "fedcm"

    def __init__(
        self,
        *,
        options: Optional[FedCMOptions] = None,
        num_clients: Optional[int] = None,
        rounds: Optional[int] = None,
        seed: int = 0,
        lr: Optional[float] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(options=options, num_clients=num_clients, rounds=rounds, seed=seed, lr=lr, **kwargs)

    def build_server_rule(self, federation: Federation) -> ServerRule:
        """Return FedCM's server half."""
        rule = LocalRuleConfig(name="fedcm", fedcm=self.option(FedCMOptions))
        return FedCMServer(federation.lr, reset_on_switch=False, options=rule)
