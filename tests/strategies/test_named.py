"""The named Flower strategies with Flower's quickstart ClientApp (examples/flower-quickstart).

The ClientApp is Flower's convention only (no QUERY handler, ``train_loss`` /
``num-examples`` metrics); LocalGrid hands it the messages in-process, Flower's own
``Strategy.start`` loop drives the rounds, so each test takes a second or two.
"""

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, MessageType
from flwr.serverapp.strategy import Strategy

from fedflex.churn import ExplicitSessions
from fedflex.config import ConfigError
from fedflex.launch.local_grid import LocalGrid
from fedflex.options import AdaptiveOptions, AwareOptions, FedCorOptions, HiCSOptions, PowDOptions
from fedflex.strategies import named
from fedflex.strategies.strategy import FedFlex, RunFailedError

pytestmark = pytest.mark.usefixtures("quickstart_example")  # tests/conftest.py


def _grid(n=4):
    from flowerquickstart.client_app import app

    grid = LocalGrid(app, n)
    for context in grid.contexts.values():
        context.run_config.update({"examples": 40})
    return grid


def _run(strategy, grid, rounds=2, evaluate_fn=None):
    from flowerquickstart.task import Net

    return strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(Net().state_dict()),
        num_rounds=rounds,
        train_config=ConfigRecord({"lr": 0.05}),
        evaluate_fn=evaluate_fn,
    )


#: strategies whose server half works with any client: 2 rounds of training each
ANY_CLIENT = ["HiCSFL", "PowerOfChoice", "ClusteredSampling", "DivFL", "FedCor", "FedAWARE", "FedAMS", "AWARE"]
ANY_CLIENT += ["FedDyn", "FedCM", "SessionAware"]


@pytest.mark.parametrize("name", ANY_CLIENT)
def test_every_named_strategy_trains_flowers_quickstart_client(name):
    # Prepare
    grid = _grid()
    strategy = named.NAMED[name](fraction_train=0.5, fraction_evaluate=0.5)
    # Execute
    result = _run(strategy, grid)
    # Assert: Flower's Result, as Flower's FedAvg fills it (2 of 4 nodes train and evaluate)
    assert sorted(result.train_metrics_clientapp) == [1, 2]
    assert set(result.train_metrics_clientapp[2]) == {"train_loss"}  # Flower drops the weight key
    assert sorted(result.evaluate_metrics_clientapp) == [1, 2]
    assert "eval_acc" in result.evaluate_metrics_clientapp[2]
    assert strategy.nodes.identify == "auto" and len(strategy.nodes.by_node_id) == 4
    from flowerquickstart.task import Net

    assert list(result.arrays) == list(Net().state_dict())


def test_evaluate_fn_gets_the_round_and_the_arrays_as_in_flower():
    # Prepare
    from flwr.app import MetricRecord

    seen = []

    def evaluate_fn(server_round, arrays):
        seen.append((server_round, type(arrays).__name__))
        return None if server_round == 1 else MetricRecord({"accuracy": 0.5})

    # Execute
    result = _run(named.FedAMS(fraction_train=0.5, fraction_evaluate=0.0), _grid(), evaluate_fn=evaluate_fn)
    # Assert: before round 1 (round 0) and after each round; None is not recorded
    assert seen == [(0, "ArrayRecord"), (1, "ArrayRecord"), (2, "ArrayRecord")]
    assert sorted(result.evaluate_metrics_serverapp) == [0, 2]
    assert result.evaluate_metrics_clientapp == {}


def test_flowers_base_class_loop_runs_a_named_strategy():
    # Prepare
    grid = _grid()
    strategy = named.HiCSFL(fraction_train=1.0, fraction_evaluate=0.0, rounds=2)
    from flowerquickstart.task import Net

    # Execute: Flower's Strategy.start itself, not FedFlex's override
    result = Strategy.start(
        strategy, grid, ArrayRecord(Net().state_dict()), num_rounds=2, train_config=ConfigRecord({"lr": 0.05})
    )
    # Assert: every client trained in round 1 (HiCS-FL's warm-up) and has an entropy estimate
    assert sorted(result.train_metrics_clientapp) == [1, 2]
    assert sorted(strategy.record.extra["hics_entropy"]) == ["0", "1", "2", "3"]


def test_node_ids_become_dense_client_ids_in_order_of_appearance():
    grid = _grid(3)
    strategy = named.FedAWARE(fraction_train=1.0, fraction_evaluate=0.0, identify="node-id")
    _run(strategy, grid, rounds=1)
    # no QUERY was sent; the nodes seen together are numbered in node-id order
    assert all(m.metadata.message_type != MessageType.QUERY for m in grid.sent)
    assert strategy.nodes.node_to_client == {n: i for i, n in enumerate(sorted(grid.contexts))}


def test_fedaware_weights_are_not_uniform():
    # Prepare: partitions of 1, 5 and 10 classes: their update momenta differ
    grid = _grid(3)
    strategy = named.FedAWARE(fraction_train=1.0, fraction_evaluate=0.0)
    # Execute
    _run(strategy, grid, rounds=3)
    # Assert
    weights = strategy.aggregator.core.last_weights
    assert weights.sum() == pytest.approx(1.0, abs=1e-6)
    assert np.ptp(weights) > 0.05, weights


def test_power_of_choice_asks_a_flower_client_for_its_loss_with_an_evaluate_message():
    grid = _grid()
    strategy = named.PowerOfChoice(clients_per_round=2, fraction_evaluate=0.0, options=PowDOptions(d=4))
    _run(strategy, grid, rounds=1)
    kinds = [m.metadata.message_type for m in grid.sent]
    # no identification query (the quickstart has no query function), 4 loss evaluations, 2 train messages
    assert kinds.count(MessageType.QUERY) == 0
    assert kinds.count(MessageType.EVALUATE) == 4
    assert kinds.count(MessageType.TRAIN) == 2


def test_session_aware_builds_a_model_at_a_scripted_change_of_the_online_set():
    # Prepare: clients {0, 1} in round 1, {2, 3} from round 2 (a new session)
    grid = _grid()
    schedule = ExplicitSessions(4, [[0, 1], [2, 3]], rounds_per_session=1, cycle=False)
    strategy = named.SessionAware(clients_per_round=2, fraction_evaluate=0.0, availability=schedule, identify="node-id")
    # Execute
    _run(strategy, grid, rounds=2)
    # Assert: the pilot was built from session 0, and session 1 started from the model of
    # its gradient round (one extra training round with the new clients)
    train = [m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN]
    assert len(train) == 2 + 2 + 2  # round 1, the gradient round, round 2
    assert strategy.initializer.pilot is not None
    assert strategy.tracker.session == 1


@pytest.mark.parametrize(
    ("name", "helper"),
    [("SCAFFOLD", "local rule scaffold"), ("FedNova", "local rule fednova"), ("BHerd", "local rule bherd")],
)
def test_a_method_that_needs_more_rejects_a_plain_reply_in_one_line(name, helper, caplog):
    strategy = named.NAMED[name](fraction_train=0.5, fraction_evaluate=0.0)
    with pytest.raises(RunFailedError, match="no round trained"):  # never an untrained model as a result
        _run(strategy, _grid(), rounds=1)
    reasons = [reason for _, reason in strategy.record.rejected]
    assert len(reasons) == 2 and all(helper in r and "\n" not in r for r in reasons)


def test_a_bad_option_fails_at_construction_with_the_scenario_key():
    with pytest.raises(ConfigError, match=r"^strategy\.sampler\.hics\.entropy_weight = -1\.0: must be >= 0$"):
        named.HiCSFL(options=HiCSOptions(entropy_weight=-1.0))
    with pytest.raises(ConfigError, match=r"^strategy\.aggregator\.server_lr = 0\.0: must be > 0$"):
        named.FedAMS(server_lr=0.0)
    with pytest.raises(ConfigError, match=r"^strategy\.aggregator\.adaptive\.beta1 = 1\.5"):
        named.AWARE(base="FedAdam", options=[AwareOptions(), AdaptiveOptions(beta1=1.5)])


def test_a_bad_keyword_is_named_in_one_line_with_the_allowed_ones():
    with pytest.raises(TypeError) as info:
        named.FedDyn(alpah=0.1)
    message = str(info.value)
    assert "\n" not in message and "'alpah'" in message
    assert "takes options, num_clients, rounds, seed, lr" in message and "fraction_train" in message
    # the first release's flat keywords are gone; the message says where each went
    with pytest.raises(TypeError, match=r"'hics_lambda' \(the first release's hics_lambda is options=HiCSOptions\("):
        named.HiCSFL(hics_lambda=5.0)
    with pytest.raises(TypeError, match="FedNova: options=HiCSOptions.* is not one of its option classes"):
        named.FedNova(options=HiCSOptions())


def test_each_strategy_takes_its_method_options_as_written_keywords_and_documents_them():
    import inspect

    from fedflex.config import AggregatorConfig

    params = inspect.signature(named.FedAMS).parameters
    assert params["server_lr"].default == AggregatorConfig.server_lr
    assert "``strategy.aggregator.fedams``" in named.FedAMS.__doc__
    for name, cls in named.NAMED.items():
        keywords = [p for p in inspect.signature(cls).parameters.values() if p.kind is p.KEYWORD_ONLY]
        assert {"num_clients", "rounds", "seed", "lr"} <= {p.name for p in keywords}, name
        for p in keywords:  # the hand-written NumPy docstring lists every keyword
            assert f"\n    {p.name} : " in cls.__doc__, (name, p.name)
        assert "\n    **kwargs\n" in cls.__doc__, name


def test_no_named_strategy_goes_through_the_scenario_loader():
    import inspect
    import sys

    for cls in [*named.NAMED.values(), named.FlowerStrategy]:
        source = inspect.getsource(sys.modules[cls.__module__])
        assert "loader" not in source and "ScenarioConfig" not in source, cls.__module__


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(
            lambda: named.HiCSFL(clients_per_round=3, seed=3, options=HiCSOptions(variant="authors")), id="HiCSFL"
        ),
        pytest.param(
            lambda: named.PowerOfChoice(clients_per_round=3, seed=1, options=PowDOptions(d=5)), id="PowerOfChoice"
        ),
        pytest.param(
            lambda: named.ClusteredSampling(clients_per_round=3, seed=2, explore_first=True), id="ClusteredSampling"
        ),
        pytest.param(lambda: named.DivFL(clients_per_round=3, seed=4), id="DivFL"),
        pytest.param(lambda: named.FedCor(clients_per_round=3, seed=5, options=FedCorOptions(warmup=2)), id="FedCor"),
        pytest.param(lambda: named.SessionAware(clients_per_round=3, seed=6), id="SessionAware"),
    ],
)
def test_a_named_strategy_samples_the_clients_a_scenario_with_its_options_samples(make):
    # Prepare: the same method, options, K and seed as a named strategy and as a scenario's parts
    from collections import OrderedDict

    from fedflex.config import SamplerConfig, ScenarioConfig, StrategyConfig
    from fedflex.strategies.build import build_parts
    from fedflex.strategies.parts import ModelInfo

    named_strategy = make()
    arrays = OrderedDict(w=np.zeros((4, 3), np.float32), b=np.zeros(3, np.float32))
    names = {"HiCSFL": "hics", "PowerOfChoice": "pow-d", "ClusteredSampling": "clustered", "DivFL": "divfl"}
    names["FedCor"] = "fedcor"
    name = names.get(type(named_strategy).__name__)
    sampler: dict = {"name": name} if name else {}
    sections: dict = {} if name else {"initializer": {"name": "session-aware"}}
    for cls, path in named_strategy.option_classes().items():
        part, section = path.split(".")[1:]
        target = sampler if part == "sampler" else sections.setdefault(part, {})
        target[section] = named_strategy.option(cls)
    sampler["explore_first"] = getattr(named_strategy, "explore_first", False)
    parts = {k: type(getattr(StrategyConfig(), k))(**v) for k, v in sections.items()}
    cfg = ScenarioConfig(
        num_clients=10,
        rounds=5,
        seed=named_strategy._seed,
        strategy=StrategyConfig(sampler=SamplerConfig(clients_per_round=3, **sampler), **parts),
    )
    # Execute
    ours = named_strategy.parts_factory(10, 5, arrays)
    theirs = build_parts(cfg, ModelInfo(output_bias_key="b"))
    # Assert: the same parts with the same generators, and (samplers that ask no client
    # for a loss) the same first draws
    assert [p.summary() for p in ours] == [p.summary() for p in theirs]
    for a, b in zip(ours, theirs):
        assert _rng_state(a) == _rng_state(b), type(a).__name__
    if not isinstance(named_strategy, (named.PowerOfChoice, named.FedCor)):
        online = np.arange(10)
        assert ours[0].sample(1, online, 3).tolist() == theirs[0].sample(1, online, 3).tolist()


def _rng_state(part):
    """The state of a part's generator (and of the part it wraps), None without one."""
    rng = getattr(part, "rng", None)
    base = getattr(part, "base", None)
    return (rng.bit_generator.state if rng is not None else None, _rng_state(base) if base is not None else None)


def test_fedflex_with_parts_keeps_flowers_fedavg_options():
    from fedflex.strategies.baseline import FedAvgAggregator, PreviousInitializer, UniformSampler

    strategy = FedFlex(
        sampler=UniformSampler(seed=0),
        aggregator=FedAvgAggregator(),
        initializer=PreviousInitializer(),
        num_clients=4,
        fraction_train=0.5,
        min_train_nodes=1,
        fraction_evaluate=0.25,
    )
    result = _run(strategy, _grid())
    assert sorted(result.train_metrics_clientapp) == [1, 2]
    assert strategy._per_round(4) == 2
    assert sorted(result.evaluate_metrics_clientapp) == [1, 2]
