"""Cohort training (clients.cohort, clients.cohort_app) against the sequential loop.

The reference is the one-client-at-a-time path (clients.train.local_train and the
ClientApp's train handler), whose steps are checked by hand in test_train.py and
test_scaffold.py. A cohort must give the same parameters, step counts, losses and reply
records up to float rounding: batched kernels sum in another order, so parameters
agree to TOL_PARAM (absolute) after a few dozen steps, not bit for bit.
"""

import copy
import json
import math

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict

import fedflex.clients.runtime as runtime
from fedflex import keys
from fedflex.clients.client_app import app as client_app
from fedflex.clients.cohort import CohortClient, batch_buckets, train_cohort, unsupported_reason
from fedflex.clients.cohort_app import CohortTrainer
from fedflex.clients.train import StepTerms, TrainSettings, batch_order, local_train
from fedflex.config import ConfigError, ModelConfig
from fedflex.data import ArrayDataset
from fedflex.launch.local_grid import LocalGrid
from fedflex.launch.server import run_server, train_config
from fedflex.loader import load_scenario
from fedflex.models import build_model
from fedflex.results import read_metrics
from fedflex.strategies.parts import ServerRule

TOL_PARAM = 2e-5
TOL_LOSS = 1e-5
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _isolated(isolated_cache):  # tests/conftest.py
    yield


def _images(n, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, *shape), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return ArrayDataset(x, y, 10, mean=(0.5,) * shape[0], std=(0.25,) * shape[0])


# Unequal clients: 23 rows (short last batch of 8 with batch 5... see below), 5 rows, 0 rows, 12 rows
SIZES = [23, 5, 0, 12]


def _clients(terms=None):
    starts = [0, 30, 40, 50]
    terms = terms or [StepTerms()] * len(SIZES)
    return [
        CohortClient(torch.arange(a, a + n), torch.Generator().manual_seed(100 + k), terms[k])
        for k, (a, n) in enumerate(zip(starts, SIZES))
    ]


def _sequential(model, data, clients, settings):
    out = []
    for c in clients:
        m = copy.deepcopy(model)
        gen = torch.Generator().manual_seed(c.generator.initial_seed())
        res = local_train(m, data, c.indices, settings, gen, CPU, c.terms)
        out.append((dict(m.named_parameters()), res))
    return out


def _assert_same(model, data, clients, settings):
    seq = _sequential(model, data, clients, settings)
    fresh = [
        CohortClient(c.indices, torch.Generator().manual_seed(c.generator.initial_seed()), c.terms) for c in clients
    ]
    trained, results = train_cohort(model, data, fresh, settings, CPU)
    for (params, ref), got, res in zip(seq, trained, results):
        assert res.num_examples == ref.num_examples
        assert res.num_steps == ref.num_steps
        if ref.num_steps:
            assert res.train_loss == pytest.approx(ref.train_loss, rel=TOL_LOSS, abs=TOL_LOSS)
        else:
            assert math.isnan(res.train_loss)
        for name, p in params.items():
            assert torch.allclose(got[name], p.detach(), atol=TOL_PARAM, rtol=0), name


MODELS = [
    ("logreg", (1, 28, 28), {}),
    ("mlp", (1, 28, 28), {"hidden": 32}),
    ("cnn-fmnist", (1, 28, 28), {}),
    # the slowest test of the default run (~15 s): the other models cover the cohort path there
    pytest.param("resnet18", (3, 8, 8), {"norm": "group"}, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name,shape,extra", MODELS, ids=["logreg", "mlp", "cnn-fmnist", "resnet18"])
def test_cohort_equals_sequential_for_each_model(name, shape, extra):
    # Prepare: unequal clients (one empty, short last batches: 23 = 4x5 + 3), momentum + wd
    torch.manual_seed(0)
    model = build_model(ModelConfig(name=name, **extra), shape, 10)
    data = _images(64, shape)
    epochs = 1 if name == "resnet18" else 2
    settings = TrainSettings(epochs=epochs, batch_size=5, lr=0.02, momentum=0.9, weight_decay=1e-3)
    # Execute / Assert
    _assert_same(model, data, _clients(), settings)


@pytest.mark.parametrize(
    "settings",
    [
        TrainSettings(steps=7, batch_size=4, lr=0.05),
        TrainSettings(epochs=1, batch_size=4, optimizer="adam", lr=1e-3, weight_decay=1e-4),
    ],
    ids=["steps-plain-sgd", "adam"],
)
def test_cohort_equals_sequential_for_each_optimiser_setting(settings):
    torch.manual_seed(1)
    model = build_model(ModelConfig(name="mlp", hidden=16), (1, 28, 28), 10)
    _assert_same(model, _images(64, (1, 28, 28)), _clients(), settings)


def test_cohort_applies_each_clients_own_rule_terms():
    # FedProx's mu for some clients, a SCAFFOLD correction for another: per client
    torch.manual_seed(2)
    model = build_model(ModelConfig(name="logreg"), (1, 28, 28), 10)
    correction = {k: torch.full_like(p, 0.01) for k, p in model.named_parameters()}
    terms = [StepTerms(prox_mu=0.5), StepTerms(correction=correction), StepTerms(), StepTerms(prox_mu=0.1)]
    settings = TrainSettings(epochs=2, batch_size=5, lr=0.05, momentum=0.5)
    _assert_same(model, _images(64, (1, 28, 28)), _clients(terms), settings)


def test_client_out_of_batches_stands_still():
    # A one-step client beside a three-step one: by hand, its single plain SGD step
    # from w = 0 on a linear model; the cohort must not move it afterwards.
    model = torch.nn.Linear(1, 2)
    torch.nn.init.zeros_(model.weight)
    torch.nn.init.zeros_(model.bias)
    data = ArrayDataset(torch.tensor([[1.0], [2.0], [3.0], [4.0]]), torch.tensor([0, 1, 0, 1]), 2)
    short = CohortClient(torch.tensor([0]), torch.Generator().manual_seed(0))
    long = CohortClient(torch.tensor([1, 2, 3]), torch.Generator().manual_seed(0))
    trained, results = train_cohort(model, data, [short, long], TrainSettings(epochs=1, batch_size=1, lr=1.0), CPU)
    # cross-entropy at equal scores: dL/dz = (1/2 - 1, 1/2) for label 0, x = 1
    assert [r.num_steps for r in results] == [1, 3]
    assert trained[0]["weight"].flatten().tolist() == pytest.approx([0.5, -0.5])
    assert trained[0]["bias"].tolist() == pytest.approx([0.5, -0.5])
    assert results[0].train_loss == pytest.approx(math.log(2))


def test_cohort_is_deterministic_and_leaves_the_model_alone():
    torch.manual_seed(3)
    model = build_model(ModelConfig(name="cnn-fmnist"), (1, 28, 28), 10)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    data = _images(64, (1, 28, 28))
    settings = TrainSettings(epochs=1, batch_size=5, lr=0.05, momentum=0.9)
    a, _ = train_cohort(model, data, _clients(), settings, CPU)
    b, _ = train_cohort(model, data, _clients(), settings, CPU)
    for x, y in zip(a, b):
        for k in x:
            assert torch.equal(x[k], y[k])
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])


def test_batchnorm_is_refused_by_name():
    model = build_model(ModelConfig(name="resnet18", norm="batch"), (3, 8, 8), 10)
    assert "BatchNorm2d" in unsupported_reason(model)
    with pytest.raises(ValueError, match="BatchNorm2d"):
        train_cohort(model, _images(8, (3, 8, 8)), _clients()[:1], TrainSettings(), CPU)
    with pytest.raises(ConfigError, match="simulation.vectorize"):
        load_scenario(None, ["model.name=resnet18", "model.norm=batch", "simulation.vectorize=on"])


def test_vectorize_accepts_yaml_booleans_and_refuses_other_values():
    assert load_scenario(None, ["simulation.vectorize=on"]).simulation.vectorize == "on"
    assert load_scenario(None, ["simulation.vectorize=off"]).simulation.vectorize == "off"
    with pytest.raises(ConfigError, match="simulation.vectorize"):
        load_scenario(None, ["simulation.vectorize=fast"])
    with pytest.raises(ConfigError, match="simulation.cohort_size"):
        load_scenario(None, ["simulation.cohort_size=-1"])


# ---------------------------------------------------------------------------- message level
BASE = [
    "num_clients=6",
    "dataset.samples_per_client=40",
    "churn.kind=none",
    "client.batch_size=8",
    "client.momentum=0.5",
    "output.progress=off",
    "output.plots=false",
]


def _train_messages(cfg, grid, rule_payload=None):
    """One round's train messages as the strategy builds them: one shared content."""
    from fedflex.launch.server import initial_model

    task = runtime.get_task(str(train_config(cfg)[keys.TASK]))
    model = initial_model(cfg, task.train.input_shape, task.train.num_classes)
    content = RecordDict({keys.ARRAYS: ArrayRecord({k: v.detach() for k, v in model.state_dict().items()})})
    for name, tensors in (rule_payload or {}).items():
        content[name] = ArrayRecord(tensors)
    config = ConfigRecord({**train_config(cfg), **ServerRule(cfg.strategy.local_rule).train_config(1)})
    config[keys.SERVER_ROUND] = 1
    content[keys.CONFIG] = config
    return model, [
        Message(content=content, dst_node_id=node, message_type=MessageType.TRAIN) for node in grid.get_node_ids()
    ]


@pytest.mark.parametrize("rule", ["sgd", "fedprox", "scaffold", "fednova", "feddyn", "fedcm"])
def test_cohort_replies_carry_the_sequential_replies_records(rule):
    # Prepare: the same messages through a plain grid and a cohort grid
    cfg = load_scenario(None, BASE + [f"strategy.local_rule.name={rule}", "strategy.local_rule.fedprox.mu=0.1"])
    plain = LocalGrid(client_app, cfg.num_clients, seed=1)
    cohort = LocalGrid(client_app, cfg.num_clients, seed=1, train_batch=CohortTrainer("on", cohort_size=4))
    payload = None
    if rule == "scaffold":
        model = runtime.get_task(str(train_config(cfg)[keys.TASK])).model
        payload = {keys.SCAFFOLD_C: {k: torch.full_like(p, 0.01) for k, p in model.named_parameters()}}
    if rule == "fedcm":
        model = runtime.get_task(str(train_config(cfg)[keys.TASK])).model
        payload = {keys.FEDCM_DELTA: {k: torch.full_like(p, 0.01) for k, p in model.named_parameters()}}
    replies = []
    for grid in (plain, cohort):
        _, messages = _train_messages(cfg, grid, payload)
        replies.append(
            sorted(grid.send_and_receive(messages), key=lambda r: r.content[keys.METRICS][keys.PARTITION_ID])
        )
    # Assert: one reply per client, same records, same metric keys, values within tolerance
    assert cohort.train_batch.last_mode == "cohort"
    assert len(replies[0]) == len(replies[1]) == cfg.num_clients
    for a, b in zip(*replies):
        assert not a.has_error() and not b.has_error()
        assert set(a.content.array_records) == set(b.content.array_records)
        ma, mb = dict(a.content[keys.METRICS]), dict(b.content[keys.METRICS])
        assert set(ma) == set(mb)
        for key, value in ma.items():
            assert mb[key] == pytest.approx(value, rel=TOL_LOSS, abs=TOL_LOSS), key
        for name in a.content.array_records:
            ra, rb = a.content[name].to_torch_state_dict(), b.content[name].to_torch_state_dict()
            assert list(ra) == list(rb)
            for k in ra:
                assert torch.allclose(ra[k], rb[k], atol=1e-4, rtol=0), (name, k)
    state = {"scaffold": keys.SCAFFOLD_CI, "feddyn": keys.FEDDYN_GRAD}.get(rule)
    if state is not None:  # the node state holds c_i / g_k on both paths
        for ctx_a, ctx_b in zip(plain.contexts.values(), cohort.contexts.values()):
            ca = ctx_a.state[state].to_torch_state_dict()
            cb = ctx_b.state[state].to_torch_state_dict()
            assert all(torch.allclose(ca[k], cb[k], atol=1e-4) for k in ca)


def test_chunked_cohorts_equal_one_cohort():
    cfg = load_scenario(None, BASE)
    replies = []
    for size in (0, 2):
        grid = LocalGrid(client_app, cfg.num_clients, seed=1, train_batch=CohortTrainer("on", cohort_size=size))
        _, messages = _train_messages(cfg, grid)
        replies.append(
            sorted(grid.send_and_receive(messages), key=lambda r: r.content[keys.METRICS][keys.PARTITION_ID])
        )
    for a, b in zip(*replies):
        ra, rb = a.content[keys.ARRAYS].to_torch_state_dict(), b.content[keys.ARRAYS].to_torch_state_dict()
        assert all(torch.allclose(ra[k], rb[k], atol=TOL_PARAM, rtol=0) for k in ra)


def test_herding_rules_train_one_client_at_a_time(caplog):
    cfg = load_scenario(None, BASE + ["strategy.local_rule.name=grab", "strategy.aggregator.name=fedavg"])
    grid = LocalGrid(client_app, cfg.num_clients, seed=1, train_batch=CohortTrainer("on"))
    _, messages = _train_messages(cfg, grid)
    with caplog.at_level("INFO", logger="fedflex.clients.cohort_app"):
        replies = grid.send_and_receive(messages)
    assert grid.train_batch.last_mode == "sequential"
    assert len(replies) == cfg.num_clients and not any(r.has_error() for r in replies)
    assert "'grab'" in caplog.text and "one client at a time" in caplog.text


def test_a_run_with_cohorts_matches_the_sequential_run(tmp_path):
    # Whole runs (FedAvg, 4 rounds, logreg): same samples, accuracies within rounding
    overrides = BASE + ["rounds=4", "strategy.sampler.clients_per_round=4", "simulation.backend=local"]
    cfg = load_scenario(None, overrides)
    rows = []
    for name, batch in (("seq", None), ("cohort", CohortTrainer("on"))):
        runtime.get_task.cache_clear()
        run_server(LocalGrid(client_app, cfg.num_clients, seed=cfg.seed, train_batch=batch), cfg, tmp_path / name)
        rows.append(read_metrics(tmp_path / name))
    for a, b in zip(*rows):
        assert a["sampled"] == b["sampled"]
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-5)
        assert b["test_accuracy"] == pytest.approx(a["test_accuracy"], abs=0.02)


def test_auto_picks_one_way_says_which_and_keeps_it(caplog):
    cfg = load_scenario(None, BASE)
    trainer = CohortTrainer("auto")
    grid = LocalGrid(client_app, cfg.num_clients, seed=1, train_batch=trainer)
    _, messages = _train_messages(cfg, grid)
    with caplog.at_level("INFO", logger="fedflex.clients.cohort_app"):
        grid.send_and_receive(messages)
        first = trainer.last_mode
        _, messages = _train_messages(cfg, grid)
        grid.send_and_receive(messages)
    assert first in ("cohort", "sequential") and trainer.last_mode == first
    assert caplog.text.count("one step on cpu took") == 1  # timed once
    assert caplog.text.count(": training ") == 1  # the choice, said when it is made
    assert json.dumps(first)  # a plain string


# ---------------------------------------------------------------------------- Ray: packed messages
def test_cohort_grid_packs_a_round_into_one_message_per_worker_and_unpacks_the_replies():
    # Prepare: the packing grid over an in-process grid (stands in for Flower's simulation
    # grid: each packed message reaches the first client's node through the ClientApp)
    from fedflex.launch.cohort_grid import CohortGrid

    cfg = load_scenario(None, BASE + ["strategy.local_rule.name=scaffold"])
    inner = LocalGrid(client_app, cfg.num_clients, seed=1)
    client_of = {n: int(c.node_config["partition-id"]) for n, c in inner.contexts.items()}
    packed = CohortGrid(inner, client_of.get, workers=2, vectorize="on")
    plain = LocalGrid(client_app, cfg.num_clients, seed=1)
    model = runtime.get_task(str(train_config(cfg)[keys.TASK])).model
    payload = {keys.SCAFFOLD_C: {k: torch.full_like(p, 0.01) for k, p in model.named_parameters()}}
    for _ in range(2):  # round 2 uses the c_i that round 1 left in the (grid-held) state
        _, messages = _train_messages(cfg, packed, payload)
        got = list(packed.send_and_receive(messages))
        sent_now = inner.sent[-2:]
        _, messages = _train_messages(cfg, plain, payload)
        ref = list(plain.send_and_receive(messages))
    # Assert: two messages went out per round, each reply comes from its client's node
    assert [len(json.loads(m.content[keys.CONFIG][keys.COHORT_CLIENTS])) for m in sent_now] == [3, 3]
    node_of = {c: n for n, c in client_of.items()}
    assert sorted(r.metadata.src_node_id for r in got) == sorted(node_of.values())
    by_pid = {int(r.content[keys.METRICS][keys.PARTITION_ID]): r for r in ref}
    for r in got:
        pid = int(r.content[keys.METRICS][keys.PARTITION_ID])
        assert r.metadata.src_node_id == node_of[pid]
        a, b = (
            r.content[keys.SCAFFOLD_DC].to_torch_state_dict(),
            by_pid[pid].content[keys.SCAFFOLD_DC].to_torch_state_dict(),
        )
        assert all(torch.allclose(a[k], b[k], atol=1e-4) for k in a)
    assert set(packed.states) == set(range(cfg.num_clients))
    assert all(keys.SCAFFOLD_CI in s for s in packed.states.values())


def test_cohort_grid_turns_a_clients_failure_into_that_clients_error_reply():
    from fedflex.launch.cohort_grid import CohortGrid

    cfg = load_scenario(None, BASE + ["strategy.local_rule.name=scaffold"])
    inner = LocalGrid(client_app, cfg.num_clients, seed=1)
    client_of = {n: int(c.node_config["partition-id"]) for n, c in inner.contexts.items()}
    packed = CohortGrid(inner, client_of.get, workers=2, vectorize="on")
    _, messages = _train_messages(cfg, packed)  # no scaffold-c record: every client fails
    replies = list(packed.send_and_receive(messages))
    assert len(replies) == cfg.num_clients
    assert all(r.has_error() and "control variate" in r.error.reason for r in replies)


SETTINGS_16 = TrainSettings(epochs=2, batch_size=16, lr=0.05, momentum=0.9)


def test_cohort_equals_sequential_across_batch_length_passes():
    """Clients whose longest mini-batches differ (16, 8, 4 and 2 rows with batch 16) train
    in separate padded passes on the CPU; each still gets exactly its sequential result."""
    torch.manual_seed(2)
    model = build_model(ModelConfig(name="cnn-fmnist"), (1, 28, 28), 10)
    sizes, starts = [23, 5, 0, 12, 2, 3], [0, 30, 40, 41, 55, 60]
    clients = [
        CohortClient(torch.arange(a, a + n), torch.Generator().manual_seed(200 + k), StepTerms())
        for k, (a, n) in enumerate(zip(starts, sizes))
    ]
    orders = [batch_order(n, SETTINGS_16, torch.Generator().manual_seed(0)) for n in sizes]
    assert batch_buckets(orders, CPU) == [[0, 3], [1], [5], [4], [2]]
    _assert_same(model, _images(64, (1, 28, 28)), clients, SETTINGS_16)
