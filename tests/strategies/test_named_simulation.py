"""The example app under Flower's simulation engine (``run_simulation``, Ray)."""

import sys
from pathlib import Path

import pytest
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from fedflex.strategies import named

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flower-quickstart"


def _simulate(monkeypatch, make_strategy, rounds=2, nodes=3):
    monkeypatch.setenv("QUICKSTART_SYNTHETIC", "1")
    monkeypatch.syspath_prepend(str(EXAMPLE))
    from flowerquickstart import server_app
    from flowerquickstart.client_app import app as client_app

    results = []
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        context.run_config.update({"num-server-rounds": rounds, "lr": 0.05})
        strategy = make_strategy()
        results.append((strategy, server_app.run(grid, context, strategy)))

    run_simulation(
        server_app=app,
        client_app=client_app,
        num_supernodes=nodes,
        backend_config={"client_resources": {"num_cpus": 1}, "init_args": {"num_cpus": 2}},
    )
    for name in [m for m in sys.modules if m.startswith("flowerquickstart")]:
        del sys.modules[name]
    return results


@pytest.mark.slow
def test_hicsfl_in_flower_simulation(monkeypatch):
    [(strategy, result)] = _simulate(monkeypatch, lambda: named.HiCSFL(fraction_train=1.0, fraction_evaluate=0.5))
    assert sorted(result.train_metrics_clientapp) == [1, 2]
    assert sorted(result.evaluate_metrics_serverapp) == [0, 1, 2]
    assert sorted(strategy.record.extra["hics_entropy"]) == ["0", "1", "2"]  # every node, by node id


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(named.NAMED) - {"SCAFFOLD", "FedNova", "BHerd"}))
def test_every_named_strategy_in_flower_simulation(monkeypatch, name):
    [(_, result)] = _simulate(monkeypatch, lambda: named.NAMED[name](fraction_train=1.0, fraction_evaluate=0.0))
    assert sorted(result.train_metrics_clientapp) == [1, 2]
