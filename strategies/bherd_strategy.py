"""BHerd as a Flower strategy: :class:`BHerd`, the server half of BHerd
(:mod:`strategies.bherd`) in FedAvg's round.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from fedflex.config import AggregatorConfig, LocalRuleConfig
from fedflex.options import BHerdOptions
from fedflex.strategies.bherd import BHerdAggregator
from fedflex.strategies.flower_strategy import Federation, FlowerStrategy, check_aggregation
from fedflex.strategies.parts import Aggregator, ServerRule
from fedflex.strategies.scaffold import ScaffoldServer


class BHerd(FlowerStrategy):
    """BHerd (Luo et al., 2024, https://arxiv.org/abs/2402.10071), the server half: the
    global step ``w - lr / alpha x sum_i p_i g_i`` with each client's herded gradient sum.

    Clients: must send ``herd-g`` and the herding metrics (fedflex's ClientApp with local
    rule bherd, or :class:`fedflex.clients.helpers.BHerdClient` around a user's
    ``train()``); a plain reply is rejected in one line.

    Parameters
    ----------
    options : BHerdOptions, optional
        The method's options (``strategy.local_rule.bherd``, sent to the clients with
        every train message): ``alpha``, ``dtype``, ``max_stored``, ``base`` (``fedavg``,
        ``fednova`` or ``scaffold``). None: the defaults.
    server_lr : float, default 1.0
        A factor on the global step (``strategy.aggregator.server_lr``).
    weighted : bool, default True
        p_i by the clients' example counts, else uniform (``strategy.aggregator.weighted``).
    num_clients : int, optional
        N; None: the nodes connected when the run starts.
    rounds : int, optional
        The run's round count under a loop that does not say it (unused by this method).
    seed : int, default 0
        Seeds the uniform sampler (as a scenario's ``seed``).
    lr : float, optional
        The clients' learning rate, the ``lr`` of the global step. None: the app's
        ``train_config["lr"]``, else fedflex's default.
    **kwargs
        Flower's FedAvg options and FedFlex's (``clients_per_round``, ``availability``,
        ...): see :class:`~strategies.flower_strategy.FlowerStrategy`.
    """

    OPTIONS = {BHerdOptions: "strategy.local_rule.bherd"}
    LOCAL_RULE = "bherd"

    def __init__(
        self,
        *,
        options: Optional[BHerdOptions] = None,
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
        """Return BHerd's server step (divided by alpha, or by FedNova's tau_eff / k_i on ``base: fednova``)."""
        rule = LocalRuleConfig(name="bherd", bherd=self.option(BHerdOptions))
        options = AggregatorConfig(name="bherd", weighted=self.weighted, server_lr=self.server_lr)
        return BHerdAggregator.build(options, dataclasses.replace(federation, local_rule=rule))

    def build_server_rule(self, federation: Federation) -> ServerRule:
        """Return the rule's server half: it sends the options (and SCAFFOLD's variate on ``base: scaffold``)."""
        rule = LocalRuleConfig(name="bherd", bherd=self.option(BHerdOptions))
        if rule.bherd.base == "scaffold":
            return ScaffoldServer(federation.num_clients, reset_on_switch=False, options=rule)
        return ServerRule(rule)
