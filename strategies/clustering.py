"""Clustering and drawing kernels shared by the clustered client samplers.

Pure functions over arrays, used by HiCS-FL (:mod:`strategies.hics`: Ward clustering of
bias-update distances, Algorithm 1's distinct draws) and Clustered Sampling
(:mod:`strategies.clustered`: Fraboni, Vidal, Kameni & Lorenzi, "Clustered Sampling:
Low-Variance and Improved Representativity for Clients Selection in Federated
Learning", ICML 2021, https://arxiv.org/abs/2105.05883, Algorithm 2), which HiCS-FL also
falls back to when its estimates spread. Their own module so that neither sampler
imports the other.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

#: ``dist_fn(rows, cols)`` -> distances between items
DistanceFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


def unit_rows(v: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm; all-zero rows stay zero."""
    v = np.atleast_2d(np.asarray(v, dtype=np.float64))
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    return np.divide(v, norms, out=np.zeros_like(v), where=norms > 0)


def angle_matrix(ua: np.ndarray, ub: np.ndarray) -> np.ndarray:
    """``arccos(cos)`` between the unit rows of ``ua`` and ``ub`` (see :func:`unit_rows`),
    in ``[0, pi]``; a zero row is at ``pi/2`` from everything.
    """
    return np.arccos(np.clip(ua @ ub.T, -1.0, 1.0))


def condensed_distances(dist_fn: DistanceFn, n: int, block: int = 1024) -> np.ndarray:
    """Return the condensed (upper-triangle, row-major) distance vector of items ``0..n-1``,
    computed ``block`` rows at a time from ``dist_fn(rows, cols)`` (memory: the vector
    plus one ``block x n`` block).
    """
    out = np.empty(n * (n - 1) // 2, dtype=np.float64)
    pos = 0
    for a in range(0, n, block):
        b = min(n, a + block)
        d = dist_fn(np.arange(a, b), np.arange(a, n))
        for i in range(a, b):
            row = d[i - a, i - a + 1 :]
            out[pos : pos + row.size] = row
            pos += row.size
    return out


def ward_tree(
    dist_fn: DistanceFn,
    n: int,
    *,
    ward: str = "exact",
    max_exact: int = 1000,
    rng: Optional[np.random.Generator] = None,
    rows_as_features: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Ward's hierarchy over ``n`` items given by a distance function.

    Parameters
    ----------
    dist_fn : callable
        ``dist_fn(rows, cols)`` -> ``[len(rows), len(cols)]`` distances between items.
    n : int
        Number of items (>= 2).
    ward : {"exact", "scalable"}
        ``exact``: all items are leaves. ``scalable``: a random subsample of
        ``max_exact`` items are the leaves; the others join their nearest leaf.
    rng : numpy.random.Generator
        Draws the subsample (``scalable`` with ``n > max_exact`` only).
    rows_as_features : bool
        Give Ward the rows of the square matrix as Euclidean feature vectors (the
        authors' code) instead of the condensed distances.

    Returns
    -------
    Z : numpy.ndarray
        scipy linkage matrix over the leaves.
    leaf : numpy.ndarray
        For every item, the index of its leaf (``arange(n)`` when exact).
    """
    if ward == "scalable" and n > max_exact:
        if rng is None:
            raise ValueError("ward='scalable' needs a random generator to draw representatives")
        reps = np.sort(rng.choice(n, size=max_exact, replace=False))
        leaf = np.empty(n, dtype=np.int64)
        for a in range(0, n, 4096):
            rows = np.arange(a, min(n, a + 4096))
            leaf[rows] = np.argmin(dist_fn(rows, reps), axis=1)
        leaf[reps] = np.arange(max_exact)  # a representative is its own leaf, whatever the ties

        def rep_fn(r: np.ndarray, c: np.ndarray) -> np.ndarray:
            return dist_fn(reps[r], reps[c])

        return _linkage(rep_fn, max_exact, rows_as_features), leaf
    if ward not in ("exact", "scalable"):
        raise ValueError(f"ward = {ward!r}: must be exact or scalable")
    return _linkage(dist_fn, n, rows_as_features), np.arange(n)


def _linkage(dist_fn: DistanceFn, n: int, rows_as_features: bool) -> np.ndarray:
    from scipy.cluster.hierarchy import linkage  # here: its import is 0.3 s of every run's start-up

    if rows_as_features:
        everyone = np.arange(n)
        return linkage(dist_fn(everyone, everyone), "ward")
    return linkage(condensed_distances(dist_fn, n), "ward")


def ward_labels(
    dist_fn: DistanceFn,
    n: int,
    num_clusters: int,
    *,
    ward: str = "exact",
    max_exact: int = 1000,
    rng: Optional[np.random.Generator] = None,
    rows_as_features: bool = False,
) -> np.ndarray:
    """Ward clustering of ``n`` items into at most ``num_clusters`` groups.

    ``linkage(squareform(D), "ward")`` then ``fcluster(Z, num_clusters, "maxclust")``
    (see :func:`ward_tree` for ``ward``, ``rows_as_features``). Returns labels
    ``0..M'-1`` (M' <= num_clusters; ``arange(n)`` when ``n <= num_clusters``).
    """
    if n <= max(num_clusters, 1):
        return np.arange(n)
    if num_clusters <= 1:
        return np.zeros(n, dtype=np.int64)
    from scipy.cluster.hierarchy import fcluster

    z, leaf = ward_tree(dist_fn, n, ward=ward, max_exact=max_exact, rng=rng, rows_as_features=rows_as_features)
    labels = fcluster(z, t=num_clusters, criterion="maxclust")[leaf]
    return np.unique(labels, return_inverse=True)[1].astype(np.int64)


def draw_distinct(rng: np.random.Generator, q: np.ndarray, num: int) -> np.ndarray:
    """``num`` distinct indices from repeated independent draws with probabilities ``q``,
    duplicates ignored (Algorithm 1, lines 8-12).

    Ignoring repeats of an i.i.d. stream is the same as drawing each next index from
    ``q`` restricted to the indices not yet chosen and renormalised; that is what is done
    (no rejection loop, so a dominant exhausted cluster costs nothing). Indices with
    ``q = 0`` are drawn only when nothing else is left.
    """
    q = np.asarray(q, dtype=np.float64)
    num = min(num, q.size)
    free = np.ones(q.size, dtype=bool)
    chosen = np.empty(num, dtype=np.int64)
    for i in range(num):
        w = np.where(free, q, 0.0)
        total = w.sum()
        if total > 0:
            pick = int(rng.choice(q.size, p=w / total))
        else:  # only zero-probability items left: uniform among them
            pick = int(rng.choice(np.flatnonzero(free)))
        free[pick] = False
        chosen[i] = pick
    return chosen


def data_shares(clients: np.ndarray, sizes: dict[int, int]) -> np.ndarray:
    """``p_k`` of ``clients`` from reported sizes, renormalised over them; a client not
    yet reported counts with the mean reported size (all equal when none is known).
    """
    known = [sizes[int(c)] for c in clients if int(c) in sizes]
    default = float(np.mean(known)) if known else 1.0
    w = np.array([sizes.get(int(c), default) for c in clients], dtype=np.float64)
    w = np.maximum(w, 0.0)
    return w / w.sum() if w.sum() > 0 else np.full(len(clients), 1.0 / max(len(clients), 1))


# ---------------------------------------------------------------------------- Clustered Sampling, Algorithm 2
_TOL = 1e-9


def weight_capped_clusters(z: np.ndarray, leaf_weights: np.ndarray, cap: float = 1.0) -> np.ndarray:
    """Cut a hierarchy into its maximal subtrees of total weight <= ``cap``.

    Parameters
    ----------
    z : numpy.ndarray
        scipy linkage matrix over ``len(leaf_weights)`` leaves.
    leaf_weights : numpy.ndarray
        Non-negative weight of every leaf.

    Returns
    -------
    numpy.ndarray
        Cluster label ``0..C-1`` of every leaf. A leaf heavier than ``cap`` is a cluster
        of its own.
    """
    n = len(leaf_weights)
    parent = np.arange(n)

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    node_w = np.concatenate([np.asarray(leaf_weights, dtype=np.float64), np.zeros(max(n - 1, 0))])
    node_leaf = np.concatenate([np.arange(n), np.zeros(max(n - 1, 0), dtype=np.int64)])
    for i, (a, b) in enumerate(np.asarray(z)[:, :2].astype(np.int64)):
        node_w[n + i] = node_w[a] + node_w[b]
        node_leaf[n + i] = node_leaf[a]
        # weights grow up the tree: a light node's children are light and already joined
        if node_w[n + i] <= cap + _TOL:
            parent[find(node_leaf[b])] = find(node_leaf[a])
    roots = np.array([find(i) for i in range(n)])
    return np.unique(roots, return_inverse=True)[1].astype(np.int64)


def algorithm2_distributions(
    z: np.ndarray, leaf: np.ndarray, shares: np.ndarray, m: int, rng: np.random.Generator
) -> np.ndarray:
    """Fraboni et al.'s Algorithm 2: ``m`` sampling distributions over the clients.

    Parameters
    ----------
    z : numpy.ndarray
        Ward linkage over the leaves (clients, or representatives of them).
    leaf : numpy.ndarray
        Leaf index of every client.
    shares : numpy.ndarray
        Data shares of the clients (renormalised here).
    m : int
        Number of distributions (clients to draw).
    rng : numpy.random.Generator
        Shuffles the clients that are poured.

    Returns
    -------
    numpy.ndarray
        ``[m, n]``, each row a probability vector; column sums are ``m p_i``.
    """
    p = np.asarray(shares, dtype=np.float64)
    units = m * p / p.sum()  # client weights; the m distributions hold 1 each
    n_leaves = np.asarray(z).shape[0] + 1
    leaf_w = np.bincount(leaf, weights=units, minlength=n_leaves)
    cluster = weight_capped_clusters(z, leaf_w, 1.0)[leaf]
    cl_w = np.bincount(cluster, weights=units)
    order = np.argsort(cl_w, kind="stable")  # lightest first
    eligible = [int(c) for c in order if cl_w[c] <= 1.0 + _TOL]
    kept = eligible[max(len(eligible) - m, 0) :]
    out = np.zeros((m, p.size), dtype=np.float64)
    load = np.zeros(m, dtype=np.float64)
    for k, c in enumerate(kept):
        members = cluster == c
        out[k, members] = units[members]
        load[k] = cl_w[c]
    k = 0
    for c in order:
        if int(c) in kept:
            continue
        for i in rng.permutation(np.flatnonzero(cluster == c)):
            rest = units[i]
            while rest > _TOL:
                while k < m - 1 and load[k] >= 1.0 - _TOL:
                    k += 1
                take = rest if k == m - 1 else min(1.0 - load[k], rest)
                out[k, i] += take
                load[k] += take
                rest -= take
    sums = out.sum(axis=1, keepdims=True)
    return np.divide(out, sums, out=np.full_like(out, 1.0 / p.size), where=sums > 0)


def draw_one_per_distribution(rng: np.random.Generator, dists: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """One distinct client from each row of ``dists``: a row whose remaining support is
    empty draws among all remaining clients by ``shares``.
    """
    m, n = dists.shape
    free = np.ones(n, dtype=bool)
    chosen = np.empty(min(m, n), dtype=np.int64)
    for k in range(chosen.size):
        w = np.where(free, dists[k], 0.0)
        if w.sum() <= 0:
            w = np.where(free, np.asarray(shares, dtype=np.float64), 0.0)
        if w.sum() <= 0:
            w = free.astype(np.float64)
        pick = int(rng.choice(n, p=w / w.sum()))
        free[pick] = False
        chosen[k] = pick
    return chosen
