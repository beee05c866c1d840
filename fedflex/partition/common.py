"""Checks and small steps that several partition schemes share."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np


def check_labels(labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Return ``labels`` as ``int64``; refuse a non-1-D array, non-integers and labels outside ``0..num_classes-1``."""
    y = np.asarray(labels)
    if y.ndim != 1:
        raise ValueError(f"labels must be one-dimensional, got shape {y.shape}")
    if len(y) and not np.issubdtype(y.dtype, np.integer):
        if not np.all(np.equal(np.mod(y, 1), 0)):
            raise ValueError("labels must be integers")
    y = y.astype(np.int64, copy=False)
    if int(num_classes) < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    if len(y) and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"labels must lie in 0..{num_classes - 1}, found {int(y.min())}..{int(y.max())}")
    return y


def check_seed(seed: int) -> None:
    """Refuse a seed that is not a non-negative integer."""
    if int(seed) != seed or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")


def check_enough(num_examples: int, num_clients: int, per_client: int) -> None:
    """Refuse fewer than one client, or fewer examples than ``per_client`` for every client."""
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if num_examples < num_clients * per_client:
        raise ValueError(
            f"cannot give {num_clients} clients {per_client} example(s) each: the training "
            f"set has {num_examples} examples"
        )


def child_seeds(seed: int, n: int) -> list[int]:
    """Independent 32-bit seeds derived from ``seed`` (one per random stream)."""
    children = np.random.SeedSequence(int(seed)).spawn(n)
    return [int(c.generate_state(1)[0]) for c in children]


def hf_dataset(labels: np.ndarray, order: np.ndarray):
    """Return an in-memory ``datasets.Dataset`` of the labels in ``order``, with the original index."""
    import datasets

    return datasets.Dataset.from_dict({"label": labels[order].astype(np.int64), "idx": order.astype(np.int64)})


def load_all(partitioner, num_clients: int) -> list[np.ndarray]:
    """Each partition's original indices (the ``idx`` column, read through Arrow: reading
    the column of a ``select``-ed dataset row by row takes seconds for 60k examples).
    """
    out = []
    for pid in range(num_clients):
        column = partitioner.load_partition(pid).with_format("arrow")[:]["idx"]
        out.append(np.sort(np.asarray(column.to_numpy(), dtype=np.int64)))
    return out


def class_pools(y: np.ndarray, order: np.ndarray, num_classes: Optional[int] = None) -> list[np.ndarray]:
    """Return indices of each label, in the order they appear in ``order`` (a permutation/subset)."""
    num_classes = int(y.max()) + 1 if num_classes is None else num_classes
    sub = y[order]
    return [order[sub == c] for c in range(num_classes)]


def materialise(pools: Sequence[np.ndarray], counts: np.ndarray) -> list[np.ndarray]:
    """Cut each label pool by the column ``counts[:, c]`` (clients in order)."""
    num_clients = counts.shape[0]
    chunks: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c, pool in enumerate(pools):
        bounds = np.cumsum(counts[:, c])[:-1]
        for k, piece in enumerate(np.split(pool, bounds)):
            chunks[k].append(piece)
    return [np.sort(np.concatenate(ch)).astype(np.int64) for ch in chunks]
