"""The named strategies that need a client half, with the quickstart ClientApp plus
fedflex's helpers (examples/flower-quickstart/flowerquickstart/client_app_halves.py).

Same in-process harness as test_named.py: LocalGrid hands the messages to the ClientApp,
the strategy's own ``start`` drives 2 rounds. Each client holds 100 examples, 80 for
training: batches of 32, 32 and 16, so every client takes tau = 3 local steps (SGD with
momentum 0.9, the quickstart's ``train()``).
"""

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp.strategy import FedProx

from fedflex import keys
from fedflex.launch.local_grid import LocalGrid
from fedflex.strategies import named

pytestmark = pytest.mark.usefixtures("quickstart_example")  # tests/conftest.py


def _grid(method, app_name="app", n=4):
    from flowerquickstart import client_app_halves

    grid = LocalGrid(getattr(client_app_halves, app_name), n)
    for context in grid.contexts.values():
        context.run_config.update({"examples": 100, "client-half": method})
    return grid


def _run(strategy, grid, rounds=2):
    from flowerquickstart.task import Net

    return strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(Net().state_dict()),
        num_rounds=rounds,
        train_config=ConfigRecord({"lr": 0.01}),
    )


@pytest.mark.parametrize("name", ["BHerd", "SCAFFOLD", "FedNova", "FedDyn", "FedCM"])
def test_the_helpers_replies_are_accepted_by_the_named_strategy(name):
    # Prepare
    grid = _grid(name)
    strategy = named.NAMED[name](fraction_train=0.5, fraction_evaluate=0.0, lr=0.01)
    # Execute
    result = _run(strategy, grid)
    # Assert: both rounds aggregated both replies, none rejected
    assert strategy.record.rejected == []
    assert sorted(result.train_metrics_clientapp) == [1, 2]


def test_bherd_herds_two_of_three_steps_of_every_client():
    # alpha 0.5 of tau = 3: k = floor(1.5 + 1/2) = 2
    strategy = named.BHerd(fraction_train=0.5, fraction_evaluate=0.0, lr=0.01)
    _run(strategy, _grid("BHerd"), rounds=1)
    assert strategy.record.extra["herd_k"] == [2, 2]


def test_fednova_normalises_by_the_momentum_steps_of_the_users_loop():
    # ||a||_1 of 3 steps with momentum 0.9: (3 - 0.9 (1 - 0.9^3) / 0.1) / 0.1 = 5.61 for both
    strategy = named.FedNova(fraction_train=0.5, fraction_evaluate=0.0)
    _run(strategy, _grid("FedNova"), rounds=1)
    assert strategy.server_rule.tau_eff == pytest.approx(5.61)


def test_fednova_mod_around_the_unchanged_quickstart_client():
    strategy = named.FedNova(fraction_train=0.5, fraction_evaluate=0.0)
    _run(strategy, _grid("FedNova", app_name="app_fednova_mod"), rounds=1)
    assert strategy.record.rejected == []
    assert strategy.server_rule.tau_eff == pytest.approx(5.61)


def test_scaffold_keeps_each_clients_variate_on_its_node_and_moves_the_servers():
    grid = _grid("SCAFFOLD")
    strategy = named.SCAFFOLD(fraction_train=0.5, fraction_evaluate=0.0)
    _run(strategy, grid, rounds=1)
    trained = [c for c in grid.contexts.values() if keys.SCAFFOLD_CI in c.state.array_records]
    assert len(trained) == 2
    assert max(float(np.abs(v).max()) for v in strategy.server_rule.c.values()) > 0


def test_fedcm_momentum_comes_from_the_helpers_step_count():
    # a plain reply has no num-steps and would leave Delta at zero
    strategy = named.FedCM(fraction_train=0.5, fraction_evaluate=0.0, lr=0.01)
    _run(strategy, _grid("FedCM"), rounds=1)
    assert max(float(np.abs(v).max()) for v in strategy.server_rule.delta.values()) > 0


def test_feddyn_keeps_the_gradient_state_on_the_trained_nodes():
    grid = _grid("FedDyn")
    _run(named.FedDyn(fraction_train=0.5, fraction_evaluate=0.0), grid, rounds=1)
    assert sum(keys.FEDDYN_GRAD in c.state.array_records for c in grid.contexts.values()) == 2


def test_flowers_own_fedprox_with_the_fedprox_helper():
    # the helper reads Flower's proximal-mu; a message without it would fail every client
    result = _run(FedProx(proximal_mu=0.1, fraction_train=0.5, fraction_evaluate=0.0), _grid("FedProx"))
    assert sorted(result.train_metrics_clientapp) == [1, 2]
