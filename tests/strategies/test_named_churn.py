"""A churn schedule handed to a named strategy in simulation (``availability=``).

Flower keeps every simulated node connected; the schedule says who is online. Client ids
are the dense ids the strategy gives the nodes (here, Flower's quickstart ClientApp: node
ids in sorted order, ``identify="node-id"``).
"""

import pytest
from flwr.app import ArrayRecord, ConfigRecord, MessageType

from fedflex.churn import ExplicitSessions, MarkovChurn
from fedflex.launch.local_grid import LocalGrid
from fedflex.strategies import named

pytestmark = pytest.mark.usefixtures("quickstart_example")  # tests/conftest.py


def _grid(n):
    from flowerquickstart.client_app import app

    grid = LocalGrid(app, n)
    for context in grid.contexts.values():
        context.run_config.update({"examples": 20})
    return grid


def _run(strategy, grid, rounds):
    from flowerquickstart.task import Net

    return strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(Net().state_dict()),
        num_rounds=rounds,
        train_config=ConfigRecord({"lr": 0.05}),
    )


def _clients_per_round(grid, strategy, message_type):
    """Round -> client ids the messages of ``message_type`` went to; a round's evaluate
    messages follow its train messages (Flower reuses one evaluate config for all rounds)."""
    out, server_round = {}, 0
    for m in grid.sent:
        if m.metadata.message_type == MessageType.TRAIN:
            server_round = m.content["config"]["server-round"]
        if m.metadata.message_type == message_type:
            out.setdefault(server_round, set()).add(strategy.nodes.client_of(m.metadata.dst_node_id))
    return out


def test_a_scripted_schedule_limits_training_and_evaluation_to_the_online_clients():
    # Prepare: 6 clients; rounds 1-3 have {0, 1, 2}, {3, 4}, {1, 5} online
    online = [[0, 1, 2], [3, 4], [1, 5]]
    schedule = ExplicitSessions(6, online, rounds_per_session=1, cycle=False)
    strategy = named.FedAMS(fraction_train=1.0, fraction_evaluate=1.0, availability=schedule, identify="node-id")
    grid = _grid(6)
    # Execute
    _run(strategy, grid, rounds=3)
    # Assert: with fraction_train 1.0 every online client trains, and nobody else does
    trained = _clients_per_round(grid, strategy, MessageType.TRAIN)
    assert trained == {1: {0, 1, 2}, 2: {3, 4}, 3: {1, 5}}
    evaluated = _clients_per_round(grid, strategy, MessageType.EVALUATE)
    assert sorted(evaluated) == [1, 2, 3]
    assert all(evaluated[t] <= set(online[t - 1]) for t in evaluated), evaluated


@pytest.mark.parametrize("name", ["FedAWARE", "HiCSFL", "PowerOfChoice"])
def test_a_markov_schedule_samples_only_online_clients(name):
    # Prepare: 8 clients on a Markov chain; 2 of the online clients train per round
    schedule = MarkovChurn(8, p_leave=0.5, p_join=0.5, seed=3)
    strategy = named.NAMED[name](clients_per_round=2, fraction_evaluate=0.0, availability=schedule, identify="node-id")
    grid = _grid(8)
    # Execute
    _run(strategy, grid, rounds=4)
    # Assert: each round's sampled clients are online in that round (the chain's own answer)
    trained = _clients_per_round(grid, strategy, MessageType.TRAIN)
    online = {t: set(schedule.online(t).tolist()) for t in range(1, 5)}
    assert len({frozenset(s) for s in online.values()}) > 1  # the online set does change
    for t, clients in trained.items():
        assert clients <= online[t] and 1 <= len(clients) <= 2, (t, clients, online[t])
    assert sorted(trained) == [t for t in range(1, 5) if online[t]]


def test_session_aware_starts_a_session_when_the_online_set_changes():
    # Prepare: {0, 1} in rounds 1-2, {2, 3} in rounds 3-4
    schedule = ExplicitSessions(4, [[0, 1], [2, 3]], rounds_per_session=2, cycle=False)
    strategy = named.SessionAware(clients_per_round=2, fraction_evaluate=0.0, availability=schedule, identify="node-id")
    grid = _grid(4)
    # Execute
    _run(strategy, grid, rounds=4)
    # Assert: session 1 started at round 3 with a gradient round of its clients (phase
    # session-init: the same round number, the new clients, from the pilot model)
    trained = [m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN]
    rounds = [m.content["config"]["server-round"] for m in trained]
    assert rounds == [1, 1, 2, 2, 3, 3, 3, 3, 4, 4]
    assert strategy.tracker.session == 1 and strategy.tracker.session_start_round == 3


def test_the_example_app_turns_churn_on_from_its_run_config():
    # Prepare: the example's run config with churn = "markov" (pyproject's [tool.flwr.app.config])
    from flowerquickstart import server_app
    from flwr.app import Context, RecordDict

    grid = _grid(6)
    config = {"churn": "markov", "churn-p-leave": 0.5, "churn-p-join": 0.5, "num-server-rounds": 3, "lr": 0.05}
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=config)
    # Execute
    availability = server_app.churn(grid, context)
    strategy = named.FedAMS(fraction_train=1.0, fraction_evaluate=0.0, availability=availability)
    server_app.run(grid, context, strategy)
    # Assert: a Markov schedule over the 6 nodes; every round trains exactly its online clients
    assert isinstance(availability, MarkovChurn) and availability.num_clients == 6
    trained = _clients_per_round(grid, strategy, MessageType.TRAIN)
    assert trained == {t: set(availability.online(t).tolist()) for t in (1, 2, 3)}
    context.run_config["churn"] = "none"
    assert server_app.churn(grid, context) is None
