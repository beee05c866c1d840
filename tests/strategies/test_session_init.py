"""Session-aware initialisation (churn paper): softmin weights, pilot, history, and the
end-to-end flow with its extra gradient rounds; baselines previous / average."""

from collections import OrderedDict

import numpy as np
import pytest

import fedflex.clients.runtime as runtime
from fedflex.checks import ConfigError
from fedflex.clients.client_app import app as client_app
from fedflex.launch.local_grid import LocalGrid
from fedflex.launch.server import run_server
from fedflex.loader import load_scenario
from fedflex.results import read_metrics
from fedflex.strategies.session_init import (
    AverageInitializer,
    SessionAwareInitializer,
    mean_models,
    session_distance,
    session_recurs,
    softmin_weights,
    weight_slices,
)


def test_softmin_with_zero_scale_is_the_plain_mean():
    np.testing.assert_allclose(softmin_weights(np.array([0.1, 5.0, 30.0]), 0.0), [1 / 3, 1 / 3, 1 / 3])


def test_softmin_with_large_scale_picks_the_nearest():
    np.testing.assert_allclose(softmin_weights(np.array([2.0, 0.5, 1.0]), 1e4), [0.0, 1.0, 0.0], atol=1e-12)


def test_softmin_splits_exact_ties_evenly():
    np.testing.assert_allclose(softmin_weights(np.array([1.0, 3.0, 1.0]), 1e4), [0.5, 0.0, 0.5], atol=1e-12)


def test_softmin_by_hand_and_stable_for_huge_distances():
    # R = ln 2: weights proportional to 2^-d: d = (0, 1) -> (2/3, 1/3)
    np.testing.assert_allclose(softmin_weights(np.array([0.0, 1.0]), np.log(2)), [2 / 3, 1 / 3])
    w = softmin_weights(np.array([1000.0, 1001.0]), 800.0)  # exp(-800000) underflows unshifted
    assert np.all(np.isfinite(w)) and w[0] == pytest.approx(1.0)


def _m(v, counter=0):
    return OrderedDict(w=np.array(v, dtype=np.float32), n=np.array(counter, dtype=np.int64))


def test_mean_models_weights_floats_and_carries_counters():
    out = mean_models([_m([1.0, 0.0], 5), _m([3.0, 4.0], 9)], np.array([0.25, 0.75]), like=_m([0.0, 0.0], 7))
    np.testing.assert_allclose(out["w"], [2.5, 3.0])  # 0.25*1 + 0.75*3, 0.75*4
    assert out["n"] == 7


class FakeCtx:
    """train_round adds a fixed per-session 'gradient' to the model it starts from."""

    def __init__(self):
        self.calls = []
        self.step = None
        self.global_arrays = None

    def train_round(self, server_round, arrays, clients, phase, isolated=False):
        self.calls.append((server_round, phase, list(clients), arrays["w"].copy()))
        return OrderedDict(w=arrays["w"] + self.step, n=arrays["n"])


def _run_sessions(init, ctx, plan, metrics=None):
    """plan: (session, online, gradient step, last model of the session); ``metrics``, when
    given, receives the initializer's round metrics after each session start."""
    starts = []
    for i, (session, online, step, last) in enumerate(plan):
        ctx.step = np.array(step, dtype=np.float32)
        starts.append(init.on_session_start(i + 1, session, np.array(online), _m([9.0, 9.0])))
        if metrics is not None:
            metrics.append(init.round_metrics())
        init.on_round_end(i + 1, session, _m(last))
    return starts


def test_session_aware_pilot_then_weights_from_gradient_distance():
    init = SessionAwareInitializer(
        pilot_sessions=1, gradient_rounds=1, similarity_scale=np.log(2), clients_per_round=10
    )
    ctx = FakeCtx()
    init.bind(ctx)
    starts = _run_sessions(
        init,
        ctx,
        [
            (0, [0, 1], [0, 0], [1.0, 1.0]),  # pilot session: no gradient round, keeps the model
            (1, [2, 3], [1, 0], [5.0, 5.0]),  # G1 = (1, 0); no history yet: keeps the model
            (2, [0, 1], [0, 1], [7.0, 7.0]),  # G2 = (0, 1); history [(w1, G1)]: starts from w1
            (3, [2, 3], [1, 0], [0.0, 0.0]),  # G3 = (1, 0): d = (0, sqrt 2) -> weights 2^0, 2^-sqrt2
        ],
    )
    assert starts[0] is None and starts[1] is None
    np.testing.assert_allclose(starts[2]["w"], [5.0, 5.0])
    a = np.array([1.0, 2 ** -np.sqrt(2)])
    a /= a.sum()
    np.testing.assert_allclose(starts[3]["w"], a[0] * 5.0 + a[1] * 7.0, rtol=1e-6)
    # gradient rounds start from the pilot (the last model of session 0), once per later session
    assert [c[1] for c in ctx.calls] == ["session-init"] * 3
    for call in ctx.calls:
        np.testing.assert_allclose(call[3], [1.0, 1.0])


def test_session_recurs_by_hand():
    # the latest stored session is the last entry; an older one must be closer by the margin
    assert session_recurs(np.array([0.5, 1.0]), 0.5)  # 0.5 <= (1 - 0.5) * 1.0
    assert not session_recurs(np.array([0.51, 1.0]), 0.5)
    assert session_recurs(np.array([0.9, 2.0, 1.0]), 0.1)  # 0.9 <= 0.9
    assert not session_recurs(np.array([0.95, 2.0, 1.0]), 0.1)
    assert not session_recurs(np.array([0.0]), 0.0)  # one stored session: nothing older


def test_switch_margin_keeps_the_model_unless_an_older_session_recurs():
    """The plan of the test above plus a fifth session whose gradient is nearest the
    latest session's: with switch_margin 0.5 sessions 2 and 4 keep the current model,
    session 3 (G3 = G1, an older session recurs) gets the paper's softmin start."""
    plan = [
        (0, [0, 1], [0, 0], [1.0, 1.0]),
        (1, [2, 3], [1, 0], [5.0, 5.0]),  # G1 = (1, 0)
        (2, [0, 1], [0, 1], [7.0, 7.0]),  # G2 = (0, 1); one stored session: keep (paper: w1)
        (3, [2, 3], [1, 0], [0.0, 0.0]),  # G3 = (1, 0): d = (0, sqrt 2), 0 <= 0.5 sqrt 2: switch
        (4, [0, 1], [1.1, 0], [3.0, 3.0]),  # G4: d = (0.1, ~1.49, 0.1); 0.1 > 0.5 * 0.1: keep
    ]
    init = SessionAwareInitializer(similarity_scale=np.log(2), switch_margin=0.5)
    ctx = FakeCtx()
    init.bind(ctx)
    metrics = []
    starts = _run_sessions(init, ctx, plan, metrics)
    assert starts[0] is None and starts[1] is None and starts[2] is None and starts[4] is None
    a = np.array([1.0, 2 ** -np.sqrt(2)])
    a /= a.sum()
    np.testing.assert_allclose(starts[3]["w"], a[0] * 5.0 + a[1] * 7.0, rtol=1e-6)
    assert [m.get("init_switched") for m in metrics] == [None, None, 0, 1, 0]
    np.testing.assert_allclose(metrics[4]["init_distances"], [0.1, np.sqrt(1.21 + 1), 0.1], atol=1e-6)
    assert "init_weights" not in metrics[4]
    # a kept start still stores its session: session 4's gradient is in the history's list
    assert len(ctx.calls) == 4 and 4 in init.gradients
    # without the margin (the paper), session 2 starts from w1
    paper = SessionAwareInitializer(similarity_scale=np.log(2))
    ctx = FakeCtx()
    paper.bind(ctx)
    np.testing.assert_allclose(_run_sessions(paper, ctx, plan[:3])[2]["w"], [5.0, 5.0])


@pytest.mark.parametrize("margin", [-0.1, 1.0, float("nan")])
def test_switch_margin_out_of_range_is_a_config_error(margin):
    with pytest.raises(ConfigError, match="switch_margin"):
        SessionAwareInitializer(switch_margin=margin)


def test_weight_slices_keep_kernels_and_skip_biases_and_counters():
    like = OrderedDict(
        conv=np.zeros((2, 3), np.float32),  # flat 0..6
        conv_bias=np.zeros(2, np.float32),  # 6..8, 1-D: left out
        count=np.array(3, np.int64),  # not float: not in the flat vector at all
        fc=np.zeros((1, 2), np.float32),  # 8..10
    )
    assert weight_slices(like) == [slice(0, 6), slice(8, 10)]
    # no kernel at all: every float entry counts
    assert weight_slices(OrderedDict(w=np.zeros(2, np.float32), b=np.zeros(1, np.float32))) == [
        slice(0, 2),
        slice(2, 3),
    ]


def test_normalized_distance_by_hand():
    parts = [slice(0, 2), slice(2, 4)]
    g_s = np.array([3.0, 0.0, 0.0, 5.0])
    g_z = np.array([0.0, 2.0, 0.0, 0.5])  # first tensor orthogonal (sqrt 2), second same direction (0)
    assert session_distance(g_s, g_z, "normalized", parts) == pytest.approx(np.sqrt(2) / 2)
    assert session_distance(g_s, g_z, "l2") == pytest.approx(np.sqrt(9 + 4 + 4.5**2))
    # opposite directions: 2 per tensor; a zero tensor stays zero (distance 1 to any unit vector)
    assert session_distance(g_s, -g_s, "normalized", parts) == pytest.approx(2.0)
    assert session_distance(np.zeros(2), np.array([0.0, 7.0]), "normalized") == pytest.approx(1.0)
    with pytest.raises(ValueError, match="distance"):
        session_distance(g_s, g_z, "cosine")


def test_normalized_distance_ignores_the_gradient_scale():
    """Same directions, 4x longer gradient in session 1: l2 sees a distance of 3, the
    authors' normalised distance none, so session 3 starts from w1 alone."""
    plan = [
        (0, [0, 1], [0, 0], [1.0, 1.0]),
        (1, [2, 3], [4, 0], [5.0, 5.0]),  # G1 = (4, 0)
        (2, [0, 1], [0, 1], [7.0, 7.0]),  # G2 = (0, 1)
        (3, [2, 3], [1, 0], [0.0, 0.0]),  # G3 = (1, 0)
    ]
    starts = {}
    for distance in ("l2", "normalized"):
        init = SessionAwareInitializer(similarity_scale=np.log(2), distance=distance)
        ctx = FakeCtx()
        init.bind(ctx)
        starts[distance] = _run_sessions(init, ctx, plan)[3]["w"]
    # l2: d = (3, sqrt 2) -> weights proportional to (2^-3, 2^-sqrt2)
    a = np.array([2.0**-3, 2 ** -np.sqrt(2)])
    a /= a.sum()
    np.testing.assert_allclose(starts["l2"], a[0] * 5.0 + a[1] * 7.0, rtol=1e-6)
    # normalized (the 1-D test model has no kernel, so all of it): d = (0, sqrt 2)
    b = np.array([1.0, 2 ** -np.sqrt(2)])
    b /= b.sum()
    np.testing.assert_allclose(starts["normalized"], b[0] * 5.0 + b[1] * 7.0, rtol=1e-6)
    with pytest.raises(ValueError, match="distance"):
        SessionAwareInitializer(distance="cos")


def test_session_aware_uses_the_model_after_v_rounds():
    init = SessionAwareInitializer(pilot_sessions=1, gradient_rounds=3, similarity_scale=1.0)
    ctx = FakeCtx()
    init.bind(ctx)
    _run_sessions(init, ctx, [(0, [0], [0, 0], [0.0, 0.0]), (1, [1], [2, 0], [1.0, 1.0])])
    assert len(ctx.calls) == 3
    np.testing.assert_allclose(init.gradients[1], [6.0, 0.0])  # 3 rounds of +2: u_V - pilot


def test_session_aware_pilot_is_the_mean_of_the_first_p_sessions():
    init = SessionAwareInitializer(pilot_sessions=2, gradient_rounds=1)
    ctx = FakeCtx()
    init.bind(ctx)
    _run_sessions(init, ctx, [(0, [0], [0, 0], [2.0, 0.0]), (1, [1], [0, 0], [4.0, 2.0]), (2, [0], [1, 1], [0.0, 0.0])])
    np.testing.assert_allclose(init.pilot["w"], [3.0, 1.0])
    assert len(ctx.calls) == 1  # only session 2 (>= P) runs a gradient round


def test_gradient_round_clients_are_drawn_from_the_online_set():
    init = SessionAwareInitializer(pilot_sessions=1, clients_per_round=2, seed=1)
    ctx = FakeCtx()
    init.bind(ctx)
    _run_sessions(init, ctx, [(0, [0], [0, 0], [0.0, 0.0]), (1, [3, 4, 5, 6], [1, 0], [0.0, 0.0])])
    chosen = ctx.calls[0][2]
    assert len(chosen) == 2 and set(chosen) <= {3, 4, 5, 6}


def test_average_starts_from_the_mean_of_earlier_last_models():
    init = AverageInitializer()
    starts = _run_sessions(
        init, FakeCtx(), [(0, [0], [0, 0], [2.0, 0.0]), (1, [1], [0, 0], [4.0, 2.0]), (2, [0], [0, 0], [0.0, 0.0])]
    )
    assert starts[0] is None
    np.testing.assert_allclose(starts[1]["w"], [2.0, 0.0])
    np.testing.assert_allclose(starts[2]["w"], [3.0, 1.0])


def test_a_session_whose_start_was_skipped_still_closes_the_one_before():
    init = AverageInitializer()
    init.on_round_end(1, 0, _m([2.0, 2.0]))
    init.on_round_end(2, 1, _m([4.0, 4.0]))  # session 1's start round was skipped: no on_session_start
    start = init.on_session_start(3, 2, np.array([0]), _m([0.0, 0.0]))
    np.testing.assert_allclose(start["w"], [3.0, 3.0])


# ----------------------------------------------------------------------- end to end
@pytest.fixture()
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDFLEX_CACHE", str(tmp_path / "cache"))
    runtime.get_task.cache_clear()
    yield tmp_path
    runtime.get_task.cache_clear()


ALTERNATING = [
    "num_clients=4",
    "rounds=6",
    "dataset.samples_per_client=30",
    "output.progress=off",
    "output.plots=false",
    "churn.kind=sessions",
    "churn.sessions=[[0,1],[2,3]]",
    "churn.rounds_per_session=2",
    "strategy.sampler.clients_per_round=2",
    "evaluation.online_labels=true",
    "evaluation.transition_window=2",
]


@pytest.mark.parametrize("rule", ["sgd", "scaffold"])
def test_session_aware_runs_logged_gradient_rounds(isolated, rule):
    cfg = load_scenario(
        None, ALTERNATING + ["strategy.initializer.name=session-aware", f"strategy.local_rule.name={rule}"]
    )
    run_server(LocalGrid(client_app, 4), cfg, isolated / "out")
    rows = read_metrics(isolated / "out")
    init_rows = [r for r in rows if r["phase"] == "session-init"]
    # sessions start at rounds 1, 3, 5; P = 1: gradient rounds at the starts of sessions 1 and 2
    assert [r["round"] for r in init_rows] == [3, 5]
    assert [r["sampled"] for r in init_rows] == [[2, 3], [0, 1]]
    train = [r for r in rows if r["phase"] == "train"]
    assert [r["round"] for r in train] == [1, 2, 3, 4, 5, 6]
    assert all(r["online_accuracy"] is not None for r in train)


def test_summary_lists_each_transition(isolated):
    import json

    cfg = load_scenario(None, ALTERNATING + ["strategy.initializer.name=average"])
    run_server(LocalGrid(client_app, 4), cfg, isolated / "out")
    summary = json.loads((isolated / "out" / "summary.json").read_text())
    rows = read_metrics(isolated / "out")
    assert [t["round"] for t in summary["transitions"]] == [3, 5]
    first = [r["online_accuracy"] for r in rows if r["round"] in (3, 4)]
    assert summary["transitions"][0]["mean_online_accuracy"] == pytest.approx(sum(first) / 2)
    assert summary["rounds"] == 6


def test_session_distance_is_a_checked_option():
    from fedflex.config import ConfigError
    from fedflex.strategies.build import INITIALIZERS, federation
    from fedflex.strategies.parts import ModelInfo

    cfg = load_scenario(
        None,
        ALTERNATING
        + ["strategy.initializer.name=session-aware", "strategy.initializer.session_aware.distance=normalized"],
    )
    initializer = INITIALIZERS["session-aware"].build(cfg.strategy.initializer, federation(cfg, ModelInfo()))
    assert initializer.distance == "normalized"
    with pytest.raises(ConfigError, match="distance"):
        load_scenario(
            None,
            ALTERNATING
            + ["strategy.initializer.name=session-aware", "strategy.initializer.session_aware.distance=cos"],
        )


@pytest.mark.parametrize("gradient_state", ["shared", "isolated"])
def test_isolated_gradient_rounds_leave_the_server_momentum_as_it_was(isolated, gradient_state):
    """With switch_margin every start of ALTERNATING keeps the model (session 1 has no
    history, session 2 one stored session), so only the gradient rounds can make the run
    differ from `previous`: isolated they leave FedAvgM's momentum alone and the run is
    `previous` to the digit; shared the momentum carries the pilot's step into round 5.
    """
    base = ALTERNATING + ["strategy.aggregator.name=fedavgm", "strategy.aggregator.fedavgm.momentum=0.5"]
    accs = {}
    for name, extra in {
        "previous": ["strategy.initializer.name=previous"],
        "gated": [
            "strategy.initializer.name=session-aware",
            "strategy.initializer.session_aware.switch_margin=0.5",
            f"strategy.initializer.session_aware.gradient_state={gradient_state}",
        ],
    }.items():
        run_server(LocalGrid(client_app, 4), load_scenario(None, base + extra), isolated / name)
        rows = read_metrics(isolated / name)
        accs[name] = [r["test_accuracy"] for r in rows if r["phase"] == "train"]
        if name == "gated":
            assert [r["round"] for r in rows if r["phase"] == "session-init"] == [3, 5]
    assert accs["gated"][:2] == accs["previous"][:2]  # before the first gradient round
    if gradient_state == "isolated":
        assert accs["gated"] == accs["previous"]
    else:
        assert accs["gated"][2:] != accs["previous"][2:]


@pytest.mark.parametrize(
    "parts",
    [
        ["strategy.sampler.name=hics", "strategy.aggregator.name=fedaware", "strategy.local_rule.name=scaffold"],
        ["strategy.sampler.name=pow-d", "strategy.aggregator.name=fedadam", "strategy.local_rule.name=feddyn"],
        ["strategy.sampler.name=fedcor", "strategy.aggregator.name=fedavg", "strategy.local_rule.name=fedcm"],
    ],
)
def test_isolated_gradient_rounds_restore_every_stateful_part(isolated, parts):
    """Each part's state before round 1 loads back, and its own state is restored after."""
    cfg = load_scenario(
        None,
        ALTERNATING
        + parts
        + ["strategy.initializer.name=session-aware", "strategy.initializer.session_aware.gradient_state=isolated"],
    )
    run_server(LocalGrid(client_app, 4), cfg, isolated / "out")
    rows = read_metrics(isolated / "out")
    assert [r["round"] for r in rows if r["phase"] == "session-init"] == [3, 5]
    assert [r["round"] for r in rows if r["phase"] == "train"] == [1, 2, 3, 4, 5, 6]
