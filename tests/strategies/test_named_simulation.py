"""The example app under Flower's simulation engine (``run_simulation``, Ray)."""

import sys
from pathlib import Path

import pytest
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from fedflex.strategies import named

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flower-quickstart"


def _simulate(monkeypatch, make_strategies, rounds=2, nodes=3):
    """Run Flower's quickstart ServerApp once per strategy of ``make_strategies`` (name ->
    factory), one after another in one Flower simulation (one Ray start for all);
    returns name -> (strategy, Result), or the exception that strategy raised.
    """
    monkeypatch.setenv("QUICKSTART_SYNTHETIC", "1")
    monkeypatch.syspath_prepend(str(EXAMPLE))
    from flowerquickstart import server_app
    from flowerquickstart.client_app import app as client_app

    results: dict = {}
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        context.run_config.update({"num-server-rounds": rounds, "lr": 0.05})
        for name, make_strategy in make_strategies.items():
            try:
                strategy = make_strategy()
                results[name] = (strategy, server_app.run(grid, context, strategy))
            except Exception as exc:  # the test of that strategy reports it
                results[name] = exc

    run_simulation(
        server_app=app,
        client_app=client_app,
        num_supernodes=nodes,
        backend_config={"client_resources": {"num_cpus": 1}, "init_args": {"num_cpus": 2}},
    )
    for name in [m for m in sys.modules if m.startswith("flowerquickstart")]:
        del sys.modules[name]
    return results


PLAIN = sorted(set(named.NAMED) - {"SCAFFOLD", "FedNova", "BHerd"})  # their clients need the client halves


@pytest.fixture(scope="module")
def simulated():
    """Every strategy of PLAIN (fraction_evaluate 0) and HiCS-FL with evaluation, in one
    simulation of 3 nodes, 2 rounds each."""
    factories = {name: (lambda n=name: named.NAMED[n](fraction_train=1.0, fraction_evaluate=0.0)) for name in PLAIN}
    factories["HiCSFL+evaluate"] = lambda: named.HiCSFL(fraction_train=1.0, fraction_evaluate=0.5)
    with pytest.MonkeyPatch.context() as monkeypatch:
        return _simulate(monkeypatch, factories)


def _result(simulated, name):
    got = simulated[name]
    if isinstance(got, Exception):
        raise got
    return got


@pytest.mark.slow
def test_hicsfl_in_flower_simulation(simulated):
    strategy, result = _result(simulated, "HiCSFL+evaluate")
    assert sorted(result.train_metrics_clientapp) == [1, 2]
    assert sorted(result.evaluate_metrics_serverapp) == [0, 1, 2]
    assert sorted(strategy.record.extra["hics_entropy"]) == ["0", "1", "2"]  # every node, by node id


@pytest.mark.slow
@pytest.mark.parametrize("name", PLAIN)
def test_every_named_strategy_in_flower_simulation(simulated, name):
    _, result = _result(simulated, name)
    assert sorted(result.train_metrics_clientapp) == [1, 2]
