"""The containers every data source returns, held whole in memory as torch tensors.

Clients index the tensors directly (no ``DataLoader`` at training time). Images are
stored compactly as ``uint8 [N, C, H, W]`` and normalised on the fly by
:meth:`ArrayDataset.inputs`; feature vectors are stored as ``float32 [N, D]``, token ids
as ``int64 [N, L]``. The sources (:mod:`fedflex.data`'s registry, :mod:`fedflex.hf`) build
them; this module also holds what they share: the data root, the error for missing
files, and a folder's file signature (what their tensor caches are keyed by).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import numpy as np
import torch

from fedflex.config import DatasetConfig

#: The environment variable that names the data root when ``dataset.root`` is unset.
DATA_ENV = "FEDFLEX_DATA"

#: The data root when neither ``dataset.root`` nor ``$FEDFLEX_DATA`` is set.
DEFAULT_ROOT = Path("~/.cache/fedflex/data")

Index = Union[torch.Tensor, np.ndarray, Sequence[int], slice, None]


class DataNotFoundError(RuntimeError):
    """A dataset's files are neither on disk nor downloadable.

    The message names every place looked at and how to get the files.

    Parameters
    ----------
    message
        The whole message.
    paths
        The places looked at, also kept as :attr:`paths`.
    """

    def __init__(self, message: str, paths: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.paths = tuple(str(p) for p in paths)

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep both arguments across pickling (Ray ships exceptions between processes).
        return (type(self), (str(self), self.paths))


def one_line(exc: BaseException, limit: int = 300) -> str:
    """``Type: message`` with its lines joined into one, cut at ``limit`` characters."""
    text = " ".join(line.strip() for line in str(exc).strip().splitlines() if line.strip())
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _as_index(idx: Index) -> Any:
    """``idx`` as something a tensor can be indexed with (``None``: everything)."""
    if idx is None:
        return slice(None)
    if isinstance(idx, slice):
        return idx
    t = torch.as_tensor(idx)
    return t if t.dtype == torch.bool else t.long()


@dataclass(frozen=True, eq=False)
class ArrayDataset:
    """A whole dataset as two tensors.

    Parameters
    ----------
    x
        Inputs: images as ``uint8 [N, C, H, W]``, features as ``float32 [N, D]``, or
        token ids as ``int64 [N, L]`` (text; 0 is padding).
    y
        Labels, ``int64 [N]``, in ``0 .. num_classes - 1``.
    num_classes
        Number of classes (some may have no example here, e.g. in a subset).
    mean, std
        Per-channel (dimension 1) normalisation that :meth:`inputs` applies, after
        scaling ``uint8`` images to ``[0, 1]``: ``(x / 255 - mean) / std``. Both or neither.

    Raises
    ------
    TypeError
        If ``x`` or ``y`` is not a tensor.
    ValueError
        If the shapes, dtypes or statistics do not fit together.
    """

    x: torch.Tensor
    y: torch.Tensor
    num_classes: int
    mean: Optional[tuple[float, ...]] = None
    std: Optional[tuple[float, ...]] = None

    def __post_init__(self) -> None:
        if not isinstance(self.x, torch.Tensor) or not isinstance(self.y, torch.Tensor):
            raise TypeError(f"x and y must be torch tensors, got {type(self.x).__name__} and {type(self.y).__name__}")
        if self.x.dim() < 2:
            raise ValueError(f"x must be [N, ...] with at least 2 dimensions, got shape {tuple(self.x.shape)}")
        if self.x.dtype not in (torch.uint8, torch.int64) and not self.x.dtype.is_floating_point:
            raise ValueError(f"x must be uint8 images, floating-point features or int64 token ids, got {self.x.dtype}")
        if self.x.dtype == torch.int64 and self.mean is not None:
            raise ValueError("token ids (int64 x) take no mean / std")
        if self.y.dim() != 1 or self.y.dtype != torch.int64:
            raise ValueError(f"y must be int64 [N], got {self.y.dtype} {tuple(self.y.shape)}")
        if self.x.shape[0] != self.y.shape[0]:
            raise ValueError(f"x has {self.x.shape[0]} rows but y has {self.y.shape[0]}")
        if self.num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {self.num_classes}")
        if (self.mean is None) != (self.std is None):
            raise ValueError("mean and std must be given together")
        if self.mean is not None and self.std is not None:
            channels = self.x.shape[1]
            if len(self.mean) != channels or len(self.std) != channels:
                raise ValueError(
                    f"mean and std need {channels} values (dimension 1 of x), got {len(self.mean)} and {len(self.std)}"
                )
            if any(s <= 0 for s in self.std):
                raise ValueError(f"std must be > 0, got {self.std}")

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def is_tokens(self) -> bool:
        """Whether the inputs are token ids (``int64``), which :meth:`inputs` returns as they are."""
        return self.x.dtype == torch.int64

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one example, e.g. ``(1, 28, 28)`` or ``(60,)``."""
        return tuple(int(s) for s in self.x.shape[1:])

    def inputs(self, idx: Index = None) -> torch.Tensor:
        """Rows ``idx`` (all if ``None``) as normalised ``float32``.

        ``uint8`` images become ``(x / 255 - mean) / std`` per channel. Float features
        without statistics come back as they are, sharing memory with :attr:`x` when they
        are already ``float32``; so do token ids (``int64``).
        """
        x = self.x[_as_index(idx)]
        if x.dtype == torch.int64:
            return x
        if x.dtype == torch.uint8:
            x = x.to(torch.float32).div_(255.0)
        elif x.dtype != torch.float32:
            x = x.to(torch.float32)
        if self.mean is not None and self.std is not None:
            view = (1, -1) + (1,) * (x.dim() - 2)
            mean = torch.tensor(self.mean, dtype=torch.float32, device=x.device).view(view)
            std = torch.tensor(self.std, dtype=torch.float32, device=x.device).view(view)
            x = (x - mean).div_(std)
        return x

    def labels(self, idx: Index = None) -> torch.Tensor:
        """Labels of rows ``idx`` (all if ``None``), ``int64``."""
        return self.y[_as_index(idx)]

    def subset(self, idx: Index) -> "ArrayDataset":
        """Return the rows ``idx`` as a new dataset with the same classes and statistics."""
        i = _as_index(idx)
        return ArrayDataset(self.x[i], self.y[i], self.num_classes, self.mean, self.std)


@dataclass(frozen=True, eq=False)
class FederatedData:
    """A train and a test set, and the dataset's own split when it has one.

    Parameters
    ----------
    train, test
        The whole training and test sets.
    natural_partition
        Per-client indices into ``train`` when the dataset comes split by client
        (``synthetic``), else ``None``.
    source
        When ``dataset.label_map`` changed the labels: the training set with the
        dataset's own labels (same inputs), for ``partition.labels: source``.
    """

    train: ArrayDataset
    test: ArrayDataset
    natural_partition: Optional[list[np.ndarray]] = None
    source: Optional[ArrayDataset] = None


def data_root(cfg: DatasetConfig) -> Path:
    """Return the directory that holds the datasets.

    ``cfg.root`` when set, else ``$FEDFLEX_DATA`` when set and non-empty, else
    ``~/.cache/fedflex/data``; ``~`` is expanded and the result made absolute.
    """
    if cfg.root:
        root = Path(cfg.root)
    elif os.environ.get(DATA_ENV):
        root = Path(os.environ[DATA_ENV])
    else:
        root = DEFAULT_ROOT
    return root.expanduser().absolute()


def source_signature(folder: Path) -> list[tuple[str, int, int]]:
    """(name, size, mtime) of every file under ``folder``: changes when the data change."""
    if not folder.is_dir():
        return []
    return sorted(
        (str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()
    )
