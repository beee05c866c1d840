"""The result of a split: per-client example indices and label counts."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedflex.atomic import atomic_write

#: Bump when an algorithm below changes its output, so that stale cache files are ignored.
PARTITION_FORMAT_VERSION = 1


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
        """Write to ``path`` (an ``.npz``) atomically (:func:`fedflex.atomic.atomic_write`).

        Stores the concatenated indices, the client offsets into them and the counts.
        """
        path = Path(path)
        sizes = self.sizes
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        flat = np.concatenate(self.indices) if self.indices else np.zeros(0, dtype=np.int64)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(path) as fh:
            np.savez(
                fh,
                version=np.array(PARTITION_FORMAT_VERSION, dtype=np.int64),
                flat=flat.astype(np.int64, copy=False),
                offsets=offsets,
                label_counts=self.label_counts,
            )

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
        if not all(np.issubdtype(a.dtype, np.integer) for a in (flat, offsets, counts)):
            raise ValueError(f"{path}: partition arrays must be integers")
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
