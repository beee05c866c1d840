"""HiCS-FL's behaviour with Flower's quickstart ClientApp: its sampling probabilities move
toward the clients of high label entropy.

The quickstart's partition i of n holds ``1 + 9 i / (n - 1)`` classes: with 4 nodes,
partition 0 holds 1 class (label entropy 0) and partition 3 all 10 (the highest), by
construction. Client ids are node-id order (``identify="node-id"``), not partition ids,
so the test maps them through the grid's node configs.
"""

import pytest
from flwr.app import ArrayRecord, ConfigRecord

from fedflex.launch.local_grid import LocalGrid
from fedflex.options import HiCSOptions
from fedflex.strategies import hics, named

pytestmark = pytest.mark.usefixtures("quickstart_example")  # tests/conftest.py


@pytest.mark.parametrize("estimate", ["unit", "bias"])
def test_hics_samples_the_high_entropy_client_more_than_the_one_class_client(estimate, monkeypatch):
    # Prepare: 4 nodes (1, 4, 7, 10 classes), K = 2: rounds 1-2 are the warm-up, rounds
    # 3-8 follow the rule with gamma_t = 4 (1 - t / 8); spy on each rule round's
    # per-client probabilities (Algorithm 1's pi_m(k) p_k / P_m(k))
    import torch
    from flowerquickstart.client_app import app
    from flowerquickstart.task import Net

    seen = {}
    draw_known, probabilities = hics.HiCSSampler._draw_known, hics.client_probabilities

    def spy_draw(self, server_round, known, num):
        seen[server_round] = {"known": known.tolist()}
        return draw_known(self, server_round, known, num)

    def spy_probabilities(labels, pi, shares):
        seen[max(seen)]["p"] = probabilities(labels, pi, shares)
        return seen[max(seen)]["p"]

    monkeypatch.setattr(hics.HiCSSampler, "_draw_known", spy_draw)
    monkeypatch.setattr(hics, "client_probabilities", spy_probabilities)
    grid = LocalGrid(app, 4)
    for context in grid.contexts.values():
        context.run_config.update({"examples": 40})
    strategy = named.HiCSFL(
        clients_per_round=2, fraction_evaluate=0.0, identify="node-id", options=HiCSOptions(estimate=estimate)
    )
    torch.manual_seed(0)
    # Execute
    strategy.start(grid, ArrayRecord(Net().state_dict()), num_rounds=8, train_config=ConfigRecord({"lr": 0.05}))
    # Assert: the 1-class client's estimate is the lowest, the 10-class client's above it
    client = {c.node_config["partition-id"]: strategy.nodes.client_of(n) for n, c in grid.contexts.items()}
    low, high = client[0], client[3]
    h = strategy.sampler.entropies
    assert h[low] == min(h.values()) and h[high] > h[low] + 0.5, h
    # while gamma_t >= 2 (rounds 3 and 4) the 10-class client is more likely than under
    # uniform sampling (1/4 a draw) and the 1-class client less
    for t in (3, 4):
        p = dict(zip(seen[t]["known"], seen[t]["p"]))
        assert p[high] > 0.25 > p[low], (t, p)
