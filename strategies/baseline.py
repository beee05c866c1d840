"""The baseline parts: uniform sampling, FedAvg aggregation, ``previous`` initialisation.

FedAvg: McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", AISTATS 2017, https://arxiv.org/abs/1602.05629.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Optional

import numpy as np

from fedflex import keys
from fedflex.arrays import is_float
from fedflex.options import UniformOptions, resolve_options
from fedflex.strategies.parts import Aggregator, Arrays, ClientUpdate, Initializer, PartWrapper, Sampler


def query_losses(ctx: Any, server_round: int, clients: np.ndarray, sizes: dict[int, int]) -> dict[int, float]:
    """Ask ``clients`` for the loss of the current global model on their data (one QUERY
    round trip, :meth:`strategies.parts.RoundContext.query`); client id -> finite loss of
    those that answered. Their reported data sizes are recorded in ``sizes``. Shared by
    the samplers that rank clients by loss (Power-of-Choice, FedCor).
    """
    replies = ctx.query(server_round, clients, ctx.global_arrays)
    losses: dict[int, float] = {}
    for client, metrics in replies.items():
        loss = metrics.get(keys.EVAL_LOSS)
        if isinstance(loss, (int, float)) and np.isfinite(loss):
            losses[int(client)] = float(loss)
        n = metrics.get(keys.NUM_EXAMPLES)
        if isinstance(n, (int, float)) and n > 0:
            sizes[int(client)] = int(n)
    return losses


def explore_first(
    rng: np.random.Generator,
    online: np.ndarray,
    num: int,
    known: "set[int] | dict[int, Any]",
    draw_known: Callable[[np.ndarray, int], np.ndarray],
) -> np.ndarray:
    """Up to ``num`` clients: online clients not in ``known`` first (drawn uniformly
    without replacement), the rest by ``draw_known(known online clients, how many)``.

    The exploration rule HiCS-FL, Clustered Sampling and FedAWARE's exploration phase
    share: a client the sampler knows nothing about is visited before it is ranked.
    """
    online = np.asarray(online, dtype=np.int64)
    num = min(int(num), len(online))
    new = np.array([c for c in online if int(c) not in known], dtype=np.int64)
    chosen = rng.choice(new, size=min(num, new.size), replace=False) if new.size else new
    rest = num - chosen.size
    if rest > 0:
        old = np.array([c for c in online if int(c) in known], dtype=np.int64)
        chosen = np.concatenate([chosen, draw_known(old, rest)])
    return np.sort(chosen).astype(np.int64)


class UniformSampler(Sampler):
    """Draws clients uniformly without replacement, or proportionally to their data
    size (``weighted``; sizes are learnt from the ``num-examples`` clients report, and a
    client not yet seen counts with the mean known size).
    """

    name = "uniform"
    DP_NOTE = None
    OPTIONS = UniformOptions
    SEED_OFFSET = 1

    def __init__(self, seed: int, options: Optional[UniformOptions] = None, **fields: Any) -> None:
        self.rng = np.random.default_rng(seed)
        self.weighted = resolve_options(UniformOptions, options, fields, "strategy.sampler.uniform").weighted
        self.sizes: dict[int, int] = {}

    def sample(self, server_round: int, online: np.ndarray, num: int) -> np.ndarray:
        """Choose at most ``num`` of the ``online`` clients to train in ``server_round``."""
        num = min(num, len(online))
        if num == 0:
            return np.zeros(0, dtype=np.int64)
        p = None
        if self.weighted and self.sizes:
            default = float(np.mean(list(self.sizes.values())))
            w = np.array([self.sizes.get(int(c), default) for c in online], dtype=np.float64)
            p = w / w.sum()
        return np.sort(self.rng.choice(online, size=num, replace=False, p=p)).astype(np.int64)

    def observe(self, server_round: int, updates: list[ClientUpdate], global_arrays: Arrays) -> None:
        """Learn from the round's replies (data sizes, update statistics)."""
        for u in updates:
            self.sizes[u.client] = u.num_examples

    def summary(self) -> str:
        """Describe the part and its settings in one line (the run log and summary.json)."""
        return f"uniform(weighted={self.weighted})"

    def state_dict(self) -> dict[str, Any]:
        """Return the state a checkpoint keeps (JSON/npz-friendly values)."""
        return {"rng": self.rng.bit_generator.state, "sizes": dict(self.sizes)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state that :meth:`state_dict` returned."""
        self.rng.bit_generator.state = state["rng"]
        self.sizes = {int(k): int(v) for k, v in state["sizes"].items()}


def weighted_average(arrays: list[Arrays], weights: np.ndarray, carry: Optional[Arrays] = None) -> Arrays:
    """sum_i w_i a_i / sum_i w_i for float entries; non-float entries (counters such as
    BatchNorm's ``num_batches_tracked``) are taken from ``carry`` (default: the first model).
    """
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    ref = carry if carry is not None else arrays[0]
    out: Arrays = OrderedDict()
    for key, value in ref.items():
        if is_float(value):
            acc = np.zeros(value.shape, dtype=np.float64)
            for wi, a in zip(w, arrays):
                acc += wi * a[key]
            out[key] = acc.astype(value.dtype)
        else:
            out[key] = value.copy()
    return out


class ExploreFirstSampler(PartWrapper, Sampler):
    """The authors' exploration: online clients that never trained go first (shuffled,
    without replacement); when all online clients have trained, ``base`` samples.

    A client counts as explored once its reply was aggregated (a failed client is
    explored again).
    """

    name = "explore-first"
    DP_NOTE = "the sampler's schedule reads per-client updates"
    base: Sampler

    def __init__(self, base: Sampler, seed: int) -> None:
        super().__init__(base)
        self.rng = np.random.default_rng(seed)
        self.seen: set[int] = set()
        self.explored = 0

    def sample(self, server_round: int, online: np.ndarray, num: int) -> np.ndarray:
        """Choose at most ``num`` of the ``online`` clients to train in ``server_round``."""
        chosen = explore_first(
            self.rng, online, num, self.seen, lambda known, rest: self.base.sample(server_round, known, rest)
        )
        self.explored = int(sum(1 for c in chosen if int(c) not in self.seen))
        return chosen

    def observe(self, server_round: int, updates: list[ClientUpdate], global_arrays: Arrays) -> None:
        """Learn from the round's replies (data sizes, update statistics)."""
        self.seen.update(u.client for u in updates)
        self.base.observe(server_round, updates, global_arrays)

    def round_metrics(self) -> dict[str, Any]:
        """Return the wrapped sampler's figures, and how many of this round's picks were
        exploration (``explored``).
        """
        return {**super().round_metrics(), "explored": self.explored}

    def summary(self) -> str:
        """Describe the part and its settings in one line (the run log and summary.json)."""
        return f"explore-first({self.base.summary()})"

    def state_dict(self) -> dict[str, Any]:
        """Return the state a checkpoint keeps (JSON/npz-friendly values)."""
        return {"rng": self.rng.bit_generator.state, "seen": sorted(self.seen), "base": self.base.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state that :meth:`state_dict` returned."""
        self.rng.bit_generator.state = state["rng"]
        self.seen = {int(c) for c in state["seen"]}
        self.base.load_state_dict(state["base"])


class FedAvgAggregator(Aggregator):
    """x <- x + eta_g (avg_i x_i - x), avg weighted by num-examples (``weighted``) or plain.

    With ``server_lr`` = 1 this is FedAvg's model averaging.
    """

    name = "fedavg"
    DP_NOTE = None

    def __init__(self, weighted: bool = True, server_lr: float = 1.0) -> None:
        self.weighted = weighted
        self.server_lr = server_lr

    def aggregate(self, server_round: int, global_arrays: Arrays, updates: list[ClientUpdate]) -> Arrays:
        """Return the next global model from the global model and the round's replies."""
        weights = np.array([u.num_examples if self.weighted else 1.0 for u in updates], dtype=np.float64)
        avg = weighted_average([u.arrays for u in updates], weights)
        if self.server_lr == 1.0:
            return avg
        out: Arrays = OrderedDict()
        for key, g in global_arrays.items():
            if is_float(g):
                out[key] = (g + self.server_lr * (avg[key] - g)).astype(g.dtype)
            else:
                out[key] = avg[key]
        return out

    def summary(self) -> str:
        """Describe the part and its settings in one line (the run log and summary.json)."""
        return f"fedavg(weighted={self.weighted}, server_lr={self.server_lr})"


class PreviousInitializer(Initializer):
    """Plain FL: a new session continues from the latest global model."""

    name = "previous"
    DP_NOTE = None
