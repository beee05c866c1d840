"""FedAWARE (Zeng et al., arXiv:2310.02702): the min-norm solver, momentum bookkeeping,
warm-up, options, the AWARE plug-in, memory options, e-LUD, and an end-to-end run."""

import json
import logging
import math
from collections import OrderedDict
from types import SimpleNamespace

import numpy as np
import pytest
from scipy.optimize import minimize

from fedflex.clients.client_app import app as client_app
from fedflex.config import ConfigError
from fedflex.launch.local_grid import LocalGrid
from fedflex.launch.server import run_server
from fedflex.loader import load_scenario
from fedflex.results import read_metrics
from fedflex.strategies import diagnostics
from fedflex.strategies.baseline import ExploreFirstSampler, FedAvgAggregator, UniformSampler
from fedflex.strategies.build import build_strategy
from fedflex.strategies.combinations import check_parts
from fedflex.strategies.diagnostics import e_lud
from fedflex.strategies.fedaware import (
    AwareCore,
    AwarePlugin,
    FedAwareAggregator,
    MomentumStore,
    best_pair,
    min_norm_away_steps,
    min_norm_weights,
    projection_coefficient,
    two_point,
)
from fedflex.strategies.optimizers import FedAvgMAggregator
from fedflex.strategies.parts import ClientUpdate, RoundFacts

SQRT3 = math.sqrt(3.0)


def _model(*w):
    return OrderedDict(w=np.array(w, dtype=np.float64))


def _up(client, x, g, n=1):
    """Client ``client`` uploading x_i = x - g (pseudo-gradient g)."""
    return ClientUpdate(client, n, OrderedDict(w=np.asarray(x, dtype=np.float64) - np.asarray(g, dtype=np.float64)))


def _qp(gram):
    """Generic reference: SLSQP on the simplex."""
    n = len(gram)
    res = minimize(
        lambda w: w @ gram @ w,
        np.full(n, 1.0 / n),
        jac=lambda w: 2 * gram @ w,
        method="SLSQP",
        bounds=[(0.0, 1.0)] * n,
        constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1.0, "jac": lambda w: np.ones(n)}],
        options={"ftol": 1e-16, "maxiter": 1000},
    )
    return res.x


# ------------------------------------------------------------------ solver
def test_two_point_rule_follows_the_spec():
    assert two_point(1.0, 1.0, 4.0) == 0.999  # v1.v2 >= v1.v1: v1 end
    assert two_point(4.0, 1.0, 1.0) == 0.001  # v1.v2 >= v2.v2: v2 end
    assert two_point(1.0, 0.0, 1.0) == pytest.approx(0.5)  # (v2v2 - v1v2) / (v1v1 + v2v2 - 2 v1v2)


@pytest.mark.parametrize("seed", range(8))
def test_frank_wolfe_matches_a_generic_qp_solver(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 9))
    vecs = rng.normal(size=(n, 12)) + 0.7 * rng.normal(size=12)
    gram = vecs @ vecs.T
    res = min_norm_weights(gram, iters=200_000, tol=1e-14)
    np.testing.assert_allclose(res.weights, _qp(gram), atol=1e-6)
    assert res.weights.sum() == pytest.approx(1.0)
    assert res.value == pytest.approx(float(res.weights @ gram @ res.weights), abs=1e-12)


def test_frank_wolfe_with_scale_solves_the_normalised_problem():
    rng = np.random.default_rng(11)
    vecs = rng.normal(size=(6, 10)) * rng.uniform(0.1, 5.0, size=(6, 1)) + 0.5
    gram = vecs @ vecs.T
    scale = 1.0 / np.linalg.norm(vecs, axis=1)
    unit = vecs * scale[:, None]
    res = min_norm_weights(gram, iters=200_000, tol=1e-14, scale=scale)
    np.testing.assert_allclose(res.weights, _qp(unit @ unit.T), atol=1e-6)


def test_two_orthogonal_unit_vectors_get_half_each():
    res = min_norm_weights(np.eye(2))
    np.testing.assert_allclose(res.weights, [0.5, 0.5])
    assert res.value == pytest.approx(0.5)


@pytest.mark.parametrize("vecs", [[[0.0, 0.0], [1.0, 2.0]], [[3.0, 1.0], [0.0, 0.0], [1.0, -2.0]]])
def test_a_zero_vector_takes_all_the_weight(vecs):
    v = np.array(vecs)
    res = min_norm_weights(v @ v.T)
    zero = int(np.flatnonzero(~v.any(axis=1))[0])
    assert res.weights[zero] == pytest.approx(1.0, abs=1e-6)
    assert res.value == pytest.approx(0.0, abs=1e-12)


def test_collinear_opposite_vectors_cancel():
    v = np.array([[1.0, 1.0], [-2.0, -2.0]])  # 2/3 v - 1/3 (2 v) = 0
    res = min_norm_weights(v @ v.T)
    np.testing.assert_allclose(res.weights, [2 / 3, 1 / 3])
    assert res.value == pytest.approx(0.0, abs=1e-12)


def _best_pair_by_loops(gram):
    best = None
    for i in range(len(gram)):
        for j in range(i + 1, len(gram)):
            a, b, c = gram[i, i], gram[i, j], gram[j, j]
            cost = a if b >= a else c if b >= c else c - (c - b) ** 2 / (a + c - 2 * b)
            if best is None or cost < best[3]:
                best = (i, j, two_point(a, b, c), cost)
    return best


@pytest.mark.parametrize("block_elems", [1, 40, 10**7])
def test_best_pair_matches_the_pairwise_loop_in_any_block_size(block_elems):
    rng = np.random.default_rng(3)
    v = rng.normal(size=(40, 5)) + rng.normal(size=5)
    gram = v @ v.T
    i, j, c, cost = best_pair(gram, block_elems=block_elems)
    ri, rj, rc, rcost = _best_pair_by_loops(gram)
    assert (i, j) == (ri, rj)
    assert c == pytest.approx(rc) and cost == pytest.approx(rcost)


# ------------------------------------------------------------------ pure metrics
def test_e_lud_by_hand():
    x = _model(0.0, 0.0)
    # g1 = (1, 0), g2 = (0, 1): sqrt(mean ||g||^2) = 1, ||mean g|| = sqrt(0.5)
    assert e_lud(x, [_model(-1.0, 0.0), _model(0.0, -1.0)]) == pytest.approx(math.sqrt(2.0))
    assert e_lud(x, [_model(2.0, 2.0), _model(2.0, 2.0)]) == pytest.approx(1.0)  # identical updates
    assert e_lud(x, [_model(1.0, 0.0), _model(-1.0, 0.0)]) is None  # mean update zero


@pytest.mark.parametrize("block_bytes", [1, 16, 2**20])
def test_e_lud_by_hand_in_any_block_size(monkeypatch, block_bytes):
    monkeypatch.setattr(diagnostics, "BLOCK_BYTES", block_bytes)
    x = _model(0.0, 0.0)
    # g = (1, 0), (0, 1), (1, 1): mean ||g||^2 = (1 + 1 + 2) / 3, mean g = (2/3, 2/3)
    clients = [_model(-1.0, 0.0), _model(0.0, -1.0), _model(-1.0, -1.0)]
    assert e_lud(x, clients) == pytest.approx(math.sqrt(4 / 3) / math.sqrt(8 / 9))


def test_projection_at_sixty_degrees_by_hand():
    d = np.array([1.0, 0.0])
    d_tilde = np.array([1.0, SQRT3])  # |d~| = 2 at 60 degrees from d: projection length 2 cos 60 = 1
    assert projection_coefficient(d_tilde, d) == pytest.approx(1.0)
    assert projection_coefficient(d_tilde, 3 * d) == pytest.approx(1 / 3)  # (<d~,3d>/<3d,3d>) 3d = d
    assert projection_coefficient(d_tilde, np.zeros(2)) is None


# ------------------------------------------------------------------ bookkeeping
def test_momenta_follow_client_ids_over_two_rounds():
    core = AwareCore(3, momentum=0.5)
    x = _model(0.0, 0.0)
    # round 1: clients 0, 2 -> m0 = (0.5, 0), m1 = 0, m2 = (0, 1)
    assert core.direction(x, [_up(0, x["w"], [1, 0]), _up(2, x["w"], [0, 2])]) is None
    np.testing.assert_allclose(core.store.get(np.arange(3)), [[0.5, 0], [0, 0], [0, 1]])
    # round 2, replies in the order 2, 1: m2 = 0.5 (0, 1) + 0.5 (0, 4) = (0, 2.5), m1 = (1, 1)
    d = core.direction(x, [_up(2, x["w"], [0, 4]), _up(1, x["w"], [2, 2])])
    np.testing.assert_allclose(core.store.get(np.arange(3)), [[0.5, 0], [1, 1], [0, 2.5]])
    np.testing.assert_allclose(core.gram, [[0.25, 0.5, 0], [0.5, 2, 2.5], [0, 2.5, 6.25]])
    # min-norm point on the segment m0-m2: lambda0 = 6.25 / 6.5 = 25/26, m1 unused
    np.testing.assert_allclose(core.last_weights, [25 / 26, 0, 1 / 26], atol=1e-9)
    np.testing.assert_allclose(d, [25 / 52, 2.5 / 26], atol=1e-9)


def test_warmup_is_fedavg_until_every_client_trained_then_aware():
    agg = FedAwareAggregator(3, momentum=0.5)
    x = _model(0.0, 0.0)
    # round 1 (clients 0, 1; 1 and 3 examples): FedAvg of x_i = (-1, 0), (0, -1)
    x1 = agg.aggregate(1, x, [_up(0, x["w"], [1, 0], 1), _up(1, x["w"], [0, 1], 3)])
    np.testing.assert_allclose(x1["w"], [-0.25, -0.75])
    assert agg.round_metrics()["aware_phase"] == "warmup"
    # round 2: client 2 completes the set; m = (0.5, 0), (0, 0.5), (0.5, 0.5) -> d = (0.25, 0.25)
    x2 = agg.aggregate(2, x1, [_up(2, x1["w"], [1, 1])])
    np.testing.assert_allclose(x2["w"], [-0.5, -1.0], atol=1e-9)
    m = agg.round_metrics()
    assert m["aware_phase"] == "aware" and m["aware_nonzero"] == 2
    # d = (0.25, 0.25) is the midpoint of m0 and m1; m2 = (0.5, 0.5) gets no weight
    assert m["aware_weights"] == {"0": 0.5, "1": 0.5}


def test_warmup_rounds_ends_a_warmup_that_a_silent_client_would_hold_for_ever():
    # client 2 is online every round but never replies (a straggler past the deadline)
    agg = FedAwareAggregator(3, momentum=1.0, warmup_rounds=2)
    agg.bind(SimpleNamespace(facts=RoundFacts(round=1, online=np.array([0, 1, 2]))))
    x = _model(0.0, 0.0)
    phases = []
    for t in (1, 2, 3):
        x = agg.aggregate(t, x, [_up(0, x["w"], [1, 0]), _up(1, x["w"], [0, 1], 3)])
        phases.append(agg.round_metrics()["aware_phase"])
    # Assert: two warm-up aggregations (FedAvg), then min-norm weights over the two momenta
    assert phases == ["warmup", "warmup", "aware"]
    assert agg.round_metrics()["aware_weights"] == {"0": 0.5, "1": 0.5}
    unbounded = FedAwareAggregator(3, momentum=1.0)
    unbounded.bind(SimpleNamespace(facts=RoundFacts(round=1, online=np.array([0, 1, 2]))))
    for t in (1, 2, 3):
        unbounded.aggregate(t, x, [_up(0, x["w"], [1, 0]), _up(1, x["w"], [0, 1], 3)])
    assert unbounded.round_metrics()["aware_phase"] == "warmup"


def test_a_warmup_held_by_a_client_that_never_replies_is_warned_about_once(caplog):
    # 2 of 3 clients reply every round: the warm-up needs ceil(3 / 2) = 2 aggregations when
    # all reply; after 3 x 2 = 6 it says so (once), naming the option that ends it
    agg = FedAwareAggregator(3, momentum=1.0)
    agg.bind(SimpleNamespace(facts=RoundFacts(round=1, online=np.array([0, 1, 2]))))
    x = _model(0.0, 0.0)
    said = []
    for t in range(1, 10):
        with caplog.at_level(logging.WARNING, logger="flwr"):
            agg.aggregate(t, x, [_up(0, x["w"], [1, 0]), _up(1, x["w"], [0, 1])])
        said.append(sum("warm-up is not ending" in r.getMessage() for r in caplog.records))
    assert said == [0, 0, 0, 0, 0, 0, 1, 1, 1]
    assert "1 online client(s) have no momentum" in caplog.records[-1].getMessage()
    assert "warmup_rounds=W" in caplog.records[-1].getMessage()


def test_without_warmup_aware_starts_at_once():
    agg = FedAwareAggregator(3, momentum=1.0, warmup=False)
    x = _model(0.0, 0.0)
    x1 = agg.aggregate(1, x, [_up(0, x["w"], [1, 0]), _up(1, x["w"], [0, 1], 3)])
    np.testing.assert_allclose(x1["w"], [-0.5, -0.5])  # min-norm of (1,0), (0,1); data sizes ignored
    assert agg.round_metrics()["aware_phase"] == "aware"


def test_with_churn_warmup_waits_only_for_the_online_clients():
    agg = FedAwareAggregator(4, momentum=1.0)
    agg.bind(SimpleNamespace(facts=RoundFacts(round=1, online=np.array([0, 1]))))
    x = _model(0.0, 0.0)
    agg.aggregate(1, x, [_up(0, x["w"], [1, 0]), _up(1, x["w"], [0, 1])])
    assert agg.round_metrics()["aware_phase"] == "aware"  # clients 2, 3 never online yet


def test_normalize_solves_on_unit_momenta():
    x = _model(0.0, 0.0)
    ups = [_up(0, x["w"], [2, 0]), _up(1, x["w"], [0, 1])]
    raw = FedAwareAggregator(2, momentum=1.0, warmup=False).aggregate(1, x, ups)
    # raw: lambda = (1/5, 4/5) (inverse squared norms) -> d = (0.4, 0.8)
    np.testing.assert_allclose(raw["w"], [-0.4, -0.8], atol=1e-9)
    unit = FedAwareAggregator(2, momentum=1.0, warmup=False, normalize=True).aggregate(1, x, ups)
    np.testing.assert_allclose(unit["w"], [-0.5, -0.5], atol=1e-9)  # (1/2)(1, 0) + (1/2)(0, 1)


def test_rescale_sets_the_step_to_the_mean_update_norm():
    x = _model(0.0, 0.0)
    ups = [_up(0, x["w"], [2, 0]), _up(1, x["w"], [0, 1])]
    agg = FedAwareAggregator(2, momentum=1.0, warmup=False, normalize=True, rescale=True)
    out = agg.aggregate(1, x, ups)
    assert np.linalg.norm(out["w"]) == pytest.approx(1.5)  # mean of ||g|| = 2 and 1
    np.testing.assert_allclose(out["w"][0], out["w"][1])


@pytest.mark.parametrize(
    "departed, weight2, kept", [("keep", 1 / 3, True), ("exclude", 0.0, True), ("drop", 0.0, False)]
)
def test_departed_clients(departed, weight2, kept):
    agg = FedAwareAggregator(3, momentum=1.0, warmup=False, departed=departed)
    x = _model(0.0, 0.0)
    agg.bind(SimpleNamespace(facts=RoundFacts(round=1, online=np.array([0, 1, 2]))))
    agg.aggregate(1, x, [_up(0, x["w"], [1, 0]), _up(1, x["w"], [0, 1]), _up(2, x["w"], [-1, -1])])
    agg.bind(SimpleNamespace(facts=RoundFacts(round=2, online=np.array([0, 1]))))  # client 2 left
    agg.aggregate(2, x, [_up(0, x["w"], [1, 0])])
    assert agg.core.last_weights[2] == pytest.approx(weight2, abs=1e-6)
    assert bool(agg.core.has[2]) is kept


@pytest.mark.parametrize(
    "max_age, step, age", [(None, [-1.0, -1.0], 0.5), (1, [-1.0, -1.0], 0.5), (0, [-2.0, 0.0], 0.0)]
)
def test_max_age_leaves_stale_momenta_out_of_the_solve(max_age, step, age):
    # round 1: m0 = (2, 0), m1 = (0, 2); round 2: only client 0 trains (m0 = (2, 0) again),
    # so m1 is 1 aggregation old. With it: the min-norm point (1, 1), lambda = (1/2, 1/2),
    # lambda-weighted age 1/2; with max_age = 0 only m0 is solved over: d = (2, 0), age 0.
    agg = FedAwareAggregator(2, momentum=1.0, warmup=False, max_age=max_age)
    x = _model(0.0, 0.0)
    agg.aggregate(1, x, [_up(0, x["w"], [2, 0]), _up(1, x["w"], [0, 2])])
    out = agg.aggregate(2, x, [_up(0, x["w"], [2, 0])])
    np.testing.assert_allclose(out["w"], step, atol=1e-6)
    assert agg.round_metrics()["aware_age"] == pytest.approx(age, abs=1e-6)
    assert bool(agg.core.has[1])  # left out of the solve, not forgotten
    out = agg.aggregate(3, x, [_up(1, x["w"], [0, 2])])  # client 1 trains again: back in
    np.testing.assert_allclose(out["w"], [-1.0, -1.0] if max_age != 0 else [0.0, -2.0], atol=1e-6)


def test_max_age_survives_a_checkpoint():
    a = FedAwareAggregator(2, momentum=1.0, warmup=False, max_age=0)
    x = _model(0.0, 0.0)
    a.aggregate(1, x, [_up(0, x["w"], [2, 0]), _up(1, x["w"], [0, 2])])
    b = FedAwareAggregator(2, momentum=1.0, warmup=False, max_age=0)
    b.load_state_dict(a.state_dict())
    np.testing.assert_allclose(b.aggregate(2, x, [_up(0, x["w"], [2, 0])])["w"], [-2.0, 0.0], atol=1e-6)


def test_bad_max_age_fails_at_load():
    with pytest.raises(ConfigError, match="aware.max_age"):
        load_scenario(None, ["strategy.aggregator.name=fedaware", "strategy.aggregator.aware.max_age=-1"])


# ------------------------------------------------------------------ plug-in
def test_plugin_steps_along_the_projection_sixty_degrees():
    # FedAvg direction d~ = (1, sqrt 3) (sizes 3:1), AWARE d = (1, 0): 60 degrees apart,
    # projection length |d~| cos 60 = 1 -> x_new = x - (1, 0)
    plug = AwarePlugin(FedAvgAggregator(weighted=True), 2, momentum=1.0, warmup=False)
    x = _model(0.0, 0.0)
    out = plug.aggregate(1, x, [_up(0, x["w"], [1, 2 * SQRT3], 3), _up(1, x["w"], [1, -2 * SQRT3], 1)])
    np.testing.assert_allclose(out["w"], [-1.0, 0.0], atol=1e-9)
    m = plug.round_metrics()
    assert m["aware_coef"] == pytest.approx(-1.0)
    assert m["aware_cos"] == pytest.approx(-0.5)


def test_plugin_is_the_base_method_during_warmup():
    x = _model(0.0, 0.0)
    ups = [_up(0, x["w"], [1, 0]), _up(1, x["w"], [0, 1])]
    plain = FedAvgMAggregator(server_lr=1.0, momentum=0.9).aggregate(1, x, ups)
    plug = AwarePlugin(FedAvgMAggregator(server_lr=1.0, momentum=0.9), 3)
    np.testing.assert_allclose(plug.aggregate(1, x, ups)["w"], plain["w"])
    assert plug.round_metrics()["aware_phase"] == "warmup"


# ------------------------------------------------------------------ memory
def _layered_updates(rng, n, body_moves=False):
    x = OrderedDict(
        body=np.zeros(3, np.float32),
        **{"fc.weight": np.zeros((2, 2), np.float32)},
        **{"fc.bias": np.zeros(2, np.float32)},
    )
    ups = []
    for i in range(n):
        arrays = OrderedDict(
            body=(rng.normal(size=3) if body_moves else np.zeros(3)).astype(np.float32),
            **{
                "fc.weight": rng.normal(size=(2, 2)).astype(np.float32),
                "fc.bias": rng.normal(size=2).astype(np.float32),
            },
        )
        ups.append(ClientUpdate(i, 1, arrays))
    return x, ups


def test_last_layers_memory_gives_the_full_lambda_when_the_last_layer_carries_everything():
    x, ups = _layered_updates(np.random.default_rng(5), 5)
    full = AwareCore(5, momentum=1.0, warmup=False)
    last = AwareCore(5, momentum=1.0, warmup=False, memory="last-layers", layers=2)
    d_full, d_last = full.direction(x, ups), last.direction(x, ups)
    assert last.store.dim == 6 and full.store.dim == 9
    np.testing.assert_allclose(last.last_weights, full.last_weights, atol=1e-12)
    np.testing.assert_allclose(d_last, d_full, atol=1e-6)  # all clients trained: same step


@pytest.mark.parametrize("dtype, tol", [("float16", 5e-3), ("bfloat16", 3e-2)])
def test_low_precision_momenta_give_nearly_the_same_lambda(dtype, tol):
    # documented tolerance: float16 keeps ~3 decimal digits per entry, bfloat16 ~2
    x, ups = _layered_updates(np.random.default_rng(6), 6, body_moves=True)
    ref = AwareCore(6, warmup=False)
    low = AwareCore(6, warmup=False, dtype=dtype)
    ref.direction(x, ups), low.direction(x, ups)
    np.testing.assert_allclose(low.last_weights, ref.last_weights, atol=tol)


def test_store_bytes_per_dtype():
    assert MomentumStore(10, 100).nbytes == 10 * 100 * 4
    assert MomentumStore(10, 100, "float16").nbytes == 10 * 100 * 2 + 10 * 8  # + row scales
    assert MomentumStore(10, 100, "bfloat16").nbytes == 10 * 100 * 2 + 10 * 8


def test_float16_store_keeps_small_updates():
    store = MomentumStore(2, 3, "float16")
    rows = np.array([[1e-6, -3e-6, 2e-7], [0.0, 0.0, 0.0]])
    store.set(np.arange(2), rows)
    np.testing.assert_allclose(store.get(np.arange(2)), rows, rtol=1e-3)


# ------------------------------------------------------------------ sampler
def test_explore_first_samples_every_online_client_once_first():
    sampler = ExploreFirstSampler(UniformSampler(seed=1), seed=2)
    online, seen = np.arange(5), []
    x = _model(0.0)
    for r in range(1, 4):
        picked = sampler.sample(r, online, 2)
        seen.append(picked.tolist())
        sampler.observe(r, [ClientUpdate(int(c), 1, x) for c in picked], x)
    assert sorted(seen[0] + seen[1]) == sorted(set(seen[0] + seen[1]))  # no repeats while exploring
    assert set(seen[0] + seen[1] + seen[2]) == set(range(5))


# ------------------------------------------------------------------ config
def test_aware_on_an_aggregator_it_cannot_wrap_is_refused():
    cfg = load_scenario(None, ["strategy.aggregator.name=fedaware", "strategy.aggregator.aware.enabled=true"])
    with pytest.raises(ConfigError, match="strategy.aggregator.aware.enabled"):
        check_parts(cfg)


def test_aware_true_wraps_the_server_optimiser():
    cfg = load_scenario(None, ["strategy.aggregator.name=fedavgm", "strategy.aggregator.aware.enabled=true"])
    strategy = build_strategy(cfg, None)
    assert isinstance(strategy.aggregator, AwarePlugin) and isinstance(strategy.aggregator.base, FedAvgMAggregator)


def test_bad_departed_value_fails_at_load():
    with pytest.raises(ConfigError, match="aware.departed"):
        load_scenario(None, ["strategy.aggregator.aware.departed=forget"])


# ------------------------------------------------------------------ end to end
@pytest.mark.parametrize(
    "aggregator",
    [
        ["strategy.aggregator.name=fedaware"],
        [
            "strategy.aggregator.name=fedavgm",
            "strategy.aggregator.aware.enabled=true",
            "strategy.aggregator.server_lr=0.5",
        ],
    ],
)
def test_three_rounds_through_the_client_app(tmp_path, isolated_cache, aggregator):
    cfg = load_scenario(
        None,
        [
            "num_clients=6",
            "rounds=3",
            "dataset.samples_per_client=30",
            "churn.kind=none",
            "strategy.sampler.clients_per_round=6",
            "output.progress=off",
            "output.plots=false",
            *aggregator,
        ],
    )
    run_server(LocalGrid(client_app, cfg.num_clients), cfg, tmp_path / "out")
    rows = read_metrics(tmp_path / "out")
    # all 6 train in round 1: every client has a momentum after it, so AWARE already steps
    assert [r["aware_phase"] for r in rows] == ["aware", "aware", "aware"]
    assert all(isinstance(r["e_lud"], float) and r["e_lud"] >= 1.0 for r in rows)  # sqrt(E|g|^2) >= |E g|
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["e_ludd"] == pytest.approx(np.mean([r["e_lud"] for r in rows]))
    assert all(np.isfinite(r["test_accuracy"]) for r in rows)


def test_checkpointed_state_continues_identically():
    x, ups = _layered_updates(np.random.default_rng(7), 4, body_moves=True)
    a = FedAwareAggregator(4, warmup=False, memory="last-layers", dtype="float16")
    a.aggregate(1, x, ups[:3])
    b = FedAwareAggregator(4, warmup=False, memory="last-layers", dtype="float16")
    b.load_state_dict(a.state_dict())
    out_a, out_b = a.aggregate(2, x, ups[1:]), b.aggregate(2, x, ups[1:])
    for key in out_a:
        np.testing.assert_array_equal(out_a[key], out_b[key])


def test_explore_first_is_wired_from_the_config():
    from fedflex.loader import load_scenario
    from fedflex.strategies.build import build_strategy

    cfg = load_scenario(
        None, ["strategy.sampler.explore_first=true", "num_clients=6", "strategy.sampler.clients_per_round=2"]
    )
    strategy = build_strategy(cfg, None)
    assert strategy.sampler.summary().startswith("explore-first(uniform")
    # 3 rounds of 2 cover all 6 clients once, whatever the draw
    seen = []
    for t in range(1, 4):
        picks = strategy.sampler.sample(t, np.arange(6), 2)
        strategy.sampler.observe(t, [ClientUpdate(int(c), 1, OrderedDict()) for c in picks], OrderedDict())
        seen += picks.tolist()
    assert sorted(seen) == list(range(6))


# ------------------------------------------------------------------ away-step solver
@pytest.mark.parametrize("seed", range(6))
def test_away_steps_match_a_generic_qp_solver_to_its_gap(seed):
    # Prepare: 12 vectors around a shared direction (the optimum has a few nonzero weights)
    rng = np.random.default_rng(seed)
    v = rng.normal(size=(12, 6)) + rng.normal(size=6)
    gram = v @ v.T
    reference = _qp(gram)

    # Execute
    res = min_norm_away_steps(gram, iters=5000, gap_tol=1e-10)

    # Assert: on the simplex, as good as SLSQP, and the gap certifies it
    assert res.weights.min() >= 0 and res.weights.sum() == pytest.approx(1.0, abs=1e-12)
    assert res.value <= reference @ gram @ reference + 1e-9
    assert res.relative_gap <= 1e-10


def test_away_steps_drop_a_vertex_that_is_not_in_the_optimum():
    # v1 = (1, 0), v2 = (0, 1), v3 = (2, 2): the hull's point nearest 0 is (1/2, 1/2),
    # reached by v1 and v2 alone; norm^2 1/2
    v = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]])
    res = min_norm_away_steps(v @ v.T, gap_tol=1e-12)
    assert res.weights.tolist() == pytest.approx([0.5, 0.5, 0.0], abs=1e-9)
    assert res.value == pytest.approx(0.5)


def test_capped_frank_wolfe_reports_the_gap_it_stopped_at():
    # Frank-Wolfe's 1/k rate: after 5 iterations its gap is still open, and the value
    # exceeds the away-step optimum by at most twice that gap
    rng = np.random.default_rng(3)
    v = rng.normal(size=(30, 8)) + rng.normal(size=8)
    gram = v @ v.T
    capped = min_norm_weights(gram, iters=5, tol=0.0)
    best = min_norm_away_steps(gram, iters=5000, gap_tol=1e-12)
    assert capped.gap > 0
    assert best.value <= capped.value <= best.value + 2 * capped.gap + 1e-12


def test_aware_solver_option_is_checked_at_load():
    with pytest.raises(ConfigError, match="strategy.aggregator.aware.solver"):
        load_scenario(None, ["strategy.aggregator.name=fedaware", "strategy.aggregator.aware.solver=newton"])
