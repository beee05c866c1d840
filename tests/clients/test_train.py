"""Local training loop: batch order, and SGD / FedProx steps worked out by hand."""

import math

import pytest
import torch
from torch import nn

from fedflex.clients.train import StepTerms, TrainSettings, batch_order, local_train
from fedflex.data import ArrayDataset
from fedflex.evaluation import evaluate


def _one_example_data():
    # one example x = 1 of class 0, two classes
    return ArrayDataset(x=torch.tensor([[1.0]]), y=torch.tensor([0]), num_classes=2)


def _zero_logreg():
    model = nn.Linear(1, 2)
    nn.init.zeros_(model.weight)
    nn.init.zeros_(model.bias)
    return model


def test_batch_order_epochs_cover_every_example_each_pass():
    batches = batch_order(10, TrainSettings(epochs=2, batch_size=4), torch.Generator().manual_seed(0))
    assert [len(b) for b in batches] == [4, 4, 2, 4, 4, 2]
    assert sorted(torch.cat(batches[:3]).tolist()) == list(range(10))
    assert sorted(torch.cat(batches[3:]).tolist()) == list(range(10))


def test_batch_order_steps_cut_consecutive_passes():
    batches = batch_order(10, TrainSettings(steps=5, batch_size=4), torch.Generator().manual_seed(0))
    assert [len(b) for b in batches] == [4, 4, 2, 4, 4]


def test_one_sgd_step_by_hand():
    # logits (0, 0) -> p = (1/2, 1/2); dCE/dlogit = p - onehot(0) = (-1/2, 1/2); x = 1
    # lr = 1: W = -(-1/2, 1/2) = (1/2, -1/2), b likewise
    model = _zero_logreg()
    res = local_train(
        model,
        _one_example_data(),
        torch.tensor([0]),
        TrainSettings(steps=1, batch_size=1, lr=1.0),
        torch.Generator().manual_seed(0),
        torch.device("cpu"),
    )
    assert model.weight.detach().flatten().tolist() == pytest.approx([0.5, -0.5])
    assert model.bias.detach().tolist() == pytest.approx([0.5, -0.5])
    assert res.train_loss == pytest.approx(math.log(2))
    assert (res.num_examples, res.num_steps) == (1, 1)


@pytest.mark.parametrize("mu", [0.0, 0.5])
def test_second_step_adds_the_proximal_gradient(mu):
    # after step 1: w = (1/2, -1/2), b = (1/2, -1/2): logits (1, -1)
    # p0 = e/(e + 1/e); grad_w0 = (p0 - 1) * 1 + mu * (w0 - 0) = (p0 - 1) + mu/2
    p0 = math.e / (math.e + math.exp(-1))
    expected_w0 = 0.5 - ((p0 - 1) + mu * 0.5)
    model = _zero_logreg()
    local_train(
        model,
        _one_example_data(),
        torch.tensor([0]),
        TrainSettings(steps=2, batch_size=1, lr=1.0),
        torch.Generator().manual_seed(0),
        torch.device("cpu"),
        StepTerms(prox_mu=mu),
    )
    assert float(model.weight.detach()[0, 0]) == pytest.approx(expected_w0, rel=1e-6)


def test_adam_first_step_moves_each_weight_by_lr():
    # Adam's first step is lr * g / (|g| + eps) = lr * sign(g) for every nonzero gradient
    model = _zero_logreg()
    local_train(
        model,
        _one_example_data(),
        torch.tensor([0]),
        TrainSettings(steps=1, batch_size=1, lr=0.1, optimizer="adam"),
        torch.Generator().manual_seed(0),
        torch.device("cpu"),
    )
    assert model.weight.detach().flatten().tolist() == pytest.approx([0.1, -0.1], rel=1e-5)


def test_evaluate_counts_correct_predictions():
    # W = (1, -1): x = 2 -> class 0 (correct), x = -1 -> class 1 (label 0: wrong)
    model = nn.Linear(1, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0], [-1.0]]))
    data = ArrayDataset(x=torch.tensor([[2.0], [-1.0]]), y=torch.tensor([0, 0]), num_classes=2)
    loss, acc, n = evaluate(model, data)
    # CE: log(1 + e^{-4}) and log(1 + e^{2})
    assert acc == 0.5 and n == 2
    assert loss == pytest.approx((math.log1p(math.exp(-4)) + math.log1p(math.exp(2))) / 2)


@pytest.mark.parametrize("keep, expected", [(False, 0.5), (True, 0.75)])
def test_kept_momentum_carries_over_to_the_next_round(keep, expected):
    # round 1 from the zero model: one step, bias gradient g = (-1/2, 1/2), buffer g,
    # b = -g. Round 2 starts again from the zero model with the same gradient: a fresh
    # buffer is g again (b = (1/2, -1/2)); a kept one is 0.5 g + g = 1.5 g (b = (3/4, -3/4))
    from flwr.app import RecordDict

    state = RecordDict()
    settings = TrainSettings(steps=1, batch_size=1, lr=1.0, momentum=0.5, keep_optimizer_state=keep)
    for _ in range(2):
        model = _zero_logreg()
        local_train(
            model,
            _one_example_data(),
            torch.tensor([0]),
            settings,
            torch.Generator().manual_seed(0),
            torch.device("cpu"),
            state=state,
        )
    assert model.bias.detach().tolist() == pytest.approx([expected, -expected])
    assert ("optimizer-state" in state.array_records) is keep


def test_kept_state_of_another_model_is_ignored():
    from flwr.app import ArrayRecord, RecordDict

    from fedflex.clients.train import OPTIMIZER_STATE

    state = RecordDict({OPTIMIZER_STATE: ArrayRecord({"bias|momentum_buffer": torch.ones(5)})})  # wrong shape
    model = _zero_logreg()
    settings = TrainSettings(steps=1, batch_size=1, lr=1.0, momentum=0.5, keep_optimizer_state=True)
    local_train(
        model, _one_example_data(), torch.tensor([0]), settings, torch.Generator(), torch.device("cpu"), state=state
    )
    assert model.bias.detach().tolist() == pytest.approx([0.5, -0.5])  # a fresh buffer
    assert state[OPTIMIZER_STATE].to_torch_state_dict()["bias|momentum_buffer"].tolist() == pytest.approx([-0.5, 0.5])
