"""``client_half`` / ``client_half_mod`` in the quickstart ClientApp, with the named
strategies' own ``Strategy.start`` loop (in-process LocalGrid, as tests/strategies/test_named_halves.py
does for the decorated ``app``), and the diffs docs/flower-strategies.md shows.

Each client holds 100 examples, 80 for training: batches of 32, 32 and 16, so every
client takes tau = 3 local steps (the quickstart's SGD with momentum 0.9).
"""

import re
from pathlib import Path

import pytest
from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp.strategy import FedAvg, FedProx

from fedflex import keys, strategies
from fedflex.launch.local_grid import LocalGrid

pytestmark = pytest.mark.usefixtures("quickstart_example")  # tests/conftest.py

DOC = Path(__file__).resolve().parents[2] / "docs" / "flower-strategies.md"


def _run(strategy, app_name, n=4):
    from flowerquickstart import client_app_halves
    from flowerquickstart.task import Net

    grid = LocalGrid(getattr(client_app_halves, app_name), n)
    for context in grid.contexts.values():
        context.run_config.update({"examples": 100})
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(Net().state_dict()),
        num_rounds=1,
        train_config=ConfigRecord({"lr": 0.01}),
    )
    return result.train_metrics_clientapp[1]


@pytest.mark.parametrize("name", ["BHerd", "SCAFFOLD", "FedNova", "FedDyn", "FedCM"])
def test_the_mod_around_the_unchanged_quickstart_serves_each_named_strategy(name):
    strategy = getattr(strategies, name)(fraction_train=0.5, fraction_evaluate=0.0)
    metrics = _run(strategy, "app_mod")
    assert strategy.record.rejected == []
    assert metrics[keys.NUM_STEPS] == 3


def test_the_mod_reads_flowers_fedprox():
    metrics = _run(FedProx(proximal_mu=0.1, fraction_train=0.5, fraction_evaluate=0.0), "app_mod")
    assert metrics[keys.NUM_STEPS] == 3


@pytest.mark.parametrize("app_name", ["app", "app_mod"])
def test_flowers_fedavg_gets_the_quickstarts_reply_unchanged(app_name):
    metrics = _run(FedAvg(fraction_train=0.5, fraction_evaluate=0.0), app_name)
    assert set(metrics) == {"train_loss"}  # Flower drops the weight key; no num-steps added


def _doc_diffs() -> list[str]:
    text = DOC.read_text()
    section = text[text.index("## Client halves") :]
    section = section[: section.index("\n## ", 1)]
    return re.findall(r"```diff\n(.*?)```", section, re.S)


def test_the_documented_diffs_change_at_most_three_lines_and_import_what_exists():
    diffs = _doc_diffs()
    assert len(diffs) >= 2  # the decorator and the mod
    for diff in diffs:
        changed = [line for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]
        assert 1 <= len(changed) <= 3, changed
        for line in changed:
            if line.startswith("+from fedflex"):
                exec(line[1:], {})  # the names the diff imports exist
