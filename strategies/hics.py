"""HiCS-FL: heterogeneity-guided client sampling.

Method: Huancheng Chen and Haris Vikalo, "Heterogeneity-Guided Client Sampling: Towards
Fast and Efficient Non-IID Federated Learning", NeurIPS 2024,
https://arxiv.org/abs/2310.00198 (the reading: docs/hics-fl.md).

The server estimates how balanced a client's labels are from the update of the output
layer's bias alone, ``db_k = b_local - b_global`` (local minus global):

    H_k = H(softmax(db_k / T))                                   (natural log, Eq. 7)

(fedflex's default takes it of the unit vector ``db_k / ||db_k||`` at T = 0.2 instead,
``estimate="unit"``: the size of ``db_k`` shrinks as the model fits a client, so the
paper's estimate stops ranking the clients after a few rounds; ``estimate="bias"`` is
the paper's; see :func:`scaled_update` and docs/hics-fl.md)

groups the clients with the distance (Eq. 9)

    dist(u, k) = arccos(cos(db_u, db_k)) + lambda |H_u - H_k|

into M clusters (Ward), draws a cluster m with probability
``pi_m = softmax(gamma_t Hbar)_m`` (``Hbar_m`` the cluster's mean estimate,
``gamma_t = gamma_0 (1 - t / T_rounds)``) and a client inside it with probability
``p_k / sum_{j in G_m} p_j`` (``p`` the data shares), until K distinct clients are
chosen (Eq. 10, Algorithm 1). The first ``ceil(N / K)`` rounds are a warm-up that visits
every client once (random order, without replacement).

How the distance reaches Ward
-----------------------------
Ward's criterion is defined for Euclidean points; Eq. 9 is a metric (a sum of two
metrics) but in general not a Euclidean one. We give scipy's ``linkage`` the condensed
matrix of Eq. 9 (``linkage(squareform(D), "ward")``): scipy then runs the Lance-Williams
recurrence with Ward's coefficients on these dissimilarities, i.e. it merges as if the
distances were Euclidean (R's ``ward.D2``). The result is a well-defined, monotone
hierarchy (Ward's coefficients satisfy the Lance-Williams monotonicity conditions) that
is exactly Ward's where D happens to be Euclidean; ``fcluster(Z, M, "maxclust")`` cuts it
into (at most) M clusters. The authors' code instead feeds the rows of the square
matrix to Ward as feature vectors (``variant="authors"``).

Scalability
-----------
``ward="exact"`` clusters all n candidate clients: O(n^2) time and memory for the
condensed matrix (built block-wise, so peak memory is about two condensed matrices).
``ward="scalable"`` runs exact Ward on a random subsample of ``max_exact`` clients (the
representatives, drawn by the sampler's generator) and puts every other client in the
cluster of its nearest representative under the same distance (1-nearest neighbour):
O(n * max_exact) time and memory. With ``n <= max_exact`` both are the same. The
per-round cost depends on N and C (classes), never on the model size: only output-layer
biases are kept.

Churn
-----
Only online clients can be drawn. A client has an estimate once it has trained; the
clusters are formed over the online clients that have one. Online clients without an
estimate (newly arrived, failed so far, or dropped) are explored first, in random order,
before the rule fills the remaining slots; with ``explore_tries`` T, a client drawn T
times without ever replying (a straggler past every deadline, a node that always fails)
is no longer drawn, where it would otherwise take an exploration slot every round.
``departed="keep"`` keeps the estimates of clients that go offline (a returning client
rejoins the clusters with its last estimate); ``"drop"`` forgets them (a returning client
is explored again). The warm-up visits the online clients it has not visited yet; the
last warm-up round may have fewer than K clients (Algorithm 1, ``min(K, |S_0|)``).

``variant="authors"`` follows the authors' public code (github.com/CityChan/HiCS-FL,
``server/server_hics.py``) where it differs from the paper: entropy from the row means
of the output *weight* update ``dW`` instead of ``db``; angle between the concatenated
``[dW, db]``; the rows of the square distance matrix as Ward's features; uniform
sampling inside a cluster (cluster counts capped at the cluster size); estimates frozen
after the warm-up (a client's first estimate is kept); and, when the variance of the
estimates is >= 0.1, Clustered Sampling's Algorithm 2 (one client per weight-balanced
distribution, :mod:`strategies.clustered`) instead of the entropy rule. The authors'
SGD momentum 0.9 and weight decay 5e-4 are client settings (``client.momentum``,
``client.weight_decay``).
"""

from __future__ import annotations

import math
from logging import DEBUG
from typing import Any, Optional, cast

import numpy as np
from flwr.common import log

from fedflex import keys
from fedflex.options import HICS_ESTIMATES, HiCSOptions, MethodOptions, resolve_options
from fedflex.strategies.baseline import explore_first
from fedflex.strategies.clustering import (
    algorithm2_distributions,
    angle_matrix,
    data_shares,
    draw_distinct,
    draw_one_per_distribution,
    unit_rows,
    ward_labels,
    ward_tree,
)
from fedflex.strategies.parts import Arrays, ClientUpdate, Federation, Sampler

#: ``variant="authors"``: the entropy rule runs only below this variance of the estimates
AUTHORS_VARIANCE_THRESHOLD = 0.1


# ---------------------------------------------------------------------------- estimate
def softmax(x: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """``softmax(x / temperature)`` over the last axis (max-shifted, so no overflow)."""
    z = np.asarray(x, dtype=np.float64) / temperature
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def entropy(p: np.ndarray) -> np.ndarray:
    """Natural-log entropy of probability vectors (last axis), with ``0 log 0 = 0``."""
    p = np.asarray(p, dtype=np.float64)
    logp = np.log(p, out=np.zeros_like(p), where=p > 0)
    return 0.0 - (p * logp).sum(axis=-1)


def estimate_entropy(db: np.ndarray, temperature: float) -> np.ndarray:
    """HiCS-FL's heterogeneity estimate ``H(softmax(db / T))`` (Eq. 7).

    Parameters
    ----------
    db : numpy.ndarray
        Output-layer bias update(s), local minus global: ``[C]`` or ``[n, C]``.
    temperature : float
        T > 0. It must match the scale of ``db`` (learning rate x local steps): with T
        far above ``|db|`` every estimate is ``ln C``, far below it every estimate is 0.

    Returns
    -------
    numpy.ndarray
        One entropy per row in ``[0, ln C]`` (0-d for one vector). Higher means more
        balanced labels.
    """
    return entropy(softmax(db, temperature))


#: unset ``temperature``: the default T of each estimate (docs/hics-fl.md, "Scale-free
#: estimates": the paper's T for ``bias``; measured on FMNIST for the other two)


def scaled_update(db: np.ndarray, estimate: str, lr: float = 1.0, steps: int = 1) -> np.ndarray:
    """Return the vector HiCS-FL's entropy is taken of, for ``estimate``.

    - ``bias``: ``db`` itself (the paper). Its size is lr x steps x (label share -
      predicted probability), so T must follow lr and steps, and as the global model
      fits a client its update shrinks and looks balanced.
    - ``unit``: ``db / ||db||``: only the direction; scale-free (a zero update stays zero).
    - ``per-step``: ``db / (lr x steps)``: per unit of learning rate and local step, about
      (label share - mean predicted probability); free of lr and steps, not of the fit.
      ``lr`` is the one the clients trained with in the round (a ``client.lr_schedule``
      followed).
    """
    db = np.asarray(db, dtype=np.float64)
    if estimate == "bias":
        return db
    if estimate == "unit":
        return unit_rows(db).reshape(db.shape)
    if estimate == "per-step":
        return db / (lr * max(int(steps), 1))
    raise ValueError(f"hics estimate {estimate!r}: must be one of {', '.join(HICS_ESTIMATES)}")


def hics_distance(
    db_a: np.ndarray, h_a: np.ndarray, db_b: np.ndarray, h_b: np.ndarray, hics_lambda: float
) -> np.ndarray:
    """Eq. 9 between every row of ``db_a`` and every row of ``db_b``:
    ``arccos(cos(db_u, db_k)) + lambda |H_u - H_k|``, shape ``[len(a), len(b)]``.
    """
    h_a, h_b = np.atleast_1d(h_a), np.atleast_1d(h_b)
    return angle_matrix(unit_rows(db_a), unit_rows(db_b)) + hics_lambda * np.abs(h_a[:, None] - h_b[None, :])


# ---------------------------------------------------------------------------- sampling rule
def gamma_schedule(server_round: int, rounds: int, gamma0: float) -> float:
    """``gamma_t = gamma_0 (1 - t / T)``, floored at 0 (t past T: uniform clusters)."""
    return gamma0 * max(0.0, 1.0 - server_round / rounds)


def cluster_mean(values: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per-cluster mean of ``values`` (clusters ``0..labels.max()``)."""
    counts = np.bincount(labels)
    return np.bincount(labels, weights=values) / np.maximum(counts, 1)


def cluster_probabilities(mean_entropy: np.ndarray, gamma: float) -> np.ndarray:
    """``pi = softmax(gamma * Hbar)`` (Eq. 10, left)."""
    return softmax(gamma * np.asarray(mean_entropy, dtype=np.float64))


def client_probabilities(labels: np.ndarray, pi: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """Probability that one draw of Algorithm 1 (cluster m ~ pi, then client k in G_m
    with ``p_k / sum_{G_m} p_j``) yields client k: ``pi_{m(k)} p_k / P_{m(k)}``.
    """
    shares = np.asarray(shares, dtype=np.float64)
    mass = np.bincount(labels, weights=shares)
    return pi[labels] * shares / mass[labels]


def _draw_cluster_counts_uniform(rng: np.random.Generator, labels: np.ndarray, pi: np.ndarray, num: int) -> np.ndarray:
    """Return the authors' draw: ``num`` cluster picks ~ pi, a full cluster is redrawn; then
    the picked number of clients uniformly without replacement inside each cluster.
    """
    sizes = np.bincount(labels, minlength=pi.size)
    counts = np.zeros_like(sizes)
    for _ in range(min(num, labels.size)):
        w = np.where(counts < sizes, pi, 0.0)
        counts[rng.choice(pi.size, p=w / w.sum())] += 1
    picks = [rng.choice(np.flatnonzero(labels == m), size=c, replace=False) for m, c in enumerate(counts) if c]
    return np.concatenate(picks).astype(np.int64) if picks else np.zeros(0, dtype=np.int64)


# ---------------------------------------------------------------------------- the part
class HiCSSampler(Sampler):
    """HiCS-FL client sampling (see the module docstring for the rule and its choices).

    Parameters
    ----------
    bias_key : str
        State-dict key of the classification layer's bias (``ModelInfo.output_bias_key``).
    num_clients : int
        N (the warm-up lasts ``ceil(N / K)`` rounds).
    rounds : int
        T of the annealing ``gamma_t = gamma_0 (1 - t / T)`` (the scenario's rounds).
    seed : int
        Seed of the sampler's own generator.
    options : HiCSOptions
        The method's options (:class:`fedflex.options.HiCSOptions`: temperature,
        estimate, refresh, entropy_weight, gamma0, num_clusters, departed, variant, ward);
        or give its fields as keywords.
    max_exact : int
        Ward ``scalable``: clustered exactly up to this many clients.
    lr : float
        The client learning rate when no strategy tells the round's (``per-step``
        divides by lr x steps; bound to a strategy, the lr of :attr:`RoundContext.facts`).
    """

    name = "hics"
    OPTIONS = HiCSOptions
    SEED_OFFSET = 11
    DP_NOTE = (
        "HiCS-FL's sampler estimates each client's label entropy from its clipped, un-noised "
        "output-layer bias update and samples by it"
    )

    @classmethod
    def build(cls, options: Optional[MethodOptions], federation: Federation) -> "HiCSSampler":
        """Return the sampler for ``federation`` (its N, T, lr and the model's output-layer bias)."""
        return cls(
            options=cast(Optional[HiCSOptions], options),
            bias_key=federation.model.output_bias_key,
            num_clients=federation.num_clients,
            rounds=federation.rounds,
            seed=federation.seed_of(cls),
            lr=federation.lr,
        )

    def __init__(
        self,
        *,
        bias_key: Optional[str],
        num_clients: int,
        rounds: int,
        seed: int,
        options: Optional[HiCSOptions] = None,
        max_exact: int = 1000,
        lr: float = 1.0,
        **fields: Any,
    ) -> None:
        if not bias_key:
            raise ValueError(
                "the hics sampler needs the state-dict key of the model's output-layer bias "
                "(ModelInfo.output_bias_key); this model has none"
            )
        o = self.options = resolve_options(HiCSOptions, options, fields, "strategy.sampler.hics")
        self.bias_key = bias_key
        self.weight_key = bias_key[: -len("bias")] + "weight" if bias_key.endswith("bias") else None
        self.num_clients = num_clients
        self.rounds = rounds
        self.estimate = o.resolved_estimate()
        self.temperature = o.resolved_temperature()
        self.hics_lambda = o.entropy_weight
        self.gamma0 = o.gamma0
        self.num_clusters = o.num_clusters
        self.departed = o.departed
        self.variant = o.variant
        self.ward = o.ward
        self.max_exact = max_exact
        self.refresh = o.resolved_refresh()
        self.lr = lr
        self.rng = np.random.default_rng(seed)
        self.entropies: dict[int, float] = {}  # latest estimate H_k
        self.vectors: dict[int, np.ndarray] = {}  # what the angle is taken on (db_k; authors: [dW, db])
        self.visited: set[int] = set()  # sampled during the warm-up
        self.explore_tries = o.explore_tries
        self.tries: dict[int, int] = {}  # times drawn without an estimate (explore_tries)
        self.sizes: dict[int, int] = {}
        self.k: Optional[int] = None  # clients per round, learnt from the first sample() call
        self._last: dict[str, Any] = {}  # this round's decision and estimates (round_metrics)

    # ------------------------------------------------------------------ rounds
    @property
    def warmup_rounds(self) -> int:
        """``ceil(N / K)`` (0 before the first round)."""
        return math.ceil(self.num_clients / self.k) if self.k else 0

    def sample(self, server_round: int, online: np.ndarray, num: int) -> np.ndarray:
        """Choose at most ``num`` of the ``online`` clients to train in ``server_round``."""
        online = np.asarray(online, dtype=np.int64)
        if self.k is None:
            self.k = max(int(num), 1)
        num = min(int(num), len(online))
        if num == 0:
            return np.zeros(0, dtype=np.int64)
        self._forget_departed(online)
        self._last = {}
        if self.explore_tries is not None:  # clients that never replied in explore_tries draws: no longer drawn
            online = np.array(
                [c for c in online if int(c) in self.entropies or self.tries.get(int(c), 0) < self.explore_tries],
                dtype=np.int64,
            )
            num = min(num, len(online))
        chosen = self._choose(server_round, online, num)
        for c in chosen:
            if int(c) not in self.entropies:
                self.tries[int(c)] = self.tries.get(int(c), 0) + 1
        return chosen

    def _choose(self, server_round: int, online: np.ndarray, num: int) -> np.ndarray:
        """Return the warm-up's unvisited clients, or the unexplored ones first and the rule for the rest."""
        if server_round <= self.warmup_rounds:
            pool = np.array([c for c in online if int(c) not in self.visited], dtype=np.int64)
            if pool.size:
                picks = self.rng.choice(pool, size=min(num, pool.size), replace=False)
                self.visited.update(int(c) for c in picks)
                self._last["hics_rule"] = "warmup"
                return np.sort(picks).astype(np.int64)
        chosen = explore_first(
            self.rng, online, num, self.entropies, lambda known, rest: self._draw_known(server_round, known, rest)
        )
        self._last["hics_explored"] = int(sum(int(c) not in self.entropies for c in chosen))
        self._last.setdefault("hics_rule", "explore")
        return chosen

    def observe(self, server_round: int, updates: list[ClientUpdate], global_arrays: Arrays) -> None:
        """Learn from the round's replies (data sizes, update statistics)."""
        for u in updates:
            self.sizes[u.client] = u.num_examples
            frozen = self.refresh == "frozen" and server_round > self.warmup_rounds
            if frozen and u.client in self.entropies:
                continue  # estimates frozen after the warm-up (the authors' code)
            steps = int(u.metrics.get(keys.NUM_STEPS, 1) or 1)
            self.entropies[u.client], self.vectors[u.client] = self._estimate(u.arrays, global_arrays, steps)
        # the estimate each trained client now carries (frozen ones included)
        self._last["hics_entropy"] = {str(u.client): round(self.entropies[u.client], 5) for u in updates}

    def _estimate(self, arrays: Arrays, global_arrays: Arrays, steps: int = 1) -> tuple[float, np.ndarray]:
        db = np.asarray(arrays[self.bias_key], dtype=np.float64) - np.asarray(
            global_arrays[self.bias_key], dtype=np.float64
        )
        if self.variant == "paper":
            h = float(
                estimate_entropy(scaled_update(db, self.estimate, self.round_lr(self.lr), steps), self.temperature)
            )
            return h, db.astype(np.float32)
        if self.weight_key is None or self.weight_key not in arrays:
            raise ValueError(f"hics variant=authors needs the output-layer weight {self.weight_key!r} in the model")
        dw = np.asarray(arrays[self.weight_key], dtype=np.float64) - np.asarray(
            global_arrays[self.weight_key], dtype=np.float64
        )
        dw = dw.reshape(dw.shape[0], -1)
        h = float(
            estimate_entropy(
                scaled_update(dw.mean(axis=1), self.estimate, self.round_lr(self.lr), steps), self.temperature
            )
        )
        return h, np.concatenate([dw.ravel(), db]).astype(np.float32)

    def _forget_departed(self, online: np.ndarray) -> None:
        if self.departed != "drop":
            return
        here = set(int(c) for c in online)
        gone = [c for c in self.entropies if c not in here]
        for c in gone:
            del self.entropies[c], self.vectors[c]
        if gone:
            log(DEBUG, "hics: dropped the estimates of %d departed client(s)", len(gone))

    # ------------------------------------------------------------------ the rule
    def _draw_known(self, server_round: int, known: np.ndarray, num: int) -> np.ndarray:
        """``num`` distinct clients among ``known`` (all have estimates) by the rule."""
        if known.size <= num:
            self._last["hics_rule"] = "all"
            return known
        h = np.array([self.entropies[int(c)] for c in known])
        units = unit_rows(np.stack([self.vectors[int(c)] for c in known]))
        lam = self.hics_lambda

        def dist(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
            return angle_matrix(units[rows], units[cols]) + lam * np.abs(h[rows, None] - h[None, cols])

        m = self.num_clusters or self.k or num
        sizes = dict(self.sizes)
        if self.ctx is not None:
            sizes.update(self.ctx.data_sizes())
        shares = data_shares(known, sizes)
        authors = self.variant == "authors"
        if authors and float(np.var(h)) >= AUTHORS_VARIANCE_THRESHOLD:
            z, leaf = ward_tree(
                dist, known.size, ward=self.ward, max_exact=self.max_exact, rng=self.rng, rows_as_features=True
            )
            dists = algorithm2_distributions(z, leaf, shares, num, self.rng)
            log(
                DEBUG,
                "hics round %d: estimate variance %.3f >= %.1f, clustered sampling",
                server_round,
                np.var(h),
                AUTHORS_VARIANCE_THRESHOLD,
            )
            self._last.update(hics_rule="clustered", hics_entropy_var=round(float(np.var(h)), 5))
            return known[draw_one_per_distribution(self.rng, dists, shares)]
        labels = ward_labels(
            dist, known.size, m, ward=self.ward, max_exact=self.max_exact, rng=self.rng, rows_as_features=authors
        )
        gamma = gamma_schedule(server_round, self.rounds, self.gamma0)
        hbar = cluster_mean(h, labels)
        pi = cluster_probabilities(hbar, gamma)
        log(
            DEBUG,
            "hics round %d: %d clusters, gamma %.3f, mean entropies %s, pi %s",
            server_round,
            pi.size,
            gamma,
            np.round(hbar, 3).tolist(),
            np.round(pi, 3).tolist(),
        )
        self._last.update(
            hics_rule="entropy",
            hics_gamma=round(gamma, 5),
            hics_cluster_entropy=np.round(hbar, 5).tolist(),
            hics_cluster_prob=np.round(pi, 5).tolist(),
        )
        if authors:
            return known[_draw_cluster_counts_uniform(self.rng, labels, pi, num)]
        return known[draw_distinct(self.rng, client_probabilities(labels, pi, shares), num)]

    # ------------------------------------------------------------------ part surface
    def round_metrics(self) -> dict[str, Any]:
        """``hics_rule`` (warmup / explore / entropy / clustered / all: what drew the
        round), ``hics_explored`` (clients without an estimate taken first),
        ``hics_entropy`` (client -> its estimate after this round), and for the entropy
        rule ``hics_gamma``, ``hics_cluster_entropy`` and ``hics_cluster_prob`` (Hbar_m,
        pi_m); for the authors' fallback ``hics_entropy_var``.
        """
        out, self._last = self._last, {}
        return out

    def summary(self) -> str:
        """Describe the part and its settings in one line (the run log and summary.json)."""
        return (
            f"hics(T={self.temperature}, lambda={self.hics_lambda}, gamma0={self.gamma0}, "
            f"M={self.num_clusters or 'K'}, rounds={self.rounds}, departed={self.departed}, "
            f"variant={self.variant}, ward={self.ward}, estimate={self.estimate}, refresh={self.refresh})"
        )

    def state_dict(self) -> dict[str, Any]:
        """Return the state a checkpoint keeps (JSON/npz-friendly values)."""
        return {
            "rng": self.rng.bit_generator.state,
            "entropies": {str(c): h for c, h in self.entropies.items()},
            "vectors": {str(c): v.tolist() for c, v in self.vectors.items()},
            "visited": sorted(self.visited),
            "tries": {str(c): n for c, n in self.tries.items()},
            "sizes": {str(c): n for c, n in self.sizes.items()},
            "k": self.k,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state that :meth:`state_dict` returned."""
        self.rng.bit_generator.state = state["rng"]
        self.entropies = {int(c): float(h) for c, h in state["entropies"].items()}
        self.vectors = {int(c): np.asarray(v, dtype=np.float32) for c, v in state["vectors"].items()}
        self.visited = {int(c) for c in state["visited"]}
        self.tries = {int(c): int(n) for c, n in state.get("tries", {}).items()}  # absent before explore_tries
        self.sizes = {int(c): int(n) for c, n in state["sizes"].items()}
        self.k = state["k"]
