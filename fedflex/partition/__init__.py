"""Split a training set over clients, and cache the split on disk.

One entry point, :func:`make_partition` (or :func:`cached_partition`, which stores the
result as an ``.npz`` so that many worker processes load it instead of recomputing it),
dispatches on ``PartitionConfig.scheme``:

- ``natural``: the dataset's own split, given by the caller (synthetic data).
- ``iid``: a uniform random split, sizes differing by at most one
  (flwr-datasets ``IidPartitioner`` on a seeded permutation).
- ``dirichlet``: for every label, the shares of the clients ~ Dirichlet(alpha)
  (Hsu, Qi & Brown 2019, arXiv:1909.06335; flwr-datasets ``DirichletPartitioner``).
- ``shards``: every client holds exactly ``labels_per_client`` labels, each label's
  examples cut evenly over the clients that hold it (pathological non-IID of McMahan et
  al. 2017, as in Li et al. 2021's NIID-Bench; flwr-datasets ``PathologicalPartitioner``).
- ``mixed-dirichlet``: HiCS-FL (Chen & Vikalo, arXiv:2310.00198, Appendix A.10): the set
  is cut at random into ``len(alphas)`` equal parts and part g is split over its own
  group of ``num_clients / len(alphas)`` clients by per-label Dirichlet(alphas[g]).
- ``label-sets``: the label-set patterns of the churn paper, Chang, Han,
  Hosseinalipour, Chiang & Brinton, "Federated Learning with Dynamic Client Arrival and
  Departure: Convergence and Rapid Adaptation via Initial Model Construction" (v1 and
  v2; docs/session-init.md): ``half``, ``two-shard``,
  ``partial-overlap``, ``distinct`` (v1) and ``sessions`` (v2). How each is read, with
  the authors' public code where the text is silent, is written in
  :func:`label_set_partition`.
- ``label-groups``: explicit label sets, client i holds the labels of
  ``label_groups[i mod G]`` (:func:`label_group_partition`); BHerd's Case 2 (Luo et al.,
  arXiv:2403.16557) is ``[[0,5],[1,6],[2,7],[3,8],[4,9]]`` with 5 clients.

Every split is a function of its seed alone (NumPy ``default_rng``; the seeds handed to
flwr-datasets are derived from it with ``SeedSequence.spawn``). Every training example
goes to at most one client: exactly one for ``iid``, ``dirichlet``, ``mixed-dirichlet``
and ``shards`` (for ``shards`` only when some client draws every label, which
``num_clients >= num_classes`` guarantees); the label-set patterns may leave labels
unused (see there). Per-client index arrays are
sorted ``int64``.
"""

from fedflex.partition.cache import cached_partition, default_cache_dir, partition_data, partition_key
from fedflex.partition.dirichlet import dirichlet_partition, mixed_dirichlet_partition
from fedflex.partition.label_sets import (
    LabelSetLayout,
    label_group_partition,
    label_set_partition,
    session_label_sets,
)
from fedflex.partition.result import PARTITION_FORMAT_VERSION, Partition, label_entropy
from fedflex.partition.split import make_partition
from fedflex.partition.uniform import iid_partition, shard_partition

__all__ = [
    "PARTITION_FORMAT_VERSION",
    "LabelSetLayout",
    "Partition",
    "cached_partition",
    "default_cache_dir",
    "dirichlet_partition",
    "iid_partition",
    "label_entropy",
    "label_group_partition",
    "label_set_partition",
    "make_partition",
    "mixed_dirichlet_partition",
    "partition_data",
    "partition_key",
    "session_label_sets",
    "shard_partition",
]
