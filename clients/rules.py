"""Local update rules: what a client computes and sends in a round.

A rule takes a :class:`RuleInput` (the model holding the global weights, the worker's
data, this client's rows, the training settings, the server's extra array records, the
node's persistent state and the train message's config entries) and returns a
:class:`RuleOutput` (the model to send, further array records, metrics). The registry
:data:`LOCAL_RULES` maps the names of ``strategy.local_rule.name`` to rules.

- ``sgd`` / ``fedprox``: :func:`clients.train.local_train`.
- ``scaffold``: Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for
  Federated Learning", ICML 2020, https://arxiv.org/abs/1910.06378 (option II).
- ``fednova``: Wang et al., "Tackling the Objective Inconsistency Problem in
  Heterogeneous Federated Optimization", NeurIPS 2020, https://arxiv.org/abs/2007.07481
  (:mod:`clients.fednova`).
- ``bherd``: Luo et al., "BHerd: Accelerating Federated Learning by Selecting a
  Beneficial Herd of Local Gradients", 2024, https://arxiv.org/abs/2403.16557, alone or
  on FedNova / SCAFFOLD; ``grab``: GraB-FedAvg, online balancing (Lu et al., NeurIPS
  2022, https://arxiv.org/abs/2205.10733) (:mod:`clients.bherd`).
- ``feddyn``: Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR
  2021, https://arxiv.org/abs/2111.04263 (:mod:`clients.feddyn`).
- ``fedcm``: Xu et al., "FedCM: Federated Learning with Client-level Momentum", 2021,
  https://arxiv.org/abs/2106.10874 (:mod:`clients.fedcm`).

Every rule trains with the loss ``settings.loss`` names (:mod:`fedflex.losses`).
"""

from __future__ import annotations

from typing import Callable

from fedflex.clients.bherd import bherd_rule, grab_rule
from fedflex.clients.fedcm import FEDCM
from fedflex.clients.feddyn import FEDDYN
from fedflex.clients.fednova import FEDNOVA
from fedflex.clients.rule_io import Params, RuleInput, RuleOutput, RuleStart, RuleSteps, load_state
from fedflex.clients.scaffold import SCAFFOLD
from fedflex.clients.train import StepTerms, TrainResult

__all__ = ["LOCAL_RULES", "RULE_STEPS", "RuleInput", "RuleOutput", "sgd_rule", "scaffold_rule", "load_state"]


def _sgd_start(inp: RuleInput, x: Params) -> RuleStart:
    mu = inp.options.fedprox.mu if inp.options.name == "fedprox" else 0.0
    return RuleStart(StepTerms(prox_mu=mu))


def _sgd_finish(inp: RuleInput, start: RuleStart, x: Params, y: Params, result: TrainResult) -> RuleOutput:
    return RuleOutput(result)


#: Plain local training, with FedProx's proximal term for rule fedprox (its option ``mu``).
SGD = RuleSteps(_sgd_start, _sgd_finish)

#: Rules written as start / train / finish: they run one client at a time or, in
#: simulation, as a batched cohort (:mod:`clients.cohort`).
RULE_STEPS: dict[str, RuleSteps] = {
    "sgd": SGD,
    "fedprox": SGD,
    "scaffold": SCAFFOLD,
    "fednova": FEDNOVA,
    "feddyn": FEDDYN,
    "fedcm": FEDCM,
}

sgd_rule = SGD.run
scaffold_rule = SCAFFOLD.run

#: Every local rule by name: ``RuleInput -> RuleOutput``, one client at a time. BHerd
#: and GraB record every step's gradient in their own loop (:mod:`clients.bherd`).
LOCAL_RULES: dict[str, Callable[[RuleInput], RuleOutput]] = {
    **{name: steps.run for name, steps in RULE_STEPS.items()},
    "bherd": bherd_rule,
    "grab": grab_rule,
}
