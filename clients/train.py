"""Local training loops over in-memory tensors.

No DataLoader: a client's examples are rows of tensors that the worker already holds,
so a mini-batch is one index operation. Local rules:

- ``sgd``: plain local training (FedAvg, McMahan et al., 2017, arXiv:1602.05629);
- ``fedprox``: adds the proximal term mu/2 ||w - w_global||^2 to every mini-batch loss
  (FedProx, Li et al., 2020, arXiv:1812.06127).

The mini-batch loss is ``TrainSettings.loss`` by name (:mod:`fedflex.losses`:
``cross-entropy`` or ``squared-hinge``), the scenario's ``model.loss``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Mapping, Optional, cast

import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict
from torch import nn

from fedflex.config import ClientConfig, ModelConfig
from fedflex.data import ArrayDataset
from fedflex.lazy_dynamo import defer_dynamo_import
from fedflex.lazy_dynamo import step as optimizer_step
from fedflex.losses import get_loss

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainSettings:
    """Hyper-parameters of one round of local training: the training fields of the
    scenario's :class:`~fedflex.config.ClientConfig` (its defaults, written there once)
    and the task's loss (``model.loss``).
    """

    epochs: int = ClientConfig.epochs
    steps: Optional[int] = ClientConfig.steps
    batch_size: int = ClientConfig.batch_size
    optimizer: str = ClientConfig.optimizer
    lr: float = ClientConfig.lr
    momentum: float = ClientConfig.momentum
    weight_decay: float = ClientConfig.weight_decay
    keep_optimizer_state: bool = ClientConfig.keep_optimizer_state
    loss: str = ModelConfig.loss
    # per-client, per-round draws (None: off); drawn_settings turns them into epochs / batch_size
    epochs_range: Optional[tuple[int, int]] = None
    batch_size_range: Optional[tuple[int, int]] = None

    @classmethod
    def from_client(cls, client: ClientConfig, loss: str = ModelConfig.loss) -> "TrainSettings":
        """Return the settings of ``client`` (its training fields) with the task's ``loss``."""
        values = {name: getattr(client, name) for name in client.training_fields()}
        for name in ("epochs_range", "batch_size_range"):
            if values.get(name) is not None:
                values[name] = tuple(int(v) for v in values[name])
        return cls(**values, loss=loss)


DRAW_EPOCHS, DRAW_BATCH = 1, 2  # stream tags: each option draws from its own stream


def _draw(seed: int, server_round: int, client: int, tag: int, lo: int, hi: int) -> int:
    """Return an integer uniform on lo..hi from the stream of (seed, round, client, tag)."""
    rng = np.random.default_rng([int(seed), int(server_round), int(client), tag])
    return int(rng.integers(lo, hi + 1))


def drawn_settings(
    settings: TrainSettings, *, seed: int, server_round: int, client: int, num_examples: int
) -> TrainSettings:
    """Return ``settings`` with this client's epochs and batch size for this round drawn from
    ``epochs_range`` / ``batch_size_range`` (``client.*``); unchanged when both are off.

    Epochs: uniform on lo..hi. Batch size: uniform on lo..min(hi, n - 1) for a client with
    n > lo examples, else n (FedAWARE's authors draw ``randint(10, n)``, i.e. 10..n-1).
    Each option has its own random stream, seeded by (``seed``, ``server_round``,
    ``client``) only: the draw does not depend on the backend, the order clients train in,
    the other option, or a resume.

    Examples
    --------
    >>> s = drawn_settings(TrainSettings(batch_size_range=(10, 10_000)), seed=0, server_round=1, client=3,
    ...                    num_examples=11)
    >>> s.batch_size, s.epochs, s.batch_size_range  # 10..min(10000, 11 - 1): always 10
    (10, 1, None)
    >>> drawn_settings(TrainSettings(batch_size_range=(10, 64)), seed=0, server_round=1, client=3,
    ...                num_examples=7).batch_size  # n <= lo: one batch of n
    7
    """
    if settings.epochs_range is None and settings.batch_size_range is None:
        return settings
    epochs, batch = settings.epochs, settings.batch_size
    if settings.epochs_range is not None:
        lo, hi = settings.epochs_range
        epochs = _draw(seed, server_round, client, DRAW_EPOCHS, lo, hi)
    if settings.batch_size_range is not None:
        lo, hi = settings.batch_size_range
        n = int(num_examples)
        batch = max(n, 1) if n <= lo else _draw(seed, server_round, client, DRAW_BATCH, lo, min(hi, n - 1))
    return dataclasses.replace(settings, epochs=epochs, batch_size=batch, epochs_range=None, batch_size_range=None)


@dataclass(frozen=True)
class StepTerms:
    """What a local rule adds to every mini-batch gradient before the optimiser step.

    ``grad_scale``: a factor on the mini-batch loss's gradient (FedCM's alpha);
    ``correction``: a constant per parameter (SCAFFOLD's ``c - c_i``); ``prox_mu``:
    FedProx's ``mu (w - w_start)``, the gradient of ``mu/2 ||w - w_start||^2``. Both
    the sequential loop (:func:`local_train`) and the cohort loop
    (:mod:`clients.cohort`) apply them, so a rule is written once for both.
    """

    correction: Optional[dict[str, torch.Tensor]] = None
    prox_mu: float = 0.0
    grad_scale: float = 1.0

    @torch.no_grad()
    def add_to_gradients(
        self, params: Mapping[str, torch.Tensor], anchor: Optional[Mapping[str, torch.Tensor]] = None
    ) -> None:
        """Turn the plain mini-batch loss's gradients of ``params`` (after ``backward``)
        into the rule's: ``grad_scale * grad + prox_mu (w - anchor) + correction``, in
        place (a parameter without a gradient gets one). What :func:`local_train` does
        through the loss, for a loop that is not fedflex's (:mod:`clients.helpers`);
        ``anchor`` (the start parameters) is needed when ``prox_mu`` > 0.
        """
        for name, p in params.items():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            if self.grad_scale != 1.0:
                p.grad.mul_(self.grad_scale)
            if self.prox_mu > 0:
                p.grad.add_(
                    p.detach() - cast(Mapping[str, torch.Tensor], anchor)[name].to(p.device), alpha=self.prox_mu
                )
            if self.correction is not None:
                p.grad.add_(self.correction[name].to(p.device))


@dataclass(frozen=True)
class TrainResult:
    """The outcome of local training: examples and steps taken and the mean training loss."""

    num_examples: int
    num_steps: int
    train_loss: float  # mean mini-batch loss (without the proximal term)


def make_optimizer(params, settings: TrainSettings) -> torch.optim.Optimizer:
    """SGD (with momentum / weight decay) or Adam, from the settings (stepped with
    :func:`fedflex.lazy_dynamo.step`: no ``torch._dynamo`` import, about 1 s a process).
    """
    defer_dynamo_import()
    if settings.optimizer == "sgd":
        return torch.optim.SGD(params, lr=settings.lr, momentum=settings.momentum, weight_decay=settings.weight_decay)
    if settings.optimizer == "adam":
        return torch.optim.Adam(params, lr=settings.lr, weight_decay=settings.weight_decay)
    raise ValueError(f"unknown optimizer {settings.optimizer!r}: use sgd or adam")


#: node-state record of the optimiser state a client keeps across rounds
#: (``client.keep_optimizer_state``): ``<parameter>|<state key>`` -> tensor
OPTIMIZER_STATE = "optimizer-state"


def load_optimizer_state(optimizer: torch.optim.Optimizer, params, state: Optional[RecordDict]) -> bool:
    """Put the optimiser state kept in the node ``state`` back into ``optimizer``
    (``params``: its ``(name, parameter)`` pairs). False when there is none yet, or it
    does not fit these parameters (another model): the optimiser then starts fresh.
    """
    if state is None or OPTIMIZER_STATE not in state.array_records:
        return False
    stored = cast(ArrayRecord, state[OPTIMIZER_STATE]).to_torch_state_dict()
    restored: dict[torch.Tensor, dict[str, torch.Tensor]] = {}
    for name, p in params:
        entries = {k.split("|", 1)[1]: v for k, v in stored.items() if k.split("|", 1)[0] == name}
        for key, value in entries.items():
            if value.dim() and value.shape != p.shape:
                return False
            restored.setdefault(p, {})[key] = value.to(p.device) if value.dim() else value
    for p, entries in restored.items():
        optimizer.state[p] = entries
    return bool(restored)


def save_optimizer_state(optimizer: torch.optim.Optimizer, params, state: Optional[RecordDict]) -> None:
    """Keep ``optimizer``'s per-parameter state in the node ``state`` for the next round."""
    if state is None:
        return
    kept = {
        f"{name}|{key}": value.detach().cpu().clone()
        for name, p in params
        for key, value in optimizer.state.get(p, {}).items()
        if isinstance(value, torch.Tensor)
    }
    state[OPTIMIZER_STATE] = ArrayRecord(kept)


def num_steps(n: int, settings: TrainSettings) -> int:
    """How many mini-batches :func:`batch_order` gives a client with ``n`` examples.

    Examples
    --------
    >>> num_steps(70, TrainSettings(epochs=2, batch_size=32))
    6
    >>> num_steps(70, TrainSettings(steps=5, batch_size=32)), num_steps(0, TrainSettings(steps=5))
    (5, 0)
    """
    if n == 0:
        return 0
    if settings.steps is not None:
        return settings.steps
    return settings.epochs * -(-n // settings.batch_size)


def batch_order(n: int, settings: TrainSettings, generator: torch.Generator) -> list[torch.Tensor]:
    """Positions (0..n-1) of each mini-batch of one round.

    ``epochs`` full passes over a fresh permutation each (the last batch of a pass may be
    short), or, when ``steps`` is set, exactly that many batches cut from consecutive
    permutations.
    """
    if n == 0:
        return []
    bs = settings.batch_size
    batches: list[torch.Tensor] = []
    if settings.steps is None:
        for _ in range(settings.epochs):
            perm = torch.randperm(n, generator=generator)
            batches.extend(perm.split(bs))
        return batches
    while len(batches) < settings.steps:
        perm = torch.randperm(n, generator=generator)
        batches.extend(perm.split(bs))
    return batches[: settings.steps]


def local_train(
    model: nn.Module,
    data: ArrayDataset,
    indices: torch.Tensor,
    settings: TrainSettings,
    generator: torch.Generator,
    device: torch.device,
    terms: Optional[StepTerms] = None,
    state: Optional[RecordDict] = None,
) -> TrainResult:
    """Train ``model`` in place on rows ``indices`` of ``data``.

    ``data`` must already live on ``device`` (the worker moves it once). ``terms``: what
    the local rule adds to each gradient (FedProx's term, SCAFFOLD's correction); ``None``
    adds nothing. ``state``: the node's persistent state, where the optimiser's state is
    kept between rounds when ``settings.keep_optimizer_state``.
    """
    if terms is None:
        terms = StepTerms()
    model.train()
    optimizer = make_optimizer(model.parameters(), settings)
    params = list(model.named_parameters())
    if settings.keep_optimizer_state:
        load_optimizer_state(optimizer, params, state)
    anchor = [p.detach().clone() for _, p in params] if terms.prox_mu > 0 else None
    indices = indices.to(device)
    loss_fn = get_loss(settings.loss).fn
    total, steps = 0.0, 0
    for pos in batch_order(len(indices), settings, generator):
        rows = indices[pos.to(device)]
        x, y = data.inputs(rows), data.labels(rows)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        total += float(loss.detach())
        if terms.grad_scale != 1.0:
            loss = loss * terms.grad_scale
        if anchor is not None:
            penalty = sum((p - a).pow(2).sum() for (_, p), a in zip(params, anchor))
            loss = loss + 0.5 * terms.prox_mu * penalty
        loss.backward()
        if terms.correction is not None:
            with torch.no_grad():
                for name, p in params:
                    cast(torch.Tensor, p.grad).add_(terms.correction[name])
        optimizer_step(optimizer)
        steps += 1
    if settings.keep_optimizer_state:
        save_optimizer_state(optimizer, params, state)
    mean_loss = total / steps if steps else math.nan
    return TrainResult(num_examples=len(indices), num_steps=steps, train_loss=mean_loss)
