"""Evaluation of a model on in-memory data (used by the server and by clients).

The loss and the prediction rule come from :mod:`fedflex.losses` by name (the
scenario's ``model.loss``).
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch import nn

from fedflex.data import ArrayDataset
from fedflex.losses import get_loss


def default_loss(scores: torch.Tensor) -> str:
    """Return the loss a model's output implies when none is named: ``squared-hinge`` for one
    output column (a binary scorer such as ``svm``: cross-entropy over one logit is
    always 0), else ``cross-entropy``.
    """
    return "squared-hinge" if scores.dim() == 1 or scores.shape[1] == 1 else "cross-entropy"


@torch.no_grad()
def predict(
    model: nn.Module,
    data: ArrayDataset,
    indices: Optional[torch.Tensor] = None,
    batch_size: int = 1000,
    loss: Optional[str] = None,
) -> tuple[float, torch.Tensor, torch.Tensor]:
    """Return (summed loss, predicted labels, true labels) on rows ``indices`` (all if
    None); the arguments are those of :func:`evaluate`.
    """
    model.eval()
    n = len(data) if indices is None else len(indices)
    device = data.x.device
    loss_sum = 0.0
    chosen = get_loss(loss) if loss is not None else None
    predicted, labels = [], []
    for start in range(0, n, batch_size):
        rows = torch.arange(start, min(start + batch_size, n), device=device)
        if indices is not None:
            rows = indices[rows]
        x, y = data.inputs(rows), data.labels(rows)
        out = model(x)
        if chosen is None:
            chosen = get_loss(default_loss(out))
        loss_sum += float(chosen.fn(out, y, reduction="sum"))
        predicted.append(chosen.predict(out).reshape(-1))
        labels.append(y.reshape(-1))
    if not predicted:
        empty = torch.zeros(0, dtype=torch.long, device=device)
        return 0.0, empty, empty
    return loss_sum, torch.cat(predicted), torch.cat(labels)


def evaluate(
    model: nn.Module,
    data: ArrayDataset,
    indices: Optional[torch.Tensor] = None,
    batch_size: int = 1000,
    loss: Optional[str] = None,
) -> tuple[float, float, int]:
    """(mean loss, accuracy, number of examples) on rows ``indices`` (all if None).

    Parameters
    ----------
    model, data
        The model and the data set (already on the same device).
    indices
        Rows to evaluate, on the same device as ``data``; ``None``: all.
    batch_size
        Rows per forward pass.
    loss
        A name of :data:`fedflex.losses.LOSSES` (``model.loss``); ``None`` picks it from
        the model's output (:func:`default_loss`).

    Returns
    -------
    tuple
        Mean per-example loss, share of correct predictions, number of examples
        (``nan, nan, 0`` for no rows).
    """
    loss_sum, predicted, labels = predict(model, data, indices, batch_size, loss)
    n = len(labels)
    if n == 0:
        return math.nan, math.nan, 0
    return loss_sum / n, int((predicted == labels).sum()) / n, n


def confusion_matrix(predicted: np.ndarray, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Return ``M[true, predicted]``: how many test examples of each class got each label."""
    matrix = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(matrix, (np.asarray(labels, dtype=np.int64), np.asarray(predicted, dtype=np.int64)), 1)
    return matrix


def class_accuracy(matrix: np.ndarray) -> list[Optional[float]]:
    """Return each class's accuracy (its diagonal count over its row), None for a class without examples."""
    totals = matrix.sum(axis=1)
    return [float(matrix[c, c] / totals[c]) if totals[c] else None for c in range(len(totals))]


def client_test_rows(
    test_labels: np.ndarray, label_counts: Sequence[np.ndarray], size: int, seed: int
) -> list[np.ndarray]:
    """Each client's test split: ``size`` test rows drawn without replacement, label by label
    in the proportions of the client's training labels (``label_counts[c][label]``),
    largest remainders rounding the counts to ``size``; a label with fewer test rows gives
    all it has. One seeded stream per client: the splits are fixed for a run.
    """
    test_labels = np.asarray(test_labels, dtype=np.int64)
    by_label = [np.flatnonzero(test_labels == label) for label in range(int(test_labels.max(initial=-1)) + 1)]
    splits = []
    for client, counts in enumerate(label_counts):
        counts = np.asarray(counts, dtype=np.float64)[: len(by_label)]
        rng = np.random.default_rng([seed, client])
        if counts.sum() <= 0:
            splits.append(np.zeros(0, dtype=np.int64))
            continue
        share = counts / counts.sum() * size
        take = np.floor(share).astype(np.int64)
        for label in np.argsort(-(share - take), kind="stable")[: size - int(take.sum())]:
            take[label] += 1
        rows = [
            rng.choice(by_label[label], min(k, len(by_label[label])), replace=False) for label, k in enumerate(take)
        ]
        splits.append(np.sort(np.concatenate(rows)) if rows else np.zeros(0, dtype=np.int64))
    return splits


def client_accuracy_stats(accuracies: dict[int, float]) -> dict[str, Any]:
    """Return ``client_accuracy`` ([client, accuracy] pairs, by client) and their mean, std
    (population), worst-10% and best-10% means (at least one client each), as row fields.
    """
    if not accuracies:
        return {}
    values = np.sort(np.fromiter(accuracies.values(), dtype=np.float64))
    tenth = max(1, math.ceil(0.1 * len(values)))
    return {
        "client_accuracy": [[c, round(a, 6)] for c, a in sorted(accuracies.items())],
        "client_accuracy_mean": float(values.mean()),
        "client_accuracy_std": float(values.std()),
        "client_accuracy_worst10": float(values[:tenth].mean()),
        "client_accuracy_best10": float(values[-tenth:].mean()),
    }
