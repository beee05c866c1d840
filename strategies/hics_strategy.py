"""HiCS-FL as a Flower strategy: :class:`HiCSFL`, FedAvg with the HiCS-FL sampler
(:mod:`strategies.hics`).
"""

from __future__ import annotations

from typing import Any, Optional

from fedflex.config import SamplerConfig
from fedflex.options import HiCSOptions
from fedflex.strategies.flower_strategy import SamplerMethod
from fedflex.strategies.hics import HiCSSampler


class HiCSFL(SamplerMethod):
    """HiCS-FL: heterogeneity-guided client sampling (Chen & Vikalo, 2024,
    https://arxiv.org/abs/2310.00198), the rest of the round FedAvg's.

    Estimates each client's label entropy from the update of the model's output-layer
    bias, clusters the clients and samples the clusters of high entropy more often; the
    first ``ceil(N / K)`` rounds visit every client once. Clients: any ClientApp (the
    update of the output-layer bias is all it reads).

    Parameters
    ----------
    options : HiCSOptions, optional
        The method's options (``strategy.sampler.hics`` of a scenario): ``temperature``,
        ``estimate``, ``refresh``, ``entropy_weight`` (the paper's lambda), ``gamma0``,
        ``num_clusters``, ``departed``, ``variant``, ``ward``. None: the defaults.
    explore_first : bool, default False
        Online clients that never trained are drawn first (``strategy.sampler.explore_first``).
    bias_key : str, optional
        The model's output-layer bias (its ``state_dict`` key). None: the model's last
        one-dimensional float array.
    num_clients : int, optional
        N; None: the nodes connected when the run starts.
    rounds : int, optional
        T of the annealing ``gamma_t = gamma0 (1 - t / T)`` under a loop that does not
        say it (Flower's DP wrappers); :meth:`start` passes its ``num_rounds``.
    seed : int, default 0
        Seeds the sampler (as a scenario's ``seed``).
    lr : float, optional
        The clients' learning rate (the ``per-step`` estimate divides by it). None: the
        app's ``train_config["lr"]``, else fedflex's default.
    **kwargs
        Flower's FedAvg options (``fraction_train``, ...) and FedFlex's
        (``clients_per_round``, ``availability``, ``identify``, ...): see
        :class:`~strategies.flower_strategy.FlowerStrategy`.

    Examples
    --------
    >>> strategy = HiCSFL(fraction_train=0.5, options=HiCSOptions(entropy_weight=5.0))
    """

    SAMPLER = HiCSSampler

    def __init__(
        self,
        *,
        options: Optional[HiCSOptions] = None,
        explore_first: bool = SamplerConfig.explore_first,
        bias_key: Optional[str] = None,
        num_clients: Optional[int] = None,
        rounds: Optional[int] = None,
        seed: int = 0,
        lr: Optional[float] = None,
        **kwargs: Any,
    ) -> None:
        self.bias_key = bias_key
        super().__init__(
            options=options,
            explore_first=explore_first,
            num_clients=num_clients,
            rounds=rounds,
            seed=seed,
            lr=lr,
            **kwargs,
        )
