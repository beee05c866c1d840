"""Evaluation of a model on in-memory data (used by the server and by clients).

The loss and the prediction rule come from :mod:`fedflex.losses` by name (the
scenario's ``model.loss``).
"""

from __future__ import annotations

import math
from typing import Optional

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
    model.eval()
    n = len(data) if indices is None else len(indices)
    if n == 0:
        return math.nan, math.nan, 0
    device = data.x.device
    loss_sum, correct = 0.0, 0
    chosen = get_loss(loss) if loss is not None else None
    for start in range(0, n, batch_size):
        rows = torch.arange(start, min(start + batch_size, n), device=device)
        if indices is not None:
            rows = indices[rows]
        x, y = data.inputs(rows), data.labels(rows)
        out = model(x)
        if chosen is None:
            chosen = get_loss(default_loss(out))
        loss_sum += float(chosen.fn(out, y, reduction="sum"))
        correct += int((chosen.predict(out) == y).sum())
    return loss_sum / n, correct / n, n
