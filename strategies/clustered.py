"""Clustered Sampling: one client per weight-balanced cluster of similar updates.

Method: Yann Fraboni, Richard Vidal, Laetitia Kameni and Marco Lorenzi, "Clustered
Sampling: Low-Variance and Improved Representativity for Clients Selection in Federated
Learning", ICML 2021, https://arxiv.org/abs/2105.05883 -- Algorithm 2 (clustering by
model similarity), as in the authors' code (``get_clusters_with_alg2``).

Each round, over the online clients that have sent an update:

1. Ward's hierarchy of the clients by the angle ``arccos(cos(u_i, u_j))`` between their
   latest full-model updates (the "representative gradients", local minus global),
   fed to scipy as the condensed matrix (see :mod:`strategies.hics` for what Ward does
   with a non-Euclidean distance);
2. the tree is cut where a subtree's data weight ``m p`` first exceeds 1 (Algorithm 2:
   clusters of weight <= 1/m of the data; ``m`` = clients to draw);
3. the m heaviest clusters each seed one sampling distribution; the clients of the other
   clusters (lightest first, shuffled inside a cluster) are poured into the
   distributions until each holds weight exactly 1, a client split between two
   distributions when it does not fit -- so every client's total weight over the m
   distributions is ``m p_i`` and the plain mean of one draw per distribution is
   unbiased;
4. one client is drawn from each distribution (proportionally to its weight there).

Choices made here: fedflex trains distinct clients, so a distribution whose draw
repeats an already chosen client draws again among its other clients (or, when it has
none left, among all remaining clients by data share); Fraboni et al. allow the repeat.
Online clients without an update yet are explored first (random order); updates of
offline clients are kept. With churn the data shares are renormalised over the
candidates.

Compact updates: a model of P parameters is stored as a count sketch of ``sketch_dim``
(default 512) numbers when P is larger (feature hashing: coordinate i goes to bucket
h(i) with sign s(i), both fixed by the seed; inner products, hence angles, are preserved
in expectation, with a relative error of order ``1/sqrt(sketch_dim)``). Memory is
``N x sketch_dim`` floats and the per-round clustering cost is independent of P; only
the sketching itself (O(P) per reply) sees the model. Models with P <= sketch_dim are
stored exactly.
"""

from __future__ import annotations

from logging import DEBUG
from typing import Any, Optional

import numpy as np
from flwr.common import log

from fedflex.arrays import flatten
from fedflex.options import ClusteredOptions, resolve_options
from fedflex.strategies.baseline import explore_first
from fedflex.strategies.clustering import (
    algorithm2_distributions,
    angle_matrix,
    data_shares,
    draw_one_per_distribution,
    unit_rows,
    ward_tree,
)
from fedflex.strategies.parts import Arrays, ClientUpdate, Sampler
from fedflex.strategies.sketch import CountSketch  # noqa: F401 - also importable from here


# ---------------------------------------------------------------------------- the part
class ClusteredSampler(Sampler):
    """Clustered Sampling, Algorithm 2 (see the module docstring).

    Parameters
    ----------
    seed : int
        Seed of the sampler's generator (and of the sketch).
    ward : {"exact", "scalable"}
        Exact Ward over the candidates, or Ward on ``max_exact`` representatives with
        the others joining their nearest one (:func:`strategies.clustering.ward_tree`).
    sketch_dim : int
        Size of the stored update sketches.
    """

    name = "clustered"
    OPTIONS = ClusteredOptions
    SEED_OFFSET = 13
    DP_NOTE = "Clustered Sampling clusters the clients by their clipped, un-noised updates"

    def __init__(
        self,
        *,
        seed: int,
        options: Optional[ClusteredOptions] = None,
        sketch_dim: int = 512,
        max_exact: int = 1000,
        **fields: Any,
    ) -> None:
        ward = resolve_options(ClusteredOptions, options, fields, "strategy.sampler.clustered").ward
        self.rng = np.random.default_rng(seed)
        self.sketch = CountSketch(sketch_dim, seed=seed + 7919)
        self.ward = ward
        self.max_exact = max_exact
        self.updates: dict[int, np.ndarray] = {}
        self.sizes: dict[int, int] = {}

    def observe(self, server_round: int, updates: list[ClientUpdate], global_arrays: Arrays) -> None:
        """Learn from the round's replies (data sizes, update statistics)."""
        g = flatten(global_arrays)
        for u in updates:
            self.sizes[u.client] = u.num_examples
            self.updates[u.client] = self.sketch(flatten(u.arrays) - g)

    def sample(self, server_round: int, online: np.ndarray, num: int) -> np.ndarray:
        """Choose at most ``num`` of the ``online`` clients to train in ``server_round``."""
        online = np.asarray(online, dtype=np.int64)
        num = min(int(num), len(online))
        if num == 0:
            return np.zeros(0, dtype=np.int64)
        return explore_first(
            self.rng, online, num, self.updates, lambda known, rest: self._draw_known(server_round, known, rest)
        )

    def _draw_known(self, server_round: int, known: np.ndarray, num: int) -> np.ndarray:
        if known.size <= num:
            return known
        units = unit_rows(np.stack([self.updates[int(c)] for c in known]))

        def dist(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
            return angle_matrix(units[rows], units[cols])

        sizes = dict(self.sizes)
        if self.ctx is not None:
            sizes.update(self.ctx.data_sizes())
        shares = data_shares(known, sizes)
        z, leaf = ward_tree(dist, known.size, ward=self.ward, max_exact=self.max_exact, rng=self.rng)
        dists = algorithm2_distributions(z, leaf, shares, num, self.rng)
        log(DEBUG, "clustered round %d: %d distributions over %d clients", server_round, num, known.size)
        return known[draw_one_per_distribution(self.rng, dists, shares)]

    def summary(self) -> str:
        """Describe the part and its settings in one line (the run log and summary.json)."""
        return f"clustered(algorithm=2, distance=arccos, ward={self.ward}, sketch_dim={self.sketch.dim})"

    def state_dict(self) -> dict[str, Any]:
        """Return the state a checkpoint keeps (JSON/npz-friendly values)."""
        return {
            "rng": self.rng.bit_generator.state,
            "updates": {str(c): v.tolist() for c, v in self.updates.items()},
            "sizes": {str(c): n for c, n in self.sizes.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state that :meth:`state_dict` returned."""
        self.rng.bit_generator.state = state["rng"]
        self.updates = {int(c): np.asarray(v, dtype=np.float32) for c, v in state["updates"].items()}
        self.sizes = {int(c): int(n) for c, n in state["sizes"].items()}
