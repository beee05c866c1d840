"""Tests for fedflex.data: real on-disk formats written small, missing data, Synthetic(alpha, beta).

The image datasets are read through torchvision's own parsers from files that these tests
write in the original formats (MNIST idx, CIFAR-10 pickle batches, SVHN .mat). Only the
md5 comparison of CIFAR-10 / SVHN is replaced by an existence check. No test reaches the
network: ``urllib.request.urlopen`` is replaced by a stub that fails like a machine
without one (and records the call).
"""

from __future__ import annotations

import gzip
import os
import pickle
import struct
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch
import torchvision.datasets.cifar
import torchvision.datasets.svhn

from fedflex import config, data
from fedflex.config import ConfigError, DatasetConfig
from fedflex.data import ArrayDataset, DataNotFoundError, FederatedData, data_root, load_dataset

IDX = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
REAL_DEBIAN_FMNIST = Path("/usr/share/datasets/fashion-mnist")


# ---------------------------------------------------------------------------- fixtures
@pytest.fixture(autouse=True)
def network_calls(monkeypatch) -> list[str]:
    """No network in any test: urlopen fails at once and records the URL it was given."""
    calls: list[str] = []

    def fail(request, *args, **kwargs):
        calls.append(getattr(request, "full_url", str(request)))
        raise urllib.error.URLError("no network in tests")

    monkeypatch.setattr(urllib.request, "urlopen", fail)
    return calls


@pytest.fixture(autouse=True)
def debian_dir(tmp_path, monkeypatch) -> Path:
    """The Debian FMNIST folder points at an empty temporary folder unless a test fills it."""
    folder = tmp_path / "debian-fashion-mnist"
    monkeypatch.setattr(data, "DEBIAN_FMNIST_DIR", folder)
    return folder


@pytest.fixture
def md5_not_checked(monkeypatch) -> None:
    """CIFAR-10 / SVHN: keep torchvision's existence checks, skip its md5 of the real files."""
    exists = lambda fpath, md5=None: os.path.isfile(fpath)  # noqa: E731
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", exists)
    monkeypatch.setattr(torchvision.datasets.svhn, "check_integrity", exists)


# ---------------------------------------------------------------------------- writers
def idx_images(images: np.ndarray) -> bytes:
    """idx3: magic 2051, then N, H, W as big-endian uint32, then the uint8 pixels row-major."""
    n, h, w = images.shape
    return struct.pack(">IIII", 2051, n, h, w) + images.astype(np.uint8).tobytes()


def idx_labels(labels: list[int]) -> bytes:
    """idx1: magic 2049, then N as big-endian uint32, then one uint8 per label."""
    return struct.pack(">II", 2049, len(labels)) + bytes(labels)


def mnist_like_files() -> dict[str, bytes]:
    """Three training images and two test images, 28x28.

    train 0: all 0 except row 3, column 5 = 77; train 1: all 128; train 2: all 255.
    test 0: all 1; test 1: all 254. Labels: train 9, 0, 4; test 3, 7.
    """
    train = np.zeros((3, 28, 28), dtype=np.uint8)
    train[0, 3, 5] = 77
    train[1] = 128
    train[2] = 255
    test = np.stack([np.full((28, 28), 1, np.uint8), np.full((28, 28), 254, np.uint8)])
    return {
        IDX[0]: idx_images(train),
        IDX[1]: idx_labels([9, 0, 4]),
        IDX[2]: idx_images(test),
        IDX[3]: idx_labels([3, 7]),
    }


def write_idx(folder: Path, gz: bool = False) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, payload in mnist_like_files().items():
        if gz:
            (folder / f"{name}.gz").write_bytes(gzip.compress(payload))
        else:
            (folder / name).write_bytes(payload)


def cifar_row(r: int, g: int, b: int) -> np.ndarray:
    """One CIFAR-10 row: 1024 red, 1024 green, 1024 blue values, each plane row-major 32x32."""
    return np.concatenate([np.full(1024, r), np.full(1024, g), np.full(1024, b)]).astype(np.uint8)


def write_cifar(root: Path) -> None:
    """Five training batches of two images, a test batch of three, and batches.meta.

    Training image j of batch b (b = 1..5) has label 2(b-1) + j, so the training labels
    read 0..9 in order. Its planes are filled with R = 10, G = 20, B = 30, except train
    image 0, whose green pixel at row 1, column 2 is 99 (flat index 1024 + 1*32 + 2).
    Test images: R = 200, G = 100, B = 255; labels 5, 6, 7.
    """
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for b in range(1, 6):
        rows = np.stack([cifar_row(10, 20, 30), cifar_row(10, 20, 30)])
        if b == 1:
            rows[0, 1024 + 1 * 32 + 2] = 99
        batch = {"batch_label": f"training batch {b} of 5", "data": rows, "labels": [2 * (b - 1), 2 * (b - 1) + 1]}
        (folder / f"data_batch_{b}").write_bytes(pickle.dumps(batch))
    test_rows = np.stack([cifar_row(200, 100, 255)] * 3)
    test = {"batch_label": "testing batch 1 of 1", "data": test_rows, "labels": [5, 6, 7]}
    (folder / "test_batch").write_bytes(pickle.dumps(test))
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": names, "num_vis": 3072}))


def write_svhn(folder: Path) -> None:
    """train_32x32.mat: 3 images, labels 10, 1, 5 (10 means digit 0); test_32x32.mat: 2 images, labels 2, 10.

    X is H x W x C x N. Train image 0: channel 0 at row 1, column 2 = 99, at row 2,
    column 1 = 11; channel 2 everywhere 200; the rest 0. Test images all 7.
    """
    folder.mkdir(parents=True)
    x = np.zeros((32, 32, 3, 3), dtype=np.uint8)
    x[1, 2, 0, 0] = 99
    x[2, 1, 0, 0] = 11
    x[:, :, 2, 0] = 200
    y = np.array([[10], [1], [5]], dtype=np.uint8)
    scipy.io.savemat(folder / "train_32x32.mat", {"X": x, "y": y})
    scipy.io.savemat(
        folder / "test_32x32.mat", {"X": np.full((32, 32, 3, 2), 7, np.uint8), "y": np.array([[2], [10]], np.uint8)}
    )


def cfg_for(name: str, root: Path, download: bool = False, **kw) -> DatasetConfig:
    return DatasetConfig(name=name, root=str(root), download=download, **kw)


# ---------------------------------------------------------------------------- data_root / registry
def test_data_root_is_cfg_root_when_set(tmp_path, monkeypatch):
    # Prepare
    monkeypatch.setenv("FEDFLEX_DATA", str(tmp_path / "env"))
    cfg = DatasetConfig(root=str(tmp_path / "cfg"))
    # Execute
    root = data_root(cfg)
    # Assert
    assert root == tmp_path / "cfg"


def test_data_root_is_env_var_when_cfg_root_unset(tmp_path, monkeypatch):
    # Prepare
    monkeypatch.setenv("FEDFLEX_DATA", str(tmp_path / "env"))
    # Execute
    root = data_root(DatasetConfig(root=None))
    # Assert
    assert root == tmp_path / "env"


def test_data_root_defaults_to_cache_under_home(tmp_path, monkeypatch):
    # Prepare
    monkeypatch.delenv("FEDFLEX_DATA", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    # Execute
    root = data_root(DatasetConfig(root=None))
    # Assert
    assert root == tmp_path / ".cache" / "fedflex" / "data"


def test_registry_holds_exactly_the_config_dataset_names():
    assert set(data.DATASETS) == set(config.DATASETS)


def test_unknown_dataset_name_is_a_config_error():
    # Prepare
    cfg = DatasetConfig(name="imagenet")
    # Execute / Assert
    with pytest.raises(ConfigError, match="dataset.name"):
        load_dataset(cfg, num_clients=2, seed=0)


# ---------------------------------------------------------------------------- fmnist / mnist
def test_fmnist_reads_idx_files_as_uint8_nchw(tmp_path):
    # Prepare
    write_idx(tmp_path / "FashionMNIST" / "raw")
    # Execute
    fd = load_dataset(cfg_for("fmnist", tmp_path), num_clients=2, seed=0)
    # Assert
    assert (fd.train.x.shape, fd.train.x.dtype) == ((3, 1, 28, 28), torch.uint8)
    assert (fd.test.x.shape, fd.test.x.dtype) == ((2, 1, 28, 28), torch.uint8)
    assert fd.train.y.dtype == torch.int64
    assert fd.train.y.tolist() == [9, 0, 4]
    assert fd.test.y.tolist() == [3, 7]
    assert fd.train.num_classes == 10 and fd.train.input_shape == (1, 28, 28)
    assert fd.natural_partition is None


def test_fmnist_pixels_keep_row_major_layout(tmp_path):
    # Prepare
    write_idx(tmp_path / "FashionMNIST" / "raw")
    # Execute
    x = load_dataset(cfg_for("fmnist", tmp_path), 2, 0).train.x
    # Assert: the one marked pixel sits at row 3, column 5 (not at row 5, column 3)
    assert x[0, 0, 3, 5].item() == 77
    assert x[0, 0, 5, 3].item() == 0
    assert x[0].sum().item() == 77
    assert torch.all(x[1] == 128) and torch.all(x[2] == 255)


def test_fmnist_inputs_normalise_with_fmnist_statistics(tmp_path):
    # Prepare
    write_idx(tmp_path / "FashionMNIST" / "raw")
    train = load_dataset(cfg_for("fmnist", tmp_path), 2, 0).train
    # Execute
    out = train.inputs(torch.tensor([2, 0]))
    # Assert: pixel 255 -> (1 - 0.2860) / 0.3530 = 2.02266..., pixel 0 -> -0.2860 / 0.3530 = -0.81020...
    assert out.dtype == torch.float32 and out.shape == (2, 1, 28, 28)
    assert out[0, 0, 0, 0].item() == pytest.approx(2.022663, abs=1e-5)
    assert out[1, 0, 0, 0].item() == pytest.approx(-0.810198, abs=1e-5)


def test_fmnist_unpacks_debian_gz_files_into_the_root(tmp_path, debian_dir):
    # Prepare
    write_idx(debian_dir, gz=True)
    root = tmp_path / "root"
    # Execute
    fd = load_dataset(cfg_for("fmnist", root), 2, 0)
    # Assert
    raw = root / "FashionMNIST" / "raw"
    expected = mnist_like_files()
    assert {name: (raw / name).read_bytes() for name in IDX} == expected
    assert fd.train.y.tolist() == [9, 0, 4] and fd.test.y.tolist() == [3, 7]
    assert fd.train.x[0, 0, 3, 5].item() == 77


def test_fmnist_with_download_on_takes_debian_files_without_network(tmp_path, debian_dir, network_calls):
    # Prepare
    write_idx(debian_dir, gz=True)
    # Execute
    fd = load_dataset(cfg_for("fmnist", tmp_path / "root", download=True), 2, 0)
    # Assert
    assert len(fd.train) == 3 and len(fd.test) == 2
    assert network_calls == []


def test_mnist_reads_its_own_folder_and_statistics(tmp_path):
    # Prepare
    write_idx(tmp_path / "MNIST" / "raw")
    # Execute
    fd = load_dataset(cfg_for("mnist", tmp_path), 2, 0)
    # Assert: pixel 128 -> (128/255 - 0.1307) / 0.3081 = 1.205001...
    assert fd.train.x.shape == (3, 1, 28, 28) and fd.train.y.tolist() == [9, 0, 4]
    assert fd.train.inputs(torch.tensor([1]))[0, 0, 0, 0].item() == pytest.approx(1.205001, abs=1e-5)


# ---------------------------------------------------------------------------- cifar10
def test_cifar10_reads_pickle_batches(tmp_path, md5_not_checked):
    # Prepare
    write_cifar(tmp_path)
    # Execute
    fd = load_dataset(cfg_for("cifar10", tmp_path), 2, 0)
    # Assert
    assert (fd.train.x.shape, fd.train.x.dtype) == ((10, 3, 32, 32), torch.uint8)
    assert (fd.test.x.shape, fd.test.x.dtype) == ((3, 3, 32, 32), torch.uint8)
    assert fd.train.y.tolist() == list(range(10))
    assert fd.test.y.tolist() == [5, 6, 7]
    assert fd.train.y.dtype == torch.int64


def test_cifar10_puts_channels_first(tmp_path, md5_not_checked):
    # Prepare
    write_cifar(tmp_path)
    # Execute
    x = load_dataset(cfg_for("cifar10", tmp_path), 2, 0).train.x
    # Assert: green pixel at row 1, column 2 is 99; the planes are 10 / 20 / 30
    assert x[0, 1, 1, 2].item() == 99
    assert x[0, 1, 2, 1].item() == 20
    assert x[0, 0, 1, 2].item() == 10 and x[0, 2, 1, 2].item() == 30
    assert torch.all(x[1, 0] == 10) and torch.all(x[1, 1] == 20) and torch.all(x[1, 2] == 30)


def test_cifar10_inputs_normalise_per_channel(tmp_path, md5_not_checked):
    # Prepare
    write_cifar(tmp_path)
    test = load_dataset(cfg_for("cifar10", tmp_path), 2, 0).test
    # Execute
    out = test.inputs()
    # Assert: R 200 -> (200/255 - 0.4914) / 0.2470 = 1.185886...; G 100 -> (100/255 - 0.4822) / 0.2435
    # = -0.369787...; B 255 -> (1 - 0.4465) / 0.2616 = 2.115826...
    assert out[2, 0, 5, 5].item() == pytest.approx(1.185886, abs=1e-5)
    assert out[2, 1, 5, 5].item() == pytest.approx(-0.369787, abs=1e-5)
    assert out[2, 2, 5, 5].item() == pytest.approx(2.115826, abs=1e-5)


# ---------------------------------------------------------------------------- svhn
def test_svhn_reads_mat_files_and_maps_label_10_to_0(tmp_path, md5_not_checked):
    # Prepare
    write_svhn(tmp_path / "SVHN")
    # Execute
    fd = load_dataset(cfg_for("svhn", tmp_path), 2, 0)
    # Assert
    assert (fd.train.x.shape, fd.train.x.dtype) == ((3, 3, 32, 32), torch.uint8)
    assert fd.train.y.tolist() == [0, 1, 5]
    assert fd.test.y.tolist() == [2, 0]
    assert fd.train.y.dtype == torch.int64


def test_svhn_pixels_come_out_nchw(tmp_path, md5_not_checked):
    # Prepare
    write_svhn(tmp_path / "SVHN")
    # Execute
    x = load_dataset(cfg_for("svhn", tmp_path), 2, 0).train.x
    # Assert: X[1, 2, 0, 0] = 99 and X[2, 1, 0, 0] = 11 land at [0, 0, 1, 2] and [0, 0, 2, 1]
    assert x[0, 0, 1, 2].item() == 99
    assert x[0, 0, 2, 1].item() == 11
    assert torch.all(x[0, 2] == 200) and torch.all(x[1] == 0)


def test_svhn_inputs_normalise_per_channel(tmp_path, md5_not_checked):
    # Prepare
    write_svhn(tmp_path / "SVHN")
    train = load_dataset(cfg_for("svhn", tmp_path), 2, 0).train
    # Execute
    out = train.inputs(torch.tensor([0]))
    # Assert: B 200 -> (200/255 - 0.4728) / 0.1970 = 1.581288...; R 0 -> -0.4377 / 0.1980 = -2.210606...
    assert out[0, 2, 0, 0].item() == pytest.approx(1.581288, abs=1e-5)
    assert out[0, 0, 0, 0].item() == pytest.approx(-2.210606, abs=1e-5)


# ---------------------------------------------------------------------------- missing data
@pytest.mark.parametrize(
    "name,where",
    [
        ("fmnist", "FashionMNIST/raw"),
        ("mnist", "MNIST/raw"),
        ("cifar10", "cifar-10-batches-py"),
        ("svhn", "SVHN"),
    ],
)
def test_missing_files_raise_data_not_found_naming_the_folder(tmp_path, name, where):
    # Prepare
    cfg = cfg_for(name, tmp_path / "empty", download=False)
    # Execute
    with pytest.raises(DataNotFoundError) as info:
        load_dataset(cfg, 2, 0)
    # Assert
    message = str(info.value)
    assert str(tmp_path / "empty" / where) in message
    assert "dataset.download=true" in message
    assert "FEDFLEX_DATA" in message


def test_missing_fmnist_names_debian_folder_and_package(tmp_path, debian_dir):
    # Prepare
    cfg = cfg_for("fmnist", tmp_path / "empty", download=False)
    # Execute
    with pytest.raises(DataNotFoundError) as info:
        load_dataset(cfg, 2, 0)
    # Assert
    message = str(info.value)
    assert str(debian_dir) in message
    assert "apt-get install dataset-fashion-mnist" in message
    assert info.value.paths == (str(tmp_path / "empty" / "FashionMNIST" / "raw"), str(debian_dir))


@pytest.mark.parametrize("name", ["fmnist", "mnist", "cifar10", "svhn"])
def test_failed_download_raises_data_not_found(tmp_path, network_calls, name):
    # Prepare
    cfg = cfg_for(name, tmp_path / "empty", download=True)
    # Execute
    with pytest.raises(DataNotFoundError) as info:
        load_dataset(cfg, 2, 0)
    # Assert: torchvision's real download code ran into the (stubbed) missing network
    assert network_calls, "torchvision never tried to download"
    assert "download failed" in str(info.value)
    assert "no network in tests" in str(info.value)


def test_data_not_found_error_survives_pickling():
    # Prepare
    err = DataNotFoundError("dataset 'x' not found", ["/a", "/b"])
    # Execute
    back = pickle.loads(pickle.dumps(err))
    # Assert
    assert type(back) is DataNotFoundError
    assert (str(back), back.paths) == ("dataset 'x' not found", ("/a", "/b"))


# ---------------------------------------------------------------------------- ArrayDataset
def test_array_dataset_of_features_reports_length_and_shape():
    # Prepare
    ds = ArrayDataset(torch.zeros(4, 60), torch.zeros(4, dtype=torch.int64), 10)
    # Execute
    n, shape = len(ds), ds.input_shape
    # Assert
    assert (n, shape) == (4, (60,))


def test_array_dataset_inputs_return_float_features_unchanged():
    # Prepare
    x = torch.tensor([[1.5, -2.0], [3.0, 4.0], [0.0, 0.25]])
    ds = ArrayDataset(x, torch.tensor([0, 1, 0]), 2)
    # Execute
    out = ds.inputs(np.array([2, 0]))
    # Assert
    assert out.tolist() == [[0.0, 0.25], [1.5, -2.0]]


def test_array_dataset_labels_take_rows():
    # Prepare
    ds = ArrayDataset(torch.zeros(3, 2), torch.tensor([7, 8, 9]), 10)
    # Execute
    got = ds.labels(torch.tensor([2, 0]))
    # Assert
    assert got.tolist() == [9, 7]
    assert ds.labels().tolist() == [7, 8, 9]


def test_array_dataset_subset_keeps_classes_and_statistics():
    # Prepare
    x = torch.tensor([[[[0]]], [[[255]]], [[[51]]]], dtype=torch.uint8)  # [3, 1, 1, 1]
    ds = ArrayDataset(x, torch.tensor([0, 1, 2]), 5, mean=(0.5,), std=(0.25,))
    # Execute
    sub = ds.subset([2, 1])
    # Assert: 51 -> (0.2 - 0.5) / 0.25 = -1.2; 255 -> (1 - 0.5) / 0.25 = 2
    assert (len(sub), sub.num_classes, sub.mean, sub.std) == (2, 5, (0.5,), (0.25,))
    assert sub.labels().tolist() == [2, 1]
    assert sub.inputs().flatten().tolist() == pytest.approx([-1.2, 2.0], abs=1e-6)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(x=torch.zeros(3, 2), y=torch.zeros(2, dtype=torch.int64), num_classes=2), "rows"),
        (dict(x=torch.zeros(3, 2), y=torch.zeros(3, dtype=torch.int32), num_classes=2), "int64"),
        (
            dict(
                x=torch.zeros(3, 1, 2, 2, dtype=torch.uint8),
                y=torch.zeros(3, dtype=torch.int64),
                num_classes=2,
                mean=(0.5,),
            ),
            "together",
        ),
        (
            dict(
                x=torch.zeros(3, 1, 2, 2, dtype=torch.uint8),
                y=torch.zeros(3, dtype=torch.int64),
                num_classes=2,
                mean=(0.5, 0.5),
                std=(1.0, 1.0),
            ),
            "1 values",
        ),
    ],
    ids=["length-mismatch", "label-dtype", "mean-without-std", "channel-count"],
)
def test_array_dataset_rejects_inconsistent_parts(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ArrayDataset(**kwargs)


# ---------------------------------------------------------------------------- synthetic
def synthetic(num_clients: int = 6, seed: int = 0, **kw) -> FederatedData:
    return load_dataset(DatasetConfig(name="synthetic", **kw), num_clients=num_clients, seed=seed)


def test_synthetic_has_float_features_and_int_labels():
    # Prepare / Execute
    fd = synthetic(num_clients=5, dim=7, num_classes=4, samples_per_client=30)
    # Assert
    for split in (fd.train, fd.test):
        assert split.x.dtype == torch.float32 and split.x.shape[1:] == (7,)
        assert split.y.dtype == torch.int64
        assert split.num_classes == 4 and split.mean is None and split.std is None
        assert int(split.y.min()) >= 0 and int(split.y.max()) <= 3


def test_synthetic_is_deterministic_per_seed():
    # Prepare / Execute
    a, b, c = synthetic(seed=3), synthetic(seed=3), synthetic(seed=4)
    # Assert
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.train.y, b.train.y)
    assert torch.equal(a.test.x, b.test.x)
    assert [p.tolist() for p in a.natural_partition] == [p.tolist() for p in b.natural_partition]
    assert a.train.x.shape != c.train.x.shape or not torch.equal(a.train.x, c.train.x)


def test_synthetic_natural_partition_covers_train_once_per_client():
    # Prepare / Execute
    fd = synthetic(num_clients=7)
    # Assert
    parts = fd.natural_partition
    assert len(parts) == 7
    assert all(p.dtype == np.int64 for p in parts)
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(len(fd.train)))


def test_synthetic_clients_hold_at_least_ten_samples():
    # Prepare: test_fraction 0.01 gives every client (n < 150) exactly one test sample, so n = train + 1.
    # samples_per_client = 5: 1 + floor(L) < 10 for most clients (L ~ LogNormal(log 5, 0.5) < 9 has
    # p = 0.88), so they are raised to 10; the others keep their larger draw
    # Execute
    fd = synthetic(num_clients=40, samples_per_client=5, test_fraction=0.01)
    # Assert
    sizes = [len(p) + 1 for p in fd.natural_partition]
    assert len(fd.test) == 40
    assert min(sizes) == 10
    assert max(sizes) > 10


@pytest.mark.parametrize(
    "test_fraction,train_per_client,test_per_client",
    [
        (0.2, 8, 2),  # round(10 * 0.2) = 2
        (0.01, 9, 1),  # round(0.1) = 0, raised to 1
        (0.99, 1, 9),  # round(9.9) = 10, lowered to 9
    ],
)
def test_synthetic_small_clients_split_by_test_fraction(test_fraction, train_per_client, test_per_client):
    # Prepare: samples_per_client = 2 draws n = 1 + floor(L), L ~ LogNormal(log 2, 0.5); n > 10 needs
    # L >= 10, i.e. z >= log(5) / 0.5 = 3.2 (p = 0.0006 per client), so every client is raised to 10
    # Execute
    fd = synthetic(num_clients=6, samples_per_client=2, test_fraction=test_fraction)
    # Assert
    assert [len(p) for p in fd.natural_partition] == [train_per_client] * 6
    assert len(fd.test) == 6 * test_per_client


def test_synthetic_median_client_size_follows_samples_per_client():
    # Prepare: test_fraction 0.001 gives every client (n < 1500) exactly one test sample, so
    # train size + 1 = n = 1 + floor(L) with median(L) = 100; the sample median of 400 clients
    # lies within +-10 % (3 standard errors: 1.25 * 0.5 / sqrt(400) = 3 % in log space)
    # Execute
    fd = synthetic(num_clients=400, samples_per_client=100, test_fraction=0.001, dim=2)
    # Assert
    sizes = np.array([len(p) for p in fd.natural_partition]) + 1
    assert len(fd.test) == 400
    assert 90 <= np.median(sizes) <= 112


def test_synthetic_larger_federation_extends_smaller_one():
    # Prepare / Execute
    small, large = synthetic(num_clients=3, seed=1), synthetic(num_clients=5, seed=1)
    # Assert: the first three clients are the same clients
    n = sum(len(p) for p in small.natural_partition)
    assert torch.equal(large.train.x[:n], small.train.x)
    assert torch.equal(large.train.y[:n], small.train.y)


def test_synthetic_feature_variance_within_a_client_is_j_to_minus_1_2():
    # Prepare: one client, ~20000 samples; x_j = v_j + sqrt(j^-1.2) z, so the within-client
    # variance of feature j is j^-1.2: 1 for j = 1, 5^-1.2 = 0.1450 for j = 5 (sample variance
    # of n = 20000 normals is within sqrt(2/n) = 1 % of the true value per standard error)
    # Execute
    fd = synthetic(num_clients=1, samples_per_client=20000, dim=5, test_fraction=0.01)
    # Assert
    var = fd.train.x.double().var(dim=0)
    assert var[0].item() == pytest.approx(1.0, rel=0.05)
    assert var[4].item() == pytest.approx(0.1450, rel=0.05)


def test_synthetic_beta_moves_clients_inputs_apart():
    # Prepare: a client's mean input over all features is about mean_j v_k[j] ~ N(B_k, 1/d):
    # across clients its standard deviation is sqrt(beta + 1/d): 0.13 for beta = 0 (d = 60),
    # 10 for beta = 100
    def spread(beta: float) -> float:
        fd = synthetic(num_clients=30, beta=beta, alpha=0.0, samples_per_client=50)
        return float(np.std([fd.train.x[p].mean().item() for p in fd.natural_partition]))

    # Execute
    flat, wide = spread(0.0), spread(100.0)
    # Assert
    assert flat < 0.5
    assert wide > 3.0


def test_synthetic_alpha_leaves_data_unchanged():
    # Prepare: u_k adds u_k * (sum(x) + 1) to every class's logit alike, which cancels in the
    # argmax; x does not involve u_k; the draws are the same for every alpha. So for one seed
    # and beta the data do not depend on alpha (as in the paper's construction).
    # Execute
    a0 = synthetic(num_clients=8, alpha=0.0, beta=1.0, seed=5)
    a100 = synthetic(num_clients=8, alpha=100.0, beta=1.0, seed=5)
    # Assert
    assert torch.equal(a0.train.x, a100.train.x)
    assert torch.equal(a0.train.y, a100.train.y)
    assert torch.equal(a0.test.y, a100.test.y)


# ---------------------------------------------------------------------------- real data
@pytest.mark.skipif(not REAL_DEBIAN_FMNIST.is_dir(), reason="Debian package dataset-fashion-mnist not installed")
def test_real_debian_fmnist_has_6000_train_examples_per_class(tmp_path, monkeypatch):
    # Prepare
    monkeypatch.setattr(data, "DEBIAN_FMNIST_DIR", REAL_DEBIAN_FMNIST)
    # Execute
    fd = load_dataset(cfg_for("fmnist", tmp_path), 10, 0)
    # Assert
    assert (len(fd.train), len(fd.test)) == (60000, 10000)
    assert fd.train.x.shape == (60000, 1, 28, 28)
    assert fd.train.y.bincount(minlength=10).tolist() == [6000] * 10
    assert fd.test.y.bincount(minlength=10).tolist() == [1000] * 10


# ---------------------------------------------------------------------------- tensor cache
def test_second_load_comes_from_the_tensor_cache(tmp_path, monkeypatch):
    write_idx(tmp_path / "FashionMNIST" / "raw")
    cfg = cfg_for("fmnist", tmp_path)
    first = data.load_dataset(cfg, 2, 0)
    assert data.tensor_cache_path(cfg).is_file()
    monkeypatch.setitem(data.DATASETS, "fmnist", lambda *a: pytest.fail("files parsed again"))
    second = data.load_dataset(cfg, 2, 0)
    assert torch.equal(first.train.x, second.train.x) and torch.equal(first.test.y, second.test.y)
    assert second.train.mean == first.train.mean and second.train.num_classes == 10


def test_tensor_cache_is_rebuilt_when_the_files_change(tmp_path, monkeypatch):
    raw = tmp_path / "FashionMNIST" / "raw"
    write_idx(raw)
    cfg = cfg_for("fmnist", tmp_path)
    data.load_dataset(cfg, 2, 0)
    calls = []
    real = data.DATASETS["fmnist"]
    monkeypatch.setitem(data.DATASETS, "fmnist", lambda *a: calls.append(1) or real(*a))
    labels = raw / "train-labels-idx1-ubyte"
    labels.write_bytes(labels.read_bytes())  # same bytes, new modification time
    os.utime(labels, ns=(1, 1))
    data.load_dataset(cfg, 2, 0)
    assert calls == [1]
