"""Splits by explicit label sets: ``label-groups`` (BHerd's Case 2) and the churn paper's
``label-sets`` patterns (``half``, ``two-shard``, ``partial-overlap``, ``distinct``,
``sessions``), with the session label sets they draw from.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np

from fedflex.partition.common import check_enough, check_labels, child_seeds, class_pools, materialise
from fedflex.partition.dirichlet import quota_dirichlet_counts

logger = logging.getLogger(__name__)


def label_group_partition(
    labels: np.ndarray,
    num_clients: int,
    groups: Sequence[Sequence[int]],
    seed: int,
    num_classes: Optional[int] = None,
) -> list[np.ndarray]:
    """Explicit label sets: client i holds the labels of ``groups[i mod G]``.

    Each label's examples are shuffled (seeded) and cut evenly (``array_split``) over
    the clients whose group contains it; labels in no group stay unassigned (logged).
    With G = N every client has its own set (BHerd's Case 2: five clients,
    ``[[0,5],[1,6],[2,7],[3,8],[4,9]]``, 2 x 6000 examples each on MNIST / FMNIST);
    with G < N the groups repeat (``[[0],[1]]`` over 5 binary-labelled clients: clients
    0, 2, 4 hold label 0, clients 1, 3 label 1).

    Raises
    ------
    ValueError
        For no groups, a label outside ``0..num_classes-1``, or a client left empty.
    """
    y = np.asarray(labels)
    num_classes = int(y.max()) + 1 if num_classes is None and len(y) else int(num_classes or 1)
    y = check_labels(y, num_classes)
    groups = [sorted({int(c) for c in g}) for g in groups]
    if not any(groups):
        raise ValueError("label-groups needs at least one non-empty label group")
    bad = sorted({c for g in groups for c in g if not 0 <= c < num_classes})
    if bad:
        raise ValueError(f"label_groups name labels {bad} outside 0..{num_classes - 1}")
    check_enough(len(y), num_clients, 1)
    rng = np.random.default_rng(child_seeds(seed, 1)[0])
    pools = class_pools(y, rng.permutation(len(y)), num_classes)
    out: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    holders = {c: [i for i in range(num_clients) if c in groups[i % len(groups)]] for c in range(num_classes)}
    for c, clients in holders.items():
        if clients:
            _spread(pools[c], clients, out)
    unused = [c for c, clients in holders.items() if not clients and len(pools[c])]
    if unused:
        logger.warning("label-groups: labels %s are held by no client and stay unassigned", unused)
    return _finish(out, y, "label-groups")


@dataclass(frozen=True)
class LabelSetLayout:
    """What a label-set pattern built, besides the indices.

    Attributes
    ----------
    groups : list of list of int
        Client ids of each group; a group's clients draw from the same label set.
    label_sets : list of list of int
        The labels group g may hold (sorted); a client's labels are a subset of its group's.
    session_labels : list of list of int
        For ``sessions``: the label set of every session, from :func:`session_label_sets`
        (what ``churn.session_labels`` should be); otherwise ``label_sets``.
    """

    groups: list[list[int]]
    label_sets: list[list[int]]
    session_labels: list[list[int]]


def label_set_partition(
    labels: np.ndarray,
    num_clients: int,
    pattern: str,
    seed: int,
    *,
    num_classes: Optional[int] = None,
    alpha: float = 0.5,
    overlap: float = 0.0,
    num_label_sets: int = 6,
) -> tuple[list[np.ndarray], LabelSetLayout]:
    """Return the label-set patterns of the session-aware initial-model paper.

    v1 of the paper (10 clients, 10 labels) describes four patterns, and its authors'
    public code (``distinct_half``, ``distribute_labels_in_batches``,
    ``distribute_labels_slight_overlap_clients``, ``distinct_class_each_device``) fixes
    the details the text leaves open. v2 replaces them with label sets per session
    (``partition_and_schedule`` in the same code). Read as follows, with N clients, C
    classes, group A = clients ``0 .. N//2 - 1`` and group B = clients ``N//2 .. N - 1``;
    "evenly" means each label's examples are shuffled and cut with ``array_split`` (the
    authors' code drops the remainder of an uneven cut; here it is kept). v1's client
    schedules (its Tables 3-4: the Half and Partial-Overlap sessions alternate clients
    0-4 and 5-9) are exactly groups A and B.

    - ``half``: A holds labels ``0 .. C//2 - 1``, B the rest; every label evenly over
      its group (each client holds all labels of its half, the same amount of each).
    - ``partial-overlap``: set 1 = the first ``int(0.6 C)`` labels, the overlap = its
      last ``int(0.2 C)``, set 2 = the overlap + the next labels up to ``int(0.6 C)``
      (C = 10: 0-5 and 4-9). An overlap label's examples are halved, one half evenly
      over A, the other over B; the other labels go evenly over their own group. Labels
      in neither set (only for some C) stay unassigned.
    - ``distinct``: N <= C: the labels are cut into N consecutive blocks, client i holds
      block i and all its examples (C = N = 10: client i holds label i; C = 100: ten
      labels each). N > C (the paper never does this): client i holds label ``i mod C``,
      each label evenly over its ``~N/C`` clients, so labels are no longer unique.
    - ``two-shard``: 2N shards; label c gets ``2N/C`` of them (array-split counts, the
      extra shards to labels in a seeded order), its shuffled examples cut evenly into
      its shards; shards are paired at random (seeded swaps remove pairs of one label),
      so every client holds two shards of two different labels (C = N = 10: every label
      in two equal halves, as in the paper). With 2N < C some labels get no shard and
      stay unassigned.
    - ``sessions`` (v2): "the set of labels available in one training session can
      partially overlap with the set of labels available in a subsequent session ...
      distributed among the active clients using a Dirichlet distribution". The paper
      does not say which clients are active; the authors' code has two client groups A
      and B of equal size, sessions alternating A, B, A, B, ... (v2: 6 sessions) and two
      label sets, from :func:`session_label_sets` (C = 10: overlap 0 -> 0-4 / 5-9,
      overlap 0.2 -> 0-4 / 4-8, label 9 unused). Their ``num_clients`` counts the
      clients of ONE group (the client list is ``2 * num_clients`` long), so the v2
      "20 clients" setting is ``num_clients = 40`` here (20 active per session).
      ``num_label_sets`` is the number of sessions listed in
      :attr:`LabelSetLayout.session_labels`; the distinct sets are the two above (one,
      A, held by all clients, when ``num_label_sets = 1``). Inside a group, as in their
      code (Hsu et al.'s formulation): every client gets the same quota (the group's
      examples evenly), draws label proportions ``q_k ~ Dirichlet(alpha)`` over the
      group's labels and fills its quota by drawing labels from ``q_k`` restricted to
      labels with examples left (uniform over those if ``q_k`` puts no mass there).
      Departure: their code gives every example of an overlap label to BOTH groups;
      here, as in partial-overlap, its examples are halved between the groups, so each
      example has at most one client. With ``churn.kind = label-sessions`` note that a
      client of A whose draws all fell on shared labels (rare, small alpha) is also a
      subset of B's set and is admitted to B's sessions too.
    - ``half-iid``: BHerd's Case 3 (not the churn paper's): the first half of the labels
      evenly over the first ceil(N/2) clients, the other labels in consecutive blocks,
      one block per remaining client (:func:`_half_iid`).

    Parameters
    ----------
    labels : numpy.ndarray
        Integer labels of the training set.
    num_clients : int
        Number of clients (>= 2, except ``distinct`` and one-set ``sessions``).
    pattern : str
        ``half``, ``two-shard``, ``partial-overlap``, ``distinct`` or ``sessions``.
    seed : int
        Seed of every random choice.
    num_classes : int, optional
        C; defaults to ``labels.max() + 1``.
    alpha : float
        ``sessions``: Dirichlet concentration inside a group.
    overlap : float
        ``sessions``: overlap fraction of consecutive label sets, in [0, 1).
    num_label_sets : int
        ``sessions``: number of sessions (label sets, alternating) to list.

    Returns
    -------
    indices : list of numpy.ndarray
        Per client, sorted ``int64`` indices.
    layout : LabelSetLayout
        Client groups, their label sets and the per-session label sets.
    """
    y = np.asarray(labels)
    num_classes = int(y.max()) + 1 if num_classes is None and len(y) else int(num_classes or 1)
    y = check_labels(y, num_classes)
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    check_enough(len(y), num_clients, 1)
    rng = np.random.default_rng(child_seeds(seed, 1)[0])
    pools = class_pools(y, rng.permutation(len(y)), num_classes)
    out: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    if pattern in _PATTERNS and pattern != "distinct" and num_classes < 2:
        raise ValueError(f"label-sets pattern {pattern!r} needs at least 2 classes")
    if pattern == "sessions":
        groups, sets, listed = _sessions(pools, num_clients, num_classes, rng, out, alpha, overlap, num_label_sets)
        return _finish(out, y, pattern), LabelSetLayout(groups, [list(s) for s in sets], listed)
    if pattern not in _PATTERNS:
        raise ValueError(f"partition.pattern = {pattern!r}: must be one of {', '.join(_PATTERNS)}")
    groups, sets = _PATTERNS[pattern](pools, num_clients, num_classes, rng, out)
    sets = [sorted(int(c) for c in s) for s in sets]
    return _finish(out, y, pattern), LabelSetLayout(groups, sets, sets)


def _groups(pattern: str, num_clients: int) -> tuple[list[int], list[int]]:
    """Return groups A (clients ``0 .. N//2 - 1``) and B (the rest)."""
    _need_two_groups(pattern, num_clients)
    half = num_clients // 2
    return list(range(half)), list(range(half, num_clients))


def _half(pools, num_clients: int, num_classes: int, rng, out) -> tuple[list, list]:
    group_a, group_b = _groups("half", num_clients)
    set_a, set_b = list(range(num_classes // 2)), list(range(num_classes // 2, num_classes))
    for c in set_a:
        _spread(pools[c], group_a, out)
    for c in set_b:
        _spread(pools[c], group_b, out)
    return [group_a, group_b], [set_a, set_b]


def _partial_overlap(pools, num_clients: int, num_classes: int, rng, out) -> tuple[list, list]:
    group_a, group_b = _groups("partial-overlap", num_clients)
    k = max(1, int(0.6 * num_classes))
    o = min(k, int(0.2 * num_classes))
    set_a = list(range(k))
    shared = set_a[k - o :]
    set_b = shared + list(range(k, min(num_classes, 2 * k - o)))
    for c in sorted(set(set_a) | set(set_b)):
        if c in shared:
            first, second = np.array_split(pools[c], 2)
            _spread(first, group_a, out)
            _spread(second, group_b, out)
        else:
            _spread(pools[c], group_a if c in set_a else group_b, out)
    return [group_a, group_b], [set_a, sorted(set_b)]


def _distinct(pools, num_clients: int, num_classes: int, rng, out) -> tuple[list, list]:
    if num_clients <= num_classes:
        blocks = np.array_split(np.arange(num_classes), num_clients)
        sets = [b.tolist() for b in blocks]
        for i, block in enumerate(sets):
            for c in block:
                out[i].append(pools[c])
    else:
        sets = [[i % num_classes] for i in range(num_clients)]
        for c in range(num_classes):
            _spread(pools[c], list(range(c, num_clients, num_classes)), out)
    return [[i] for i in range(num_clients)], sets


def _half_iid(pools, num_clients: int, num_classes: int, rng, out) -> tuple[list, list]:
    """BHerd's Case 3 (Luo et al., arXiv:2403.16557, Section 2.1): "data samples with the
    first half of the labels are distributed to the first half of the clients as in
    Case 1 [IID], the other samples are distributed to the second half of the clients as
    in Case 2 [label-disjoint]". With N = 5 the paper's "first half" is clients 1-3
    (its Section 2.7), so group A is the first ceil(N/2) clients: labels 0 .. C//2 - 1,
    each label evenly over A (every client of A holds the same label mix); group B, the
    other clients, splits the remaining labels into consecutive blocks, one per client
    (C = 10, N = 5: {5, 6, 7} and {8, 9}), each label whole on its client.
    """
    _need_two_groups("half-iid", num_clients)
    first = (num_clients + 1) // 2
    group_a, group_b = list(range(first)), list(range(first, num_clients))
    set_a = list(range(num_classes // 2))
    rest = np.arange(num_classes // 2, num_classes)
    for c in set_a:
        _spread(pools[c], group_a, out)
    blocks = [b.tolist() for b in np.array_split(rest, len(group_b))]
    for client, block in zip(group_b, blocks):
        for c in block:
            out[client].append(pools[c])
    return [group_a, *[[c] for c in group_b]], [set_a, *blocks]


def _sessions(
    pools, num_clients: int, num_classes: int, rng, out, alpha: float, overlap: float, num_label_sets: int
) -> tuple[list, list, list]:
    if not 0 <= overlap < 1:
        raise ValueError(f"overlap must be in [0, 1), got {overlap}")
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    if num_label_sets < 1:
        raise ValueError(f"num_label_sets must be >= 1, got {num_label_sets}")
    session_sets = session_label_sets(num_classes, num_label_sets, overlap)
    if num_label_sets == 1:
        groups, sets = [list(range(num_clients))], [session_sets[0]]
    else:
        groups, sets = list(_groups("sessions", num_clients)), session_sets[:2]
    for g, (members, allowed) in enumerate(zip(groups, sets)):
        group_pools: list[np.ndarray] = []
        for c in allowed:
            holders = [h for h, s in enumerate(sets) if c in s]
            group_pools.append(np.array_split(pools[c], len(holders))[holders.index(g)])
        total = sum(len(p) for p in group_pools)
        if total < len(members):
            raise ValueError(
                f"sessions: label set {allowed} has {total} examples for group {g}, "
                f"fewer than its {len(members)} clients"
            )
        counts = quota_dirichlet_counts(np.array([len(p) for p in group_pools]), len(members), alpha, rng)
        for i, ix in zip(members, materialise(group_pools, counts)):
            out[i].append(ix)
    return groups, sets, session_sets


def session_label_sets(
    num_classes: int, num_sessions: int, overlap: float, seed: Optional[int] = None
) -> list[list[int]]:
    """Label set of each v2 session: two sets A and B, alternating A, B, A, ...

    As in the authors' code (``partition_and_schedule``): overlap 0 (or an overlap that
    rounds to no shared label) gives A = the first ``C // 2`` labels and B = the rest;
    otherwise ``G = floor(C / (2 - overlap))`` labels per set, ``O = floor(G * overlap)``
    shared, ``U = G - O``: A = labels ``0 .. G-1``, B = labels ``U .. U+G-1`` and the
    labels after B are unused. C = 10, overlap 0.2: A = 0-4, B = 4-8, shared {4}, so
    ``|A & B| / |A| = 0.2``. The realised fraction is ``O / G`` (overlap 0.1 with C = 10
    shares nothing).

    Parameters
    ----------
    num_classes : int
        C (>= 2).
    num_sessions : int
        Number of sessions to list (>= 1).
    overlap : float
        Wanted fraction of a set shared with the next one, in [0, 1).
    seed : int, optional
        None (the paper, and what ``label-sets/sessions`` partitions use): labels in
        natural order. An int draws the label order at random from it instead.

    Returns
    -------
    list of list of int
        ``num_sessions`` sorted label lists.
    """
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    if num_sessions < 1:
        raise ValueError(f"num_sessions must be >= 1, got {num_sessions}")
    if not 0 <= overlap < 1:
        raise ValueError(f"overlap must be in [0, 1), got {overlap}")
    order = np.arange(num_classes)
    if seed is not None:
        order = np.random.default_rng(seed).permutation(num_classes)
    size = int(np.floor(num_classes / (2 - overlap)))
    shared = int(np.floor(size * overlap))
    if shared == 0 or size <= shared:
        set_a, set_b = order[: num_classes // 2], order[num_classes // 2 :]
    else:
        step = size - shared
        set_a, set_b = order[:size], order[step : step + size]
    a, b = sorted(set_a.tolist()), sorted(set_b.tolist())
    return [list(a) if s % 2 == 0 else list(b) for s in range(num_sessions)]


def _need_two_groups(pattern: str, num_clients: int) -> None:
    if num_clients < 2:
        raise ValueError(f"label-sets pattern {pattern!r} needs at least 2 clients, got {num_clients}")


def _spread(pool: np.ndarray, clients: Sequence[int], out: list[list[np.ndarray]]) -> None:
    """Cut ``pool`` evenly (``array_split``) over ``clients``."""
    for client, chunk in zip(clients, np.array_split(pool, len(clients))):
        out[client].append(chunk)


def _finish(out: list[list[np.ndarray]], y: np.ndarray, pattern: str) -> list[np.ndarray]:
    indices = [
        np.sort(np.concatenate(chunks)).astype(np.int64) if chunks else np.zeros(0, dtype=np.int64) for chunks in out
    ]
    assigned = sum(len(ix) for ix in indices)
    if assigned < len(y):
        logger.info("label-sets %s: %d of %d examples unassigned", pattern, len(y) - assigned, len(y))
    empty = [i for i, ix in enumerate(indices) if len(ix) == 0]
    if empty:
        shown = ", ".join(str(i) for i in empty[:5]) + (", ..." if len(empty) > 5 else "")
        raise ValueError(
            f"label-sets {pattern}: {len(empty)} client(s) ({shown}) got no examples: too few "
            f"examples per label for {len(indices)} clients"
        )
    return indices


def _two_shards(
    pools: list[np.ndarray], num_clients: int, rng: np.random.Generator, out: list[list[np.ndarray]]
) -> tuple[list[list[int]], list[list[int]]]:
    num_classes = len(pools)
    num_shards = 2 * num_clients
    order = rng.permutation(num_classes)
    per_label = np.zeros(num_classes, dtype=np.int64)
    per_label[order] = [len(s) for s in np.array_split(np.arange(num_shards), num_classes)]
    shards: list[np.ndarray] = []
    shard_label: list[int] = []
    for c in order:  # shards grouped by label, labels in the seeded order
        if per_label[c] == 0:
            continue
        if len(pools[c]) < per_label[c]:
            raise ValueError(f"two-shard: label {c} has {len(pools[c])} examples, fewer than its {per_label[c]} shards")
        shards.extend(np.array_split(pools[c], per_label[c]))
        shard_label.extend([int(c)] * int(per_label[c]))
    lab = np.array(shard_label)
    pairs = rng.permutation(num_shards).reshape(num_clients, 2)
    for _ in range(200 * num_clients):
        bad = np.flatnonzero(lab[pairs[:, 0]] == lab[pairs[:, 1]])
        if not bad.size:
            break
        i, j = int(bad[0]), int(rng.integers(num_clients))
        a0, a1 = pairs[i]
        b0, b1 = pairs[j]
        if lab[a0] != lab[b0] and lab[a1] != lab[b1]:  # swap a1 <-> b0
            pairs[i] = (a0, b0)
            pairs[j] = (a1, b1)
    if np.any(lab[pairs[:, 0]] == lab[pairs[:, 1]]):
        # No valid random pairing found: shard j with shard j + N is always two labels
        # (no label has more than N of the 2N shards when C >= 2).
        logger.debug("two-shard: random pairing failed, pairing shard j with j + N")
        clients = rng.permutation(num_clients)
        first = np.arange(num_clients)
        pairs = np.stack([first, first + num_clients], axis=1)[clients]
    sets = []
    for client, (s0, s1) in enumerate(pairs):
        out[client].extend([shards[s0], shards[s1]])
        sets.append([int(lab[s0]), int(lab[s1])])
    return [[i] for i in range(num_clients)], sets


#: the patterns and their splits: ``(pools, num_clients, num_classes, rng, out) ->
#: (groups, label sets)``; ``sessions`` takes its own options (:func:`_sessions`)
_PATTERNS: dict[str, Callable[..., Any]] = {
    "half": _half,
    "two-shard": lambda pools, n, c, rng, out: _two_shards(pools, n, rng, out),
    "partial-overlap": _partial_overlap,
    "distinct": _distinct,
    "sessions": _sessions,
    "half-iid": _half_iid,
}
