"""FedDyn's and FedCM's client steps and state, worked out by hand on one example.

Model: logistic regression with one input, two classes, zero weights; the example is
x = 1 of class 0. At zero weights p = softmax(0, 0) = (1/2, 1/2), so the loss gradient is
(p - onehot(0)) x = (-1/2, 1/2) for the weight column and the bias alike.
"""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord, RecordDict
from torch import nn

from fedflex import keys
from fedflex.clients.fedcm import FEDCM
from fedflex.clients.feddyn import FEDDYN
from fedflex.clients.rule_io import RuleInput
from fedflex.clients.train import TrainSettings
from fedflex.config import LocalRuleConfig
from fedflex.data import ArrayDataset
from fedflex.options import FedCMOptions, FedDynOptions

ONE_STEP = TrainSettings(steps=1, batch_size=1, lr=1.0)


def _input(options: LocalRuleConfig, state=None, payload=None) -> RuleInput:
    model = nn.Linear(1, 2)
    nn.init.zeros_(model.weight)
    nn.init.zeros_(model.bias)
    return RuleInput(
        model=model,
        data=ArrayDataset(x=torch.tensor([[1.0]]), y=torch.tensor([0]), num_classes=2),
        indices=torch.tensor([0]),
        settings=ONE_STEP,
        generator=torch.Generator().manual_seed(0),
        device=torch.device("cpu"),
        payload=payload or {},
        state=state,
        options=options,
    )


def _ones_state() -> RecordDict:
    state = RecordDict()
    state[keys.FEDDYN_GRAD] = ArrayRecord({"weight": torch.ones(2, 1), "bias": torch.ones(2)})
    return state


def test_feddyn_step_subtracts_the_clients_gradient_state():
    # Prepare: g_k = 1 everywhere; at the start w = w^{t-1}, so the proximal term is 0:
    # step = loss grad - g_k = (-1/2 - 1, 1/2 - 1) = (-3/2, -1/2); lr 1 -> w = (3/2, 1/2)
    inp = _input(LocalRuleConfig(name="feddyn", feddyn=FedDynOptions(alpha=0.1)), state=_ones_state())

    # Execute
    FEDDYN.run(inp)

    # Assert
    assert inp.model.weight.detach().flatten().tolist() == pytest.approx([1.5, 0.5])
    assert inp.model.bias.detach().tolist() == pytest.approx([1.5, 0.5])


def test_feddyn_keeps_the_new_gradient_state_on_the_node():
    # g_k <- g_k - alpha (w_k - w^{t-1}) = 1 - 0.1 (3/2, 1/2) = (0.85, 0.95)
    state = _ones_state()
    FEDDYN.run(_input(LocalRuleConfig(name="feddyn", feddyn=FedDynOptions(alpha=0.1)), state=state))
    stored = state[keys.FEDDYN_GRAD].to_torch_state_dict()
    assert stored["weight"].flatten().tolist() == pytest.approx([0.85, 0.95])
    assert stored["bias"].tolist() == pytest.approx([0.85, 0.95])


def test_feddyn_starts_from_a_zero_gradient_state():
    # no state yet: the first step is plain SGD, w = (1/2, -1/2); g = 0 - 0.5 (1/2, -1/2)
    state = RecordDict()
    FEDDYN.run(_input(LocalRuleConfig(name="feddyn", feddyn=FedDynOptions(alpha=0.5)), state=state))
    stored = state[keys.FEDDYN_GRAD].to_torch_state_dict()
    assert stored["bias"].tolist() == pytest.approx([-0.25, 0.25])


def test_fedcm_steps_along_the_blend_of_gradient_and_global_momentum():
    # Prepare: Delta = 2 everywhere, alpha = 1/4:
    # v = 1/4 (-1/2, 1/2) + 3/4 * 2 = (11/8, 13/8); lr 1 -> w = -v
    delta = {"weight": torch.full((2, 1), 2.0), "bias": torch.full((2,), 2.0)}
    inp = _input(LocalRuleConfig(name="fedcm", fedcm=FedCMOptions(alpha=0.25)), payload={keys.FEDCM_DELTA: delta})

    # Execute
    FEDCM.run(inp)

    # Assert
    assert inp.model.weight.detach().flatten().tolist() == pytest.approx([-1.375, -1.625])
    assert inp.model.bias.detach().tolist() == pytest.approx([-1.375, -1.625])


def test_fedcm_without_the_global_momentum_is_refused():
    with pytest.raises(ValueError, match="fedcm-delta"):
        FEDCM.run(_input(LocalRuleConfig(name="fedcm")))
