"""The model, the data and the training loop, as in Flower's quickstart-pytorch.

The data is the local Fashion-MNIST (the Debian package ``dataset-fashion-mnist``, or the
four ``*-ubyte.gz`` files under ``$FEDFLEX_DATA/fashion-mnist``; nothing is downloaded).
Partition ``i`` of ``n`` holds ``1 + 9 i / (n - 1)`` of the ten classes (partition 0 one
class, the last one all ten): a label-skewed federation, so that heterogeneity-aware
methods have something to find. ``QUICKSTART_SYNTHETIC=1`` replaces the images with small
class-dependent random ones (tests, machines without the data).
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")


class Net(nn.Module):
    """A small CNN for 28x28 grey images (Flower's quickstart Net, one input channel)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.flatten(1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def _read_idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def _fashion_mnist(split: str) -> tuple[np.ndarray, np.ndarray]:
    prefix = "train" if split == "train" else "t10k"
    roots = [Path(os.environ["FEDFLEX_DATA"]) / "fashion-mnist"] if os.environ.get("FEDFLEX_DATA") else []
    for root in [*roots, DEBIAN_DIR]:
        images, labels = root / f"{prefix}-images-idx3-ubyte.gz", root / f"{prefix}-labels-idx1-ubyte.gz"
        if images.is_file() and labels.is_file():
            return _read_idx(images), _read_idx(labels)
    raise FileNotFoundError(
        f"no Fashion-MNIST under {', '.join(map(str, [*roots, DEBIAN_DIR]))}: "
        "apt-get install dataset-fashion-mnist, or set QUICKSTART_SYNTHETIC=1"
    )


def _synthetic(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` 28x28 images whose mean brightness pattern depends on the class."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=n)
    patterns = np.random.default_rng(1234).uniform(0, 255, size=(10, 28, 28))
    images = np.clip(patterns[labels] + rng.normal(0, 40, size=(n, 28, 28)), 0, 255)
    return images.astype(np.uint8), labels.astype(np.uint8)


def partition_classes(partition_id: int, num_partitions: int) -> list[int]:
    """The classes partition ``partition_id`` holds: ``1 + 9 i / (n - 1)`` of them."""
    count = 1 + (9 * partition_id) // max(num_partitions - 1, 1)
    return [(partition_id + c) % 10 for c in range(count)]


def _tensors(images: np.ndarray, labels: np.ndarray) -> TensorDataset:
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    return TensorDataset((x - 0.5) / 0.5, torch.from_numpy(labels.astype(np.int64)))


def load_data(
    partition_id: int, num_partitions: int, examples: int = 600, batch_size: int = 32
) -> tuple[DataLoader, DataLoader]:
    """Train and validation loaders of one partition (80 / 20), ``examples`` images."""
    if os.environ.get("QUICKSTART_SYNTHETIC"):
        images, labels = _synthetic(20 * examples, seed=0)
    else:
        images, labels = _fashion_mnist("train")
    keep = np.flatnonzero(np.isin(labels, partition_classes(partition_id, num_partitions)))
    rng = np.random.default_rng(partition_id)
    chosen = rng.permutation(keep)[:examples]
    cut = int(0.8 * len(chosen))
    train, val = chosen[:cut], chosen[cut:]
    trainloader = DataLoader(_tensors(images[train], labels[train]), batch_size=batch_size, shuffle=True)
    valloader = DataLoader(_tensors(images[val], labels[val]), batch_size=batch_size)
    return trainloader, valloader


def load_centralized(examples: int = 1000) -> DataLoader:
    """The server's test set (the first ``examples`` test images, all classes)."""
    if os.environ.get("QUICKSTART_SYNTHETIC"):
        images, labels = _synthetic(examples, seed=1)
    else:
        images, labels = _fashion_mnist("test")
    return DataLoader(_tensors(images[:examples], labels[:examples]), batch_size=128)


def train(net: nn.Module, trainloader: DataLoader, epochs: int, lr: float, device: str) -> float:
    """Local SGD; the mean training loss."""
    net.to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    total, steps = 0.0, 0
    for _ in range(epochs):
        for images, labels in trainloader:
            optimizer.zero_grad()
            loss = criterion(net(images.to(device)), labels.to(device))
            loss.backward()
            optimizer.step()
            total += loss.item()
            steps += 1
    return total / max(steps, 1)


def test(net: nn.Module, testloader: DataLoader, device: str) -> tuple[float, float]:
    """(mean loss, accuracy) of ``net`` on ``testloader``."""
    net.to(device)
    net.eval()
    criterion = nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for images, labels in testloader:
            outputs = net(images.to(device))
            loss += criterion(outputs, labels.to(device)).item()
            correct += (outputs.argmax(1) == labels.to(device)).sum().item()
    return loss / max(len(testloader), 1), correct / max(len(testloader.dataset), 1)
