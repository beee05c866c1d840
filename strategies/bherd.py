"""BHerd's server step, also serving GraB-FedAvg and BHerd-FedNova.

BHerd: Luo et al., "BHerd: Accelerating Federated Learning by Selecting a Beneficial
Herd of Local Gradients", 2024, https://arxiv.org/abs/2403.16557 (Eq. 7, Algorithm 3).
GraB-FedAvg: the same paper's Algorithm 4, after Lu et al., NeurIPS 2022,
https://arxiv.org/abs/2205.10733. FedNova: Wang et al., NeurIPS 2020,
https://arxiv.org/abs/2007.07481.

Every client sends g_i, the sum of the local gradients it selected (record ``herd-g``,
see :mod:`clients.bherd`), with tau_i, k_i and alpha_i = k_i / tau_i. With
p_i = n_i / sum_j n_j (``weighted``; else 1/m) and eta the clients' learning rate:

- ``alpha`` (local rule ``bherd``, base ``fedavg`` or ``scaffold``):
  w <- w - (eta / alpha) sum_i p_i g_i, alpha the configured ``bherd_alpha``;
- ``reported`` (local rule ``grab``): w <- w - (eta / alpha_t) sum_i p_i g_i with
  alpha_t = sum_i p_i alpha_i (a round where nobody selected anything keeps the model);
- ``fednova`` (local rule ``bherd`` with base ``fednova``):
  w <- w - eta tau_eff sum_i p_i g_i / k_i, tau_eff = sum_i p_i tau_i.

``server_lr`` multiplies the step (1 is the paper's). Only the parameters move by the
gradient step; buffers (BatchNorm statistics) are averaged from the clients' models like
FedAvg's, integer counters taken from the first. With alpha = 1 and plain SGD
(momentum 0) g_i = (w - y_i) / eta, so the step is exactly FedAvg's model average.

The local rule's options (``bherd_alpha``, ``bherd_base`` ...) reach the clients through
the rule's server half (:class:`strategies.parts.ServerRule`; SCAFFOLD's for
BHerd-SCAFFOLD).
"""

from __future__ import annotations

from collections import OrderedDict
from logging import WARNING
from typing import Any, Optional

import numpy as np
from flwr.common import log

from fedflex import keys
from fedflex.arrays import is_float
from fedflex.config import AggregatorConfig, LocalRuleConfig
from fedflex.strategies.baseline import weighted_average
from fedflex.strategies.parts import Aggregator, Arrays, ClientUpdate, Federation

DIVISORS = ("alpha", "reported", "fednova")
#: warn when the median relative gap between the herded and the full mean gradient
#: (``herd_gap``) passes this: the herded step is then no longer FedAvg's step plus a small
#: correction (measured: the CNN at lr 0.01 passed 0.5 by round 3 and diverged)
GAP_WARNING = 0.5


def gradient_step(
    global_arrays: Arrays, grads: list[Arrays], coefs: np.ndarray, others: Optional[Arrays] = None
) -> Arrays:
    """Return w - sum_i coefs_i grads_i for every key the gradients hold; other keys from
    ``others`` (e.g. averaged buffers) or, without it, unchanged.

    Computed in float64, returned in each array's dtype.
    """
    coefs = np.asarray(coefs, dtype=np.float64)
    out: Arrays = OrderedDict()
    for key, w in global_arrays.items():
        if grads and key in grads[0] and is_float(w):
            step = np.zeros(w.shape, dtype=np.float64)
            for c, g in zip(coefs, grads):
                if c:
                    step += c * np.asarray(g[key], dtype=np.float64).reshape(w.shape)
            out[key] = (w.astype(np.float64) - step).astype(w.dtype)
        else:
            out[key] = (others[key] if others is not None else w).copy()
    return out


def bherd_coefficients(
    divisor: str,
    lr: float,
    alpha: float,
    weights: np.ndarray,
    alphas: np.ndarray,
    taus: np.ndarray,
    ks: np.ndarray,
) -> tuple[np.ndarray, dict[str, float]]:
    """Per-client coefficients c_i of w <- w - sum_i c_i g_i, and the round's figures.

    Parameters
    ----------
    divisor
        ``alpha`` (c_i = eta p_i / alpha), ``reported`` (c_i = eta p_i / alpha_t,
        alpha_t = sum_j p_j alpha_j; all zeros when alpha_t = 0) or ``fednova``
        (c_i = eta tau_eff p_i / k_i, tau_eff = sum_j p_j tau_j; 0 where k_i = 0).
    lr, alpha
        eta and the configured alpha.
    weights
        Unnormalised client weights (p = weights / sum).
    alphas, taus, ks
        The clients' alpha_i, tau_i and k_i.
    """
    p = np.asarray(weights, dtype=np.float64)
    p = p / p.sum()
    figures: dict[str, float] = {}
    if divisor == "alpha":
        coefs = lr * p / alpha
        figures["herd_alpha_t"] = float(alpha)
    elif divisor == "reported":
        alpha_t = float(np.dot(p, alphas))
        figures["herd_alpha_t"] = alpha_t
        coefs = lr * p / alpha_t if alpha_t > 0 else np.zeros_like(p)
    elif divisor == "fednova":
        tau_eff = float(np.dot(p, taus))
        figures["herd_tau_eff"] = tau_eff
        ks = np.asarray(ks, dtype=np.float64)
        coefs = np.divide(lr * tau_eff * p, ks, out=np.zeros_like(p), where=ks > 0)
    else:
        raise ValueError(f"unknown divisor {divisor!r}: must be one of " + ", ".join(DIVISORS))
    return coefs, figures


class BHerdAggregator(Aggregator):
    """w <- w - server_lr * sum_i c_i g_i with the coefficients of ``divisor`` (see the
    module docstring and :func:`bherd_coefficients`).
    """

    name = "bherd"
    DP_NOTE = "BHerd's step uses each client's herded gradients"

    @classmethod
    def build(cls, options: AggregatorConfig, federation: Federation) -> "BHerdAggregator":
        """Return BHerd's step with the divisor of the federation's local rule: configured
        alpha (bherd), reported alpha_t (grab) or FedNova's tau_eff / k_i (bherd on fednova).
        """
        rule = federation.local_rule or LocalRuleConfig(name="bherd")
        divisor = "reported" if rule.name == "grab" else ("fednova" if rule.bherd.base == "fednova" else "alpha")
        if federation.momentum > 0:
            log(
                WARNING,
                "bherd: client.momentum=%s: the server steps with the raw mini-batch gradients, "
                "not the momentum steps the clients took (alpha=1 is then not FedAvg)",
                federation.momentum,
            )
        if rule.name == "bherd" and rule.bherd.alpha == 1.0:
            log(
                WARNING,
                "bherd with bherd.alpha=1 uploads every gradient: it is %s",
                {"fedavg": "FedAvg", "fednova": "FedNova", "scaffold": "SCAFFOLD"}[rule.bherd.base],
            )
        return cls(
            lr=federation.lr,
            alpha=rule.bherd.alpha,
            divisor=divisor,
            weighted=options.weighted,
            server_lr=options.server_lr,
        )

    def __init__(
        self, lr: float, alpha: float, divisor: str = "alpha", weighted: bool = True, server_lr: float = 1.0
    ) -> None:
        if divisor not in DIVISORS:
            raise ValueError(f"unknown divisor {divisor!r}: must be one of " + ", ".join(DIVISORS))
        self.lr, self.alpha, self.divisor = lr, alpha, divisor
        self.weighted, self.server_lr = weighted, server_lr
        self._figures: dict[str, Any] = {}
        self._warned = False

    def aggregate(self, server_round: int, global_arrays: Arrays, updates: list[ClientUpdate]) -> Arrays:
        """Return the next global model from the global model and the round's replies."""
        grads = []
        for u in updates:
            g = u.extras.get(keys.HERD_G)
            if g is None:
                raise ValueError(
                    f"bherd: client {u.client} sent no {keys.HERD_G} record (local rule bherd or grab needed)"
                )
            grads.append(g)

        def metric(name: str, default: float = 0.0) -> np.ndarray:
            return np.array([float(u.metrics.get(name, default)) for u in updates])

        weights = np.array([u.num_examples if self.weighted else 1.0 for u in updates], dtype=np.float64)
        coefs, figures = bherd_coefficients(
            self.divisor,
            self.round_lr(self.lr),
            self.alpha,
            weights,
            metric(keys.HERD_ALPHA_I),
            metric(keys.HERD_TAU),
            metric(keys.HERD_K),
        )
        if not np.any(coefs):
            log(WARNING, "round %d: bherd: no client selected a gradient; the parameters stay", server_round)
        others = weighted_average([u.arrays for u in updates], weights)
        distance, mean_norm = metric(keys.HERD_DISTANCE, np.nan), metric(keys.HERD_MEAN_NORM, np.nan)
        with np.errstate(divide="ignore", invalid="ignore"):
            gap = distance / mean_norm
        self._figures = {
            **figures,
            "herd_k": [int(k) for k in metric(keys.HERD_K)],
            "herd_distance": distance.tolist(),
            "herd_mean_norm": mean_norm.tolist(),
            "herd_gap": gap.tolist(),
        }
        self._warn_on_gap(server_round, gap)
        return gradient_step(global_arrays, grads, self.server_lr * coefs, others)

    def round_metrics(self) -> dict[str, Any]:
        """Return this round's figures for the round's row of metrics.jsonl."""
        return dict(self._figures)

    def _warn_on_gap(self, server_round: int, gap: np.ndarray) -> None:
        """Warn once per run when the median ``herd_gap`` (||g_i/k_i - mean(z_i)|| /
        ||mean(z_i)||: how far the herded step is from the client's full mean gradient,
        relative to it) passes :data:`GAP_WARNING`.
        """
        finite = gap[np.isfinite(gap)]
        if self._warned or not finite.size or float(np.median(finite)) <= GAP_WARNING:
            return
        self._warned = True
        log(
            WARNING,
            "round %d: bherd: the herded gradients differ from the clients' mean gradient by a median "
            "%.0f%% of it (herd_gap in metrics.jsonl). Herding assumes the local gradients scatter "
            "around one mean; a local trajectory that moves far (large lr x local steps) breaks "
            "that and BHerd can diverge: lower client.lr or raise bherd_alpha (docs/bherd.md)",
            server_round,
            100 * float(np.median(finite)),
        )

    def summary(self) -> str:
        """Describe the part and its settings in one line (the run log and summary.json)."""
        return (
            f"bherd(divisor={self.divisor}, lr={self.lr}, alpha={self.alpha}, "
            f"weighted={self.weighted}, server_lr={self.server_lr})"
        )
