"""The one entry point: :func:`make_partition` dispatches on ``PartitionConfig.scheme``."""

from __future__ import annotations

import logging
from typing import Optional

import numpy as np

from fedflex.config import PartitionConfig
from fedflex.partition.common import check_labels, check_seed
from fedflex.partition.dirichlet import dirichlet_partition, mixed_dirichlet_partition
from fedflex.partition.label_sets import label_group_partition, label_set_partition
from fedflex.partition.result import Partition
from fedflex.partition.uniform import iid_partition, shard_partition

logger = logging.getLogger(__name__)


def make_partition(
    cfg: PartitionConfig,
    labels: np.ndarray,
    num_clients: int,
    num_classes: int,
    seed: int,
    natural: Optional[list[np.ndarray]] = None,
) -> Partition:
    """Split a training set with labels ``labels`` over ``num_clients`` clients.

    Parameters
    ----------
    cfg : PartitionConfig
        The scheme and its parameters.
    labels : numpy.ndarray
        Integer label of every training example, in ``0 .. num_classes - 1``.
    num_clients : int
        Number of clients.
    num_classes : int
        Number of classes (the columns of ``label_counts``).
    seed : int
        Non-negative seed; the result depends on nothing else.
    natural : list of numpy.ndarray, optional
        The dataset's own per-client index lists; required by ``scheme="natural"``.

    Returns
    -------
    Partition

    Raises
    ------
    ValueError
        For an unknown scheme, bad labels, or an impossible request (more clients than
        examples, more labels per client than classes, ...).
    """
    y = check_labels(labels, num_classes)
    check_seed(seed)
    if int(num_clients) < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    num_clients = int(num_clients)
    scheme = cfg.scheme
    if scheme == "natural":
        indices = _natural(natural, num_clients, len(y))
    elif scheme == "iid":
        indices = iid_partition(y, num_clients, seed)
    elif scheme == "dirichlet":
        indices = dirichlet_partition(y, num_clients, cfg.alpha, seed, min_size=cfg.min_size)
    elif scheme == "shards":
        indices = shard_partition(y, num_clients, cfg.labels_per_client, seed)
    elif scheme == "mixed-dirichlet":
        indices = mixed_dirichlet_partition(y, num_clients, cfg.alphas, seed, min_size=cfg.min_size)
    elif scheme == "label-sets":
        indices, _ = label_set_partition(
            y,
            num_clients,
            cfg.pattern,
            seed,
            num_classes=num_classes,
            alpha=cfg.alpha,
            overlap=cfg.overlap,
            num_label_sets=cfg.num_label_sets,
        )
    elif scheme == "label-groups":
        indices = label_group_partition(y, num_clients, cfg.label_groups, seed, num_classes=num_classes)
    else:
        raise ValueError(
            f"partition.scheme = {scheme!r}: must be one of natural, iid, dirichlet, shards, "
            "mixed-dirichlet, label-sets, label-groups"
        )
    counts = np.stack([np.bincount(y[ix], minlength=num_classes) for ix in indices])
    part = Partition(indices=indices, label_counts=counts)
    sizes = part.sizes
    logger.info(
        "partition %s: %d clients, %d of %d examples assigned, sizes min %d / median %d / max %d, "
        "mean label entropy %.3f",
        scheme,
        num_clients,
        int(sizes.sum()),
        len(y),
        int(sizes.min()),
        int(np.median(sizes)),
        int(sizes.max()),
        float(part.entropies().mean()),
    )
    return part


def _natural(natural: Optional[list[np.ndarray]], num_clients: int, num_examples: int) -> list[np.ndarray]:
    if natural is None:
        raise ValueError("partition.scheme = 'natural' needs the dataset's own split (natural=None)")
    if len(natural) != num_clients:
        raise ValueError(
            f"natural split has {len(natural)} clients, num_clients is {num_clients}: set num_clients={len(natural)}"
        )
    indices = [np.asarray(ix, dtype=np.int64).ravel() for ix in natural]
    flat = np.concatenate(indices) if indices else np.zeros(0, dtype=np.int64)
    if len(flat) and (flat.min() < 0 or flat.max() >= num_examples):
        raise ValueError(f"natural split indices must lie in 0..{num_examples - 1}")
    if len(np.unique(flat)) != len(flat):
        raise ValueError("natural split gives some example to more than one client")
    return indices
