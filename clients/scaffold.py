"""SCAFFOLD's client (option II).

Karimireddy, Kale, Mohri, Reddi, Stich & Suresh, "SCAFFOLD: Stochastic Controlled
Averaging for Federated Learning", ICML 2020, https://arxiv.org/abs/1910.06378.

Corrected steps ``y <- y - lr (g(y) - c_i + c)``, then option II
``c_i+ = c_i - c + (x - y) / (K lr)``; the client sends y and ``delta c = c_i+ - c_i``.
The server control variate c arrives as the ``scaffold-c`` record; the client's c_i
lives in the node state (zero at first). With momentum or weight decay the corrected
gradient goes through the optimiser as a plain gradient would. The variate bookkeeping
(:func:`scaffold_variates`, :func:`scaffold_finish`) is shared with BHerd-SCAFFOLD
(:mod:`clients.bherd`); the server half is :mod:`strategies.scaffold`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
from flwr.app import ArrayRecord

from fedflex import keys
from fedflex.clients.common import Params, RuleInput, RuleOutput, RuleStart, RuleSteps, load_state
from fedflex.clients.fednova import fednova_a_norm
from fedflex.clients.train import StepTerms, TrainResult


@dataclass
class ScaffoldVariates:
    """The server's c and the client's c_i for one round (on the training device)."""

    c: dict[str, torch.Tensor]
    c_i: dict[str, torch.Tensor]

    @property
    def correction(self) -> dict[str, torch.Tensor]:
        """Return c - c_i: what SCAFFOLD adds to every mini-batch gradient."""
        return {k: self.c[k] - self.c_i[k] for k in self.c}


def scaffold_variates(inp: RuleInput, params: "OrderedDict[str, torch.Tensor]") -> ScaffoldVariates:
    """Return c from the ``scaffold-c`` record, c_i from the node state (zeros at first).

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


def _scaffold_start(inp: RuleInput, x: Params) -> RuleStart:
    variates = scaffold_variates(inp, x)
    return RuleStart(StepTerms(correction=variates.correction), context=variates)


def _scaffold_finish(inp: RuleInput, start: RuleStart, x: Params, y: Params, result: TrainResult) -> RuleOutput:
    delta_c = scaffold_finish(inp, start.context, x, y, result.num_steps)
    return RuleOutput(result, extras={keys.SCAFFOLD_DC: delta_c})


SCAFFOLD = RuleSteps(_scaffold_start, _scaffold_finish)
