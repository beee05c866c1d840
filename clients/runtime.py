"""What a worker process keeps between messages: data, partition, model skeleton.

A Ray worker (simulation) or a SuperNode (deployment) serves many messages, and in
simulation many virtual clients. Parsing the task spec, loading the data set, computing
the partition and building the model happen once per worker and task, keyed by the task
entry the server sends with every message (:class:`fedflex.taskspec.TaskSpec`); each
message then only copies the global weights in.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from dataclasses import dataclass
from typing import Optional

import torch

from fedflex.data import ArrayDataset, FederatedData, load_dataset
from fedflex.models import build_model
from fedflex.partition import Partition, partition_data
from fedflex.taskspec import TaskSpec

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
        self._last_global: Optional[tuple] = None  # the global model node.load_global decoded last


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
def get_task(task: str, data_path: Optional[str] = None) -> Task:
    """Build (once per worker) the task whose spec is ``task``, a train message's task entry
    (:meth:`TaskSpec.entry`): parsed by :meth:`TaskSpec.from_entry` only when it is not cached.
    """
    spec = TaskSpec.from_entry(task)
    dataset_cfg = dataclasses.replace(spec.dataset, root=data_path) if data_path else spec.dataset
    set_threads(spec.num_threads)
    device = resolve_device(spec.device)
    data = load_dataset(dataset_cfg, spec.num_clients, spec.seed)
    partition = partition_data(spec.partition, data, spec.num_clients, spec.seed)
    torch.manual_seed(spec.seed)
    model = build_model(spec.model, data.train.input_shape, data.train.num_classes).to(device)
    logger.info("worker %d loaded task: %s on %s", os.getpid(), dataset_cfg.name, device)
    return Task(
        data=data,
        train=to_device(data.train, device),
        partition=partition,
        model=model,
        device=device,
        num_clients=spec.num_clients,
        loss=spec.model.loss,
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
