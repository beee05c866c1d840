"""Client halves for a user's own loop (clients.helpers) against fedflex's own rules.

Each test trains one copy of a tiny model with fedflex's rule (clients.rules / clients.bherd)
and another with a user-style loop (the same mini-batches, torch.optim.SGD, F.cross_entropy)
wrapped in the helper, then compares what the two send. Where the helper applies the rule's
terms exactly as fedflex's loop does (SCAFFOLD's correction added to the gradient, BHerd's
recorded gradients, FedNova's arithmetic after plain steps) the results are bitwise equal;
where fedflex puts the term in the loss and the helper adds its gradient (FedProx's and
FedDyn's proximal term, FedCM's scaled loss) they differ by float32 rounding only
(atol 1e-6 on weights of order 0.1-1).
"""

from __future__ import annotations

import copy
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from torch import nn

from fedflex import keys
from fedflex.clients import helpers
from fedflex.clients.bherd import bherd_rule
from fedflex.clients.fedcm import FEDCM
from fedflex.clients.feddyn import FEDDYN
from fedflex.clients.fednova import FEDNOVA
from fedflex.clients.rule_io import RuleInput
from fedflex.clients.rules import SGD
from fedflex.clients.scaffold import SCAFFOLD
from fedflex.clients.train import TrainSettings, batch_order
from fedflex.config import LocalRuleConfig
from fedflex.data import ArrayDataset
from fedflex.options import BHerdOptions, FedCMOptions, FedDynOptions, FedProxOptions
from fedflex.records import to_record


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch):
    """Messages take their run and sender ids from Flower's task identity (as a run sets it)."""
    for name, value in (("_task_id", 1), ("_run_id", 1), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, name, value)


SETTINGS = TrainSettings(epochs=2, batch_size=4, lr=0.1, momentum=0.9, weight_decay=0.01)
SEED = 7


def _data() -> ArrayDataset:
    g = torch.Generator().manual_seed(0)
    return ArrayDataset(x=torch.randn(14, 3, generator=g), y=torch.randint(0, 3, (14,), generator=g), num_classes=3)


def _model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 3))


def _message(model: nn.Module, options: LocalRuleConfig, payload=None, extra_config=None) -> Message:
    content = RecordDict({keys.ARRAYS: ArrayRecord(model.state_dict())})
    for name, tensors in (payload or {}).items():
        content[name] = ArrayRecord(tensors)
    config = {**to_record(options, keys.LOCAL_RULE, only=options.sent()), keys.SERVER_ROUND: 1, **(extra_config or {})}
    content[keys.CONFIG] = ConfigRecord(config)
    return Message(content=content, dst_node_id=1, message_type=MessageType.TRAIN)


def _context(state: RecordDict | None = None) -> Context:
    state = state if state is not None else RecordDict()
    return Context(run_id=1, node_id=1, node_config={}, state=state, run_config={})


def _fedflex(rule, model, options, payload=None, state=None):
    return rule(_input(model, options, payload, state))


def _user_loop(model, step=None):
    """A Flower quickstart's train(): SGD with momentum and weight decay over the same
    mini-batches fedflex's rule draws; ``step``: call it instead of optimizer.step()."""
    data = _data()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    for pos in batch_order(14, SETTINGS, torch.Generator().manual_seed(SEED)):
        optimizer.zero_grad()
        F.cross_entropy(model(data.inputs(pos)), data.labels(pos)).backward()
        step(optimizer) if step else optimizer.step()


def _helped(cls, model, options, payload=None, state=None, extra_config=None, **kwargs) -> RecordDict:
    msg = _message(model, options, payload, extra_config)
    helper = cls.from_message(msg, model, _context(state), **kwargs)
    with helper:
        _user_loop(model)
    return helper.reply(14, {"train_loss": 0.5})


def _tensors(content: RecordDict, name: str) -> "OrderedDict[str, torch.Tensor]":
    return content[name].to_torch_state_dict()


def _variate(model, value):
    return OrderedDict((k, torch.full_like(p, value)) for k, p in model.state_dict().items())


# ------------------------------------------------------------------ equal to fedflex's rules
@pytest.mark.parametrize("alpha", [0.5, 0.25])
def test_bherd_client_sends_fedflexs_herded_gradient_sum(alpha):
    # Prepare: 2 epochs of ceil(14 / 4) = 4 batches: tau = 8, k = floor(8 alpha + 1/2)
    options = LocalRuleConfig(name="bherd", bherd=BHerdOptions(alpha=alpha))
    ours, theirs = _model(), _model()
    # Execute
    expected = _fedflex(bherd_rule, ours, options)
    content = _helped(helpers.BHerdClient, theirs, options)
    # Assert
    metrics = content[keys.METRICS]
    assert (metrics[keys.HERD_TAU], metrics[keys.HERD_K]) == (8, {0.5: 4, 0.25: 2}[alpha])
    assert metrics[keys.HERD_ALPHA_I] == expected.metrics[keys.HERD_ALPHA_I]
    for k, g in _tensors(content, keys.HERD_G).items():
        assert torch.equal(g, expected.extras[keys.HERD_G][k]), k
    for k, w in _tensors(content, keys.ARRAYS).items():
        assert torch.equal(w, ours.state_dict()[k]), k


def test_bherd_client_on_scaffold_sends_both_records_as_fedflex():
    options = LocalRuleConfig(name="bherd", bherd=BHerdOptions(base="scaffold"))
    ours, theirs = _model(), _model()
    payload = {keys.SCAFFOLD_C: _variate(ours, 0.05)}
    state_ours, state_theirs = RecordDict(), RecordDict()
    expected = _fedflex(bherd_rule, ours, options, payload, state_ours)
    content = _helped(helpers.BHerdClient, theirs, options, payload, state_theirs)
    for name in (keys.HERD_G, keys.SCAFFOLD_DC):
        for k, v in _tensors(content, name).items():
            assert torch.equal(v, expected.extras[name][k]), (name, k)
    assert list(state_theirs.array_records) == [keys.SCAFFOLD_CI]


def test_bherd_client_with_declared_steps_blocks_as_fedflex():
    # bherd_max_stored = 3 of tau = 8 steps: blocks of 3, 3, 2 steps; needs steps=8
    options = LocalRuleConfig(name="bherd", bherd=BHerdOptions(max_stored=3))
    ours, theirs = _model(), _model()
    expected = _fedflex(bherd_rule, ours, options)
    content = _helped(helpers.BHerdClient, theirs, options, steps=8)
    assert content[keys.METRICS][keys.HERD_K] == expected.metrics[keys.HERD_K]
    for k, g in _tensors(content, keys.HERD_G).items():
        assert torch.equal(g, expected.extras[keys.HERD_G][k]), k


def test_scaffold_client_corrects_and_sends_delta_c_as_fedflex():
    # Prepare: c = 0.05, c_i = -0.02 in the node state: every step's gradient gets +0.07
    options = LocalRuleConfig(name="scaffold")
    ours, theirs = _model(), _model()
    payload = {keys.SCAFFOLD_C: OrderedDict((k, v) for k, v in _variate(ours, 0.05).items())}
    states = []
    for _ in range(2):
        state = RecordDict()
        state[keys.SCAFFOLD_CI] = ArrayRecord(_variate(ours, -0.02))
        states.append(state)
    # Execute
    expected = SCAFFOLD.run(_input(ours, options, payload, states[0]))
    content = _helped(helpers.SCAFFOLDClient, theirs, options, payload, states[1])
    # Assert: the same model, delta c and new c_i
    assert all(torch.equal(theirs.state_dict()[k], v) for k, v in ours.state_dict().items())
    for k, v in _tensors(content, keys.SCAFFOLD_DC).items():
        assert torch.equal(v, expected.extras[keys.SCAFFOLD_DC][k]), k
    new_ci = [s[keys.SCAFFOLD_CI].to_torch_state_dict() for s in states]
    assert all(torch.equal(new_ci[0][k], new_ci[1][k]) for k in new_ci[0])


def _input(model, options, payload=None, state=None) -> RuleInput:
    return RuleInput(
        model=model,
        data=_data(),
        indices=torch.arange(14),
        settings=SETTINGS,
        generator=torch.Generator().manual_seed(SEED),
        device=torch.device("cpu"),
        payload=payload or {},
        state=state,
        options=options,
    )


def test_fednova_client_sends_fedflexs_normalised_update():
    # Prepare: tau = 8 steps with momentum 0.9: ||a||_1 = (8 - 0.9 (1 - 0.9^8) / 0.1) / 0.1
    options = LocalRuleConfig(name="fednova")
    ours, theirs = _model(), _model()
    # Execute
    expected = FEDNOVA.run(_input(ours, options))
    content = _helped(helpers.FedNovaClient, theirs, options)
    # Assert
    metrics = content[keys.METRICS]
    assert metrics[keys.FEDNOVA_TAU] == 8
    assert metrics[keys.FEDNOVA_A_NORM] == pytest.approx((8 - 0.9 * (1 - 0.9**8) / 0.1) / 0.1)
    for k, d in _tensors(content, keys.FEDNOVA_D).items():
        assert torch.equal(d, expected.extras[keys.FEDNOVA_D][k]), k


@pytest.mark.parametrize(
    ("cls", "steps", "options", "extra_config"),
    [
        (helpers.FedProxClient, SGD, LocalRuleConfig(name="fedprox", fedprox=FedProxOptions(mu=0.5)), None),
        (
            helpers.FedProxClient,
            SGD,
            LocalRuleConfig(name="fedprox", fedprox=FedProxOptions(mu=0.5)),
            {"proximal-mu": 0.5},
        ),
        (helpers.FedDynClient, FEDDYN, LocalRuleConfig(name="feddyn", feddyn=FedDynOptions(alpha=0.3)), None),
        (helpers.FedCMClient, FEDCM, LocalRuleConfig(name="fedcm", fedcm=FedCMOptions(alpha=0.2)), None),
    ],
    ids=["fedprox", "flower-fedprox", "feddyn", "fedcm"],
)
def test_term_clients_train_as_fedflex_up_to_rounding(cls, steps, options, extra_config):
    # Prepare: FedDyn's g_k = 0.1 in the node state; FedCM's Delta = 0.2 from the server
    ours, theirs = _model(), _model()
    payload = {keys.FEDCM_DELTA: _variate(ours, 0.2)} if options.name == "fedcm" else {}
    states = [RecordDict(), RecordDict()]
    for state in states:
        state[keys.FEDDYN_GRAD] = ArrayRecord(_variate(ours, 0.1))
    if extra_config:  # Flower's FedProx: no local-rule entries, only proximal-mu
        options = LocalRuleConfig()
    start = copy.deepcopy(ours.state_dict())
    # Execute
    fedflex_options = LocalRuleConfig(
        name=cls.rules[0],
        fedprox=FedProxOptions(mu=0.5),
        feddyn=FedDynOptions(alpha=0.3),
        fedcm=FedCMOptions(alpha=0.2),
    )
    steps.run(_input(ours, fedflex_options, payload, states[0]))
    content = _helped(cls, theirs, options, payload, states[1], extra_config)
    # Assert: the same model (moved well away from the start), the same node state
    for k, w in _tensors(content, keys.ARRAYS).items():
        torch.testing.assert_close(w, ours.state_dict()[k], atol=1e-6, rtol=0)
        assert (w - start[k]).abs().max() > 1e-2
    g = [s[keys.FEDDYN_GRAD].to_torch_state_dict() for s in states]
    for k in g[0]:
        torch.testing.assert_close(g[1][k], g[0][k], atol=1e-5, rtol=0)
    assert content[keys.METRICS][keys.NUM_STEPS] == 8


def test_step_without_with_block_does_the_same():
    options = LocalRuleConfig(name="fednova")
    a, b = _model(), _model()
    with_block = _helped(helpers.FedNovaClient, a, options)
    helper = helpers.FedNovaClient.from_message(_message(b, options), b, _context())
    _user_loop(b, step=helper.step)
    explicit = helper.reply(14)
    expected = _tensors(with_block, keys.FEDNOVA_D)
    assert all(torch.equal(v, expected[k]) for k, v in _tensors(explicit, keys.FEDNOVA_D).items())


# ------------------------------------------------------------------ errors in one line
def test_a_message_from_another_strategy_is_refused_in_one_line():
    model = _model()
    with pytest.raises(ValueError, match=r"local rule 'sgd', not bherd: run fedflex's BHerd strategy") as err:
        helpers.BHerdClient.from_message(_message(model, LocalRuleConfig()), model)
    assert "\n" not in str(err.value)


def test_scaffold_client_needs_the_server_variate_and_the_context():
    model = _model()
    with pytest.raises(ValueError, match="no scaffold-c record"):
        helpers.SCAFFOLDClient.from_message(_message(model, LocalRuleConfig(name="scaffold")), model, _context())
    msg = _message(model, LocalRuleConfig(name="scaffold"), {keys.SCAFFOLD_C: _variate(model, 0.0)})
    with pytest.raises(ValueError, match="needs the node's Context"):
        helpers.SCAFFOLDClient.from_message(msg, model)


def test_bherd_client_refuses_adam():
    model = _model()
    helper = helpers.BHerdClient.from_message(_message(model, LocalRuleConfig(name="bherd")), model)
    optimizer = torch.optim.Adam(model.parameters())
    F.cross_entropy(model(_data().inputs(None)), _data().labels(None)).backward()
    with helper, pytest.raises(ValueError, match="BHerd needs torch.optim.SGD"):
        optimizer.step()


def test_the_hook_leaves_other_models_alone():
    model, other = _model(), _model()
    helper = helpers.FedNovaClient.from_message(_message(model, LocalRuleConfig(name="fednova")), model)
    with helper:
        _user_loop(other)
    assert helper.num_steps == 0


# ------------------------------------------------------------------ the FedNova mod
def test_fednova_mod_adds_what_the_helper_sends():
    # Prepare: a plain train function (no fedflex in it) behind the mod
    options = LocalRuleConfig(name="fednova")
    reference, model = _model(), _model()
    expected = _helped(helpers.FedNovaClient, reference, options)
    msg = _message(model, options)

    def plain_train(msg: Message, context: Context) -> Message:
        _user_loop(model)
        content = RecordDict(
            {keys.ARRAYS: ArrayRecord(model.state_dict()), keys.METRICS: MetricRecord({keys.NUM_EXAMPLES: 14})}
        )
        return Message(content=content, reply_to=msg)

    # Execute
    reply = helpers.fednova_mod(msg, _context(), plain_train)
    # Assert
    assert reply.content[keys.METRICS][keys.FEDNOVA_TAU] == 8
    for k, d in _tensors(reply.content, keys.FEDNOVA_D).items():
        torch.testing.assert_close(d, _tensors(expected, keys.FEDNOVA_D)[k], atol=1e-7, rtol=0)


def test_the_global_model_is_decoded_once_per_content_and_again_when_an_array_changes(monkeypatch):
    """On the in-process grid a round's messages share one content: load_global decodes it
    once; an Array given new data (or a new record) is decoded again, so no client trains
    from a stale model."""
    from types import SimpleNamespace

    import numpy as np

    from fedflex.arrays import numpy_to_array, numpy_to_record
    from fedflex.clients import node

    decoded = []
    real = node._tensors
    monkeypatch.setattr(node, "_tensors", lambda record: decoded.append(1) or real(record))
    model = torch.nn.Linear(2, 1)
    task = SimpleNamespace(model=model)
    w = {"weight": np.ones((1, 2), np.float32), "bias": np.zeros(1, np.float32)}
    record = numpy_to_record(w)
    content = RecordDict({keys.ARRAYS: record})
    for _ in range(3):  # three clients of one round
        node.load_global(task, Message(content=content, dst_node_id=1, message_type=MessageType.TRAIN))
    assert len(decoded) == 1 and torch.equal(model.weight, torch.ones(1, 2))
    record["weight"] = numpy_to_array(np.full((1, 2), 5, np.float32))  # a new Array under the same name
    node.load_global(task, Message(content=content, dst_node_id=1, message_type=MessageType.TRAIN))
    assert len(decoded) == 2 and torch.equal(model.weight, torch.full((1, 2), 5.0))
    record["weight"].data = numpy_to_array(np.full((1, 2), 7, np.float32)).data  # new bytes in the same Array
    node.load_global(task, Message(content=content, dst_node_id=1, message_type=MessageType.TRAIN))
    assert len(decoded) == 3 and torch.equal(model.weight, torch.full((1, 2), 7.0))


# ------------------------------------------------------------------ the decorator / the mod
def _flower_train(model, loop=None, num_examples=14):
    """A train function as Flower's quickstart writes it (the Message API), training ``model``."""

    def train(msg: Message, context: Context) -> Message:
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        (loop or _user_loop)(model)
        metrics = MetricRecord({"train_loss": 0.5, "num-examples": num_examples})
        return Message(
            content=RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}), reply_to=msg
        )

    return train


def _decorated(model, options, payload=None, state=None, extra_config=None, loop=None, **kwargs) -> RecordDict:
    """``@client_half`` (``@client_half(**kwargs)`` with arguments) over a Flower-style train function."""
    decorator = helpers.client_half(**kwargs) if kwargs else helpers.client_half
    train = decorator(_flower_train(model, loop))
    return train(_message(model, options, payload, extra_config), _context(state)).content


def _assert_same_content(a: RecordDict, b: RecordDict) -> None:
    assert sorted(a.array_records) == sorted(b.array_records)
    for name in a.array_records:
        x, y = _tensors(a, name), _tensors(b, name)
        assert list(x) == list(y), name
        for k in x:
            assert torch.equal(x[k], y[k]), (name, k)
    assert dict(a[keys.METRICS]) == dict(b[keys.METRICS])


def _assert_same_state(a: RecordDict, b: RecordDict) -> None:
    assert sorted(a.array_records) == sorted(b.array_records)
    for name in a.array_records:
        x, y = _tensors(a, name), _tensors(b, name)
        assert all(torch.equal(x[k], y[k]) for k in x) and list(x) == list(y), name


HALF_CASES = {
    "bherd": (helpers.BHerdClient, LocalRuleConfig(name="bherd", bherd=BHerdOptions(alpha=0.25)), None, {}),
    "bherd-scaffold": (
        helpers.BHerdClient,
        LocalRuleConfig(name="bherd", bherd=BHerdOptions(base="scaffold")),
        None,
        {"payload": keys.SCAFFOLD_C},
    ),
    "bherd-max-stored": (
        helpers.BHerdClient,
        LocalRuleConfig(name="bherd", bherd=BHerdOptions(max_stored=3)),
        None,
        {"steps": 8},
    ),
    "scaffold": (helpers.SCAFFOLDClient, LocalRuleConfig(name="scaffold"), None, {"payload": keys.SCAFFOLD_C}),
    "fednova": (helpers.FedNovaClient, LocalRuleConfig(name="fednova"), None, {}),
    "feddyn": (helpers.FedDynClient, LocalRuleConfig(name="feddyn", feddyn=FedDynOptions(alpha=0.3)), None, {}),
    "fedcm": (
        helpers.FedCMClient,
        LocalRuleConfig(name="fedcm", fedcm=FedCMOptions(alpha=0.2)),
        None,
        {"payload": keys.FEDCM_DELTA},
    ),
    "fedprox": (helpers.FedProxClient, LocalRuleConfig(name="fedprox", fedprox=FedProxOptions(mu=0.5)), None, {}),
    "flower-fedprox": (helpers.FedProxClient, LocalRuleConfig(), {"proximal-mu": 0.5}, {}),
}


def _case(name):
    cls, options, extra_config, how = HALF_CASES[name]
    payload = {how["payload"]: _variate(_model(), 0.05)} if "payload" in how else None
    states = []
    for _ in range(2):  # a node state with the method's variables from an earlier round
        state = RecordDict()
        state[keys.SCAFFOLD_CI] = ArrayRecord(_variate(_model(), -0.02))
        state[keys.FEDDYN_GRAD] = ArrayRecord(_variate(_model(), 0.1))
        states.append(state)
    kwargs = {"steps": how["steps"]} if "steps" in how else {}
    return cls, options, payload, extra_config, states, kwargs


@pytest.mark.parametrize("name", list(HALF_CASES))
def test_client_half_replies_bitwise_as_the_helper(name):
    # Prepare: the helper around the loop, and the decorator over a Flower-style train function
    cls, options, payload, extra_config, states, kwargs = _case(name)
    # Execute
    expected = _helped(cls, _model(), options, payload, states[0], extra_config, **kwargs)
    content = _decorated(_model(), options, payload, states[1], extra_config, **kwargs)
    # Assert: the same records, metrics (num-steps and the method's) and node state
    _assert_same_content(content, expected)
    _assert_same_state(states[1], states[0])
    assert content[keys.METRICS][keys.NUM_STEPS] == 8


def test_client_half_mod_replies_as_the_decorator():
    cls, options, payload, _, states, _ = _case("scaffold")
    decorated = _decorated(_model(), options, payload, states[0])
    model = _model()
    reply = helpers.client_half_mod(_message(model, options, payload), _context(states[1]), _flower_train(model))
    _assert_same_content(reply.content, decorated)
    _assert_same_state(states[1], states[0])


def test_client_half_passes_a_plain_message_through():
    # Flower's FedAvg: no local rule, no proximal-mu: the function's reply as it is
    model, plain = _model(), _model()
    content = _decorated(model, LocalRuleConfig())
    expected = _flower_train(plain)(_message(plain, LocalRuleConfig()), _context()).content
    _assert_same_content(content, expected)
    assert keys.NUM_STEPS not in content[keys.METRICS]


def test_client_half_finds_a_wrapped_model_by_its_names():
    # the optimiser steps a wrapper whose parameter names carry a prefix ("inner.0.weight")
    class Wrapper(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x)

    def wrapped_loop(model):
        _user_loop(Wrapper(model))

    cls, options, payload, _, states, _ = _case("scaffold")
    expected = _helped(cls, _model(), options, payload, states[0])
    content = _decorated(_model(), options, payload, states[1], loop=wrapped_loop)
    _assert_same_content(content, expected)


def test_client_half_names_the_parameters_by_value_without_a_module_call(monkeypatch):
    # model.forward() directly: no module with the message's names is called (only its layers);
    # each parameter equals one received array until the first step
    by_value = []
    real = helpers._TrainCall._named_by_value
    monkeypatch.setattr(helpers._TrainCall, "_named_by_value", lambda *a: by_value.append(1) or real(*a))

    def forward_loop(model):
        data = _data()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
        for pos in batch_order(14, SETTINGS, torch.Generator().manual_seed(SEED)):
            optimizer.zero_grad()
            F.cross_entropy(model.forward(data.inputs(pos)), data.labels(pos)).backward()
            optimizer.step()

    cls, options, payload, _, states, _ = _case("fedcm")
    expected = _helped(cls, _model(), options, payload, states[0])
    content = _decorated(_model(), options, payload, states[1], loop=forward_loop)
    _assert_same_content(content, expected)
    assert by_value == [1]


def test_client_half_refuses_parameters_it_cannot_name_in_one_line():
    # two zero biases of one shape, and no module call to name them
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    with torch.no_grad():
        for layer in model:
            layer.bias.zero_()

    def forward_loop(net):
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        F.cross_entropy(net.forward(torch.ones(2, 3)), torch.tensor([0, 1])).backward()
        optimizer.step()

    train = helpers.client_half(_flower_train(model, forward_loop))
    with pytest.raises(ValueError, match=r"client_half\(FedNova\): cannot tell the names of 2 of") as err:
        train(_message(model, LocalRuleConfig(name="fednova")), _context())
    assert "\n" not in str(err.value)


def test_client_half_leaves_another_models_optimizer_alone():
    # the loop first trains a model that is not the received one, then the received one
    def two_models(model):
        _user_loop(nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 3)))
        _user_loop(model)

    cls, options, payload, _, states, _ = _case("fednova")
    expected = _helped(cls, _model(), options, payload, states[0])
    content = _decorated(_model(), options, payload, states[1], loop=two_models)
    _assert_same_content(content, expected)


def test_client_half_refuses_a_second_optimizer_on_the_model():
    def two_optimizers(model):
        _user_loop(model)
        _user_loop(model)  # a new torch.optim.SGD over the same parameters

    with pytest.raises(ValueError, match=r"client_half\(FedNova\): a second optimizer \(SGD\) stepped the model"):
        _decorated(_model(), LocalRuleConfig(name="fednova"), loop=two_optimizers)


@pytest.mark.parametrize("rule", ["bherd", "fednova", "fedcm"])
def test_client_half_refuses_adam_where_the_method_needs_sgd(rule):
    def adam_loop(model):
        optimizer = torch.optim.Adam(model.parameters())
        F.cross_entropy(model(_data().inputs(None)), _data().labels(None)).backward()
        optimizer.step()

    payload = {keys.FEDCM_DELTA: _variate(_model(), 0.0)} if rule == "fedcm" else None
    with pytest.raises(ValueError, match=r"needs torch.optim.SGD .* got Adam"):
        _decorated(_model(), LocalRuleConfig(name=rule), payload, loop=adam_loop)


def test_client_half_refuses_a_call_without_steps_and_other_methods_messages():
    with pytest.raises(ValueError, match=r"client_half\(FedNova\): the train function took no optimizer step"):
        _decorated(_model(), LocalRuleConfig(name="fednova"), loop=lambda model: None)
    with pytest.raises(ValueError, match=r"local rule 'sgd', not bherd: run fedflex's BHerd strategy"):
        helpers.client_half("BHerd")(_flower_train(_model()))(_message(_model(), LocalRuleConfig()), _context())
    with pytest.raises(ValueError, match=r"local rule 'grab', which has no client half"):
        _decorated(_model(), LocalRuleConfig(name="grab"))
    with pytest.raises(ValueError, match=r"no client half named 'Herd'"):
        helpers.client_half("Herd")
    with pytest.raises(ValueError, match=r"bherd.max_stored=3\): declare the loop's local steps"):
        _decorated(_model(), LocalRuleConfig(name="bherd", bherd=BHerdOptions(max_stored=3)))


def test_client_half_removes_its_hooks_after_the_call():
    _decorated(_model(), LocalRuleConfig(name="fednova"))
    from torch.nn.modules import module as torch_module
    from torch.optim import optimizer as torch_optimizer

    assert not torch_module._global_forward_pre_hooks
    assert not torch_optimizer._global_optimizer_pre_hooks


@pytest.mark.filterwarnings("ignore:Using `torch.compile\\(module\\)` when there are global hooks")
def test_client_half_finds_the_model_inside_torch_compile():
    def compiled_loop(model):
        _user_loop(torch.compile(model, backend="eager"))

    cls, options, payload, _, states, _ = _case("fednova")
    expected = _helped(cls, _model(), options, payload, states[0])
    content = _decorated(_model(), options, payload, states[1], loop=compiled_loop)
    _assert_same_content(content, expected)
