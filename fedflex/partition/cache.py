"""Partitions cached on disk as ``.npz``, so that many worker processes load a split
instead of recomputing it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Optional

import numpy as np

from fedflex.config import PartitionConfig
from fedflex.partition.result import PARTITION_FORMAT_VERSION, Partition
from fedflex.partition.split import make_partition

logger = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    """``$FEDFLEX_CACHE/partitions`` when that variable is set, else
    ``~/.cache/fedflex/partitions``.
    """
    root = os.environ.get("FEDFLEX_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "fedflex"
    return base / "partitions"


def partition_key(
    cfg: PartitionConfig,
    labels: np.ndarray,
    num_clients: int,
    num_classes: int,
    seed: int,
    natural: Optional[list[np.ndarray]] = None,
) -> str:
    """Hex digest naming a partition: config fields, sizes, seed and hashes of the data."""
    payload = {
        "version": PARTITION_FORMAT_VERSION,
        "cfg": dataclasses.asdict(cfg),
        "num_clients": int(num_clients),
        "num_classes": int(num_classes),
        "seed": int(seed),
        "labels": _array_digest(np.asarray(labels)),
        "natural": None if natural is None else [_array_digest(np.asarray(ix)) for ix in natural],
    }
    text = json.dumps(payload, sort_keys=True, default=float)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def partition_data(
    cfg: PartitionConfig, data, num_clients: int, seed: int, cache_dir: Optional[Path] = None
) -> Partition:
    """Return the scenario's partition of ``data.train`` (a :class:`fedflex.data.FederatedData`),
    through :func:`cached_partition`.

    ``cfg.labels == "source"`` splits on the dataset's own labels (``data.source``, present
    when a label map changed them) and then counts the mapped labels, so that the label
    counts describe what the model learns.
    """
    train = data.train
    if cfg.labels == "source" and getattr(data, "source", None) is not None:
        source = data.source
        part = cached_partition(
            cfg,
            source.y.numpy(),
            num_clients,
            source.num_classes,
            seed,
            natural=data.natural_partition,
            cache_dir=cache_dir,
        )
        y = train.y.numpy()
        counts = np.stack([np.bincount(y[ix], minlength=train.num_classes) for ix in part.indices])
        return Partition(indices=part.indices, label_counts=counts)
    return cached_partition(
        cfg, train.y.numpy(), num_clients, train.num_classes, seed, natural=data.natural_partition, cache_dir=cache_dir
    )


def cached_partition(
    cfg: PartitionConfig,
    labels: np.ndarray,
    num_clients: int,
    num_classes: int,
    seed: int,
    natural: Optional[list[np.ndarray]] = None,
    cache_dir: Optional[Path] = None,
) -> Partition:
    """:func:`make_partition`, stored once as an ``.npz`` and loaded afterwards.

    The file is ``<cache_dir>/partition-<scheme>-<key>.npz`` with ``key`` from
    :func:`partition_key`; ``cache_dir`` defaults to :func:`default_cache_dir`. Writes
    are atomic (temporary file + ``os.replace``), so concurrent workers either find a
    complete file or compute the same result themselves. A cache file that cannot be
    read (truncated, emptied, garbled) or that does not fit the data
    (:func:`inconsistency`) is logged, recomputed and replaced; an unwritable cache
    directory is logged and ignored.
    """
    directory = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = partition_key(cfg, labels, num_clients, num_classes, seed, natural)
    path = directory / f"partition-{cfg.scheme}-{key}.npz"
    if path.is_file():
        try:
            part = Partition.from_npz(path)
        except Exception as exc:  # truncated, emptied, garbled: zipfile, zlib, numpy raise many types
            reason = " ".join(str(exc).split())
            kind = type(exc).__name__
            logger.warning("partition cache %s is unreadable (%s: %s); recomputing it", path, kind, reason)
        else:
            problem = inconsistency(part, labels, num_clients, num_classes)
            if problem is None:
                logger.debug("partition loaded from %s", path)
                return part
            logger.warning("partition cache %s does not fit this data set (%s); recomputing it", path, problem)
    part = make_partition(cfg, labels, num_clients, num_classes, seed, natural)
    try:
        part.to_npz(path)
        logger.debug("partition stored in %s", path)
    except OSError as exc:
        logger.warning("could not store partition cache %s: %s", path, exc)
    return part


def inconsistency(part: Partition, labels: np.ndarray, num_clients: int, num_classes: int) -> Optional[str]:
    """Why ``part`` cannot be a split of ``labels`` over ``num_clients`` clients (None: it
    can): another number of clients or classes, an index outside the training set, an
    example given twice (no scheme does that), or label counts that are not those of
    the indices.
    """
    if part.num_clients != num_clients:
        return f"{part.num_clients} clients, not {num_clients}"
    if part.num_classes != num_classes:
        return f"{part.num_classes} classes, not {num_classes}"
    labels = np.asarray(labels)
    flat = np.concatenate(part.indices) if part.indices else np.zeros(0, dtype=np.int64)
    if flat.size and (flat.min() < 0 or flat.max() >= len(labels)):
        return f"indices outside 0..{len(labels) - 1}"
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        return f"labels outside 0..{num_classes - 1}"  # make_partition says more
    if np.unique(flat).size != flat.size:
        return "an example given to a client twice, or to two clients"
    counts = np.stack([np.bincount(labels[ix], minlength=num_classes) for ix in part.indices])
    if counts.shape != part.label_counts.shape or not np.array_equal(counts, part.label_counts):
        return "label counts that do not match its indices"
    return None


def _array_digest(arr: np.ndarray) -> str:
    data = np.ascontiguousarray(arr, dtype=np.int64)
    h = hashlib.sha256(str(data.shape).encode())
    h.update(data.tobytes())
    return h.hexdigest()
