"""The dataset registry: each source, loaded whole into memory as torch tensors
(:class:`~fedflex.arraydata.ArrayDataset`, :class:`~fedflex.arraydata.FederatedData`,
defined in :mod:`fedflex.arraydata` and importable from here too).

Registered datasets (:data:`DATASETS`):

- ``fmnist``: Fashion-MNIST through torchvision's ``FashionMNIST``. When its raw files
  are not under the data root, the Debian package ``dataset-fashion-mnist``
  (``/usr/share/datasets/fashion-mnist/*-ubyte.gz``) is unpacked there; only then, and
  only with ``dataset.download=true``, is the network tried. A raw file that is there but
  damaged (cut short, another header; :func:`idx_problem`) is named in one warning and
  the intact Debian copy read instead (the damaged file is left alone); without an
  intact copy the damaged file is named in the :class:`DataNotFoundError`.
- ``mnist``: MNIST through torchvision's ``MNIST``.
- ``cifar10``: CIFAR-10 through torchvision's ``CIFAR10`` (python pickle batches).
- ``svhn``: SVHN (cropped digits) through torchvision's ``SVHN``, files in ``<root>/SVHN``.
- ``hf``: a Hugging Face dataset, text or images, from a ``save_to_disk`` directory, data
  files (CSV, JSON lines, Parquet) or the hub (:mod:`fedflex.hf`); text is tokenised into
  ``int64`` token ids, and a ``client_column`` gives a natural split (FEMNIST writers,
  Shakespeare speakers).
- ``synthetic``: Synthetic(alpha, beta) of the FedProx paper, Li et al., 2020,
  "Federated Optimization in Heterogeneous Networks", https://arxiv.org/abs/1812.06127:
  one generating distribution per client, generated, never downloaded; it is the only
  generated dataset with a natural per-client split.

The data root is ``dataset.root``, else ``$FEDFLEX_DATA``, else ``~/.cache/fedflex/data``
(:func:`data_root`). Missing files end as one :class:`DataNotFoundError` that names
every place looked at and how to get the files; failed downloads end the same way.

It is over 600 lines because it is the registry of every data source with its checks
(IDX headers, damaged files, the places looked at) and the tensor cache they share.
"""

from __future__ import annotations

import gzip
import http.client
import logging
import math
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from fedflex.arraydata import (  # noqa: F401 - the containers, also importable from here
    DATA_ENV,
    DEFAULT_ROOT,
    ArrayDataset,
    DataNotFoundError,
    FederatedData,
    data_root,
    one_line,
    source_signature,
)
from fedflex.config import ConfigError, DatasetConfig

log = logging.getLogger(__name__)

#: Where the Debian package ``dataset-fashion-mnist`` puts the four ``*-ubyte.gz`` files.
#: A module constant so tests can point it elsewhere.
DEBIAN_FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")

# The four files of the MNIST family, uncompressed names (torchvision reads these).
_IDX_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)

# Per-channel statistics of the training sets (the values commonly used with them).
FMNIST_MEAN, FMNIST_STD = (0.2860,), (0.3530,)
MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
SVHN_MEAN, SVHN_STD = (0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970)

# Errors that mean "the files are not there / could not be fetched": torchvision's
# "Dataset not found" RuntimeError, urllib's URLError (an OSError), socket errors,
# and http.client's protocol errors on a broken download.
_FETCH_ERRORS = (RuntimeError, OSError, EOFError, http.client.HTTPException)


# ---------------------------------------------------------------------------- errors
def _not_found(
    name: str,
    looked: Sequence[tuple[Path, Sequence[str]]],
    how: Sequence[str],
    *,
    download: bool,
    cause: Optional[BaseException] = None,
) -> DataNotFoundError:
    """Build the one message for a missing dataset."""
    where = "; ".join(f"{path} ({', '.join(files)})" if files else str(path) for path, files in looked)
    lines = [f"dataset {name!r} not found (dataset.download={str(download).lower()})."]
    lines.append(f"  looked in: {where}")
    if cause is not None and (download or "not found" not in str(cause)):
        verb = "download failed" if download else "torchvision said"
        lines.append(f"  {verb}: {one_line(cause)}")
    if download:
        how = [*how, "dataset.download is on: run where the network is reachable"]
    else:
        how = [*how, "set dataset.download=true on a machine with a network"]
    lines.append("  to get it: " + "; or ".join(how))
    return DataNotFoundError("\n".join(lines), [str(path) for path, _ in looked])


# ---------------------------------------------------------------------------- containers
# ---------------------------------------------------------------------------- roots
def _root_hint() -> str:
    return f"set dataset.root / ${DATA_ENV} to a directory that already holds them"


# ---------------------------------------------------------------------------- torchvision
def _construct(
    name: str,
    build: Callable[[], Any],
    looked: Sequence[tuple[Path, Sequence[str]]],
    how: Sequence[str],
    download: bool,
) -> Any:
    """Call a torchvision constructor; missing files and failed downloads -> DataNotFoundError."""
    try:
        return build()
    except _FETCH_ERRORS as exc:
        raise _not_found(name, looked, how, download=download, cause=exc) from exc


def _image_set(
    data: Any, targets: Any, num_classes: int, mean: tuple[float, ...], std: tuple[float, ...], nhwc: bool
) -> ArrayDataset:
    x = torch.as_tensor(np.asarray(data)) if not isinstance(data, torch.Tensor) else data
    if nhwc:
        x = x.permute(0, 3, 1, 2)
    elif x.dim() == 3:  # MNIST family: [N, H, W]
        x = x.unsqueeze(1)
    x = x.to(torch.uint8).contiguous()
    y = torch.as_tensor(np.asarray(targets), dtype=torch.int64).reshape(-1)
    return ArrayDataset(x, y.contiguous(), num_classes, mean, std)


def _unpack_debian_fmnist(raw: Path) -> bool:
    """Gunzip the Debian package's files into ``raw`` when all four are there.

    Returns whether ``raw`` now holds the four files. Each file is written to a
    temporary name and renamed, so concurrent loaders never see half a file.
    """
    src = DEBIAN_FMNIST_DIR
    sources = [src / f"{f}.gz" for f in _IDX_FILES]
    if not all(p.is_file() for p in sources):
        return False
    try:
        raw.mkdir(parents=True, exist_ok=True)
        for gz, name in zip(sources, _IDX_FILES):
            dest = raw / name
            if dest.is_file():
                continue
            tmp = raw / f".{name}.{os.getpid()}.tmp"
            with gzip.open(gz, "rb") as fin, open(tmp, "wb") as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
            os.replace(tmp, dest)
            log.info("unpacked %s into %s", gz, dest)
    except (OSError, EOFError) as exc:
        raise DataNotFoundError(
            f"dataset 'fmnist': could not unpack {src} into {raw}: {one_line(exc)}\n"
            f"  set dataset.root / ${DATA_ENV} to a writable directory",
            [str(raw), str(src)],
        ) from exc
    return True


#: idx element types (the third byte of the magic number) -> bytes per element
_IDX_TYPES = {0x08: 1, 0x09: 1, 0x0B: 2, 0x0C: 4, 0x0D: 4, 0x0E: 8}


def _idx_header(head: bytes, size: int, ndim: int) -> tuple[Optional[tuple[int, ...]], str]:
    """Return the dims an idx file's first bytes say, or why they do not fit a file of ``size`` bytes."""
    if len(head) < 4 or head[0] != 0 or head[1] != 0 or head[2] not in _IDX_TYPES:
        return None, "not an idx file (bad magic number)"
    if head[3] != ndim:
        return None, f"{head[3]} dimensions, expected {ndim}"
    if len(head) < 4 + 4 * ndim:
        return None, f"{size} bytes, shorter than its header"
    dims = tuple(int.from_bytes(head[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    want = 4 + 4 * ndim + math.prod(dims) * _IDX_TYPES[head[2]]
    if size != want:
        return None, f"{size} bytes, but its header says {' x '.join(map(str, dims))} values: {want} bytes"
    return dims, ""


def idx_problem(path: Path) -> str:
    """Why ``path`` is not a whole idx file of the MNIST family ("" when it is): its magic
    number, its number of dimensions (3 for ``*-images-*``, 1 for ``*-labels-*``) and its
    size, which its header fixes (a file cut short, a download broken off).
    """
    ndim = 3 if "images" in path.name else 1
    try:
        with open(path, "rb") as fh:
            head = fh.read(4 + 4 * ndim)
        size = path.stat().st_size
    except OSError as exc:
        return f"cannot be read ({one_line(exc)})"
    return _idx_header(head, size, ndim)[1]


def _idx_damage(folder: Path, names: Sequence[str]) -> list[tuple[Path, str]]:
    """Return the files of ``names`` in ``folder`` that are damaged, with why; a train or
    test set whose images and labels disagree in number counts as damaged too.
    """
    damaged = [(folder / n, why) for n in names if (folder / n).is_file() for why in [idx_problem(folder / n)] if why]
    if damaged or not all((folder / n).is_file() for n in names):
        return damaged
    for images, labels in zip(names[0::2], names[1::2]):
        counts = []
        for name in (images, labels):
            with open(folder / name, "rb") as fh:
                counts.append(int.from_bytes(fh.read(8)[4:8], "big"))
        if counts[0] != counts[1]:
            damaged.append((folder / labels, f"{counts[1]} labels for {counts[0]} images in {images}"))
    return damaged


def _read_idx_gz(path: Path, ndim: int) -> np.ndarray:
    """Return the array of a gzipped idx file of unsigned bytes (raises ValueError when damaged)."""
    with gzip.open(path, "rb") as fh:
        data = fh.read()
    dims, why = _idx_header(data[: 4 + 4 * ndim], len(data), ndim)
    if dims is None or data[2] != 0x08:
        raise ValueError(f"{path}: {why or 'not unsigned bytes'}")
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _debian_fmnist() -> Optional[FederatedData]:
    """Fashion-MNIST read straight from the Debian package's files (None when they are
    missing or damaged themselves).
    """
    try:
        parts = [_read_idx_gz(DEBIAN_FMNIST_DIR / f"{name}.gz", 3 if "images" in name else 1) for name in _IDX_FILES]
    except (OSError, EOFError, ValueError) as exc:
        log.debug("the Debian Fashion-MNIST copy cannot be read: %s", one_line(exc))
        return None
    train_x, train_y, test_x, test_y = parts
    if len(train_x) != len(train_y) or len(test_x) != len(test_y):
        return None
    return FederatedData(
        train=_image_set(train_x, train_y, 10, FMNIST_MEAN, FMNIST_STD, nhwc=False),
        test=_image_set(test_x, test_y, 10, FMNIST_MEAN, FMNIST_STD, nhwc=False),
    )


def _load_idx_family(
    cfg: DatasetConfig, name: str, cls_name: str, mean: tuple[float, ...], std: tuple[float, ...], debian: bool
) -> FederatedData:
    """MNIST and Fashion-MNIST: torchvision reads ``<root>/<ClassName>/raw/*-ubyte``."""
    from torchvision import datasets as tvd

    cls = getattr(tvd, cls_name)
    root = data_root(cfg)
    raw = root / cls_name / "raw"
    looked: list[tuple[Path, Sequence[str]]] = [(raw, _IDX_FILES)]
    how = [f"put the four files {', '.join(_IDX_FILES)} (gunzipped) in {raw}", _root_hint()]
    if debian:
        looked.append((DEBIAN_FMNIST_DIR, [f"{f}.gz" for f in _IDX_FILES]))
        how.insert(0, f"`apt-get install dataset-fashion-mnist` (Debian; puts them in {DEBIAN_FMNIST_DIR})")
        if not all((raw / f).is_file() for f in _IDX_FILES):
            _unpack_debian_fmnist(raw)
    damaged = _idx_damage(raw, _IDX_FILES)
    if damaged:
        bad, why = damaged[0]
        intact = _debian_fmnist() if debian else None
        if intact is not None:
            log.warning(
                "dataset %r: %s is damaged (%s): reading the intact copy in %s instead "
                "(delete the damaged file to have that copy unpacked in its place)",
                name,
                bad,
                why,
                DEBIAN_FMNIST_DIR,
            )
            return intact
        how = [f"`apt-get install dataset-fashion-mnist` (an intact copy in {DEBIAN_FMNIST_DIR})"] if debian else []
        how.append("dataset.download=true (it downloads the missing file)" if not cfg.download else "run again")
        raise DataNotFoundError(
            f"dataset {name!r}: {bad} is damaged ({why}).\n"
            f"  to get it: delete the damaged file, then " + "; or ".join(how),
            [str(bad)],
        )

    def build(train: bool) -> Any:
        return _construct(name, lambda: cls(str(root), train=train, download=cfg.download), looked, how, cfg.download)

    train, test = build(True), build(False)
    return FederatedData(
        train=_image_set(train.data, train.targets, 10, mean, std, nhwc=False),
        test=_image_set(test.data, test.targets, 10, mean, std, nhwc=False),
    )


def _load_fmnist(cfg: DatasetConfig, num_clients: int, seed: int) -> FederatedData:
    """Fashion-MNIST: 60000 / 10000 grey 28x28 images, 10 classes."""
    return _load_idx_family(cfg, "fmnist", "FashionMNIST", FMNIST_MEAN, FMNIST_STD, debian=True)


def _load_mnist(cfg: DatasetConfig, num_clients: int, seed: int) -> FederatedData:
    """MNIST: 60000 / 10000 grey 28x28 digits, 10 classes."""
    return _load_idx_family(cfg, "mnist", "MNIST", MNIST_MEAN, MNIST_STD, debian=False)


def _load_cifar10(cfg: DatasetConfig, num_clients: int, seed: int) -> FederatedData:
    """CIFAR-10: 50000 / 10000 colour 32x32 images, 10 classes."""
    from torchvision.datasets import CIFAR10

    root = data_root(cfg)
    folder = root / CIFAR10.base_folder
    files = [f for f, _ in CIFAR10.train_list + CIFAR10.test_list] + [CIFAR10.meta["filename"]]
    looked = [(folder, files)]
    how = [
        f"unpack cifar-10-python.tar.gz (https://www.cs.toronto.edu/~kriz/cifar.html) in {root}",
        _root_hint(),
    ]

    def build(train: bool) -> Any:
        return _construct(
            "cifar10", lambda: CIFAR10(str(root), train=train, download=cfg.download), looked, how, cfg.download
        )

    train, test = build(True), build(False)
    return FederatedData(
        train=_image_set(train.data, train.targets, 10, CIFAR10_MEAN, CIFAR10_STD, nhwc=True),
        test=_image_set(test.data, test.targets, 10, CIFAR10_MEAN, CIFAR10_STD, nhwc=True),
    )


def _load_svhn(cfg: DatasetConfig, num_clients: int, seed: int) -> FederatedData:
    """SVHN cropped digits: 73257 / 26032 colour 32x32 images, 10 classes (label 10 -> 0)."""
    from torchvision.datasets import SVHN

    root = data_root(cfg) / "SVHN"
    files = [SVHN.split_list[s][1] for s in ("train", "test")]
    looked = [(root, files)]
    how = [
        f"put {' and '.join(files)} (http://ufldl.stanford.edu/housenumbers/) in {root}",
        _root_hint() + " (in its SVHN/ folder)",
    ]

    def build(split: str) -> Any:
        return _construct(
            "svhn", lambda: SVHN(str(root), split=split, download=cfg.download), looked, how, cfg.download
        )

    train, test = build("train"), build("test")
    return FederatedData(
        train=_image_set(train.data, train.labels, 10, SVHN_MEAN, SVHN_STD, nhwc=False),
        test=_image_set(test.data, test.labels, 10, SVHN_MEAN, SVHN_STD, nhwc=False),
    )


# ---------------------------------------------------------------------------- synthetic
#: sigma of the log-normal client sizes of ``synthetic``.
SYNTHETIC_SIZE_SIGMA = 0.5
#: Smallest client of the synthetic federation.
SYNTHETIC_MIN_SIZE = 10


def _load_synthetic(cfg: DatasetConfig, num_clients: int, seed: int) -> FederatedData:
    """Synthetic(alpha, beta) of the FedProx paper (Li et al., 2020, arXiv 1812.06127).

    For client ``k`` (``d = cfg.dim``, ``C = cfg.num_classes``; alpha and beta are
    variances, as in the paper):

    - ``u_k ~ N(0, alpha)``, ``B_k ~ N(0, beta)``;
    - ``W_k in R^{C x d}``, ``b_k in R^C`` with entries ``~ N(u_k, 1)``;
    - ``v_k in R^d`` with entries ``~ N(B_k, 1)``;
    - ``x ~ N(v_k, Sigma)``, ``Sigma`` diagonal with ``Sigma_jj = j^-1.2`` (j = 1..d);
    - ``y = argmax(W_k x + b_k)``.

    Sizes follow the paper's power law: ``n_k = 1 + floor(L_k)``,
    ``L_k ~ LogNormal(log(cfg.samples_per_client), 0.5)`` (median ``samples_per_client``),
    raised to at least 10. (The paper's code draws ``LogNormal(4, 2) + 50``; a median tied
    to ``samples_per_client`` with a milder spread keeps the scale configurable.) The
    last ``n_k * test_fraction`` samples of a client (rounded half up, at least one, at most
    ``n_k - 1``) are its test samples; samples are i.i.d. within a client, so no shuffle
    is needed. ``natural_partition[k]`` holds client ``k``'s rows of ``train``.

    One ``numpy.random.default_rng(seed)`` draws everything client by client, so client
    ``k``'s data do not depend on ``num_clients`` (a larger federation extends a smaller
    one), and changing alpha or beta changes the values, never the draws.

    Note that ``u_k`` shifts every logit of client ``k`` by the same amount
    (``u_k * (sum(x) + 1)``), which cancels in the argmax: alpha does not change the
    labels, as in the paper's construction. Heterogeneity comes from each client's own
    ``W_k, b_k`` (at any alpha) and from beta, which moves the clients' inputs apart.
    """
    if num_clients < 1:
        raise ValueError(f"synthetic needs num_clients >= 1, got {num_clients}")
    d, c = int(cfg.dim), int(cfg.num_classes)
    rng = np.random.default_rng(seed)
    sd_x = np.arange(1, d + 1, dtype=np.float64) ** (-1.2 / 2)  # sqrt of Sigma_jj
    sd_u, sd_b = math.sqrt(cfg.alpha), math.sqrt(cfg.beta)
    train_x, train_y, test_x, test_y = [], [], [], []
    for _ in range(num_clients):
        draw = rng.lognormal(math.log(cfg.samples_per_client), SYNTHETIC_SIZE_SIGMA)
        n = max(SYNTHETIC_MIN_SIZE, 1 + int(math.floor(draw)))
        u = sd_u * rng.standard_normal()
        big_b = sd_b * rng.standard_normal()
        w = u + rng.standard_normal((c, d))
        b = u + rng.standard_normal(c)
        v = big_b + rng.standard_normal(d)
        x = v + sd_x * rng.standard_normal((n, d))
        y = np.argmax(x @ w.T + b, axis=1)
        n_test = min(n - 1, max(1, int(math.floor(n * cfg.test_fraction + 0.5))))
        train_x.append(x[: n - n_test])
        train_y.append(y[: n - n_test])
        test_x.append(x[n - n_test :])
        test_y.append(y[n - n_test :])
    sizes = np.array([len(t) for t in train_y])
    ends = np.cumsum(sizes)
    partition = [np.arange(e - s, e, dtype=np.int64) for s, e in zip(sizes, ends)]

    def as_set(xs: list[np.ndarray], ys: list[np.ndarray]) -> ArrayDataset:
        x = torch.from_numpy(np.concatenate(xs).astype(np.float32))
        y = torch.from_numpy(np.concatenate(ys).astype(np.int64))
        return ArrayDataset(x, y, c)

    return FederatedData(train=as_set(train_x, train_y), test=as_set(test_x, test_y), natural_partition=partition)


def _load_hf(cfg: DatasetConfig, num_clients: int, seed: int) -> FederatedData:
    """Return a Hugging Face dataset: hub name, ``save_to_disk`` directory or data files
    (:mod:`fedflex.hf`).
    """
    from fedflex.hf import load_hf

    return load_hf(cfg, num_clients, seed)


# ---------------------------------------------------------------------------- registry
#: Registry name -> loader ``(cfg, num_clients, seed) -> FederatedData``.
DATASETS: dict[str, Callable[[DatasetConfig, int, int], FederatedData]] = {
    "synthetic": _load_synthetic,
    "fmnist": _load_fmnist,
    "mnist": _load_mnist,
    "cifar10": _load_cifar10,
    "svhn": _load_svhn,
    "hf": _load_hf,
}


def load_dataset(cfg: DatasetConfig, num_clients: int, seed: int) -> FederatedData:
    """Load ``cfg.name`` whole into memory.

    Parameters
    ----------
    cfg
        The scenario's dataset section.
    num_clients
        Number of clients (``synthetic`` generates one distribution per client).
    seed
        Seed of the generated datasets; the file-based ones ignore it.

    Returns
    -------
    FederatedData
        Train and test sets, and ``natural_partition`` for ``synthetic``; labels mapped
        by ``cfg.label_map`` (:func:`apply_label_map`; the tensor cache keeps the
        original labels).

    Raises
    ------
    ConfigError
        If ``cfg.name`` is not a registered dataset.
    DataNotFoundError
        If the files are not on disk and cannot be downloaded.
    """
    loader = DATASETS.get(cfg.name)
    if loader is None:
        raise ConfigError("dataset.name", cfg.name, "must be one of " + ", ".join(DATASETS))
    if cfg.name in SOURCE_DIRS:
        data = _load_with_tensor_cache(cfg, loader, num_clients, seed)
    else:
        data = loader(cfg, num_clients, seed)
    data = apply_label_map(data, cfg.label_map)
    log.info(
        "loaded %s: %d train / %d test examples, input shape %s, %d classes",
        cfg.name,
        len(data.train),
        len(data.test),
        data.train.input_shape,
        data.train.num_classes,
    )
    return data


def check_data_fits(cfg: Any, data: FederatedData) -> None:
    """Check what only the loaded data can tell, before a run starts: text models need
    token ids and token ids need a text model; with ``partition.scheme=natural``,
    ``num_clients`` must be the number of natural clients (an ``hf`` dataset's
    ``client_column`` values).

    Raises
    ------
    ConfigError
        Naming the key and what to set.
    """
    from fedflex.config import TEXT_MODELS

    text_model = cfg.model.name in TEXT_MODELS
    if data.train.is_tokens != text_model:
        what = (
            "token ids (a text input_column)" if data.train.is_tokens else f"inputs of shape {data.train.input_shape}"
        )
        need = ", ".join(TEXT_MODELS) if data.train.is_tokens else "an image or feature model"
        raise ConfigError("model.name", cfg.model.name, f"dataset {cfg.dataset.name} gives {what}: use {need}")
    if cfg.partition.scheme != "natural" or data.natural_partition is None:
        return
    found = len(data.natural_partition)
    if found != cfg.num_clients:
        by = f"dataset.client_column={cfg.dataset.client_column!r}" if cfg.dataset.name == "hf" else cfg.dataset.name
        raise ConfigError(
            "num_clients",
            cfg.num_clients,
            f"partition.scheme=natural by {by} gives {found} clients: set num_clients={found}",
        )


def apply_label_map(data: FederatedData, label_map: str) -> FederatedData:
    """Return the data with their labels mapped (a post-step of :func:`load_dataset`).

    ``none``: unchanged. ``even-odd``: y -> y mod 2 (even -> 0, odd -> 1), two classes,
    the BHerd paper's SVM task. Inputs are shared, not copied; the labels are new
    tensors, so a memory-mapped cache is never written to.

    Raises
    ------
    ConfigError
        For an unknown map (``dataset.label_map``).
    """
    if label_map == "none":
        return data
    if label_map == "even-odd":

        def mapped(part: ArrayDataset) -> ArrayDataset:
            return ArrayDataset(part.x, torch.remainder(part.y, 2), 2, part.mean, part.std)

        return FederatedData(
            train=mapped(data.train),
            test=mapped(data.test),
            natural_partition=data.natural_partition,
            source=data.train,
        )
    raise ConfigError("dataset.label_map", label_map, "must be one of none, even-odd")


# ---------------------------------------------------------------------------- tensor cache
#: Where each file-based dataset's source files live under the data root.
SOURCE_DIRS = {"fmnist": "FashionMNIST", "mnist": "MNIST", "cifar10": "cifar-10-batches-py", "svhn": "SVHN"}
_CACHE_FORMAT = 1


def tensor_cache_path(cfg: DatasetConfig) -> Path:
    """Return ``<data root>/fedflex-tensors/<name>.pt``: the decoded tensors of a file-based dataset."""
    return data_root(cfg) / "fedflex-tensors" / f"{cfg.name}.pt"


def _load_with_tensor_cache(cfg: DatasetConfig, loader: Callable, num_clients: int, seed: int) -> FederatedData:
    """Decode the dataset's files once, then load the tensors memory-mapped.

    Parsing image files (and importing torchvision) costs seconds in every worker
    process; a memory-mapped tensor file loads in milliseconds and its pages are shared
    by all workers on the machine. The cache is checked against the sizes and
    modification times of the source files and rebuilt when they change.
    """
    path = tensor_cache_path(cfg)
    source = data_root(cfg) / SOURCE_DIRS[cfg.name]
    signature = source_signature(source)
    if signature and path.is_file():
        try:
            blob = torch.load(path, mmap=True, weights_only=True)
            if blob.get("format") == _CACHE_FORMAT and [tuple(s) for s in blob["signature"]] == signature:
                return _from_blob(blob)
        except Exception as exc:  # a broken cache file is only a slower start
            log.warning("ignoring unreadable tensor cache %s: %s", path, one_line(exc))
    data = loader(cfg, num_clients, seed)
    signature = source_signature(source)
    # not from damaged files (another copy was read): the next run warns about them again
    if signature and not _idx_damage(source / "raw", _IDX_FILES):
        _save_blob(path, data, signature)
    return data


def _from_blob(blob: dict) -> FederatedData:
    def part(prefix: str) -> ArrayDataset:
        stats = blob["stats"]
        return ArrayDataset(
            x=blob[f"{prefix}_x"],
            y=blob[f"{prefix}_y"],
            num_classes=int(stats["num_classes"]),
            mean=tuple(stats["mean"]) if stats["mean"] is not None else None,
            std=tuple(stats["std"]) if stats["std"] is not None else None,
        )

    return FederatedData(train=part("train"), test=part("test"))


def _save_blob(path: Path, data: FederatedData, signature: list) -> None:
    blob = {
        "format": _CACHE_FORMAT,
        "signature": [list(s) for s in signature],
        "stats": {"num_classes": data.train.num_classes, "mean": data.train.mean, "std": data.train.std},
        "train_x": data.train.x.contiguous(),
        "train_y": data.train.y.contiguous(),
        "test_x": data.test.x.contiguous(),
        "test_y": data.test.y.contiguous(),
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        torch.save(blob, tmp)
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("could not write the tensor cache %s: %s", path, one_line(exc))
