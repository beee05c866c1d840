"""FedNova's server half: normalised averaging.

Wang, Liu, Liang, Joshi & Poor, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization", NeurIPS 2020, https://arxiv.org/abs/2007.07481
(Eq. 6-7). Client i sends d_i = (x - y_i) / ||a_i||_1 (record ``fednova-d``) and
``||a_i||_1`` (``fednova-a-norm``; tau_i for plain SGD, see :mod:`clients.fednova`). The
FedNova step is

    x <- x - tau_eff sum_i p_i d_i,    tau_eff = sum_i p_i ||a_i||_1,

p_i = n_i / sum_j n_j (or 1/m for an unweighted aggregator). :class:`FedNovaServer`
realises it as the server half of the local rule: before the aggregator runs, it
replaces each reply's parameters by the normalised model x - tau_eff d_i, so that
aggregator ``fedavg`` (model averaging with the same p_i) yields exactly the step above,
and a server optimiser (``fedavgm``, ``fedadam``, ...) takes tau_eff sum_i p_i d_i as
its pseudo-gradient (FedNova with server momentum, the paper's Sec. 5). Buffers and
counters keep the clients' values (averaged by the aggregator).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Optional

import numpy as np

from fedflex import keys
from fedflex.arrays import is_float
from fedflex.config import LocalRuleConfig
from fedflex.strategies.parts import Arrays, ClientUpdate, ServerRule


def fednova_tau_eff(a_norms: np.ndarray, weights: np.ndarray) -> float:
    """tau_eff = sum_i p_i ||a_i||_1 with p = weights / sum(weights)."""
    p = np.asarray(weights, dtype=np.float64)
    return float(np.dot(p / p.sum(), np.asarray(a_norms, dtype=np.float64)))


def fednova_step(global_arrays: Arrays, ds: list[Arrays], a_norms: np.ndarray, weights: np.ndarray) -> Arrays:
    """Return x - tau_eff sum_i p_i d_i for the keys the d_i hold (others unchanged)."""
    p = np.asarray(weights, dtype=np.float64)
    p = p / p.sum()
    tau_eff = fednova_tau_eff(a_norms, weights)
    out: Arrays = OrderedDict()
    for key, x in global_arrays.items():
        if key in ds[0] and is_float(x):
            step = sum(pi * np.asarray(d[key], dtype=np.float64) for pi, d in zip(p, ds))
            out[key] = (x.astype(np.float64) - tau_eff * step).astype(x.dtype)
        else:
            out[key] = x.copy()
    return out


def normalised_models(
    global_arrays: Arrays, ds: list[Arrays], a_norms: np.ndarray, weights: np.ndarray
) -> list[Arrays]:
    """Per client, the parameters x - tau_eff d_i (the keys of d_i only): their
    p-weighted average is :func:`fednova_step`.
    """
    tau_eff = fednova_tau_eff(a_norms, weights)
    return [
        OrderedDict(
            (
                key,
                (global_arrays[key].astype(np.float64) - tau_eff * np.asarray(d[key], dtype=np.float64)).astype(
                    global_arrays[key].dtype
                ),
            )
            for key in d
        )
        for d in ds
    ]


class FedNovaServer(ServerRule):
    """Replaces the replies' parameters by FedNova's normalised models before the
    aggregator (see the module docstring). ``weighted`` must match the aggregator's.
    """

    name = rule = "fednova"

    def __init__(self, weighted: bool = True, options: Optional[LocalRuleConfig] = None) -> None:
        super().__init__(options)
        self.weighted = weighted
        self.tau_eff = 0.0

    def observe(self, server_round: int, updates: list[ClientUpdate], global_arrays: Arrays) -> None:
        """Learn from the round's replies (data sizes, update statistics)."""
        if not updates:
            return
        ds = []
        for u in updates:
            d = u.extras.get(keys.FEDNOVA_D)
            if d is None or keys.FEDNOVA_A_NORM not in u.metrics:
                raise ValueError(f"fednova: client {u.client} sent no {keys.FEDNOVA_D} / {keys.FEDNOVA_A_NORM}")
            ds.append(d)
        a_norms = np.array([float(u.metrics[keys.FEDNOVA_A_NORM]) for u in updates])
        weights = np.array([u.num_examples if self.weighted else 1.0 for u in updates], dtype=np.float64)
        self.tau_eff = fednova_tau_eff(a_norms, weights)
        for u, model in zip(updates, normalised_models(global_arrays, ds, a_norms, weights)):
            arrays = OrderedDict(u.arrays)
            arrays.update(model)
            u.arrays = arrays

    def summary(self) -> str:
        """Describe the part and its settings in one line (the run log and summary.json)."""
        return f"fednova(weighted={self.weighted}; {super().summary()})"

    def state_dict(self) -> dict[str, Any]:
        """Return the state a checkpoint keeps (JSON/npz-friendly values)."""
        return {}
