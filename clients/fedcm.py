"""FedCM's client: local steps along a blend of the gradient and the global momentum.

Xu, Wang, Wang & Yao, "FedCM: Federated Learning with Client-level Momentum", 2021,
https://arxiv.org/abs/2106.10874 (Algorithm 1).

The server broadcasts its momentum Delta_t (the ``fedcm-delta`` record; zero in the
first round) with the model. Every local step of client i moves along

    v = alpha g(y) + (1 - alpha) Delta_t,      y <- y - lr v,

``alpha`` = ``fedcm.alpha`` (the paper's default 0.1). Written as
:class:`clients.train.StepTerms`: the loss gradient scaled by alpha plus the constant
correction (1 - alpha) Delta_t, so cohorts run it too. The client sends its model; the
server half (:mod:`strategies.fedcm`) computes the next Delta from the replies. Weight
decay, when set, is added by the optimiser unscaled.
"""

from __future__ import annotations

from fedflex import keys
from fedflex.clients.rule_io import Params, RuleInput, RuleOutput, RuleStart, RuleSteps
from fedflex.clients.train import StepTerms, TrainResult


def _start(inp: RuleInput, x: Params) -> RuleStart:
    alpha = inp.options.fedcm.alpha
    delta = inp.payload.get(keys.FEDCM_DELTA)
    if delta is None:
        raise ValueError("fedcm: the train message carries no global momentum (fedcm-delta)")
    correction = {k: (1.0 - alpha) * delta[k].to(inp.device) for k in x}
    return RuleStart(StepTerms(correction=correction, grad_scale=alpha))


def _finish(inp: RuleInput, start: RuleStart, x: Params, y: Params, result: TrainResult) -> RuleOutput:
    return RuleOutput(result)


FEDCM = RuleSteps(_start, _finish)
