"""Label-skewed splits drawn from Dirichlet shares: ``dirichlet`` (Hsu, Qi & Brown 2019,
arXiv:1909.06335) and HiCS-FL's ``mixed-dirichlet`` (Chen & Vikalo, arXiv:2310.00198,
Appendix A.10), and the count helpers the label-set patterns reuse.
"""

from __future__ import annotations

import logging
import warnings
from typing import Sequence

import numpy as np

from fedflex.partition.common import check_enough, child_seeds, class_pools, hf_dataset, load_all, materialise

logger = logging.getLogger(__name__)


def dirichlet_partition(
    labels: np.ndarray, num_clients: int, alpha: float, seed: int, min_size: int = 1
) -> list[np.ndarray]:
    """Per-label Dirichlet split (Hsu et al. 2019): label k's examples are cut over the
    clients in proportions ~ Dirichlet(alpha * 1); small alpha = few labels per client.

    Uses flwr-datasets' ``DirichletPartitioner`` (``self_balancing=False``) on a seeded
    permutation of the examples (it cuts each label in index order, so the permutation
    makes which examples go where random too). It redraws while a client has fewer than
    ``min_size`` examples and gives up after 10 draws; that is the normal outcome for
    tiny alpha (0.001: each label lands on one client, so with 10 labels and 10 clients
    some client is empty almost surely). Then the same per-label split is drawn here and
    repaired: a client under ``min_size`` receives half of the largest label block of the
    largest client (see :func:`_repair_min_size`), so it still holds about one label.
    """
    y = np.asarray(labels)
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    if min_size < 0:
        raise ValueError(f"min_size must be >= 0, got {min_size}")
    check_enough(len(y), num_clients, max(min_size, 1))
    from flwr_datasets.partitioner import DirichletPartitioner

    s_perm, s_flwr, s_own = child_seeds(seed, 3)
    perm = np.random.default_rng(s_perm).permutation(len(y))
    partitioner = DirichletPartitioner(
        num_partitions=num_clients,
        partition_by="label",
        alpha=float(alpha),
        min_partition_size=int(min_size),
        self_balancing=False,
        shuffle=False,
        seed=s_flwr,
    )
    partitioner.dataset = hf_dataset(y, perm)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # one warning per failed redraw
            return load_all(partitioner, num_clients)
    except ValueError as exc:
        logger.info(
            "DirichletPartitioner(alpha=%g) could not give every client %d examples (%s); "
            "drawing the per-label split here and repairing it",
            alpha,
            min_size,
            exc,
        )
    rng = np.random.default_rng(s_own)
    by_class = class_pools(y, perm)
    counts = _dirichlet_counts(np.array([len(p) for p in by_class]), num_clients, alpha, rng, max(min_size, 1))
    return materialise(by_class, counts)


def mixed_dirichlet_partition(
    labels: np.ndarray,
    num_clients: int,
    alphas: Sequence[float],
    seed: int,
    min_size: int = 1,
) -> list[np.ndarray]:
    """HiCS-FL's mixed heterogeneity (arXiv:2310.00198, Appendix A.10).

    The training set is cut at random into ``G = len(alphas)`` equal parts; part g is
    split over clients ``g*m .. (g+1)*m - 1`` (``m = num_clients / G``) by the paper's
    rule: label i's examples of the part go to the group's clients in proportions
    ``X_i ~ Dirichlet(alphas[g])``. The paper says it follows the strategy of its
    reference [35], Yurochkin et al. 2019 (PFNM), whose partition code also balances:
    a client already holding the average size gets no share of the next labels. That is
    done here (flwr-datasets' ``self_balancing`` is the same idea, but its
    redraw-then-fail loop cannot serve tiny alphas): with alpha = 0.001 each label lands
    on one client that is not yet full, so a group of 10 clients over 10 labels gives
    about one label per client. Redrawn up to 10 times while a client has fewer than
    ``max(min_size, 1)`` examples (PFNM redraws until 10), then a client still under it
    receives half of the largest label block of the group's largest client
    (:func:`_repair_min_size`), so every client has at least one example. Tiny alphas
    can leave a client a few stray examples of a second label (the floor of a share of
    1e-3); raise ``min_size`` (PFNM: 10) to keep clients from being that small.
    """
    y = np.asarray(labels)
    alphas = [float(a) for a in alphas]
    if not alphas:
        raise ValueError("mixed-dirichlet needs at least one alpha")
    if any(not a > 0 for a in alphas):
        raise ValueError(f"alphas must all be > 0, got {alphas}")
    if min_size < 0:
        raise ValueError(f"min_size must be >= 0, got {min_size}")
    groups = len(alphas)
    if num_clients < groups or num_clients % groups:
        raise ValueError(
            f"num_clients = {num_clients}: mixed-dirichlet needs a positive multiple of len(alphas) = {groups}"
        )
    per_group = num_clients // groups
    need = max(min_size, 1)
    check_enough(len(y), num_clients, need)
    rng = np.random.default_rng(child_seeds(seed, 1)[0])
    parts = np.array_split(rng.permutation(len(y)), groups)
    indices: list[np.ndarray] = []
    for g, (alpha, part) in enumerate(zip(alphas, parts)):
        if len(part) < per_group * need:
            raise ValueError(
                f"mixed-dirichlet: part {g} has {len(part)} examples, fewer than {per_group} clients x {need}"
            )
        by_class = class_pools(y, part)
        counts = _dirichlet_counts(np.array([len(p) for p in by_class]), per_group, alpha, rng, need, balance=True)
        indices.extend(materialise(by_class, counts))
    return indices


def _dirichlet_shares(rng: np.random.Generator, alpha: float, n: int) -> np.ndarray:
    p = rng.dirichlet(np.full(n, float(alpha)))
    if not np.all(np.isfinite(p)) or p.sum() <= 0:  # underflow guard for tiny alpha
        p = np.zeros(n)
        p[rng.integers(n)] = 1.0
    return p


def _dirichlet_counts(
    class_sizes: np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    min_size: int,
    balance: bool = False,
    attempts: int = 10,
) -> np.ndarray:
    """``[num_clients, C]`` counts: label c cut in proportions ~ Dirichlet(alpha).

    Labels are taken in order 0..C-1; the cut points are ``floor(cumsum(p) * n_c)`` as in
    flwr-datasets and Yurochkin et al.'s code. ``balance``: as in that code, a client that
    already holds the average size or more gets no share of the next labels (when the
    draw puts all mass on such clients, which tiny alpha does, the share is redrawn over
    the others). Redrawn up to ``attempts`` times while a client has fewer than
    ``min_size`` examples, then repaired (:func:`_repair_min_size`).
    """
    counts = np.zeros((num_clients, len(class_sizes)), dtype=np.int64)
    average = class_sizes.sum() / num_clients
    for _ in range(attempts):
        sizes = np.zeros(num_clients, dtype=np.int64)
        for c, size in enumerate(class_sizes):
            p = _dirichlet_shares(rng, alpha, num_clients)
            if balance:
                eligible = sizes < average
                if not eligible.any():
                    eligible[:] = True
                p = p * eligible
                if not p.sum() > 0:  # all mass on full clients (tiny alpha): redraw over the rest
                    p = np.zeros(num_clients)
                    p[eligible] = _dirichlet_shares(rng, alpha, int(eligible.sum()))
                p = p / p.sum()
            bounds = np.minimum((np.cumsum(p)[:-1] * size).astype(np.int64), size)
            counts[:, c] = np.diff(np.concatenate([[0], bounds, [size]]))
            sizes += counts[:, c]
        if sizes.min() >= min_size:
            return counts
    logger.debug(
        "Dirichlet(%g): %d draws left a client under %d examples; repairing",
        alpha,
        attempts,
        min_size,
    )
    return _repair_min_size(counts, min_size)


def _repair_min_size(counts: np.ndarray, min_size: int) -> np.ndarray:
    """Move examples until every client has ``min_size``, keeping label structure.

    The smallest client takes from the largest one's most frequent label: half of that
    block, or what it lacks if that is more, never leaving the donor under ``min_size``.
    Deterministic given ``counts``.
    """
    counts = counts.copy()
    sizes = counts.sum(axis=1)
    while sizes.min() < min_size:
        r, d = int(np.argmin(sizes)), int(np.argmax(sizes))
        spare = int(sizes[d]) - min_size
        if r == d or spare <= 0:
            raise ValueError(f"cannot give each of {len(sizes)} clients {min_size} examples")
        label = int(np.argmax(counts[d]))
        block = int(counts[d, label])
        take = min(max(min_size - int(sizes[r]), block // 2), block, spare)
        counts[d, label] -= take
        counts[r, label] += take
        sizes[d] -= take
        sizes[r] += take
    return counts


def quota_dirichlet_counts(
    pool_sizes: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator
) -> np.ndarray:
    """Equal quotas, per-client label priors ~ Dirichlet(alpha) (v2 authors' in-session split).

    Client k fills its quota by multinomial draws from its prior restricted to labels
    with examples left (uniform over those when the prior has no mass there), the
    clients in order; every example of the pools is used.
    """
    avail = pool_sizes.astype(np.int64).copy()
    num_labels = len(avail)
    quotas = np.array([len(q) for q in np.array_split(np.arange(int(avail.sum())), num_clients)])
    counts = np.zeros((num_clients, num_labels), dtype=np.int64)
    for k in range(num_clients):
        prior = _dirichlet_shares(rng, alpha, num_labels)
        need = int(quotas[k])
        while need > 0:
            mask = avail > 0
            if not mask.any():
                break
            p = prior * mask
            total = p.sum()
            p = p / total if total > 0 and np.isfinite(total) else mask / mask.sum()
            draw = np.minimum(rng.multinomial(need, p), avail)
            counts[k] += draw
            avail -= draw
            need -= int(draw.sum())
    return counts
