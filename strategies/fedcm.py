"""FedCM's server half: the global momentum Delta.

Xu, Wang, Wang & Yao, "FedCM: Federated Learning with Client-level Momentum", 2021,
https://arxiv.org/abs/2106.10874 (Algorithm 1). The client half is :mod:`clients.fedcm`.

The server sends Delta_t (zeros at first, shaped like the model's float arrays) with
every train message (``fedcm-delta``) and, after the round, sets

    Delta_{t+1} = (1/|S|) sum_{i in S} (x_t - y_i) / (lr K_i),

the mean per-step direction of the replies (K_i: client i's local steps, ``lr``: the
client learning rate). The model step x_{t+1} = x_t - eta_g Delta_{t+1} is the
aggregator's: FedAvg with ``server_lr`` s is eta_g = s lr K (for equal K_i; with
``weighted: false`` the paper's plain mean). ``reset_on_switch``: Delta back to zero when
an initializer replaces the model.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional

import numpy as np

from fedflex import keys
from fedflex.arrays import is_float
from fedflex.config import LocalRuleConfig
from fedflex.strategies.parts import Arrays, ClientHalfCheck, ClientUpdate, ModelStateRule


def fedcm_delta(updates: list[Arrays], steps: list[int], start: Arrays, lr: float) -> Arrays:
    """(1/|S|) sum_i (x - y_i) / (lr K_i) over the float arrays (clients with K_i = 0 count as 0)."""
    out = OrderedDict()
    for k, x in start.items():
        if not is_float(x):
            continue
        total = np.zeros(x.shape, dtype=np.float64)
        for u, n in zip(updates, steps):
            if n > 0:
                total += (x - np.asarray(u[k], dtype=np.float64)) / (lr * n)
        out[k] = (total / len(updates)).astype(np.float32)
    return out


class FedCMServer(ModelStateRule):
    """FedCM's server half: keeps and sends the global momentum ``delta`` built from the clients' updates."""

    DP_NOTE = "FedCM's momentum (sent to the clients) is built from the un-noised aggregate"

    name = rule = "fedcm"
    state_key = "delta"
    delta: Arrays  # the state, set by ModelStateRule under ``state_key``

    def __init__(self, lr: float, reset_on_switch: bool = False, options: Optional[LocalRuleConfig] = None) -> None:
        super().__init__(reset_on_switch, options)
        self.plain_check = ClientHalfCheck(
            "FedCM",
            "@fedflex.clients.helpers.client_half under your @app.train()",
            "the momentum Delta stays 0 and FedCM is FedAvg",
        )
        self.lr = lr

    def train_payload(self, server_round: int) -> dict[str, Arrays]:
        """Return the array records added to this round's train messages (name -> arrays)."""
        if not self.delta:
            assert self.ctx is not None  # bound before any round
            self.delta = OrderedDict(
                (k, np.zeros(v.shape, dtype=np.float32)) for k, v in self.ctx.global_arrays.items() if is_float(v)
            )
        return {keys.FEDCM_DELTA: self.delta}

    def observe(self, server_round: int, updates: list[ClientUpdate], global_arrays: Arrays) -> None:
        """Learn from the round's replies (data sizes, update statistics)."""
        if not updates:
            return
        self.plain_check(updates)
        steps = [int(u.metrics.get(keys.NUM_STEPS, 0)) for u in updates]
        self.delta = fedcm_delta([u.arrays for u in updates], steps, global_arrays, self.round_lr(self.lr))

    def summary(self) -> str:
        """Describe the part and its settings in one line (the run log and summary.json)."""
        return f"fedcm(lr={self.lr}, reset_on_switch={self.reset_on_switch}; {super().summary()})"
