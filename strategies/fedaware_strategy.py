"""FedAWARE and the AWARE plug-in as Flower strategies: :class:`FedAWARE` (the FedAWARE
aggregator) and :class:`AWARE` (the plug-in around a server optimiser), both
:mod:`strategies.fedaware`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence, Union

from fedflex.checks import ConfigError
from fedflex.config import AggregatorConfig
from fedflex.options import AWARE_BASES, AdaptiveOptions, AwareOptions, FedAMSOptions, FedAvgMOptions, MethodOptions
from fedflex.strategies.baseline import FedAvgAggregator
from fedflex.strategies.fedaware import AwarePlugin, FedAwareAggregator
from fedflex.strategies.flower_strategy import Federation, FlowerStrategy, check_aggregation
from fedflex.strategies.optimizers import (
    FedAdagradAggregator,
    FedAdamAggregator,
    FedAMSAggregator,
    FedAvgMAggregator,
    FedYogiAggregator,
)
from fedflex.strategies.parts import Aggregator

#: the scenario section of the AWARE options
AWARE_SECTION = "strategy.aggregator.aware"


class FedAWARE(FlowerStrategy):
    """FedAWARE (Zeng et al., 2024, https://arxiv.org/abs/2305.04979): per-client update
    momenta, aggregated with the min-norm weights that balance them; the rest of the round
    FedAvg's. Until every online client has a momentum (``warmup``) the step is FedAvg's.
    Clients: any.

    Parameters
    ----------
    options : AwareOptions, optional
        The method's options (``strategy.aggregator.aware``): ``momentum``, ``normalize``,
        ``rescale``, ``warmup``, ``solver``, ``iters``, ``tol``, ``gap_tol``, ``memory``,
        ``layers``, ``dtype``, ``departed``, ``max_age`` (``enabled`` is the plug-in's:
        :class:`AWARE`). None: the defaults.
    server_lr : float, default 1.0
        eta_g of the step ``x - eta_g d`` (``strategy.aggregator.server_lr``).
    weighted : bool, default True
        The warm-up's FedAvg weighs the replies by their example counts
        (``strategy.aggregator.weighted``).
    num_clients : int, optional
        N, the momenta kept; None: the nodes connected when the run starts.
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

    OPTIONS = {AwareOptions: AWARE_SECTION}

    def __init__(
        self,
        *,
        options: Optional[AwareOptions] = None,
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
        if self.option(AwareOptions).enabled:
            raise ConfigError(
                f"{AWARE_SECTION}.enabled", True, "FedAWARE is AWARE already (the plug-in around a base is AWARE)"
            )

    def build_aggregator(self, federation: Federation) -> Aggregator:
        """Return the FedAWARE aggregator."""
        options = AggregatorConfig(
            name="fedaware", server_lr=self.server_lr, weighted=self.weighted, aware=self.option(AwareOptions)
        )
        return FedAwareAggregator.build(options, federation)


#: Flower's server optimisers (their names in :mod:`flwr.serverapp.strategy`) -> fedflex's aggregator
FLOWER_OPTIMIZERS = {
    "FedAvg": "fedavg",
    "FedAvgM": "fedavgm",
    "FedAdam": "fedadam",
    "FedYogi": "fedyogi",
    "FedAdagrad": "fedadagrad",
}

#: each base of the plug-in -> the option classes it reads, by scenario section
BASE_OPTIONS: dict[str, dict[type[MethodOptions], str]] = {
    "fedavg": {},
    "fedavgm": {FedAvgMOptions: "strategy.aggregator.fedavgm"},
    "fedadam": {AdaptiveOptions: "strategy.aggregator.adaptive"},
    "fedyogi": {AdaptiveOptions: "strategy.aggregator.adaptive"},
    "fedadagrad": {AdaptiveOptions: "strategy.aggregator.adaptive"},
    "fedams": {AdaptiveOptions: "strategy.aggregator.adaptive", FedAMSOptions: "strategy.aggregator.fedams"},
}

#: each base's server optimiser class (``fedavg``: FedAvg's mean, without optimiser state)
_OPTIMIZERS: dict[str, Callable[..., Aggregator]] = {
    "fedavgm": FedAvgMAggregator,
    "fedadam": FedAdamAggregator,
    "fedyogi": FedYogiAggregator,
    "fedadagrad": FedAdagradAggregator,
    "fedams": FedAMSAggregator,
}


class AWARE(FlowerStrategy):
    """The AWARE plug-in (Zeng et al., 2024, https://arxiv.org/abs/2305.04979) around a
    server optimiser: the base steps as usual, and after the warm-up only the part of its
    step along FedAWARE's min-norm direction is kept. The rest of the round is FedAvg's.
    Clients: any.

    Parameters
    ----------
    base : str or type, default "fedavgm"
        The server optimiser: Flower's strategy class or its name (``FedAvg``,
        ``FedAvgM``, ``FedAdam``, ``FedYogi``, ``FedAdagrad``), or fedflex's aggregator
        name (``fedavg``, ``fedavgm``, ``fedadam``, ``fedyogi``, ``fedadagrad``,
        ``fedams``).
    options : AwareOptions or list, optional
        The plug-in's :class:`~fedflex.options.AwareOptions` (``strategy.aggregator.aware``)
        and the base's: :class:`~fedflex.options.FedAvgMOptions` (fedavgm),
        :class:`~fedflex.options.AdaptiveOptions` (fedadam, fedyogi, fedadagrad, fedams),
        :class:`~fedflex.options.FedAMSOptions` (fedams); one object or a list, e.g.
        ``[AwareOptions(momentum=0.9), FedAvgMOptions(momentum=0.5)]``. None: the defaults.
    server_lr : float, default 1.0
        The base's server learning rate (``strategy.aggregator.server_lr``).
    weighted : bool, default True
        The base's mean weighs the replies by their example counts
        (``strategy.aggregator.weighted``).
    num_clients : int, optional
        N, the momenta kept; None: the nodes connected when the run starts.
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
    >>> from flwr.serverapp.strategy import FedAdam
    >>> strategy = AWARE(base=FedAdam, server_lr=0.1, options=AdaptiveOptions(tau=0.01))
    """

    def __init__(
        self,
        *,
        base: Union[str, type] = "fedavgm",
        options: Union[MethodOptions, Sequence[MethodOptions], None] = None,
        server_lr: float = AggregatorConfig.server_lr,
        weighted: bool = AggregatorConfig.weighted,
        num_clients: Optional[int] = None,
        rounds: Optional[int] = None,
        seed: int = 0,
        lr: Optional[float] = None,
        **kwargs: Any,
    ) -> None:
        name = base if isinstance(base, str) else getattr(base, "__name__", str(base))
        name = FLOWER_OPTIMIZERS.get(name, name)
        if name not in AWARE_BASES:
            allowed = ", ".join(list(FLOWER_OPTIMIZERS) + list(AWARE_BASES))
            raise ValueError(f"AWARE: base is {base!r}; allowed: {allowed}")
        check_aggregation(server_lr, weighted)
        self.base_name, self.server_lr, self.weighted = name, server_lr, weighted
        super().__init__(options=options, num_clients=num_clients, rounds=rounds, seed=seed, lr=lr, **kwargs)

    def option_classes(self) -> dict[type[MethodOptions], str]:
        """Return the plug-in's option class and its base's -> their scenario section."""
        return {AwareOptions: AWARE_SECTION, **BASE_OPTIONS[self.base_name]}

    def build_aggregator(self, federation: Federation) -> Aggregator:
        """Return the base's aggregator inside the AWARE plug-in."""
        if self.base_name == "fedavg":
            base: Aggregator = FedAvgAggregator(weighted=self.weighted, server_lr=self.server_lr)
        else:
            fields = {
                k: v for cls in BASE_OPTIONS[self.base_name] for k, v in dataclasses.asdict(self.option(cls)).items()
            }
            base = _OPTIMIZERS[self.base_name](
                server_lr=self.server_lr, weighted=self.weighted, reset_on_switch=False, **fields
            )
        aware = dataclasses.replace(self.option(AwareOptions), enabled=True)
        return AwarePlugin(base, federation.num_clients, aware, reset_on_switch=False)
