"""SCAFFOLD's client steps by hand on a one-example logistic model."""

from collections import OrderedDict

import pytest
import torch
from flwr.app import RecordDict
from torch import nn

from fedflex import keys
from fedflex.clients.rules import RuleInput, scaffold_rule
from fedflex.clients.train import TrainSettings
from fedflex.data import ArrayDataset


def _setup(c_weight=(0.0, 0.0)):
    model = nn.Linear(1, 2)
    nn.init.zeros_(model.weight)
    nn.init.zeros_(model.bias)
    data = ArrayDataset(x=torch.tensor([[1.0]]), y=torch.tensor([0]), num_classes=2)
    c = OrderedDict(weight=torch.tensor([[c_weight[0]], [c_weight[1]]]), bias=torch.zeros(2))
    return model, data, c


def _run(model, data, c, state, steps=1):
    return scaffold_rule(
        RuleInput(
            model=model,
            data=data,
            indices=torch.tensor([0]),
            settings=TrainSettings(steps=steps, batch_size=1, lr=1.0),
            generator=torch.Generator().manual_seed(0),
            device=torch.device("cpu"),
            payload={keys.SCAFFOLD_C: c},
            state=state,
        )
    )


def test_first_round_is_sgd_and_delta_c_is_the_mean_gradient():
    # c = c_i = 0: plain step; gradient of W = (-1/2, 1/2) -> y = (1/2, -1/2)
    # option II: c_i+ = 0 - 0 + (x - y) / (K lr) = (-1/2, 1/2) = delta c
    model, data, c = _setup()
    state = RecordDict()
    out = _run(model, data, c, state)
    assert model.weight.detach().flatten().tolist() == pytest.approx([0.5, -0.5])
    assert out.extras[keys.SCAFFOLD_DC]["weight"].flatten().tolist() == pytest.approx([-0.5, 0.5])
    assert state[keys.SCAFFOLD_CI].to_torch_state_dict()["weight"].flatten().tolist() == pytest.approx([-0.5, 0.5])


def test_correction_c_minus_ci_is_added_to_the_gradient():
    # c = (1, 0), c_i = 0: corrected gradient of W = (-1/2 + 1, 1/2) -> y = (-1/2, -1/2)
    model, data, c = _setup(c_weight=(1.0, 0.0))
    _run(model, data, c, RecordDict())
    assert model.weight.detach().flatten().tolist() == pytest.approx([-0.5, -0.5])


def test_missing_server_variate_is_an_error():
    model, data, _ = _setup()
    with pytest.raises(ValueError, match="control variate"):
        scaffold_rule(
            RuleInput(
                model=model,
                data=data,
                indices=torch.tensor([0]),
                settings=TrainSettings(steps=1, batch_size=1),
                generator=torch.Generator(),
                device=torch.device("cpu"),
            )
        )


def test_control_variate_estimates_the_gradient_under_momentum():
    # a tiny lr keeps the gradient (-1/2, 1/2) nearly constant over 5 momentum steps:
    # x - y = lr * ||a||_1 * g, so c_i+ = (x - y) / (lr ||a||_1) must be ~g, not ||a||_1/K g
    model, data, c = _setup()
    state = RecordDict()
    scaffold_rule(
        RuleInput(
            model=model,
            data=data,
            indices=torch.tensor([0]),
            settings=TrainSettings(steps=5, batch_size=1, lr=1e-6, momentum=0.9),
            generator=torch.Generator().manual_seed(0),
            device=torch.device("cpu"),
            payload={keys.SCAFFOLD_C: c},
            state=state,
        )
    )
    c_i = state[keys.SCAFFOLD_CI].to_torch_state_dict()["weight"].flatten().tolist()
    assert c_i == pytest.approx([-0.5, 0.5], rel=1e-4)
