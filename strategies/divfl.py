"""DivFL: diverse client selection by greedy facility-location maximisation.

Method: Ravikumar Balakrishnan, Tian Li, Tianyi Zhou, Nageen Himayat, Virginia Smith and
Jeff Bilmes, "Diverse Client Selection for Federated Learning via Submodular
Maximization", ICLR 2022, https://openreview.net/forum?id=nwKXyFvaUm.

DivFL picks the K clients whose updates best represent the updates of all clients: with
``d(k, i) = ||g_k - g_i||`` the distance between the update proxies of clients k and i,
it maximises the facility-location function

    F(S) = sum_{k in V} max_{i in S} (C - d(k, i))      (C >= max d: F is monotone submodular)

over |S| = K by the greedy rule ``S <- S + argmax_j F(S + j) - F(S)``, which is within
(1 - 1/e) of the optimum. Since ``F(S) = |V| C - sum_k min_{i in S} d(k, i)``, the greedy
step is the one that most reduces the summed distance of every client to its nearest
chosen client (the paper's approximation error of the full gradient by the chosen
ones); with ``min`` over the empty set read as C, the first pick is the medoid
``argmin_j sum_k d(k, j)``, and no pick depends on C. That is what the code computes.

Proxies (``proxies``), the two settings of the paper:

- ``stale`` (default): a client's latest update (local model minus the global model it
  received) from the last round it trained; online clients that never trained are
  explored first (random order), as fedflex's other update-based samplers do. Costs
  nothing beyond the server's bookkeeping.
- ``ideal``: every online client computes its update on the current global model each
  round before the selection (the paper's "ideal" DivFL, the one HiCS-FL compares
  against). fedflex sends every online client a real train message with the current
  model (``RoundContext.probe``): plain local SGD with the round's training settings
  (``probe_steps`` > 0: that many local steps instead), not aggregated; the replies
  replace the proxies, then the K chosen clients train for real. Local rules and their
  client state are not involved in a probe (a probe is plain SGD, so SCAFFOLD's control
  variates do not move). The chosen clients train twice on the same model; with the
  same seed, round and settings their real update is the probe's (fedflex's batch order
  depends on seed, round and client), so the aggregated updates are the ones the
  selection saw, as in the paper. Cost: every online client trains every round (N + K
  local trainings instead of K).

Choices made here: the ground set V (the clients to represent) and the candidates are
the online clients with a proxy; offline clients keep their proxy for when they return.
Aggregation is not the sampler's business (the paper's experiments average the chosen
updates as FedAvg does; any aggregator can be combined). Proxies of P > ``sketch_dim``
numbers are stored as count sketches (:class:`strategies.clustered.CountSketch`:
``E[||Sx - Sy||^2] = ||x - y||^2``), so memory is ``N x sketch_dim`` floats.
Cost of the selection: the ``n x n`` distance matrix (float32, built block-wise from the
Gram matrix) and K greedy passes over it, O(n^2 (sketch_dim + K)) time and 4 n^2 bytes.
"""

from __future__ import annotations

from logging import DEBUG, WARNING
from typing import Any, Optional

import numpy as np
from flwr.common import log

from fedflex.arrays import flatten
from fedflex.options import DivFLOptions, resolve_options
from fedflex.strategies.baseline import explore_first
from fedflex.strategies.parts import Arrays, ClientUpdate, Sampler
from fedflex.strategies.sketch import CountSketch

#: where the update proxies come from
PROXIES = ("stale", "ideal")


# ---------------------------------------------------------------------------- kernels
def pairwise_distances(x: np.ndarray, block: int = 2048) -> np.ndarray:
    """Euclidean distances between the rows of ``x`` ([n, d]) as an [n, n] float32 matrix,
    from ``||a||^2 + ||b||^2 - 2 <a, b>`` in row blocks (negative round-off clipped to 0;
    the diagonal is 0).
    """
    x = np.asarray(x, dtype=np.float32)
    n = x.shape[0]
    sq = np.einsum("ij,ij->i", x, x)
    out = np.empty((n, n), dtype=np.float32)
    for a in range(0, n, block):
        b = min(n, a + block)
        d2 = sq[a:b, None] + sq[None, :] - 2.0 * (x[a:b] @ x.T)
        np.maximum(d2, 0.0, out=d2)
        out[a:b] = np.sqrt(d2)
        out[np.arange(a, b), np.arange(a, b)] = 0.0
    return out


def greedy_facility_location(dist: np.ndarray, k: int, block: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """Greedy maximisation of F(S) = sum_v max_{i in S} (C - dist[v, i]) over |S| = k.

    Parameters
    ----------
    dist
        [n, n] dissimilarities (row v: the client to represent, column j: the candidate).
    k
        How many to choose (at most n).

    Returns
    -------
    chosen : ndarray
        Column indices in the order the greedy picked them (ties: the lowest index).
    cost : ndarray
        After each pick, ``sum_v min_{i in S} dist[v, i]`` (F = n C - cost).

    The gain of j given S is ``sum_v max(0, m_v - dist[v, j])`` with ``m_v = min_{i in S}
    dist[v, i]`` (``+inf`` before the first pick, where the gain is ranked by
    ``-sum_v dist[v, j]``: the medoid). Columns are processed in blocks of ``block``.
    """
    dist = np.asarray(dist)
    n = dist.shape[0]
    k = min(int(k), n)
    nearest = np.full(n, np.inf, dtype=np.float64)
    chosen: list[int] = []
    costs: list[float] = []
    taken = np.zeros(n, dtype=bool)
    for _ in range(k):
        # score_j = sum_v min(m_v, dist[v, j]) = the cost after adding j (smaller is better);
        # the minimum in dist's precision, the sum in float64
        near = nearest.astype(dist.dtype)[:, None]
        score = np.empty(n, dtype=np.float64)
        for a in range(0, n, block):
            score[a : a + block] = np.minimum(near, dist[:, a : a + block]).sum(axis=0, dtype=np.float64)
        score[taken] = np.inf
        j = int(np.argmin(score))  # first minimum: lowest index on ties
        chosen.append(j)
        taken[j] = True
        nearest = np.minimum(nearest, dist[:, j])
        costs.append(float(nearest.sum()))
    return np.array(chosen, dtype=np.int64), np.array(costs, dtype=np.float64)


# ---------------------------------------------------------------------------- the part
class DivFLSampler(Sampler):
    """DivFL (see the module docstring).

    Parameters
    ----------
    seed : int
        Seed of the sampler's generator (exploration order) and of the sketch.
    proxies : {"stale", "ideal"}
        Latest update of each client, or a fresh update of every online client each round.
    probe_steps : int
        ``ideal`` only: local steps of a probe (0: the round's own local training).
    sketch_dim : int
        Size of the stored proxies when the model is larger.
    """

    name = "divfl"
    OPTIONS = DivFLOptions
    SEED_OFFSET = 15
    DP_NOTE = "DivFL samples by per-client update proxies (un-noised; 'ideal' proxies are extra TRAIN rounds)"

    def __init__(
        self, *, seed: int, options: Optional[DivFLOptions] = None, sketch_dim: int = 512, **fields: Any
    ) -> None:
        o = self.options = resolve_options(DivFLOptions, options, fields, "strategy.sampler.divfl")
        proxies, probe_steps = o.proxies, o.probe_steps
        if proxies == "stale" and probe_steps:
            log(WARNING, "divfl: probe_steps=%d has no effect with stale proxies (nothing is probed)", probe_steps)
        self.rng = np.random.default_rng(seed)
        self.sketch = CountSketch(sketch_dim, seed=seed + 7919)
        self.proxies = proxies
        self.probe_steps = probe_steps
        self.updates: dict[int, np.ndarray] = {}
        self._last: dict[str, Any] = {}

    def _store(self, updates: list[ClientUpdate], global_arrays: Arrays) -> None:
        g = flatten(global_arrays)
        for u in updates:
            self.updates[u.client] = self.sketch(flatten(u.arrays) - g)

    def observe(self, server_round: int, updates: list[ClientUpdate], global_arrays: Arrays) -> None:
        """Learn from the round's replies (data sizes, update statistics)."""
        self._store(updates, global_arrays)

    def sample(self, server_round: int, online: np.ndarray, num: int) -> np.ndarray:
        """Choose at most ``num`` of the ``online`` clients to train in ``server_round``."""
        online = np.asarray(online, dtype=np.int64)
        num = min(int(num), len(online))
        self._last = {}
        if num == 0:
            return np.zeros(0, dtype=np.int64)
        if self.proxies == "ideal" and num < len(online):
            self._probe(server_round, online)
        return explore_first(
            self.rng, online, num, self.updates, lambda known, rest: self._select(server_round, known, rest)
        )

    def _probe(self, server_round: int, online: np.ndarray) -> None:
        if self.ctx is None:
            raise RuntimeError("divfl with ideal proxies needs the strategy's context (bind the sampler first)")
        arrays = self.ctx.global_arrays
        replies = self.ctx.probe(server_round, online, arrays, steps=self.probe_steps)
        if len(replies) < len(online):
            log(
                WARNING,
                "divfl round %d: %d of %d online clients answered the probe",
                server_round,
                len(replies),
                len(online),
            )
        self._store(replies, arrays)
        self._last["divfl_probed"] = len(replies)

    def _select(self, server_round: int, known: np.ndarray, num: int) -> np.ndarray:
        if known.size <= num:
            return known
        dist = pairwise_distances(np.stack([self.updates[int(c)] for c in known]))
        picks, costs = greedy_facility_location(dist, num)
        # mean distance of a represented client to its nearest chosen one (the paper's
        # approximation error, per client)
        self._last["divfl_mean_distance"] = float(costs[-1] / known.size)
        log(DEBUG, "divfl round %d: chose %s of %d", server_round, known[picks].tolist(), known.size)
        return known[picks]

    def round_metrics(self) -> dict[str, Any]:
        """``divfl_mean_distance``: mean distance from a represented client's proxy to the
        nearest chosen one (how well the K chosen cover the rest); ``divfl_probed``
        (ideal): how many online clients answered the probe.
        """
        return dict(self._last)

    def summary(self) -> str:
        """Describe the part and its settings in one line (the run log and summary.json)."""
        probe = f", probe_steps={self.probe_steps or 'round'}" if self.proxies == "ideal" else ""
        return f"divfl(proxies={self.proxies}{probe}, sketch_dim={self.sketch.dim})"

    def state_dict(self) -> dict[str, Any]:
        """Return the state a checkpoint keeps (JSON/npz-friendly values)."""
        return {"rng": self.rng.bit_generator.state, "updates": {str(c): v.tolist() for c, v in self.updates.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state that :meth:`state_dict` returned."""
        self.rng.bit_generator.state = state["rng"]
        self.updates = {int(c): np.asarray(v, dtype=np.float32) for c, v in state["updates"].items()}
