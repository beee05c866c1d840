"""FedDyn's client: dynamic regularisation.

Acar, Zhao, Matas, Mattina, Whatmough & Saligrama, "Federated Learning Based on Dynamic
Regularization", ICLR 2021, https://arxiv.org/abs/2111.04263 (Algorithm 1).

Client k in round t starts from the server model w^{t-1} and minimises

    L_k(w) - <g_k, w> + (alpha / 2) ||w - w^{t-1}||^2,

g_k = grad L_k(w_k^{t-1}) its gradient state (zero at first, kept in the node state as
``feddyn-grad``). Every mini-batch step therefore adds ``-g_k + alpha (w - w^{t-1})`` to
the loss gradient: SCAFFOLD's constant correction (-g_k) and FedProx's proximal term
(mu = alpha), so the rule is written once for the plain loop and for cohorts
(:class:`clients.train.StepTerms`). After training, the first-order condition of the
local problem gives the new state

    g_k <- g_k - alpha (w_k^t - w^{t-1}).

The client sends w_k^t; the server half (:mod:`strategies.feddyn`) keeps h and returns
the average shifted by -h / alpha.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from flwr.app import ArrayRecord

from fedflex import keys
from fedflex.clients.rule_io import Params, RuleInput, RuleOutput, RuleStart, RuleSteps, load_state
from fedflex.clients.train import StepTerms, TrainResult


def _start(inp: RuleInput, x: Params) -> RuleStart:
    grad = load_state(inp.state, keys.FEDDYN_GRAD, x, inp.device)
    alpha = inp.options.feddyn.alpha
    return RuleStart(StepTerms(correction={k: -g for k, g in grad.items()}, prox_mu=alpha), context=grad)


@torch.no_grad()
def _finish(inp: RuleInput, start: RuleStart, x: Params, y: Params, result: TrainResult) -> RuleOutput:
    alpha = inp.options.feddyn.alpha
    grad = start.context
    new = OrderedDict((k, (grad[k] - alpha * (y[k].detach() - x[k])).cpu()) for k in x)
    if inp.state is not None:
        inp.state[keys.FEDDYN_GRAD] = ArrayRecord(new)
    return RuleOutput(result)


FEDDYN = RuleSteps(_start, _finish)
