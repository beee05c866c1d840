"""What every local rule takes and returns, and helpers several rules share.

:class:`RuleInput` / :class:`RuleOutput` are the rule interface (re-exported by
:mod:`clients.rules`, whose :data:`~clients.rules.LOCAL_RULES` registry maps rule names
to functions ``RuleInput -> RuleOutput``). SCAFFOLD's control-variate bookkeeping
(Karimireddy et al., ICML 2020, https://arxiv.org/abs/1910.06378, option II) lives here
because both ``scaffold`` and BHerd-SCAFFOLD (:mod:`clients.bherd`) use it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from flwr.app import ArrayRecord, RecordDict
from torch import nn

from clients.train import StepTerms, TrainResult, TrainSettings, local_train
from fedflex import keys
from fedflex.data import ArrayDataset


@dataclass
class RuleInput:
    model: nn.Module  # holds the global weights on ``device``
    data: ArrayDataset
    indices: torch.Tensor
    settings: TrainSettings
    generator: torch.Generator
    device: torch.device
    payload: dict[str, "OrderedDict[str, torch.Tensor]"] = field(default_factory=dict)
    state: Optional[RecordDict] = None  # the node's persistent context state
    server_round: int = 0
    options: dict[str, Any] = field(default_factory=dict)  # the train message's config entries


@dataclass
class RuleOutput:
    result: TrainResult
    extras: dict[str, "OrderedDict[str, torch.Tensor]"] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    arrays: Optional["OrderedDict[str, torch.Tensor]"] = None  # None: the model's state dict


Params = "OrderedDict[str, torch.Tensor]"


@dataclass
class RuleStart:
    """What a rule computed before training: the terms each step adds (``terms``) and
    anything its :attr:`RuleSteps.finish` needs (``context``)."""

    terms: StepTerms = field(default_factory=StepTerms)
    context: Any = None


@dataclass(frozen=True)
class RuleSteps:
    """A local rule written around one plain training loop, so that the loop can run
    one client at a time (:func:`clients.train.local_train`) or a cohort of clients at
    once (:mod:`clients.cohort`) with the same rule code.

    ``start(inp, x)``: ``x`` holds the start (global) parameters, which must not be
    changed; returns the :class:`RuleStart`. ``finish(inp, start, x, y, result)``:
    ``y`` holds the trained parameters; returns the :class:`RuleOutput` (``arrays=None``:
    send the model's state).
    """

    start: Callable[["RuleInput", Params], RuleStart]
    finish: Callable[["RuleInput", RuleStart, Params, Params, TrainResult], "RuleOutput"]

    def run(self, inp: "RuleInput") -> "RuleOutput":
        """The rule, one client at a time, training ``inp.model`` in place."""
        params = OrderedDict(inp.model.named_parameters())
        x = OrderedDict((k, p.detach().clone()) for k, p in params.items())
        begun = self.start(inp, x)
        result = local_train(inp.model, inp.data, inp.indices, inp.settings, inp.generator, inp.device, begun.terms)
        y = OrderedDict((k, p.detach()) for k, p in params.items())
        return self.finish(inp, begun, x, y, result)


def load_state(state: Optional[RecordDict], name: str, like: "OrderedDict[str, torch.Tensor]", device) -> dict:
    """Tensors stored in the node state under ``name``, or zeros shaped like ``like``."""
    if state is not None and name in state.array_records:
        stored = state[name].to_torch_state_dict()
        if list(stored) == list(like) and all(stored[k].shape == like[k].shape for k in like):
            return {k: stored[k].to(device) for k in like}
    return {k: torch.zeros_like(p.detach()) for k, p in like.items()}


@dataclass
class ScaffoldVariates:
    """The server's c and the client's c_i for one round (on the training device)."""

    c: dict[str, torch.Tensor]
    c_i: dict[str, torch.Tensor]

    @property
    def correction(self) -> dict[str, torch.Tensor]:
        """c - c_i: what SCAFFOLD adds to every mini-batch gradient."""
        return {k: self.c[k] - self.c_i[k] for k in self.c}


def scaffold_variates(inp: RuleInput, params: "OrderedDict[str, torch.Tensor]") -> ScaffoldVariates:
    """c from the ``scaffold-c`` record, c_i from the node state (zeros at first).

    Raises
    ------
    ValueError
        When the train message carries no server control variate.
    """
    server_c = inp.payload.get(keys.SCAFFOLD_C)
    if server_c is None:
        raise ValueError("scaffold: the train message carries no server control variate")
    c = {k: server_c[k].to(inp.device) for k in params}
    return ScaffoldVariates(c=c, c_i=load_state(inp.state, keys.SCAFFOLD_CI, params, inp.device))


def fednova_a_norm(tau: int, momentum: float = 0.0) -> float:
    """``||a_i||_1`` of tau local SGD steps with heavy-ball momentum ``momentum``.

    Examples
    --------
    >>> fednova_a_norm(4)
    4.0
    >>> round(fednova_a_norm(2, 0.5), 6)  # weights (1 + 0.5) and 1
    2.5
    """
    if tau <= 0:
        return 0.0
    rho = float(momentum)
    if rho == 0.0:
        return float(tau)
    return (tau - rho * (1.0 - rho**tau) / (1.0 - rho)) / (1.0 - rho)


@torch.no_grad()
def scaffold_finish(
    inp: RuleInput,
    variates: ScaffoldVariates,
    x: dict[str, torch.Tensor],
    params: "OrderedDict[str, torch.Tensor]",
    steps: int,
) -> "OrderedDict[str, torch.Tensor]":
    """Option II: c_i+ = c_i - c + (x - y) / (||a|| lr); store c_i+ in the node state and
    return delta c = c_i+ - c_i (on the CPU) for the ``scaffold-dc`` record.

    ||a|| = K for plain SGD (the paper's K lr). With heavy-ball momentum beta the K steps
    move the model by lr * ||a||_1 mean gradients (FedNova's ||a||_1, see
    :func:`fednova_a_norm`), not K: dividing by K would overstate c_i by up to
    1/(1 - beta) and made SCAFFOLD diverge with momentum 0.9 (measured on the churn
    paper's FMNIST scenario).
    """
    c, c_i = variates.c, variates.c_i
    a_norm = fednova_a_norm(max(steps, 1), inp.settings.momentum if inp.settings.optimizer == "sgd" else 0.0)
    scale = 1.0 / (a_norm * inp.settings.lr)
    new_ci = {k: c_i[k] - c[k] + (x[k] - params[k].detach()) * scale for k in params}
    if inp.state is not None:
        inp.state[keys.SCAFFOLD_CI] = ArrayRecord(OrderedDict((k, v.cpu()) for k, v in new_ci.items()))
    return OrderedDict((k, (new_ci[k] - c_i[k]).cpu()) for k in params)
