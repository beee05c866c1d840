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
  v2, ``shared/papers/dynamic-clients-initial-model-v*.txt``): ``half``, ``two-shard``,
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

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from fedflex.config import PartitionConfig

logger = logging.getLogger(__name__)

#: Bump when an algorithm below changes its output, so that stale cache files are ignored.
PARTITION_FORMAT_VERSION = 1


# ---------------------------------------------------------------------------- result
@dataclass(frozen=True)
class Partition:
    """Which training examples each client holds.

    Attributes
    ----------
    indices : list of numpy.ndarray
        Per client, the sorted ``int64`` indices into the training set.
    label_counts : numpy.ndarray
        ``[num_clients, num_classes]`` integer matrix: examples of each label per client.
    """

    indices: list[np.ndarray]
    label_counts: np.ndarray

    def __post_init__(self) -> None:
        counts = np.asarray(self.label_counts)
        if counts.ndim != 2 or counts.shape[0] != len(self.indices):
            raise ValueError(
                f"label_counts must be [num_clients={len(self.indices)}, num_classes], got shape {counts.shape}"
            )
        indices = [np.sort(np.asarray(ix, dtype=np.int64).ravel()) for ix in self.indices]
        object.__setattr__(self, "indices", indices)
        object.__setattr__(self, "label_counts", counts.astype(np.int64, copy=False))

    # ------------------------------------------------------------------ views
    @property
    def num_clients(self) -> int:
        """Number of clients."""
        return len(self.indices)

    @property
    def num_classes(self) -> int:
        """Number of classes (columns of :attr:`label_counts`)."""
        return int(self.label_counts.shape[1])

    @property
    def client_labels(self) -> list[frozenset[int]]:
        """The labels each client holds (count > 0)."""
        return [frozenset(int(y) for y in np.flatnonzero(row)) for row in self.label_counts]

    @property
    def sizes(self) -> np.ndarray:
        """Examples per client, ``int64`` of length ``num_clients``."""
        return np.array([len(ix) for ix in self.indices], dtype=np.int64)

    def entropies(self) -> np.ndarray:
        """Natural-log entropy of each client's label distribution (0 for an empty client)."""
        return label_entropy(self.label_counts)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Partition):
            return NotImplemented
        return (
            len(self.indices) == len(other.indices)
            and np.array_equal(self.label_counts, other.label_counts)
            and all(np.array_equal(a, b) for a, b in zip(self.indices, other.indices))
        )

    # ------------------------------------------------------------------ disk
    def to_npz(self, path: str | os.PathLike[str]) -> None:
        """Write to ``path`` (an ``.npz``) atomically: a temporary file, then ``os.replace``.

        Stores the concatenated indices, the client offsets into them and the counts.
        """
        path = Path(path)
        sizes = self.sizes
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        flat = np.concatenate(self.indices) if self.indices else np.zeros(0, dtype=np.int64)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                np.savez(
                    fh,
                    version=np.array(PARTITION_FORMAT_VERSION, dtype=np.int64),
                    flat=flat.astype(np.int64, copy=False),
                    offsets=offsets,
                    label_counts=self.label_counts,
                )
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    @classmethod
    def from_npz(cls, path: str | os.PathLike[str]) -> "Partition":
        """Read a file written by :meth:`to_npz`.

        Raises
        ------
        ValueError
            If the file is not such a partition (missing arrays, inconsistent shapes).
        """
        with np.load(path, allow_pickle=False) as data:
            missing = {"flat", "offsets", "label_counts"} - set(data.files)
            if missing:
                raise ValueError(f"{path}: not a partition file (missing {sorted(missing)})")
            flat, offsets, counts = data["flat"], data["offsets"], data["label_counts"]
        if (
            offsets.ndim != 1
            or counts.ndim != 2
            or len(offsets) != counts.shape[0] + 1
            or offsets[0] != 0
            or offsets[-1] != len(flat)
            or np.any(np.diff(offsets) < 0)
        ):
            raise ValueError(f"{path}: inconsistent partition arrays")
        indices = [flat[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
        return cls(indices=indices, label_counts=counts)


def label_entropy(counts: np.ndarray) -> np.ndarray:
    """Natural-log entropy of label-count rows, with ``0 * log 0 = 0``.

    Parameters
    ----------
    counts : numpy.ndarray
        ``[num_clients, num_classes]`` (or one row ``[num_classes]``) of non-negative counts.

    Returns
    -------
    numpy.ndarray
        One entropy per row (a 0-d array for a single row); a row of zeros has entropy 0.

    Examples
    --------
    >>> label_entropy(np.array([[5, 5, 0], [10, 0, 0]])).round(4).tolist()
    [0.6931, 0.0]
    """
    c = np.asarray(counts, dtype=np.float64)
    if c.ndim not in (1, 2):
        raise ValueError(f"counts must be one row or a matrix of rows, got shape {c.shape}")
    if np.any(c < 0) or not np.all(np.isfinite(c)):
        raise ValueError("counts must be finite and non-negative")
    total = c.sum(axis=-1, keepdims=True)
    p = np.divide(c, total, out=np.zeros_like(c), where=total > 0)
    logp = np.log(p, out=np.zeros_like(p), where=p > 0)
    return 0.0 - (p * logp).sum(axis=-1)  # 0.0 - x, not -x: no "-0.0" for one-label rows


# ---------------------------------------------------------------------------- entry points
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
    y = _check_labels(labels, num_classes)
    _check_seed(seed)
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


def default_cache_dir() -> Path:
    """``$FEDFLEX_CACHE/partitions`` when that variable is set, else
    ``~/.cache/fedflex/partitions``."""
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
    """The scenario's partition of ``data.train`` (a :class:`fedflex.data.FederatedData`),
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
    complete file or compute the same result themselves. An unreadable cache file is
    logged and recomputed; an unwritable cache directory is logged and ignored.
    """
    directory = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = partition_key(cfg, labels, num_clients, num_classes, seed, natural)
    path = directory / f"partition-{cfg.scheme}-{key}.npz"
    if path.is_file():
        try:
            part = Partition.from_npz(path)
        except (OSError, ValueError, KeyError) as exc:
            logger.warning("ignoring unreadable partition cache %s: %s", path, exc)
        else:
            if part.num_clients == num_clients and part.num_classes == num_classes:
                logger.debug("partition loaded from %s", path)
                return part
            logger.warning("ignoring partition cache %s: wrong shape", path)
    part = make_partition(cfg, labels, num_clients, num_classes, seed, natural)
    try:
        part.to_npz(path)
        logger.debug("partition stored in %s", path)
    except OSError as exc:
        logger.warning("could not store partition cache %s: %s", path, exc)
    return part


# ---------------------------------------------------------------------------- schemes
def iid_partition(labels: np.ndarray, num_clients: int, seed: int) -> list[np.ndarray]:
    """Uniform random split; sizes differ by at most one (the first clients get the extra).

    flwr-datasets' ``IidPartitioner`` (contiguous ``Dataset.shard``) cuts a seeded
    permutation of the examples, so 1000 examples over 3 clients give 334/333/333.
    """
    y = np.asarray(labels)
    _check_enough(len(y), num_clients, 1)
    from flwr_datasets.partitioner import IidPartitioner

    perm = np.random.default_rng(_child_seeds(seed, 1)[0]).permutation(len(y))
    partitioner = IidPartitioner(num_partitions=num_clients)
    partitioner.dataset = _hf_dataset(y, perm)
    return _load_all(partitioner, num_clients)


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
    _check_enough(len(y), num_clients, max(min_size, 1))
    from flwr_datasets.partitioner import DirichletPartitioner

    s_perm, s_flwr, s_own = _child_seeds(seed, 3)
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
    partitioner.dataset = _hf_dataset(y, perm)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # one warning per failed redraw
            return _load_all(partitioner, num_clients)
    except ValueError as exc:
        logger.info(
            "DirichletPartitioner(alpha=%g) could not give every client %d examples (%s); "
            "drawing the per-label split here and repairing it",
            alpha,
            min_size,
            exc,
        )
    rng = np.random.default_rng(s_own)
    by_class = _class_pools(y, perm)
    counts = _dirichlet_counts(np.array([len(p) for p in by_class]), num_clients, alpha, rng, max(min_size, 1))
    return _materialise(by_class, counts)


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
    _check_enough(len(y), num_clients, 1)
    present = np.unique(y)
    if not 1 <= labels_per_client <= len(present):
        raise ValueError(
            f"labels_per_client = {labels_per_client}: must be between 1 and the number of "
            f"labels present ({len(present)})"
        )
    from flwr_datasets.partitioner import PathologicalPartitioner

    s_perm, s_flwr = _child_seeds(seed, 2)
    perm = np.random.default_rng(s_perm).permutation(len(y))
    partitioner = PathologicalPartitioner(
        num_partitions=num_clients,
        partition_by="label",
        num_classes_per_partition=int(labels_per_client),
        class_assignment_mode="first-deterministic",
        shuffle=False,
        seed=s_flwr,
    )
    partitioner.dataset = _hf_dataset(y, perm)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "classes will NOT be used": logged below
        indices = _load_all(partitioner, num_clients)
    used = np.zeros(len(y), dtype=bool)
    for ix in indices:
        used[ix] = True
    unused = sorted(set(present.tolist()) - set(np.unique(y[used]).tolist()))
    if unused:
        logger.warning("shards: labels %s are held by no client and stay unassigned", unused)
    return indices


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
    _check_enough(len(y), num_clients, need)
    rng = np.random.default_rng(_child_seeds(seed, 1)[0])
    parts = np.array_split(rng.permutation(len(y)), groups)
    indices: list[np.ndarray] = []
    for g, (alpha, part) in enumerate(zip(alphas, parts)):
        if len(part) < per_group * need:
            raise ValueError(
                f"mixed-dirichlet: part {g} has {len(part)} examples, fewer than {per_group} clients x {need}"
            )
        by_class = _class_pools(y, part)
        counts = _dirichlet_counts(np.array([len(p) for p in by_class]), per_group, alpha, rng, need, balance=True)
        indices.extend(_materialise(by_class, counts))
    return indices


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
    y = _check_labels(y, num_classes)
    groups = [sorted({int(c) for c in g}) for g in groups]
    if not any(groups):
        raise ValueError("label-groups needs at least one non-empty label group")
    bad = sorted({c for g in groups for c in g if not 0 <= c < num_classes})
    if bad:
        raise ValueError(f"label_groups name labels {bad} outside 0..{num_classes - 1}")
    _check_enough(len(y), num_clients, 1)
    rng = np.random.default_rng(_child_seeds(seed, 1)[0])
    pools = _class_pools(y, rng.permutation(len(y)), num_classes)
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
    """The label-set patterns of the session-aware initial-model paper.

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
    y = _check_labels(y, num_classes)
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    _check_enough(len(y), num_clients, 1)
    rng = np.random.default_rng(_child_seeds(seed, 1)[0])
    pools = _class_pools(y, rng.permutation(len(y)), num_classes)
    out: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    half = num_clients // 2
    group_a, group_b = list(range(half)), list(range(half, num_clients))

    if pattern in ("half", "partial-overlap", "two-shard", "sessions") and num_classes < 2:
        raise ValueError(f"label-sets pattern {pattern!r} needs at least 2 classes")

    if pattern == "half":
        _need_two_groups(pattern, num_clients)
        set_a, set_b = list(range(num_classes // 2)), list(range(num_classes // 2, num_classes))
        for c in set_a:
            _spread(pools[c], group_a, out)
        for c in set_b:
            _spread(pools[c], group_b, out)
        groups, sets = [group_a, group_b], [set_a, set_b]
    elif pattern == "partial-overlap":
        _need_two_groups(pattern, num_clients)
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
        groups, sets = [group_a, group_b], [set_a, sorted(set_b)]
    elif pattern == "distinct":
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
        groups = [[i] for i in range(num_clients)]
    elif pattern == "two-shard":
        groups, sets = _two_shards(pools, num_clients, rng, out)
    elif pattern == "sessions":
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
            _need_two_groups(pattern, num_clients)
            groups, sets = [group_a, group_b], session_sets[:2]
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
            counts = _quota_dirichlet_counts(np.array([len(p) for p in group_pools]), len(members), alpha, rng)
            for i, ix in zip(members, _materialise(group_pools, counts)):
                out[i].append(ix)
        layout = LabelSetLayout(groups, [list(s) for s in sets], session_sets)
        return _finish(out, y, pattern), layout
    else:
        raise ValueError(
            f"partition.pattern = {pattern!r}: must be one of half, two-shard, partial-overlap, distinct, sessions"
        )
    sets = [sorted(int(c) for c in s) for s in sets]
    return _finish(out, y, pattern), LabelSetLayout(groups, sets, sets)


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


# ---------------------------------------------------------------------------- helpers
def _check_labels(labels: np.ndarray, num_classes: int) -> np.ndarray:
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


def _check_seed(seed: int) -> None:
    if int(seed) != seed or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")


def _check_enough(num_examples: int, num_clients: int, per_client: int) -> None:
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if num_examples < num_clients * per_client:
        raise ValueError(
            f"cannot give {num_clients} clients {per_client} example(s) each: the training "
            f"set has {num_examples} examples"
        )


def _need_two_groups(pattern: str, num_clients: int) -> None:
    if num_clients < 2:
        raise ValueError(f"label-sets pattern {pattern!r} needs at least 2 clients, got {num_clients}")


def _child_seeds(seed: int, n: int) -> list[int]:
    """Independent 32-bit seeds derived from ``seed`` (one per random stream)."""
    children = np.random.SeedSequence(int(seed)).spawn(n)
    return [int(c.generate_state(1)[0]) for c in children]


def _array_digest(arr: np.ndarray) -> str:
    data = np.ascontiguousarray(arr, dtype=np.int64)
    h = hashlib.sha256(str(data.shape).encode())
    h.update(data.tobytes())
    return h.hexdigest()


def _hf_dataset(labels: np.ndarray, order: np.ndarray):
    """An in-memory ``datasets.Dataset`` of the labels in ``order``, with the original index."""
    import datasets

    return datasets.Dataset.from_dict({"label": labels[order].astype(np.int64), "idx": order.astype(np.int64)})


def _load_all(partitioner, num_clients: int) -> list[np.ndarray]:
    """Each partition's original indices (the ``idx`` column, read through Arrow: reading
    the column of a ``select``-ed dataset row by row takes seconds for 60k examples)."""
    out = []
    for pid in range(num_clients):
        column = partitioner.load_partition(pid).with_format("arrow")[:]["idx"]
        out.append(np.sort(np.asarray(column.to_numpy(), dtype=np.int64)))
    return out


def _natural(natural: Optional[list[np.ndarray]], num_clients: int, num_examples: int) -> list[np.ndarray]:
    if natural is None:
        raise ValueError("partition.scheme = 'natural' needs the dataset's own split (natural=None)")
    if len(natural) != num_clients:
        raise ValueError(f"natural split has {len(natural)} clients, num_clients is {num_clients}")
    indices = [np.asarray(ix, dtype=np.int64).ravel() for ix in natural]
    flat = np.concatenate(indices) if indices else np.zeros(0, dtype=np.int64)
    if len(flat) and (flat.min() < 0 or flat.max() >= num_examples):
        raise ValueError(f"natural split indices must lie in 0..{num_examples - 1}")
    if len(np.unique(flat)) != len(flat):
        raise ValueError("natural split gives some example to more than one client")
    return indices


def _class_pools(y: np.ndarray, order: np.ndarray, num_classes: Optional[int] = None) -> list[np.ndarray]:
    """Indices of each label, in the order they appear in ``order`` (a permutation/subset)."""
    num_classes = int(y.max()) + 1 if num_classes is None else num_classes
    sub = y[order]
    return [order[sub == c] for c in range(num_classes)]


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


def _materialise(pools: Sequence[np.ndarray], counts: np.ndarray) -> list[np.ndarray]:
    """Cut each label pool by the column ``counts[:, c]`` (clients in order)."""
    num_clients = counts.shape[0]
    chunks: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c, pool in enumerate(pools):
        bounds = np.cumsum(counts[:, c])[:-1]
        for k, piece in enumerate(np.split(pool, bounds)):
            chunks[k].append(piece)
    return [np.sort(np.concatenate(ch)).astype(np.int64) for ch in chunks]


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


def _quota_dirichlet_counts(
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
