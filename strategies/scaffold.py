"""SCAFFOLD's server half (Karimireddy et al., ICML 2020, https://arxiv.org/abs/1910.06378).

The server keeps the control variate c (zeros at first, shaped like the model's float
arrays), sends it with every train message (``scaffold-c``) and, after each round,
moves it by c <- c + (1/N) sum_{i in S} delta c_i with the deltas the clients send
(``scaffold-dc``). The model step x <- x + eta_g mean_i (y_i - x) is the aggregator's
(FedAvg with ``weighted: false`` is the paper's; weighted is the usual FL variant).
``reset_on_switch``: set c to zero when an initializer replaces the model (the clients'
own c_i stay: they are client state).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional

import numpy as np

from fedflex import keys
from fedflex.arrays import is_float
from fedflex.config import LocalRuleConfig
from fedflex.strategies.parts import Arrays, ClientUpdate, ModelStateRule


class ScaffoldServer(ModelStateRule):
    """SCAFFOLD's server half: keeps the global control variate ``c``, sends it and updates it."""

    name = rule = "scaffold"
    state_key = "c"
    c: Arrays  # the state, set by ModelStateRule under ``state_key``

    def __init__(
        self, num_clients: int, reset_on_switch: bool = False, options: Optional[LocalRuleConfig] = None
    ) -> None:
        super().__init__(reset_on_switch, options)
        self.num_clients = num_clients

    def _ensure(self, like: Arrays) -> None:
        if not self.c:
            self.c = OrderedDict((k, np.zeros(v.shape, dtype=np.float32)) for k, v in like.items() if is_float(v))

    def train_payload(self, server_round: int) -> dict[str, Arrays]:
        """Return the array records added to this round's train messages (name -> arrays)."""
        assert self.ctx is not None  # bound before any round
        self._ensure(self.ctx.global_arrays)
        return {keys.SCAFFOLD_C: self.c}

    def observe(self, server_round: int, updates: list[ClientUpdate], global_arrays: Arrays) -> None:
        """Learn from the round's replies (data sizes, update statistics)."""
        self._ensure(global_arrays)
        for u in updates:
            dc = u.extras.get(keys.SCAFFOLD_DC)
            if dc is None:
                raise ValueError(f"scaffold: client {u.client} sent no {keys.SCAFFOLD_DC}")
            for k, v in dc.items():
                self.c[k] = (self.c[k] + v / self.num_clients).astype(np.float32)

    def summary(self) -> str:
        """Describe the part and its settings in one line (the run log and summary.json)."""
        return f"scaffold(reset_on_switch={self.reset_on_switch}; {super().summary()})"
