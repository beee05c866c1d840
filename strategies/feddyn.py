"""FedDyn's server half: the state h and the shifted average.

Acar, Zhao, Matas, Mattina, Whatmough & Saligrama, "Federated Learning Based on Dynamic
Regularization", ICLR 2021, https://arxiv.org/abs/2111.04263 (Algorithm 1). The client
half is :mod:`clients.feddyn`.

With m = ``num_clients`` (all clients, not only this round's), P_t the round's replies
and w^{t-1} the model they started from:

    h^t = h^{t-1} - alpha (1/m) sum_{k in P_t} (w_k^t - w^{t-1})        (h^0 = 0)
    w^t = (1/|P_t|) sum_{k in P_t} w_k^t - h^t / alpha

:meth:`FedDynServer.observe` updates h and shifts every reply by -h^t / alpha before the
aggregator, so FedAvg with ``weighted: false`` and ``server_lr: 1`` gives w^t exactly
(any convex weighting still shifts the mean by -h^t / alpha). Only float arrays take part
(integer buffers, e.g. BatchNorm's counter, are left to the aggregator).
``reset_on_switch``: h back to zero when an initializer replaces the model.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional

import numpy as np

from fedflex.arrays import is_float
from fedflex.config import LocalRuleConfig
from fedflex.strategies.parts import Arrays, ClientHalfCheck, ClientUpdate, ModelStateRule


def feddyn_h(h: Arrays, updates: list[Arrays], start: Arrays, alpha: float, num_clients: int) -> Arrays:
    """Return h - alpha (1/m) sum_k (w_k - w^{t-1}) over the float arrays (h: zeros when empty)."""
    out = OrderedDict()
    for k, w in start.items():
        if not is_float(w):
            continue
        drift = sum(np.asarray(u[k], dtype=np.float64) - w for u in updates)
        base = h.get(k, np.zeros(w.shape))
        out[k] = (base - alpha * drift / num_clients).astype(np.float32)
    return out


class FedDynServer(ModelStateRule):
    """FedDyn's server half: keeps the state ``h`` and shifts every reply by -h / alpha before the aggregator."""

    DP_NOTE = "FedDyn's state h accumulates the un-noised updates"

    name = rule = "feddyn"
    state_key = "h"
    h: Arrays  # the state, set by ModelStateRule under ``state_key``

    def __init__(
        self, num_clients: int, reset_on_switch: bool = False, options: Optional[LocalRuleConfig] = None
    ) -> None:
        super().__init__(reset_on_switch, options)
        self.plain_check = ClientHalfCheck(
            "FedDyn",
            "@fedflex.clients.helpers.client_half under your @app.train()",
            "the clients train without the dynamic regulariser and FedDyn is FedAvg shifted by h / alpha",
        )
        self.num_clients = num_clients

    @property
    def alpha(self) -> float:
        """Return FedDyn's alpha (``strategy.local_rule.feddyn.alpha``)."""
        return self.options.feddyn.alpha

    def observe(self, server_round: int, updates: list[ClientUpdate], global_arrays: Arrays) -> None:
        """Learn from the round's replies (data sizes, update statistics)."""
        if not updates:
            return
        self.plain_check(updates)
        self.h = feddyn_h(self.h, [u.arrays for u in updates], global_arrays, self.alpha, self.num_clients)
        for u in updates:
            arrays = OrderedDict(u.arrays)
            for k, h in self.h.items():
                arrays[k] = (np.asarray(arrays[k], dtype=np.float32) - h / self.alpha).astype(np.float32)
            u.arrays = arrays

    def summary(self) -> str:
        """Describe the part and its settings in one line (the run log and summary.json)."""
        return f"feddyn(num_clients={self.num_clients}, reset_on_switch={self.reset_on_switch}; {super().summary()})"
