"""Training losses by name, each with the prediction rule that goes with it.

``model.loss`` in a scenario names one of :data:`LOSSES`; the training loops
(:mod:`clients.train`, :mod:`clients.rules`, :mod:`clients.bherd`) and
:func:`fedflex.evaluation.evaluate` look it up here, so a loss and the accuracy it is
reported with never disagree.

- ``cross-entropy``: :func:`torch.nn.functional.cross_entropy` on ``[B, C]`` logits;
  prediction ``argmax``.
- ``squared-hinge``: the squared hinge loss of the L2-SVM, as the BHerd paper uses it
  for its linear SVM (Luo et al., 2024, https://arxiv.org/abs/2403.16557, Sec. 1.2):
  ``mean_b max(0, 1 - y_b f(x_b))^2`` with ``y_b in {-1, +1}``.
  A model with ONE output column (``svm``) is a binary classifier: label 0 -> y = -1,
  label 1 -> y = +1; prediction ``1 if f(x) > 0 else 0``. A model with ``C >= 2``
  columns gets the one-vs-rest form ``mean_b sum_c max(0, 1 - y_bc f_c(x_b))^2``
  (``y_bc = +1`` for the true class, ``-1`` otherwise); prediction ``argmax``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch.nn import functional as F

__all__ = ["Loss", "LOSSES", "get_loss", "cross_entropy", "squared_hinge", "predict_argmax", "predict_sign"]


def cross_entropy(scores: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of ``[B, C]`` logits against integer labels."""
    return F.cross_entropy(scores, labels, reduction=reduction)


def _signed_targets(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``y`` in {-1, +1} shaped like ``scores`` (binary for one column, one-vs-rest else)."""
    if scores.shape[1] == 1:
        return (2.0 * labels.to(scores.dtype) - 1.0).unsqueeze(1)
    onehot = F.one_hot(labels, num_classes=scores.shape[1]).to(scores.dtype)
    return 2.0 * onehot - 1.0


def squared_hinge(scores: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Squared hinge loss ``max(0, 1 - y f)^2``, summed over output columns, reduced over
    the batch (``mean`` or ``sum``).

    Parameters
    ----------
    scores : torch.Tensor
        ``[B]`` or ``[B, 1]`` (binary: labels must be 0 or 1) or ``[B, C]`` (one-vs-rest).
    labels : torch.Tensor
        Integer labels ``[B]``.

    Raises
    ------
    ValueError
        When a one-column model meets a label other than 0 or 1.
    """
    if scores.dim() == 1:
        scores = scores.unsqueeze(1)
    if scores.shape[1] == 1 and labels.numel() and int(labels.max()) > 1:
        raise ValueError(
            f"squared-hinge on a one-output (binary) model needs labels 0/1, got label {int(labels.max())}; "
            "map the labels to two classes (dataset.label_map=even-odd)"
        )
    margins = torch.clamp(1.0 - _signed_targets(scores, labels) * scores, min=0.0)
    per_example = margins.pow(2).sum(dim=1)
    if reduction == "sum":
        return per_example.sum()
    if reduction == "none":
        return per_example
    return per_example.mean()


def predict_argmax(scores: torch.Tensor) -> torch.Tensor:
    """Predicted class of ``[B, C]`` scores: the highest one."""
    return scores.argmax(dim=1)


def predict_sign(scores: torch.Tensor) -> torch.Tensor:
    """Predicted class of a binary scorer: 1 where ``f(x) > 0``, else 0; ``argmax`` for
    two or more columns.
    """
    if scores.dim() == 1:
        scores = scores.unsqueeze(1)
    if scores.shape[1] == 1:
        return (scores[:, 0] > 0).long()
    return scores.argmax(dim=1)


@dataclass(frozen=True)
class Loss:
    """A named loss: ``fn(scores, labels, reduction)`` and ``predict(scores) -> labels``."""

    name: str
    fn: Callable[..., torch.Tensor]
    predict: Callable[[torch.Tensor], torch.Tensor]


#: Registry of the names ``model.loss`` takes (kept equal to ``fedflex.config.LOSSES``).
LOSSES: dict[str, Loss] = {
    "cross-entropy": Loss("cross-entropy", cross_entropy, predict_argmax),
    "squared-hinge": Loss("squared-hinge", squared_hinge, predict_sign),
}


def get_loss(name: str) -> Loss:
    """Return the loss called ``name``.

    Raises
    ------
    ValueError
        For a name not in :data:`LOSSES`, listing the known ones.
    """
    try:
        return LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown loss {name!r}: must be one of " + ", ".join(LOSSES)) from None
