"""What a worker process keeps between messages: data, partition, model skeleton.

A Ray worker (simulation) or a SuperNode (deployment) serves many messages, and in
simulation many virtual clients. Loading the data set, computing the partition and
building the model happen once per worker and task, keyed by the task JSON that the
server sends with every message; each message then only copies the global weights in.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
from dataclasses import dataclass
from typing import Optional

import torch

from fedflex.config import DatasetConfig, ModelConfig, PartitionConfig
from fedflex.data import ArrayDataset, FederatedData, load_dataset
from fedflex.models import build_model
from fedflex.partition import Partition, partition_data

logger = logging.getLogger(__name__)


@dataclass
class Task:
    """One worker's cached state for one scenario task."""

    data: FederatedData
    train: ArrayDataset  # the training set on ``device``
    partition: Partition
    model: torch.nn.Module  # on ``device``; weights overwritten by every message
    device: torch.device
    num_clients: int
    loss: str = "cross-entropy"  # the scenario's model.loss (fedflex.losses)

    def client_indices(self, partition_id: int) -> torch.Tensor:
        """Return the row indices of client ``partition_id``'s data in the worker's training set."""
        if not 0 <= partition_id < self.num_clients:
            raise ValueError(f"partition-id {partition_id} is outside 0..{self.num_clients - 1} for this scenario")
        return self._indices[partition_id]

    def __post_init__(self) -> None:
        self._indices = [torch.as_tensor(ix, dtype=torch.long) for ix in self.partition.indices]


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; ``cuda`` without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("client.device=cuda but no CUDA device is visible to this worker")
    return torch.device(name)


def to_device(data: ArrayDataset, device: torch.device) -> ArrayDataset:
    """Return the same data set with its tensors on ``device`` (no copy when already there)."""
    if data.x.device == device:
        return data
    return dataclasses.replace(data, x=data.x.to(device), y=data.y.to(device))


@functools.lru_cache(maxsize=2)
def get_task(task_json: str, data_path: Optional[str] = None) -> Task:
    """Build (once per worker) the task described by ``task_json``."""
    spec = json.loads(task_json)
    dataset_cfg = DatasetConfig(**spec["dataset"])
    if data_path:
        dataset_cfg = dataclasses.replace(dataset_cfg, root=data_path)
    partition_cfg = PartitionConfig(**spec["partition"])
    model_cfg = ModelConfig(**spec["model"])
    num_clients, seed = int(spec["num_clients"]), int(spec["seed"])
    set_threads(int(spec.get("num_threads", 0)))
    device = resolve_device(spec.get("device", "auto"))
    data = load_dataset(dataset_cfg, num_clients, seed)
    partition = partition_data(partition_cfg, data, num_clients, seed)
    torch.manual_seed(seed)
    model = build_model(model_cfg, data.train.input_shape, data.train.num_classes).to(device)
    logger.info("worker %d loaded task: %s on %s", os.getpid(), dataset_cfg.name, device)
    return Task(
        data=data,
        train=to_device(data.train, device),
        partition=partition,
        model=model,
        device=device,
        num_clients=num_clients,
        loss=model_cfg.loss,
    )


_threads_set = False


def set_threads(num_threads: int) -> None:
    """Intra-op threads of this worker (once; several workers share the cores); 0 keeps
    torch's default (Ray sets OMP_NUM_THREADS to the worker's num_cpus).
    """
    global _threads_set
    if not _threads_set and num_threads > 0:
        torch.set_num_threads(num_threads)
        _threads_set = True
