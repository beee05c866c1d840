"""BHerd / GraB / FedNova on the client: selection kernels by hand, the rules, and
alpha = 1 reproducing the base method end to end through the real ClientApp.

Tolerance of the end-to-end equalities: both runs compute the same float32 SGD
trajectory; FedAvg averages the local models, BHerd subtracts eta times the float32 sum
of the same gradients. The two differ only by float32 rounding of the sums
(|w| ~ 0.3, ulp ~ 3e-8; measured differences <= 1e-7 after 3 rounds), so
``atol = 1e-6`` (some 30 ulps) -- while alpha = 0.5 moves the model by ~0.1.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Context, Message, MessageType, RecordDict
from torch import nn

import fedflex.clients.runtime as runtime
from fedflex import keys
from fedflex.clients.bherd import (
    GradientStore,
    bherd_rule,
    block_sizes,
    centered_gram,
    grab_balance,
    herd_k,
    herd_select,
    herd_select_naive,
)
from fedflex.clients.client_app import app as client_app
from fedflex.clients.fednova import fednova_a_norm, fednova_rule
from fedflex.clients.rule_io import RuleInput
from fedflex.clients.train import TrainSettings
from fedflex.config import LocalRuleConfig
from fedflex.data import ArrayDataset
from fedflex.launch.local_grid import LocalGrid
from fedflex.launch.server import run_server, train_config
from fedflex.loader import load_scenario
from fedflex.options import BHerdOptions
from fedflex.strategies.parts import ServerRule

# the greedy example worked out on paper: mean (2, 1), centred c1 = (2, 0), c2 = (-1, 2),
# c3 = (-2, -1), c4 = (1, -1); ||c||^2 = 4, 5, 5, 2 -> pick c4, s = (1, -1);
# ||s + c1||^2 = 10, ||s + c2||^2 = 1, ||s + c3||^2 = 5 -> pick c2, s = (0, 1);
# ||s + c1||^2 = 5, ||s + c3||^2 = 4 -> pick c3.
HAND_Z = np.array([[4.0, 1.0], [1.0, 3.0], [0.0, 0.0], [3.0, 0.0]])
HAND_ORDER = [3, 1, 2]


# ------------------------------------------------------------------ kernels
@pytest.mark.parametrize(
    "alpha, tau, k",
    [
        (0.5, 120, 60),
        (0.3, 120, 36),
        (0.1, 120, 12),
        (0.7, 120, 84),
        (0.5, 5, 3),
        (0.1, 5, 1),
        (0.1, 4, 1),
        (1.0, 7, 7),
        (0.5, 0, 0),
    ],
)
def test_herd_k_rounds_half_up_and_keeps_at_least_one(alpha, tau, k):
    assert herd_k(alpha, tau) == k


def test_greedy_order_of_the_hand_example():
    gram = centered_gram(torch.tensor(HAND_Z))
    assert herd_select(gram, 3) == HAND_ORDER
    assert herd_select_naive(HAND_Z, 3) == HAND_ORDER


def test_hand_example_gram_matrix():
    c = HAND_Z - HAND_Z.mean(axis=0)
    np.testing.assert_allclose(centered_gram(torch.tensor(HAND_Z)).numpy(), c @ c.T)
    np.testing.assert_allclose(np.diag(c @ c.T), [4, 5, 5, 2])


def test_prefix_balancing_is_not_nearest_to_the_mean():
    # the two centred vectors nearest the mean are c4 and c1 (||c||^2 = 2, 4);
    # balancing the running sum picks c4 then c2
    assert herd_select(centered_gram(torch.tensor(HAND_Z)), 2) == [3, 1]


@pytest.mark.parametrize("seed", range(5))
def test_gram_selection_equals_naive_selection_on_random_data(seed):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(30, 50)) + rng.normal(size=50)  # a common mean, as gradients have
    for k in (1, 7, 15, 30):
        assert herd_select(centered_gram(torch.tensor(z)), k) == herd_select_naive(z, k)


def test_float32_gram_selection_equals_naive_on_random_data():
    z = np.random.default_rng(7).normal(size=(40, 300)).astype(np.float32)
    assert herd_select(centered_gram(torch.tensor(z)), 20) == herd_select_naive(z, 20)


def test_block_gram_centres_block_means_on_the_mean_of_all_gradients():
    # rows are sums of 2 and 1 gradients: means (1, 2) and (4, 4); overall mean (6, 8) / 3
    rows = torch.tensor([[2.0, 4.0], [4.0, 4.0]])
    mean = np.array([6.0, 8.0]) / 3
    c = np.array([[1.0, 2.0], [4.0, 4.0]]) - mean
    np.testing.assert_allclose(centered_gram(rows, [2, 1]).numpy(), c @ c.T, rtol=1e-6)


def test_store_with_a_row_bound_keeps_block_sums():
    store = GradientStore(7, 2, torch.float32, torch.device("cpu"), max_rows=3)
    for step in range(7):
        store.add(step, torch.tensor([float(step), 1.0]))
    assert block_sizes(7, 3) == store.counts == [3, 2, 2]
    torch.testing.assert_close(store.rows, torch.tensor([[3.0, 3.0], [7.0, 2.0], [11.0, 2.0]]))
    torch.testing.assert_close(store.total, torch.tensor([21.0, 7.0]))


def test_store_selects_and_sums_the_original_gradients():
    store = GradientStore(4, 2, torch.float32, torch.device("cpu"))
    for step, z in enumerate(HAND_Z):
        store.add(step, torch.tensor(z, dtype=torch.float32))
    order, g, k = store.select(0.5)
    assert order == [3, 1] and k == 2
    torch.testing.assert_close(g, torch.tensor([4.0, 3.0]))  # z4 + z2, uncentred


def test_half_precision_store_picks_the_same_rows():
    z = torch.tensor(np.random.default_rng(3).normal(size=(12, 64)), dtype=torch.float32)
    picks = {}
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        store = GradientStore(12, 64, dtype, torch.device("cpu"))
        for step, row in enumerate(z):
            store.add(step, row)
        picks[dtype] = store.select(0.5)[0]
    assert picks[torch.float16] == picks[torch.float32]
    assert store.nbytes == 12 * 64 * 2


def test_grab_hand_example():
    # tau = 3. step 1: mu = (1/3, 0), z = (2/3, 0), s = 0: <s, z> = 0, not selected, s = (-2/3, 0)
    # step 2: mu = (2/3, 0), z = (1/3, 0), <s, z> = -2/9 < 0: selected, s = (-1/3, 0), g = (1, 0)
    # step 3: mu = (2/3, 1/3), z = (-2/3, 2/3), <s, z> = 2/9: not selected
    mask, g = grab_balance(np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]))
    assert mask == [False, True, False]
    torch.testing.assert_close(g, torch.tensor([1.0, 0.0]))


def test_fednova_a_norm_with_momentum_sums_the_step_weights():
    # torch momentum 0.9, 3 steps: weights (1 + .9 + .81), (1 + .9), 1
    assert fednova_a_norm(3, 0.9) == pytest.approx(2.71 + 1.9 + 1.0)
    assert fednova_a_norm(5) == 5.0


# ------------------------------------------------------------------ rules on a tiny model
def _tiny(n=6):
    torch.manual_seed(0)
    x = torch.randn(n, 3)
    y = torch.tensor([0, 1] * (n // 2))
    model = nn.Linear(3, 2)
    return model, ArrayDataset(x=x, y=y, num_classes=2)


def _input(model, data, options=None, rule="sgd", **settings):
    return RuleInput(
        model=model,
        data=data,
        indices=torch.arange(len(data)),
        settings=TrainSettings(**settings),
        generator=torch.Generator().manual_seed(0),
        device=torch.device("cpu"),
        options=LocalRuleConfig(
            name=rule, bherd=BHerdOptions(**{k.removeprefix("bherd_"): v for k, v in (options or {}).items()})
        ),
    )


def test_bherd_rule_alpha_one_uploads_the_whole_sgd_displacement():
    model, data = _tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out = bherd_rule(_input(model, data, {"bherd_alpha": 1.0}, batch_size=2, lr=0.1, rule="bherd"))
    g = out.extras[keys.HERD_G]
    for k, p in model.state_dict().items():
        torch.testing.assert_close(before[k] - 0.1 * g[k], p, atol=1e-7, rtol=0)
    assert (out.metrics[keys.HERD_TAU], out.metrics[keys.HERD_K]) == (3, 3)


def test_bherd_rule_reports_the_mean_gradient_norm_from_the_sgd_displacement():
    # With plain SGD the tau steps move the model by lr * sum(z), so the mean gradient
    # is (before - after) / (lr * tau): its norm, worked out from the weights alone, is
    # what the client reports; at alpha = 1 the herded mean is that mean (distance 0).
    model, data = _tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out = bherd_rule(_input(model, data, {"bherd_alpha": 1.0}, batch_size=2, lr=0.1, rule="bherd"))
    moved = torch.cat([(before[k] - p).flatten() for k, p in model.state_dict().items()])
    expected = float(torch.linalg.vector_norm(moved)) / (0.1 * 3)
    assert out.metrics[keys.HERD_MEAN_NORM] == pytest.approx(expected, rel=1e-5)
    assert out.metrics[keys.HERD_DISTANCE] == pytest.approx(0.0, abs=1e-6)


def test_bherd_rule_half_selects_round_half_of_the_steps():
    model, data = _tiny(10)
    out = bherd_rule(_input(model, data, {"bherd_alpha": 0.5}, batch_size=2, lr=0.1, rule="bherd"))
    assert (out.metrics[keys.HERD_TAU], out.metrics[keys.HERD_K]) == (5, 3)  # 2.5 rounds up
    assert out.metrics[keys.HERD_ALPHA_I] == pytest.approx(0.6)


def test_bherd_rule_refuses_adam():
    model, data = _tiny()
    with pytest.raises(ValueError, match="optimizer=sgd"):
        bherd_rule(_input(model, data, optimizer="adam"))


def test_fednova_rule_sends_the_displacement_over_tau():
    model, data = _tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out = fednova_rule(_input(model, data, batch_size=2, lr=0.1, rule="fednova"))
    assert out.metrics[keys.FEDNOVA_A_NORM] == 3.0
    for k, p in model.state_dict().items():
        torch.testing.assert_close(out.extras[keys.FEDNOVA_D][k], (before[k] - p) / 3.0)


# ------------------------------------------------------------------ through the ClientApp
@pytest.fixture(autouse=True)
def _isolated(isolated_cache):  # tests/conftest.py
    yield


BASE = [
    "num_clients=4",
    "rounds=3",
    "dataset.samples_per_client=40",
    "churn.kind=none",
    "strategy.sampler.clients_per_round=4",
    "output.progress=off",
    "output.plots=false",
    "client.lr=0.1",
    "client.batch_size=8",
    "client.momentum=0.0",
]
BHERD = ["strategy.local_rule.name=bherd", "strategy.aggregator.name=bherd"]


def _final(overrides, tmp_path=None):
    runtime.get_task.cache_clear()
    cfg = load_scenario(None, BASE + overrides)
    result = run_server(LocalGrid(client_app, cfg.num_clients), cfg, tmp_path)
    return {k: v.numpy() for k, v in result.arrays.items()}


def _max_diff(a, b):
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


@pytest.mark.parametrize("model", ["logreg", "mlp"])
def test_bherd_alpha_one_is_fedavg_end_to_end(model):
    fedavg = _final([f"model.name={model}"])
    bherd = _final([f"model.name={model}", *BHERD, "strategy.local_rule.bherd.alpha=1.0"])
    half = _final([f"model.name={model}", *BHERD, "strategy.local_rule.bherd.alpha=0.5"])
    assert _max_diff(fedavg, bherd) < 1e-6
    assert _max_diff(fedavg, half) > 1e-2  # alpha < 1 is not model averaging


def test_bherd_on_fednova_alpha_one_is_fednova():
    fednova = _final(["strategy.local_rule.name=fednova"])
    bherd = _final([*BHERD, "strategy.local_rule.bherd.alpha=1.0", "strategy.local_rule.bherd.base=fednova"])
    assert _max_diff(fednova, bherd) < 1e-6


def test_bherd_on_scaffold_alpha_one_is_scaffold():
    scaffold = _final(["strategy.local_rule.name=scaffold"])
    bherd = _final([*BHERD, "strategy.local_rule.bherd.alpha=1.0", "strategy.local_rule.bherd.base=scaffold"])
    assert _max_diff(scaffold, bherd) < 1e-6


def test_bherd_with_a_row_bound_at_alpha_one_is_still_fedavg():
    fedavg = _final([])
    bounded = _final([*BHERD, "strategy.local_rule.bherd.alpha=1.0", "strategy.local_rule.bherd.max_stored=2"])
    assert _max_diff(fedavg, bounded) < 1e-6


def test_herding_figures_reach_metrics_jsonl(tmp_path):
    from fedflex.results import read_metrics

    _final([*BHERD, "strategy.local_rule.bherd.alpha=0.5"], tmp_path / "out")
    rows = read_metrics(tmp_path / "out")
    assert all(r["herd_alpha_t"] == 0.5 and len(r["herd_distance"]) == 4 for r in rows)
    assert all(len(r["herd_mean_norm"]) == 4 and min(r["herd_mean_norm"]) > 0 for r in rows)


def test_grab_reports_the_weighted_share_it_divides_by(tmp_path):
    from fedflex.results import read_metrics

    # batch 4: ~9 steps; with 5 steps the first, much larger, logistic-regression gradient
    # makes every later <s, z> positive and GraB keeps nothing (GraB's running mean is
    # a partial sum / tau)
    _final(["strategy.local_rule.name=grab", "strategy.aggregator.name=bherd", "client.batch_size=4"], tmp_path / "out")
    rows = read_metrics(tmp_path / "out")
    assert all(0.0 < r["herd_alpha_t"] < 1.0 for r in rows)


def _train_message(cfg, model, server_round):
    config = train_config(cfg)
    config[keys.SERVER_ROUND] = server_round
    config.update(ServerRule(cfg.strategy.local_rule).train_config(server_round))
    content = RecordDict({keys.ARRAYS: ArrayRecord(model), keys.CONFIG: config})
    return Message(content=content, dst_node_id=1, message_type=MessageType.TRAIN)


@pytest.mark.parametrize("fixed", [True, False])
def test_fixed_order_gives_the_same_batches_every_round(fixed):
    cfg = load_scenario(None, BASE + [f"strategy.local_rule.fixed_order={fixed}"])
    context = Context(run_id=1, node_id=1, node_config={"partition-id": 0}, state=RecordDict(), run_config={})
    task = runtime.get_task(train_config(cfg)[keys.TASK])
    start = OrderedDict((k, v.clone()) for k, v in task.model.state_dict().items())
    models = []
    for server_round in (1, 5):
        reply = client_app(_train_message(cfg, start, server_round), context)
        models.append(reply.content[keys.ARRAYS].to_torch_state_dict())
    same = all(torch.equal(models[0][k], models[1][k]) for k in models[0])
    assert same == fixed


def test_svm_with_squared_hinge_trains_through_the_client_app(tmp_path):
    from fedflex.results import read_metrics

    _final([*BHERD, "dataset.num_classes=2", "model.name=svm", "model.loss=squared-hinge", "rounds=2"], tmp_path / "o")
    rows = read_metrics(tmp_path / "o")
    assert rows[-1]["test_accuracy"] > 0.5 and np.isfinite(rows[-1]["test_loss"])


def test_local_train_uses_the_loss_the_settings_name():
    # f = w x + b = 0 at x = 1, label 1 -> y = +1: loss (1 - 0)^2 = 1, dL/df = -2, so
    # w and b move by lr * 2 = 0.2
    from fedflex.clients.train import local_train

    model = nn.Linear(1, 1)
    nn.init.zeros_(model.weight)
    nn.init.zeros_(model.bias)
    data = ArrayDataset(x=torch.tensor([[1.0]]), y=torch.tensor([1]), num_classes=2)
    res = local_train(
        model,
        data,
        torch.tensor([0]),
        TrainSettings(steps=1, batch_size=1, lr=0.1, loss="squared-hinge"),
        torch.Generator().manual_seed(0),
        torch.device("cpu"),
    )
    assert float(model.weight) == pytest.approx(0.2) and float(model.bias) == pytest.approx(0.2)
    assert res.train_loss == pytest.approx(1.0)
