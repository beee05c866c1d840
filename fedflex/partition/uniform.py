"""Splits that treat every client alike: ``iid`` (flwr-datasets ``IidPartitioner``) and
``shards`` (``labels_per_client`` labels each, flwr-datasets ``PathologicalPartitioner``).
"""

from __future__ import annotations

import logging
import warnings

import numpy as np

from fedflex.partition.common import check_enough, child_seeds, hf_dataset, load_all

logger = logging.getLogger(__name__)


def iid_partition(labels: np.ndarray, num_clients: int, seed: int) -> list[np.ndarray]:
    """Uniform random split; sizes differ by at most one (the first clients get the extra).

    flwr-datasets' ``IidPartitioner`` (contiguous ``Dataset.shard``) cuts a seeded
    permutation of the examples, so 1000 examples over 3 clients give 334/333/333.
    """
    y = np.asarray(labels)
    check_enough(len(y), num_clients, 1)
    from flwr_datasets.partitioner import IidPartitioner

    perm = np.random.default_rng(child_seeds(seed, 1)[0]).permutation(len(y))
    partitioner = IidPartitioner(num_partitions=num_clients)
    partitioner.dataset = hf_dataset(y, perm)
    return load_all(partitioner, num_clients)


def shard_partition(labels: np.ndarray, num_clients: int, labels_per_client: int, seed: int) -> list[np.ndarray]:
    """Every client holds exactly ``labels_per_client`` labels (pathological non-IID).

    flwr-datasets' ``PathologicalPartitioner`` with
    ``class_assignment_mode="first-deterministic"`` (the mode of NIID-Bench, which it
    implements): client i's first label is ``i mod C`` and the others are drawn at random
    from the seed, so every label is used once ``num_clients >= C`` (``"random"`` may
    leave labels unused even then; ``"deterministic"`` ignores the seed). Each label's
    examples are cut evenly over the clients holding it, after a seeded permutation.
    Labels held by no client (``num_clients < C``) stay unassigned (logged).
    """
    y = np.asarray(labels)
    check_enough(len(y), num_clients, 1)
    present = np.unique(y)
    if not 1 <= labels_per_client <= len(present):
        raise ValueError(
            f"labels_per_client = {labels_per_client}: must be between 1 and the number of "
            f"labels present ({len(present)})"
        )
    from flwr_datasets.partitioner import PathologicalPartitioner

    s_perm, s_flwr = child_seeds(seed, 2)
    perm = np.random.default_rng(s_perm).permutation(len(y))
    partitioner = PathologicalPartitioner(
        num_partitions=num_clients,
        partition_by="label",
        num_classes_per_partition=int(labels_per_client),
        class_assignment_mode="first-deterministic",
        shuffle=False,
        seed=s_flwr,
    )
    partitioner.dataset = hf_dataset(y, perm)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "classes will NOT be used": logged below
        indices = load_all(partitioner, num_clients)
    used = np.zeros(len(y), dtype=bool)
    for ix in indices:
        used[ix] = True
    unused = sorted(set(present.tolist()) - set(np.unique(y[used]).tolist()))
    if unused:
        logger.warning("shards: labels %s are held by no client and stay unassigned", unused)
    return indices
