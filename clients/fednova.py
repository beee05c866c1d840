"""FedNova's client: normalised local updates.

Wang, Liu, Liang, Joshi & Poor, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization", NeurIPS 2020, https://arxiv.org/abs/2007.07481.

Client i runs its tau_i local steps as plain local training does; its change
``x - y_i = lr * sum_k a_ik g_ik`` is a weighted sum of its mini-batch gradients, and it
sends the normalised update ``d_i = (x - y_i) / ||a_i||_1`` (record ``fednova-d``) with
``||a_i||_1`` and tau_i in the metrics. The server (:mod:`strategies.fednova`) steps
``x <- x - tau_eff sum_i p_i d_i`` with ``tau_eff = sum_i p_i ||a_i||_1``.

Variant: local SGD, with or without heavy-ball momentum (the paper's Sec. 5 covers both):

- momentum 0: a_i = (1, ..., 1), ``||a_i||_1 = tau_i`` (vanilla FedNova);
- torch's SGD momentum rho (buffer b_k = rho b_{k-1} + g_k, step lr b_k, a fresh buffer
  every round): ``x - y_i = lr sum_k g_k (1 - rho^(tau-k+1)) / (1 - rho)``, so
  ``||a_i||_1 = [tau_i - rho (1 - rho^tau_i) / (1 - rho)] / (1 - rho)``.

Weight decay is part of each g_k and changes nothing here. Adam and FedProx's proximal
term give other a_i and are refused at config load (``strategies.build.check_parts``).
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import torch

from fedflex import keys
from fedflex.clients.rule_io import Params, RuleInput, RuleOutput, RuleStart, RuleSteps
from fedflex.clients.train import TrainResult

logger = logging.getLogger(__name__)


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


def _start(inp: RuleInput, x: Params) -> RuleStart:
    return RuleStart()


def _finish(inp: RuleInput, start: RuleStart, x: Params, y: Params, result: TrainResult) -> RuleOutput:
    a_norm = fednova_a_norm(result.num_steps, inp.settings.momentum)
    scale = 1.0 / a_norm if a_norm > 0 else 0.0
    with torch.no_grad():
        d = OrderedDict((k, ((x[k] - y[k]) * scale).cpu()) for k in y)
    metrics = {keys.FEDNOVA_TAU: result.num_steps, keys.FEDNOVA_A_NORM: a_norm}
    return RuleOutput(result, extras={keys.FEDNOVA_D: d}, metrics=metrics)


#: Local training, then the normalised update ``(x - y) / ||a||_1`` of every parameter
#: as the ``fednova-d`` record; ``fednova-tau`` and ``fednova-a-norm`` in the metrics.
#: The local model is sent too (its buffers, e.g. BatchNorm statistics, are averaged by
#: the aggregator).
FEDNOVA = RuleSteps(_start, _finish)
fednova_rule = FEDNOVA.run
