"""Server optimisers on the FedAvg pseudo-gradient, as aggregator parts (named
``<Method>Aggregator``: Flower's strategies of the same method are ``FedAvgM``,
``FedAdam``, ...).

With delta = avg_i x_i - x (the example-weighted mean of the client models minus the
global model):

- FedAvgM (Hsu et al., 2019, https://arxiv.org/abs/1909.06335):
  v <- beta v - delta;  x <- x - eta v   (as Flower's FedAvgM: momentum on x - avg);
- FedAdagrad / FedAdam / FedYogi (Reddi et al., "Adaptive Federated Optimization",
  ICLR 2021, https://arxiv.org/abs/2003.00295, Algorithm 2, no bias correction):
  m <- beta1 m + (1 - beta1) delta;
  v <- v + delta^2                                    (Adagrad)
  v <- beta2 v + (1 - beta2) delta^2                  (Adam)
  v <- v - (1 - beta2) delta^2 sign(v - delta^2)      (Yogi)
  x <- x + eta m / (sqrt(v) + tau);
- FedAMS (Wang, Lin & Chen, "Communication-Efficient Adaptive Federated Learning",
  ICML 2022, https://arxiv.org/abs/2205.02719, Algorithm 1 without compression): Adam's
  moments from zero, and the AMSGrad maximum of the second moment:
  m <- beta1 m + (1 - beta1) delta;  v <- beta2 v + (1 - beta2) delta^2;
  v_hat <- max(v_hat, v, eps);       x <- x + eta m / sqrt(v_hat)
  ("max stabilisation", ``epsilon_at="max"``, the reading followed by default), or
  v_hat <- max(v_hat, v);            x <- x + eta m / (sqrt(v_hat) + eps)
  (``epsilon_at="denominator"``, AMSGrad's placement, which the paper calls FedAMSGrad);
  eps is ``tau``.

Flower ships the same methods as whole strategies; here they are parts, so that any
sampler, initializer and local rule can sit beside them. ``direction`` exposes the step
each would take (AWARE projects it). ``reset_on_switch``: forget the optimiser state when
an initializer replaces the global model.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any, ClassVar

import numpy as np

from fedflex.arrays import is_float
from fedflex.config import AggregatorConfig
from fedflex.strategies.baseline import weighted_average
from fedflex.strategies.parts import Aggregator, Arrays, ClientUpdate, Federation


class ServerOptimizer(Aggregator):
    """Base: FedAvg mean, then a stateful step on the pseudo-gradient."""

    #: the sections of ``strategy.aggregator`` whose fields are its keyword arguments
    SECTIONS: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def build(cls, options: AggregatorConfig, federation: Federation) -> "ServerOptimizer":
        """Return the optimiser from the common options and the fields of its :attr:`SECTIONS`."""
        fields = {k: v for section in cls.SECTIONS for k, v in dataclasses.asdict(getattr(options, section)).items()}
        reset = options.on_model_switch == "reset"
        return cls(server_lr=options.server_lr, weighted=options.weighted, reset_on_switch=reset, **fields)

    def __init__(self, server_lr: float, weighted: bool = True, reset_on_switch: bool = False) -> None:
        self.server_lr = server_lr
        self.weighted = weighted
        self.reset_on_switch = reset_on_switch
        self.state: dict[str, "OrderedDict[str, np.ndarray]"] = {}

    def pseudo_gradient(self, global_arrays: Arrays, updates: list[ClientUpdate]) -> "OrderedDict[str, np.ndarray]":
        """Return delta = avg_i x_i - x over the float entries."""
        w = np.array([u.num_examples if self.weighted else 1.0 for u in updates], dtype=np.float64)
        avg = weighted_average([u.arrays for u in updates], w)
        return OrderedDict(
            (k, avg[k].astype(np.float64) - g.astype(np.float64)) for k, g in global_arrays.items() if is_float(g)
        )

    def step(self, delta: "OrderedDict[str, np.ndarray]") -> "OrderedDict[str, np.ndarray]":
        """Return the update u to add to x (x <- x + u); updates the optimiser state."""
        raise NotImplementedError

    def aggregate(self, server_round: int, global_arrays: Arrays, updates: list[ClientUpdate]) -> Arrays:
        """Return the next global model from the global model and the round's replies."""
        delta = self.pseudo_gradient(global_arrays, updates)
        update = self.step(delta)
        return apply_update(global_arrays, update, updates)

    def on_model_switch(self, server_round: int) -> None:
        """React to the initializer replacing the global model (state is reset when configured)."""
        if self.reset_on_switch:
            self.state = {}

    def state_dict(self) -> dict[str, Any]:
        """Return the state a checkpoint keeps (JSON/npz-friendly values)."""
        return {"state": {k: dict(v) for k, v in self.state.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state that :meth:`state_dict` returned."""
        self.state = {k: OrderedDict(v) for k, v in state["state"].items()}

    def _zeros(self, name: str, like: "OrderedDict[str, np.ndarray]") -> "OrderedDict[str, np.ndarray]":
        if name not in self.state:
            self.state[name] = OrderedDict((k, np.zeros_like(v)) for k, v in like.items())
        return self.state[name]


def apply_update(global_arrays: Arrays, update: "OrderedDict[str, np.ndarray]", updates: list[ClientUpdate]) -> Arrays:
    """Return x + u on float entries (dtype kept); non-float entries from the first reply."""
    out: Arrays = OrderedDict()
    for k, g in global_arrays.items():
        if k in update:
            out[k] = (g.astype(np.float64) + update[k]).astype(g.dtype)
        else:
            out[k] = updates[0].arrays[k].copy()
    return out


class FedAvgMAggregator(ServerOptimizer):
    """FedAvg with server momentum (FedAvgM)."""

    name = "fedavgm"
    SECTIONS = ("fedavgm",)
    DP_NOTE = "the server momentum is built from the un-noised aggregate"

    def __init__(self, server_lr: float = 1.0, momentum: float = 0.9, **kw: Any) -> None:
        super().__init__(server_lr, **kw)
        self.momentum = momentum

    def step(self, delta):
        """Return the server update for the pseudo-gradient ``delta`` (optimiser state in ``self.state``)."""
        v = self._zeros("v", delta)
        for k in delta:
            v[k] = self.momentum * v[k] - delta[k]
        return OrderedDict((k, -self.server_lr * v[k]) for k in delta)

    def summary(self) -> str:
        """Describe the part and its settings in one line (the run log and summary.json)."""
        return f"fedavgm(server_lr={self.server_lr}, momentum={self.momentum})"


class _Adaptive(ServerOptimizer):
    def __init__(
        self, server_lr: float = 0.01, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3, **kw: Any
    ) -> None:
        super().__init__(server_lr, **kw)
        self.beta1, self.beta2, self.tau = beta1, beta2, tau

    def second_moment(self, v: np.ndarray, d2: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def step(self, delta):
        m, v = self._zeros("m", delta), self._zeros("v", delta)
        if "v_init" not in self.state:  # Reddi et al. start v at tau^2
            for k in v:
                v[k] = np.full_like(v[k], self.tau**2)
            self.state["v_init"] = OrderedDict()
        out = OrderedDict()
        for k, d in delta.items():
            m[k] = self.beta1 * m[k] + (1 - self.beta1) * d
            v[k] = self.second_moment(v[k], d * d)
            out[k] = self.server_lr * m[k] / (np.sqrt(v[k]) + self.tau)
        return out

    def summary(self) -> str:
        return f"{self.name}(server_lr={self.server_lr}, beta1={self.beta1}, beta2={self.beta2}, tau={self.tau})"


class FedAdagradAggregator(_Adaptive):
    """FedAdagrad: the adaptive server optimiser with a summed second moment."""

    name = "fedadagrad"
    SECTIONS = ("adaptive",)
    DP_NOTE = "the server moments are built from the un-noised aggregate"

    def second_moment(self, v, d2):
        """Return the next second-moment estimate from ``v`` and the squared pseudo-gradient ``d2``."""
        return v + d2


class FedAdamAggregator(_Adaptive):
    """FedAdam: the adaptive server optimiser with Adam's second moment."""

    name = "fedadam"
    SECTIONS = ("adaptive",)
    DP_NOTE = "the server moments are built from the un-noised aggregate"

    def second_moment(self, v, d2):
        """Return the next second-moment estimate from ``v`` and the squared pseudo-gradient ``d2``."""
        return self.beta2 * v + (1 - self.beta2) * d2


class FedYogiAggregator(_Adaptive):
    """FedYogi: the adaptive server optimiser with Yogi's second moment."""

    name = "fedyogi"
    SECTIONS = ("adaptive",)
    DP_NOTE = "the server moments are built from the un-noised aggregate"

    def second_moment(self, v, d2):
        """Return the next second-moment estimate from ``v`` and the squared pseudo-gradient ``d2``."""
        return v - (1 - self.beta2) * d2 * np.sign(v - d2)


class FedAMSAggregator(ServerOptimizer):
    """FedAMS (Wang, Lin & Chen, ICML 2022; see the module docstring).

    Parameters
    ----------
    server_lr : float
        eta.
    beta1, beta2 : float
        Decay of the first and second moment.
    tau : float
        epsilon. With ``epsilon_at="max"`` it floors ``v_hat`` (a squared quantity: the
        denominator is at least ``sqrt(tau)``); with ``"denominator"`` it is added to
        ``sqrt(v_hat)``, as in FedAdam / FedYogi.
    epsilon_at : {"max", "denominator"}
        Where epsilon goes (see the module docstring); ``"max"`` is the paper's FedAMS.

    m, v and v_hat start at zero (the paper's initialisation; FedAdam / FedYogi here start
    v at tau^2 as Reddi et al.). No bias correction, as in the paper.
    """

    name = "fedams"
    SECTIONS = ("adaptive", "fedams")
    DP_NOTE = "the server moments are built from the un-noised aggregate"

    def __init__(
        self,
        server_lr: float = 0.01,
        beta1: float = 0.9,
        beta2: float = 0.99,
        tau: float = 1e-3,
        epsilon_at: str = "max",
        **kw: Any,
    ) -> None:
        if epsilon_at not in EPSILON_AT:
            raise ValueError(f"fedams: epsilon_at = {epsilon_at!r}: must be one of {', '.join(EPSILON_AT)}")
        super().__init__(server_lr, **kw)
        self.beta1, self.beta2, self.tau, self.epsilon_at = beta1, beta2, tau, epsilon_at

    def step(self, delta):
        """Return the server update for the pseudo-gradient ``delta`` (optimiser state in ``self.state``)."""
        m, v, v_hat = self._zeros("m", delta), self._zeros("v", delta), self._zeros("v_hat", delta)
        out = OrderedDict()
        for k, d in delta.items():
            m[k], v[k], v_hat[k], out[k] = ams_step(
                m[k], v[k], v_hat[k], d, self.server_lr, self.beta1, self.beta2, self.tau, self.epsilon_at
            )
        return out

    def summary(self) -> str:
        """Describe the part and its settings in one line (the run log and summary.json)."""
        return (
            f"fedams(server_lr={self.server_lr}, beta1={self.beta1}, beta2={self.beta2}, tau={self.tau}, "
            f"epsilon_at={self.epsilon_at})"
        )


#: where FedAMS puts epsilon
EPSILON_AT = ("max", "denominator")


def ams_step(
    m: np.ndarray,
    v: np.ndarray,
    v_hat: np.ndarray,
    delta: np.ndarray,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    epsilon_at: str = "max",
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One FedAMS step on one tensor: the new (m, v, v_hat) and the update u (x <- x + u).

    ``epsilon_at="max"``: v_hat' = max(v_hat, v', eps), u = lr m' / sqrt(v_hat');
    ``"denominator"``: v_hat' = max(v_hat, v'), u = lr m' / (sqrt(v_hat') + eps).
    """
    m = beta1 * m + (1.0 - beta1) * delta
    v = beta2 * v + (1.0 - beta2) * delta * delta
    if epsilon_at == "max":
        v_hat = np.maximum(np.maximum(v_hat, v), eps)
        return m, v, v_hat, lr * m / np.sqrt(v_hat)
    v_hat = np.maximum(v_hat, v)
    return m, v, v_hat, lr * m / (np.sqrt(v_hat) + eps)
