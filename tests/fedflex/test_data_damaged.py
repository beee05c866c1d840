"""A damaged Fashion-MNIST copy (issue 45, item 5): a raw idx file cut short is named,
and the intact Debian copy is read instead (one warning), or, without one, the damaged
file is named in the error; the damaged file is left as it was."""

import gzip
import logging
import struct
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from fedflex import data
from fedflex.config import DatasetConfig
from fedflex.data import DataNotFoundError, idx_problem, load_dataset, tensor_cache_path

IDX = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    def fail(request, *args, **kwargs):
        raise urllib.error.URLError("no network in tests")

    monkeypatch.setattr(urllib.request, "urlopen", fail)


@pytest.fixture(autouse=True)
def debian_dir(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "debian-fashion-mnist"
    monkeypatch.setattr(data, "DEBIAN_FMNIST_DIR", folder)
    return folder


def _files(offset: int = 0) -> dict[str, bytes]:
    """Four train and two test images of 28x28 (pixel values ``offset + i``), labels 0..3 and 5, 6."""
    train = np.stack([np.full((28, 28), offset + i, np.uint8) for i in range(4)])
    test = np.stack([np.full((28, 28), offset + 10 + i, np.uint8) for i in range(2)])

    def images(x):
        return struct.pack(">IIII", 2051, *x.shape) + x.tobytes()

    def labels(y):
        return struct.pack(">II", 2049, len(y)) + bytes(y)

    return {IDX[0]: images(train), IDX[1]: labels([0, 1, 2, 3]), IDX[2]: images(test), IDX[3]: labels([5, 6])}


def _write(folder: Path, files: dict[str, bytes], gz: bool = False) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, payload in files.items():
        if gz:
            (folder / f"{name}.gz").write_bytes(gzip.compress(payload))
        else:
            (folder / name).write_bytes(payload)


def _cfg(root: Path, **kw) -> DatasetConfig:
    return DatasetConfig(name="fmnist", root=str(root), **kw)


def _damaged_root(tmp_path: Path) -> Path:
    """A data root whose train images are cut to 1 KB (the issue's file cut to 1 MB, smaller)."""
    raw = tmp_path / "root" / "FashionMNIST" / "raw"
    _write(raw, _files(offset=100))
    images = raw / IDX[0]
    images.write_bytes(images.read_bytes()[:1024])
    return tmp_path / "root"


def test_a_damaged_fmnist_file_is_named_once_and_the_intact_debian_copy_read(tmp_path, debian_dir, caplog):
    # Prepare: the data root's train images cut short; an intact Debian copy
    root = _damaged_root(tmp_path)
    _write(debian_dir, _files(offset=0), gz=True)
    damaged = root / "FashionMNIST" / "raw" / IDX[0]
    before = damaged.read_bytes()
    # Execute
    with caplog.at_level(logging.WARNING, logger="fedflex.data"):
        fd = load_dataset(_cfg(root), 2, 0)
    # Assert: the Debian copy's pixels and labels; one warning naming the damaged file; the
    # damaged file untouched and no tensor cache made from it (the next run warns again)
    assert fd.train.x[:, 0, 0, 0].tolist() == [0, 1, 2, 3] and fd.train.y.tolist() == [0, 1, 2, 3]
    assert fd.test.x[:, 0, 0, 0].tolist() == [10, 11] and fd.test.y.tolist() == [5, 6]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert f"{damaged} is damaged (1024 bytes, but its header says 4 x 28 x 28 values: 3152 bytes)" in warnings[0]
    assert str(debian_dir) in warnings[0]
    assert damaged.read_bytes() == before
    assert not tensor_cache_path(_cfg(root)).exists()


def test_a_damaged_fmnist_file_without_an_intact_copy_is_refused_by_name(tmp_path):
    root = _damaged_root(tmp_path)
    with pytest.raises(DataNotFoundError) as err:
        load_dataset(_cfg(root), 2, 0)
    message = str(err.value)
    assert message.startswith(f"dataset 'fmnist': {root / 'FashionMNIST' / 'raw' / IDX[0]} is damaged (1024 bytes")
    assert "delete the damaged file" in message and "not found" not in message


def test_a_damaged_mnist_file_is_refused_by_name(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    _write(raw, _files())
    (raw / IDX[3]).write_bytes(b"\x00\x00\x08\x03junk")  # labels with 3 dimensions
    with pytest.raises(DataNotFoundError, match=r"t10k-labels-idx1-ubyte is damaged \(3 dimensions, expected 1\)"):
        load_dataset(DatasetConfig(name="mnist", root=str(tmp_path)), 2, 0)


def test_images_and_labels_that_disagree_in_number_are_damage(tmp_path):
    raw = tmp_path / "FashionMNIST" / "raw"
    files = _files()
    files[IDX[1]] = struct.pack(">II", 2049, 3) + bytes([0, 1, 2])
    _write(raw, files)
    with pytest.raises(DataNotFoundError, match="train-labels-idx1-ubyte is damaged \\(3 labels for 4 images"):
        load_dataset(_cfg(tmp_path), 2, 0)


@pytest.mark.parametrize(
    "payload, problem",
    [
        (b"", "not an idx file (bad magic number)"),
        (b"\x00\x00\x08\x03\x00\x00", "6 bytes, shorter than its header"),
        (b"\x08\x08\x08\x03" + bytes(12), "not an idx file (bad magic number)"),
        (struct.pack(">IIII", 2051, 1, 2, 2) + bytes(5), "21 bytes, but its header says 1 x 2 x 2 values: 20 bytes"),
        (struct.pack(">IIII", 2051, 1, 2, 2) + bytes(4), ""),
    ],
)
def test_idx_problem_names_what_is_wrong(tmp_path, payload, problem):
    path = tmp_path / IDX[0]
    path.write_bytes(payload)
    assert idx_problem(path) == problem
