"""Hugging Face datasets as a fedflex dataset (``dataset.name=hf``), text or images.

Sources, looked at in this order (``docs/datasets.md``):

1. ``dataset.path``: a directory written by ``Dataset.save_to_disk`` /
   ``DatasetDict.save_to_disk`` (``datasets.load_from_disk``);
2. ``dataset.train_files`` (and ``test_files``): CSV, JSON lines or Parquet files, read by
   the packaged ``datasets`` builders (``load_dataset("csv" | "json" | "parquet",
   data_files=...)``), the format taken from the file suffix;
3. ``dataset.hub``: a hub name, ``datasets.load_dataset(hub, hub_config)`` (downloaded
   and cached by ``datasets`` when the network is reachable; only with
   ``dataset.download=true``).

A local source that is configured but absent falls through to the hub when ``hub`` is
set; when nothing can be had, one :class:`fedflex.data.DataNotFoundError` line names what
to provide. Relative paths resolve against the data root (:func:`fedflex.data.data_root`).

What becomes of a column:

- input: strings are tokenised (:class:`Tokenizer`) into ``int64 [N, max_len]`` token
  ids; images (``datasets.Image``) and integer arrays in 0..255 become ``uint8 [N, C, H, W]``
  normalised by the training split's per-channel mean and std; other numbers
  ``float32 [N, D]``;
- label: a ``ClassLabel`` keeps its ids; integers are used as they are (``num_classes``
  = largest + 1); strings are numbered in sorted order over both splits;
- ``client_column`` (optional): each training example's natural client, grouped by
  flwr-datasets' ``NaturalIdPartitioner`` (client ``k`` is its partition ``k``) into
  ``FederatedData.natural_partition`` for ``partition.scheme=natural``.

Without a test split, ``test_fraction`` of the training split is held out by a draw
with the fixed seed :data:`HOLDOUT_SEED` (so the split, and the cache, do not depend on the
scenario's seed).

The decoded tensors, the vocabulary and the natural split are stored once in
``<data root>/fedflex-tensors/hf-<key>.pt`` (the vocabulary also as ``.vocab.json``) and
loaded memory-mapped afterwards, so thousands of virtual clients in many worker
processes share one copy; ``key`` hashes the source (file names, sizes and modification
times, or the hub name), the columns and the tokenizer settings.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import re
import zlib
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch

from fedflex.arraydata import ArrayDataset, DataNotFoundError, FederatedData, data_root, one_line, source_signature
from fedflex.config import ConfigError, DatasetConfig

log = logging.getLogger(__name__)

#: Seed of the held-out test draw when the source has no test split.
HOLDOUT_SEED = 0
#: Token id of padding and of a token outside the vocabulary.
PAD_ID, UNK_ID = 0, 1
#: ``datasets`` builder of each data file suffix.
FILE_FORMATS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
_CACHE_FORMAT = 1
_WORD = re.compile(r"\w+", re.UNICODE)


# ---------------------------------------------------------------------------- tokenizer
class Tokenizer:
    """Text -> ``max_len`` token ids, without any download.

    ``vocab``: the ``vocab_size`` most frequent tokens of the training texts (ties broken
    by the token's text) get ids ``2 ..``; others map to :data:`UNK_ID`. ``hashing``: a
    token's id is ``2 + crc32(token) mod vocab_size`` (stable across processes and
    machines; different tokens may share an id). Either way ids lie in
    ``0 .. vocab_size + 1``, so a model's embedding table has ``vocab_size + 2`` rows.

    Parameters
    ----------
    cfg
        ``tokenizer``, ``token_unit`` (``words``: runs of word characters, ``chars``: every
        character, spaces included), ``lowercase``, ``vocab_size``, ``max_len``,
        ``truncation`` (``right``: keep the first ``max_len`` tokens; ``left``: the last)
        and ``padding`` (the side the :data:`PAD_ID` fill goes).
    vocab
        The vocabulary (tokens in id order from 2), for ``tokenizer=vocab``.
    """

    def __init__(self, cfg: DatasetConfig, vocab: Optional[Sequence[str]] = None) -> None:
        self.cfg = cfg
        self.vocab = list(vocab or [])
        self._ids = {tok: i + 2 for i, tok in enumerate(self.vocab)}

    @classmethod
    def fit(cls, cfg: DatasetConfig, texts: Sequence[str]) -> "Tokenizer":
        """Return a tokenizer for ``cfg``, its vocabulary counted on ``texts`` (``tokenizer=vocab``)."""
        if cfg.tokenizer == "hashing":
            return cls(cfg)
        counts: collections.Counter[str] = collections.Counter()
        probe = cls(cfg)
        for text in texts:
            counts.update(probe.tokens(text))
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: cfg.vocab_size]
        return cls(cfg, [tok for tok, _ in ranked])

    def tokens(self, text: Any) -> list[str]:
        """Split ``text`` into tokens (lower-cased when configured; None is the empty text)."""
        text = "" if text is None else str(text)
        if self.cfg.lowercase:
            text = text.lower()
        return _WORD.findall(text) if self.cfg.token_unit == "words" else list(text)

    def _id(self, token: str) -> int:
        if self.cfg.tokenizer == "hashing":
            return 2 + zlib.crc32(token.encode("utf-8")) % self.cfg.vocab_size
        return self._ids.get(token, UNK_ID)

    def encode(self, text: Any) -> list[int]:
        """One text as exactly ``max_len`` ids (cut and padded on the configured sides)."""
        n = self.cfg.max_len
        ids = [self._id(t) for t in self.tokens(text)]
        ids = ids[:n] if self.cfg.truncation == "right" else ids[-n:]
        fill = [PAD_ID] * (n - len(ids))
        return ids + fill if self.cfg.padding == "right" else fill + ids

    def encode_all(self, texts: Sequence[Any]) -> torch.Tensor:
        """``int64 [len(texts), max_len]``."""
        out = np.zeros((len(texts), self.cfg.max_len), dtype=np.int64)
        for i, text in enumerate(texts):
            out[i] = self.encode(text)
        return torch.from_numpy(out)


# ---------------------------------------------------------------------------- sources
def _resolve(root: Path, name: str) -> Path:
    p = Path(name).expanduser()
    return p if p.is_absolute() else root / p


def _source(cfg: DatasetConfig) -> tuple[str, Any, list[str]]:
    """``(kind, what, looked)``: ``("dir", Path)``, ``("files", (train, test))`` or
    ``("hub", name)``, and the local places looked at (for the error).
    """
    root = data_root(cfg)
    looked: list[str] = []
    if cfg.path:
        folder = _resolve(root, cfg.path)
        if folder.is_dir():
            return "dir", folder, looked
        looked.append(str(folder))
    elif cfg.train_files:
        train = [_resolve(root, f) for f in cfg.train_files]
        test = [_resolve(root, f) for f in cfg.test_files]
        for f in train + test:
            if f.suffix.lower() not in FILE_FORMATS:
                raise ConfigError(
                    "dataset.train_files" if f in train else "dataset.test_files",
                    str(f),
                    "must end in " + ", ".join(FILE_FORMATS) + " (CSV, JSON lines, Parquet)",
                )
        missing = [str(f) for f in train + test if not f.is_file()]
        if not missing:
            return "files", (train, test), looked
        looked.extend(missing)
    if cfg.hub:
        return "hub", cfg.hub, looked
    raise _missing(cfg, looked, None)


def _missing(cfg: DatasetConfig, looked: Sequence[str], cause: Optional[BaseException]) -> DataNotFoundError:
    """Return the one line for a dataset that is neither on disk nor downloadable."""
    what = f"hub {cfg.hub!r}" if cfg.hub else "dataset hf"
    parts = [f"{what}: no local copy"]
    if looked:
        parts[0] += " (looked for " + ", ".join(looked) + ")"
    if cfg.hub and not cfg.download:
        parts.append("dataset.download=false")
    elif cause is not None:
        parts.append("the hub could not be reached (" + one_line(cause, 160) + ")")
    parts.append(
        "provide dataset.path=<a save_to_disk directory> or dataset.train_files=[...] / test_files=[...] "
        f"(CSV, JSON lines, Parquet; relative to {data_root(cfg)}, set by dataset.root or $FEDFLEX_DATA)"
    )
    return DataNotFoundError("; ".join(parts), list(looked))


def _open(cfg: DatasetConfig, kind: str, what: Any, looked: list[str]) -> dict[str, Any]:
    """Return the source's splits as ``{name: datasets.Dataset}``."""
    import datasets

    if kind == "dir":
        loaded = datasets.load_from_disk(str(what))
        return dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {cfg.train_split: loaded}
    if kind == "files":
        train, test = what
        cache = str(data_root(cfg) / "hf-cache")
        out = {cfg.train_split: _read_files(train, cache)}
        if test:
            out[cfg.test_split] = _read_files(test, cache)
        return out
    if not cfg.download:
        raise _missing(cfg, looked, None)
    try:
        loaded = datasets.load_dataset(what, cfg.hub_config)
    except Exception as exc:  # no network, an unknown name, a rate limit: all end the same way
        raise _missing(cfg, looked, exc) from exc
    return dict(loaded)


def _read_files(files: Sequence[Path], cache_dir: str):
    import datasets

    formats = {FILE_FORMATS[f.suffix.lower()] for f in files}
    if len(formats) > 1:
        raise ConfigError("dataset.train_files", [str(f) for f in files], "mixes formats; give files of one format")
    builder = formats.pop()
    # the packaged builders read the files without any network access
    loaded = datasets.load_dataset(
        builder, data_files={"split": [str(f) for f in files]}, split="split", cache_dir=cache_dir
    )
    return loaded


# ---------------------------------------------------------------------------- cache
def _cache_path(cfg: DatasetConfig, kind: str, what: Any) -> Path:
    if kind == "dir":
        ident: Any = [str(what), source_signature(Path(what))]
    elif kind == "files":
        ident = [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in what[0] + what[1]]
    else:
        ident = [what, cfg.hub_config]
    settings = {
        k: v
        for k, v in asdict(cfg).items()
        if k
        in (
            "train_split",
            "test_split",
            "input_column",
            "label_column",
            "client_column",
            "tokenizer",
            "token_unit",
            "lowercase",
            "vocab_size",
            "max_len",
            "truncation",
            "padding",
            "test_fraction",
        )
    }
    text = json.dumps({"format": _CACHE_FORMAT, "kind": kind, "source": ident, "settings": settings}, sort_keys=True)
    key = hashlib.sha256(text.encode()).hexdigest()[:20]
    return data_root(cfg) / "fedflex-tensors" / f"hf-{key}.pt"


def _save(path: Path, data: FederatedData, extra: dict) -> None:
    natural = data.natural_partition
    blob = {
        "format": _CACHE_FORMAT,
        "num_classes": data.train.num_classes,
        "mean": data.train.mean,
        "std": data.train.std,
        "train_x": data.train.x.contiguous(),
        "train_y": data.train.y.contiguous(),
        "test_x": data.test.x.contiguous(),
        "test_y": data.test.y.contiguous(),
        "natural_sizes": None if natural is None else torch.tensor([len(ix) for ix in natural], dtype=torch.int64),
        "natural_flat": None if natural is None else torch.from_numpy(np.concatenate(natural).astype(np.int64)),
        **extra,
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        torch.save(blob, tmp)
        os.replace(tmp, path)
        if extra.get("vocab"):
            vocab_file = path.with_suffix(".vocab.json")
            tmp = vocab_file.with_name(f"{vocab_file.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"pad": PAD_ID, "unk": UNK_ID, "tokens": extra["vocab"]}, ensure_ascii=False))
            os.replace(tmp, vocab_file)
    except OSError as exc:
        log.warning("could not write the tensor cache %s: %s", path, one_line(exc))


def _load(path: Path) -> Optional[tuple[FederatedData, dict]]:
    if not path.is_file():
        return None
    try:
        blob = torch.load(path, mmap=True, weights_only=True)
    except Exception as exc:  # a broken cache file is only a slower start
        log.warning("ignoring unreadable tensor cache %s: %s", path, one_line(exc))
        return None
    if blob.get("format") != _CACHE_FORMAT:
        return None
    mean = tuple(blob["mean"]) if blob["mean"] is not None else None
    std = tuple(blob["std"]) if blob["std"] is not None else None
    c = int(blob["num_classes"])
    natural = None
    if blob["natural_sizes"] is not None:
        ends = np.cumsum(blob["natural_sizes"].numpy())
        natural = np.split(blob["natural_flat"].numpy(), ends[:-1])
    data = FederatedData(
        train=ArrayDataset(blob["train_x"], blob["train_y"], c, mean, std),
        test=ArrayDataset(blob["test_x"], blob["test_y"], c, mean, std),
        natural_partition=natural,
    )
    return data, {"vocab": blob.get("vocab"), "label_names": blob.get("label_names")}


# ---------------------------------------------------------------------------- decoding
def _column(split: Any, name: str, key: str, where: str) -> Any:
    if name not in split.column_names:
        raise ConfigError(
            f"dataset.{key}", name, f"no such column in {where}; its columns are " + ", ".join(split.column_names)
        )
    return split.features[name]


def _labels(train: Any, test: Any, col: str, feature: Any) -> tuple[np.ndarray, np.ndarray, int, list[str]]:
    import datasets

    y_train, y_test = list(train[col]), list(test[col])
    if isinstance(feature, datasets.ClassLabel):
        return np.asarray(y_train, np.int64), np.asarray(y_test, np.int64), feature.num_classes, list(feature.names)
    values = y_train + y_test
    if values and all(isinstance(v, str) for v in values):
        names = sorted(set(values))
        index = {n: i for i, n in enumerate(names)}
        return (
            np.asarray([index[v] for v in y_train], np.int64),
            np.asarray([index[v] for v in y_test], np.int64),
            len(names),
            names,
        )
    try:
        a, b = np.asarray(y_train), np.asarray(y_test)
        ok = a.ndim == 1 and b.ndim == 1 and np.issubdtype(np.result_type(a, b), np.integer)
    except (TypeError, ValueError):
        ok = False
    if not ok or (len(values) and min(a.min(initial=0), b.min(initial=0)) < 0):
        raise ConfigError("dataset.label_column", col, "must hold non-negative integers, class labels or strings")
    num_classes = int(max(a.max(initial=0), b.max(initial=0))) + 1
    return a.astype(np.int64), b.astype(np.int64), num_classes, []


def _is_text(feature: Any) -> bool:
    import datasets

    return isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")


def _images(values: Sequence[Any]) -> torch.Tensor:
    """Images or arrays as one tensor: ``uint8 [N, C, H, W]`` or ``float32 [N, D]``."""
    arrays = [np.asarray(v) for v in values]
    x = np.stack(arrays) if arrays else np.zeros((0, 1), np.float32)
    if np.issubdtype(x.dtype, np.integer) and x.ndim >= 3 and x.min(initial=0) >= 0 and x.max(initial=0) <= 255:
        if x.ndim == 3:  # [N, H, W]
            x = x[:, None]
        elif x.shape[-1] in (1, 3, 4) and x.shape[1] not in (1, 3, 4):  # [N, H, W, C]
            x = x.transpose(0, 3, 1, 2)
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.uint8))
    return torch.from_numpy(np.ascontiguousarray(x.reshape(len(x), -1), dtype=np.float32))


def _natural(train: Any, col: str) -> list[np.ndarray]:
    """Return indices of ``train`` per value of ``col``, grouped by flwr-datasets'
    ``NaturalIdPartitioner`` (partition ``k`` is client ``k``).
    """
    import datasets
    from flwr_datasets.partitioner import NaturalIdPartitioner

    ids = [str(v) for v in train[col]]
    table = datasets.Dataset.from_dict({col: ids, "idx": np.arange(len(ids), dtype=np.int64)})
    partitioner = NaturalIdPartitioner(partition_by=col)
    partitioner.dataset = table
    out = []
    for pid in range(partitioner.num_partitions):
        column = partitioner.load_partition(pid).with_format("arrow")[:]["idx"]
        out.append(np.sort(np.asarray(column.to_numpy(), dtype=np.int64)))
    return out


def _decode(cfg: DatasetConfig, splits: dict[str, Any], where: str) -> tuple[FederatedData, dict]:
    if cfg.train_split not in splits:
        raise ConfigError(
            "dataset.train_split", cfg.train_split, f"no such split in {where}; it has " + ", ".join(splits)
        )
    train = splits[cfg.train_split]
    if cfg.test_split in splits:
        test = splits[cfg.test_split]
    else:
        order = np.random.default_rng(HOLDOUT_SEED).permutation(len(train))
        n_test = max(1, int(round(len(train) * cfg.test_fraction)))
        test, train = train.select(np.sort(order[:n_test])), train.select(np.sort(order[n_test:]))
        log.info("%s has no %r split: %d of its examples held out for testing", where, cfg.test_split, n_test)
    feature = _column(train, cfg.input_column, "input_column", where)
    label_feature = _column(train, cfg.label_column, "label_column", where)
    _column(test, cfg.input_column, "input_column", f"{where} ({cfg.test_split})")
    _column(test, cfg.label_column, "label_column", f"{where} ({cfg.test_split})")
    if cfg.client_column:
        _column(train, cfg.client_column, "client_column", where)
    y_train, y_test, num_classes, names = _labels(train, test, cfg.label_column, label_feature)
    extra: dict[str, Any] = {"label_names": names, "vocab": None}
    if _is_text(feature):
        texts = train[cfg.input_column]
        tok = Tokenizer.fit(cfg, texts)
        x_train, x_test = tok.encode_all(texts), tok.encode_all(test[cfg.input_column])
        extra["vocab"] = tok.vocab
        mean = std = None
    else:
        x_train, x_test = _images(train[cfg.input_column]), _images(test[cfg.input_column])
        mean = std = None
        if x_train.dtype == torch.uint8:
            dims = [0] + list(range(2, x_train.dim()))
            scaled = x_train.to(torch.float32) / 255.0
            mean = tuple(float(v) for v in scaled.mean(dim=dims))
            std = tuple(max(float(v), 1e-6) for v in scaled.std(dim=dims))
    natural = _natural(train, cfg.client_column) if cfg.client_column else None
    data = FederatedData(
        train=ArrayDataset(x_train, torch.from_numpy(y_train), num_classes, mean, std),
        test=ArrayDataset(x_test, torch.from_numpy(y_test), num_classes, mean, std),
        natural_partition=natural,
    )
    return data, extra


# ---------------------------------------------------------------------------- entry point
def load_hf(cfg: DatasetConfig, num_clients: int, seed: int) -> FederatedData:
    """Return the ``hf`` dataset of ``cfg`` (module docstring), from its tensor cache when there.

    Raises
    ------
    ConfigError
        For a missing column or split, unusable labels, or data files of unknown format.
    DataNotFoundError
        When no local copy exists and the hub cannot be reached (one line).
    """
    kind, what, looked = _source(cfg)
    path = _cache_path(cfg, kind, what)
    cached = _load(path)
    if cached is not None:
        log.info("hf dataset loaded memory-mapped from %s", path)
        return cached[0]
    where = {"dir": f"directory {what}", "files": "the data files", "hub": f"hub dataset {what!r}"}[kind]
    data, extra = _decode(cfg, _open(cfg, kind, what, looked), where)
    _save(path, data, extra)
    if extra["vocab"] is not None and cfg.tokenizer == "vocab":
        log.info("vocabulary: %d tokens (of at most %d), saved with %s", len(extra["vocab"]), cfg.vocab_size, path)
    cached = _load(path)  # memory-mapped, as every later process will see it
    return cached[0] if cached is not None else data


def vocabulary(cfg: DatasetConfig) -> Optional[list[str]]:
    """Return the vocabulary saved with the dataset's cache (``None`` before it was built, or
    for the hashing tokenizer).
    """
    kind, what, _ = _source(cfg)
    cached = _load(_cache_path(cfg, kind, what))
    return None if cached is None else cached[1]["vocab"]
