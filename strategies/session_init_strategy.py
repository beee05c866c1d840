"""Session-aware initialisation as a Flower strategy: :class:`SessionAware`, the
session-aware initializer (:mod:`strategies.session_init`) around another named
strategy's method (FedAvg by default).
"""

from __future__ import annotations

from typing import Any, Optional

from fedflex.options import SessionAwareOptions
from fedflex.strategies.flower_strategy import Federation, FlowerStrategy
from fedflex.strategies.parts import Aggregator, Initializer, Sampler, ServerRule
from fedflex.strategies.session_init import SessionAwareInitializer


class SessionAware(FlowerStrategy):
    """Session-aware initialisation under churn (the churn paper's method,
    docs/session-init.md): when the online set changes, the next session starts from a
    model built for its clients (softmin weights over the stored session models, from the
    distance between session gradients).

    Sessions follow the online set: the live nodes in a deployment, or an
    ``availability`` schedule (:mod:`fedflex.churn`) in simulation, where Flower keeps
    every node connected. Clients: as ``base``'s method (any, for FedAvg).

    Parameters
    ----------
    base : FlowerStrategy, optional
        Another named strategy (e.g. ``HiCSFL(options=HiCSOptions(entropy_weight=5.0))``)
        whose method runs inside the sessions: its sampler, aggregator and local rule,
        with its method options (``options``, ``explore_first``, ``server_lr``,
        ``bias_key``, ...). Its other keywords (``fraction_train``, ``seed``, ``lr``, ...)
        are not read: give them here. None: FedAvg.
    options : SessionAwareOptions, optional
        The method's options (``strategy.initializer.session_aware``):
        ``pilot_sessions``, ``gradient_rounds``, ``similarity_scale``, ``distance``,
        ``switch_margin``, ``gradient_state``. None: the defaults.
    num_clients : int, optional
        N; None: the nodes connected when the run starts.
    rounds : int, optional
        The run's round count under a loop that does not say it (``base``'s schedules).
    seed : int, default 0
        Seeds the initializer and ``base``'s parts (as a scenario's ``seed``).
    lr : float, optional
        The clients' learning rate (for ``base``'s server half). None: the app's
        ``train_config["lr"]``, else fedflex's default.
    **kwargs
        Flower's FedAvg options and FedFlex's (``clients_per_round``, ``availability``,
        ...): see :class:`~strategies.flower_strategy.FlowerStrategy`.

    Examples
    --------
    >>> from fedflex.churn import MarkovChurn
    >>> from fedflex.strategies import HiCSFL
    >>> strategy = SessionAware(base=HiCSFL(), availability=MarkovChurn(10, p_leave=0.3, p_join=0.3))
    """

    OPTIONS = {SessionAwareOptions: "strategy.initializer.session_aware"}

    def __init__(
        self,
        *,
        base: Optional[FlowerStrategy] = None,
        options: Optional[SessionAwareOptions] = None,
        num_clients: Optional[int] = None,
        rounds: Optional[int] = None,
        seed: int = 0,
        lr: Optional[float] = None,
        **kwargs: Any,
    ) -> None:
        if base is not None and (not isinstance(base, FlowerStrategy) or isinstance(base, SessionAware)):
            raise TypeError(f"SessionAware: base={base!r} must be another named strategy (HiCSFL(), FedAWARE(), ...)")
        self.base = base
        self.bias_key = base.bias_key if base is not None else None
        super().__init__(options=options, num_clients=num_clients, rounds=rounds, seed=seed, lr=lr, **kwargs)
        if base is not None:
            self.local_rule = base.local_rule

    def build_sampler(self, federation: Federation) -> Sampler:
        """Return ``base``'s sampler (FedAvg's uniform draw without a base)."""
        return self.base.build_sampler(federation) if self.base is not None else super().build_sampler(federation)

    def build_aggregator(self, federation: Federation) -> Aggregator:
        """Return ``base``'s aggregator (FedAvg's mean without a base)."""
        if self.base is not None:
            return self.base.build_aggregator(federation)
        return super().build_aggregator(federation)

    def build_server_rule(self, federation: Federation) -> ServerRule:
        """Return ``base``'s local-rule server half (plain SGD's without a base)."""
        if self.base is not None:
            return self.base.build_server_rule(federation)
        return super().build_server_rule(federation)

    def build_initializer(self, federation: Federation) -> Initializer:
        """Return the session-aware initializer."""
        return SessionAwareInitializer(
            self.option(SessionAwareOptions),
            clients_per_round=federation.clients_per_round,
            seed=federation.seed_of("session-aware"),
        )
