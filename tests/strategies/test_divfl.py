"""DivFL: the facility-location kernels by hand, the sampler's two proxy settings, and a
real run with ideal proxies (every online client probed each round)."""

from collections import OrderedDict

import numpy as np
import pytest

import fedflex.clients.runtime as runtime
from fedflex.clients.client_app import app as client_app
from fedflex.config import ConfigError
from fedflex.launch.local_grid import LocalGrid
from fedflex.launch.server import run_server
from fedflex.loader import load_scenario
from fedflex.results import read_metrics
from fedflex.strategies.divfl import DivFLSampler, greedy_facility_location, pairwise_distances
from fedflex.strategies.parts import ClientUpdate

# clients on a line at 0, 1, 10, 11, 12 (one-number updates)
LINE = [0.0, 1.0, 10.0, 11.0, 12.0]


def _g(x):
    return OrderedDict(w=np.array([x], dtype=np.float32))


def _ups(positions, clients=None):
    clients = range(len(positions)) if clients is None else clients
    return [ClientUpdate(int(c), 10, _g(p)) for c, p in zip(clients, positions)]


def test_pairwise_distances_by_hand():
    x = np.array([[0.0, 0.0], [3.0, 4.0], [6.0, 8.0]])
    d = pairwise_distances(x, block=2)
    np.testing.assert_allclose(d, [[0, 5, 10], [5, 0, 5], [10, 5, 0]], atol=1e-5)


def test_greedy_picks_the_medoid_then_the_biggest_reduction():
    # distance sums: 34, 31, 22, 23, 26 -> first pick 10 (index 2), cost 22; then adding
    # 0 or 1 leaves nearest distances (0, 1, 0, 1, 2) or (1, 0, 0, 1, 2): cost 4 either
    # way, the tie goes to the lower index; adding 11 would leave 20
    pos = np.array(LINE)
    dist = np.abs(pos[:, None] - pos[None, :])
    chosen, cost = greedy_facility_location(dist, 2, block=2)
    assert chosen.tolist() == [2, 0]
    np.testing.assert_allclose(cost, [22.0, 4.0])


def test_greedy_stops_at_n():
    chosen, cost = greedy_facility_location(np.zeros((2, 2)), 5)
    assert sorted(chosen.tolist()) == [0, 1] and cost[-1] == 0.0


def test_stale_sampler_picks_diverse_latest_updates():
    sampler = DivFLSampler(seed=0)
    sampler.observe(1, _ups(LINE), _g(0.0))
    picks = sampler.sample(2, np.arange(5), 2)
    assert picks.tolist() == [0, 2]
    assert sampler.round_metrics()["divfl_mean_distance"] == pytest.approx(4.0 / 5)


def test_stale_sampler_explores_clients_without_an_update_first():
    sampler = DivFLSampler(seed=0)
    sampler.observe(1, _ups(LINE), _g(0.0))
    # client 5 never trained: it goes first, the one remaining place is the medoid (2)
    assert sampler.sample(2, np.arange(6), 2).tolist() == [2, 5]


class ProbeCtx:
    """Answers a probe with fixed updates and records the call."""

    def __init__(self, positions):
        self.global_arrays = _g(0.0)
        self.positions = positions
        self.calls = []

    def probe(self, server_round, clients, arrays, steps=0):
        self.calls.append((server_round, list(map(int, clients)), steps))
        return _ups([self.positions[int(c)] for c in clients], clients)


def test_ideal_sampler_selects_on_fresh_updates_of_every_online_client():
    # stale updates on the line would give [0, 2]; the probe says four clients sit at 0
    # and client 4 at 100: medoid 0 (the lowest of four ties), then 4 (cost 100 -> 0)
    ctx = ProbeCtx([0.0, 0.0, 0.0, 0.0, 100.0])
    sampler = DivFLSampler(seed=0, proxies="ideal", probe_steps=3)
    sampler.bind(ctx)
    sampler.observe(1, _ups(LINE), _g(0.0))
    picks = sampler.sample(2, np.arange(5), 2)
    assert ctx.calls == [(2, [0, 1, 2, 3, 4], 3)]
    assert picks.tolist() == [0, 4]
    assert sampler.round_metrics()["divfl_probed"] == 5


def test_ideal_sampler_does_not_probe_when_everyone_trains():
    ctx = ProbeCtx(LINE)
    sampler = DivFLSampler(seed=0, proxies="ideal")
    sampler.bind(ctx)
    assert sampler.sample(1, np.arange(3), 3).tolist() == [0, 1, 2]
    assert ctx.calls == []


def test_config_refuses_unknown_proxies_by_name():
    with pytest.raises(ConfigError, match="strategy.sampler.divfl.proxies"):
        load_scenario(None, ["strategy.sampler.name=divfl", "strategy.sampler.divfl.proxies=fresh"])


def test_ideal_divfl_runs_real_rounds_and_probes_every_online_client(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDFLEX_CACHE", str(tmp_path / "cache"))
    runtime.get_task.cache_clear()
    cfg = load_scenario(
        None,
        [
            "num_clients=4",
            "rounds=2",
            "dataset.samples_per_client=20",
            "client.batch_size=5",
            "strategy.sampler.clients_per_round=2",
            "strategy.sampler.name=divfl",
            "strategy.sampler.divfl.proxies=ideal",
            "strategy.sampler.divfl.probe_steps=1",
            "strategy.local_rule.name=scaffold",
            "output.progress=off",
            "output.plots=false",
            "output.checkpoint_every=0",
        ],
    )
    run_server(LocalGrid(client_app, cfg.num_clients), cfg, tmp_path / "run")
    rows = [r for r in read_metrics(tmp_path / "run") if r["phase"] == "train"]
    assert [r["divfl_probed"] for r in rows] == [4, 4]
    assert all(len(r["sampled"]) == 2 for r in rows)
