"""Every record a client sends is bounded (issue 45, item 2): a rule record (SCAFFOLD's
``scaffold-dc``, FedNova's ``fednova-d`` and ``fednova-a-norm``, BHerd's ``herd-g`` and
counts, FedCM's local steps) holds exactly the arrays every rule record of the run holds,
with the model's shapes and dtypes, and its norm is bounded relative to the round's
updates; ``clip_norm`` clips SCAFFOLD's record with the model and is refused where it
cannot protect."""

from collections import OrderedDict

import numpy as np
import pytest
from flwr.app import Array, MetricRecord, RecordDict

from fedflex import keys
from fedflex.arrays import numpy_to_record
from fedflex.clients.client_app import app as client_app
from fedflex.config import ConfigError
from fedflex.launch.local_grid import LocalGrid
from fedflex.launch.server import run_server
from fedflex.loader import load_scenario
from fedflex.results import read_metrics
from fedflex.strategies.combinations import check_parts
from fedflex.strategies.parts import ClientUpdate
from fedflex.strategies.replies import ReplyLimits, check_reply, pin_record_arrays, round_problems
from fedflex.strategies.robust import clip_records, clip_update

SCAFFOLD = ReplyLimits(records=(keys.SCAFFOLD_DC,))
BHERD = ReplyLimits(records=(keys.HERD_G,), metrics=(keys.HERD_TAU, keys.HERD_K, keys.HERD_ALPHA_I))


def _model():
    """Two trained float arrays, a float buffer no rule record holds, an int counter."""
    return OrderedDict(
        w=np.zeros(2, np.float32), b=np.zeros(1, np.float32), mean=np.zeros(1, np.float32), n=np.array(0, np.int64)
    )


def _params(value=1.0, dtype=np.float32):
    return OrderedDict(w=np.full(2, value, dtype), b=np.full(1, value, dtype))


def _reply(extras=None, n=10, arrays=None, **metrics):
    content = RecordDict(
        {
            keys.ARRAYS: numpy_to_record(arrays if arrays is not None else _model()),
            keys.METRICS: MetricRecord({keys.NUM_EXAMPLES: n, **metrics}),
        }
    )
    for name, record in (extras or {}).items():
        content[name] = numpy_to_record(record)
    return content


def _update(client, extras, n=10, arrays=None, **metrics):
    model = arrays if arrays is not None else _model()
    return ClientUpdate(client=client, num_examples=n, arrays=model, metrics=dict(metrics), extras=extras)


# ---------------------------------------------------------------------------- exactly the model's arrays
def test_the_record_arrays_are_pinned_by_the_rounds_majority_not_by_a_lone_reply():
    # Prepare: two honest replies hold w and b; a hostile one holds only w
    replies = [_reply({keys.SCAFFOLD_DC: _params()}) for _ in range(2)]
    replies.append(_reply({keys.SCAFFOLD_DC: OrderedDict(w=np.ones(2, np.float32))}))
    # Execute
    limits = pin_record_arrays(SCAFFOLD, replies, _model())
    # Assert: the model's order, and a pinned set stays pinned
    assert limits.record_arrays == ("w", "b")
    assert pin_record_arrays(limits, replies[2:], _model()) is limits


def test_a_scaffold_delta_holding_one_of_the_models_arrays_is_rejected():
    # Prepare: the run's rule records hold w and b
    limits = ReplyLimits(records=(keys.SCAFFOLD_DC,), record_arrays=("w", "b"))
    # Execute
    update, reason = check_reply(_reply({keys.SCAFFOLD_DC: OrderedDict(w=np.ones(2, np.float32))}), _model(), limits)
    # Assert
    assert update is None
    assert reason == "scaffold-dc lacks b: every scaffold-dc of this run holds the arrays w, b"


def test_a_record_with_an_array_the_others_do_not_hold_is_rejected():
    limits = ReplyLimits(records=(keys.SCAFFOLD_DC,), record_arrays=("w", "b"))
    record = OrderedDict(w=np.ones(2, np.float32), b=np.ones(1, np.float32), mean=np.ones(1, np.float32))
    update, reason = check_reply(_reply({keys.SCAFFOLD_DC: record}), _model(), limits)
    assert update is None
    assert reason == "scaffold-dc also holds mean: every scaffold-dc of this run holds the arrays w, b"


def test_a_record_of_another_float_dtype_than_the_models_is_rejected():
    update, reason = check_reply(_reply({keys.SCAFFOLD_DC: _params(dtype=np.float64)}), _model(), SCAFFOLD)
    assert update is None
    assert reason == "scaffold-dc/w has dtype float64, expected float32 like the model's"


def test_an_empty_record_is_rejected():
    update, reason = check_reply(_reply({keys.SCAFFOLD_DC: OrderedDict()}), _model(), SCAFFOLD)
    assert update is None
    assert reason == "scaffold-dc holds no arrays"


@pytest.mark.parametrize(
    "metrics, fragment",
    [
        ({keys.HERD_TAU: 5, keys.HERD_K: 6, keys.HERD_ALPHA_I: 1.0}, "herd-k is 6, more than the 5 local steps"),
        ({keys.HERD_TAU: 5, keys.HERD_K: 2.5, keys.HERD_ALPHA_I: 0.5}, "must be integers >= 0"),
        ({keys.HERD_TAU: -5, keys.HERD_K: 0, keys.HERD_ALPHA_I: 0.0}, "must be integers >= 0"),
        ({keys.HERD_TAU: 5, keys.HERD_K: 2, keys.HERD_ALPHA_I: -3.0}, "herd-alpha-i is -3.0, must be in [0, 1]"),
        ({keys.HERD_TAU: 5, keys.HERD_K: 0, keys.HERD_ALPHA_I: 0.0}, "herd-g is not zero, but herd-k is 0"),
    ],
)
def test_bherd_counts_that_do_not_fit_together_are_rejected(metrics, fragment):
    update, reason = check_reply(_reply({keys.HERD_G: _params()}, **metrics), _model(), BHERD)
    assert update is None
    assert fragment in reason


def test_a_negative_fednova_norm_is_rejected():
    limits = ReplyLimits(records=(keys.FEDNOVA_D,), metrics=(keys.FEDNOVA_A_NORM,))
    update, reason = check_reply(_reply({keys.FEDNOVA_D: _params()}, **{keys.FEDNOVA_A_NORM: -4.0}), _model(), limits)
    assert update is None
    assert reason == "fednova-a-norm is -4.0, must be >= 0"


# ---------------------------------------------------------------------------- bounded relative to the round
def _scaffold_round(scale_of_3=1.0, lr=0.1):
    """Four SCAFFOLD replies: update x - y = 0.1 (w, b), c = 0.25, dc = (x - y) / (K lr) - c
    with K = 2 local steps (so dc + c = 0.5); client 3's dc scaled by ``scale_of_3``."""
    c = _params(0.25)
    updates = []
    for client in range(4):
        y = _model()
        y["w"][:], y["b"][:] = -0.1, -0.1
        dc = OrderedDict((k, np.float32(0.1 / (2 * lr)) - c[k]) for k in c)
        if client == 3:
            dc = OrderedDict((k, v * np.float32(scale_of_3)) for k, v in dc.items())
        updates.append(_update(client, {keys.SCAFFOLD_DC: dc}, arrays=y))
    return updates, {keys.SCAFFOLD_C: c}


def test_honest_scaffold_replies_are_within_the_rounds_bounds():
    updates, sent = _scaffold_round()
    assert round_problems(updates, _model(), SCAFFOLD, "scaffold", sent, lr=0.1) == {}


def test_a_scaffold_delta_times_1e12_is_out_of_its_own_updates_bound():
    updates, sent = _scaffold_round(scale_of_3=1e12)
    problems = round_problems(updates, _model(), SCAFFOLD, "scaffold", sent, lr=0.1)
    assert list(problems) == [3]
    assert problems[3].startswith("scaffold-dc + scaffold-c has norm 4.33e+11, more than 100 x ||x - y|| / lr")


def test_without_the_learning_rate_the_rounds_other_replies_bound_a_scaffold_delta():
    updates, sent = _scaffold_round(scale_of_3=1e12)
    problems = round_problems(updates, _model(), SCAFFOLD, "scaffold", sent, lr=None)
    assert list(problems) == [3]
    assert "scaffold-dc norm is" in problems[3] and "the round's other replies" in problems[3]


def test_in_a_round_of_two_the_hostile_reply_is_rejected_and_the_honest_one_kept():
    updates, sent = _scaffold_round(scale_of_3=1e6)
    assert list(round_problems(updates[2:], _model(), SCAFFOLD, "scaffold", sent, lr=None)) == [3]


def test_a_fednova_update_inconsistent_with_the_model_it_sent_is_rejected():
    # Prepare: client 1 sends d 1000 times its model's update (honest: d = (x - y) / ||a||_1)
    limits = ReplyLimits(records=(keys.FEDNOVA_D,), metrics=(keys.FEDNOVA_A_NORM,))
    updates = []
    for client, scale in ((0, 1.0), (1, 1000.0)):
        y = _model()
        y["w"][:], y["b"][:] = -0.4, -0.4
        d = _params(0.1 * scale)
        updates.append(_update(client, {keys.FEDNOVA_D: d}, arrays=y, **{keys.FEDNOVA_A_NORM: 4.0}))
    # Execute
    problems = round_problems(updates, _model(), limits, "fednova")
    # Assert
    assert list(problems) == [1]
    assert problems[1].startswith("fednova-a-norm x fednova-d has norm 692.8, more than 100 x ||x - y|| = 0.6928")


def test_a_fednova_norm_a_million_times_the_others_is_rejected():
    limits = ReplyLimits(records=(keys.FEDNOVA_D,), metrics=(keys.FEDNOVA_A_NORM,))
    updates = [
        _update(c, {keys.FEDNOVA_D: _params(0.0)}, n=100, **{keys.FEDNOVA_A_NORM: a})
        for c, a in enumerate([5.0, 6.0, 5e6])
    ]
    problems = round_problems(updates, _model(), limits, "fednova")
    assert problems == {
        2: "fednova-a-norm per example is 5e+04, more than 10000 x the median 0.06 of the round's other replies"
    }


def test_herded_gradients_are_compared_per_selected_gradient():
    # Prepare: client 1 selected 12 gradients (a larger sum, honest), client 2 scales its sum by 1e9
    def herd(client, k, scale):
        metrics = {keys.HERD_TAU: 2 * k, keys.HERD_K: k, keys.HERD_ALPHA_I: 0.5}
        return _update(client, {keys.HERD_G: _params(k * scale)}, **metrics)

    updates = [herd(0, 3, 1.0), herd(1, 12, 1.0), herd(2, 3, 1e9), herd(3, 0, 0.0)]
    # Execute
    problems = round_problems(updates, _model(), BHERD, "bherd")
    # Assert: the zero sum of client 3 (nothing selected) is no reference and no problem
    assert list(problems) == [2]
    assert problems[2].startswith("herd-g per selected gradient is 1.732e+09")


def test_fedcm_local_steps_are_bounded_from_below_too():
    # FedCM divides each update by lr K_i: one step claimed for a 1000-example update amplifies it
    updates = [_update(c, {}, n=100_000, **{keys.NUM_STEPS: k}) for c, k in enumerate([30_000, 32_000, 1])]
    problems = round_problems(updates, _model(), ReplyLimits(), "fedcm")
    assert problems == {
        2: "num-steps per example is 1e-05, less than 1/10000 of the median 0.3 of the round's other replies"
    }


def test_step_counts_of_plain_rules_are_not_bounded():
    updates = [_update(c, {}, n=100_000, **{keys.NUM_STEPS: k}) for c, k in enumerate([30_000, 32_000, 1])]
    assert round_problems(updates, _model(), ReplyLimits(), "sgd") == {}


# ---------------------------------------------------------------------------- clipping
def test_clipping_scales_scaffolds_delta_as_the_clipped_update_makes_it():
    # Prepare: c = 0.5, update x - y = 3 on w (norm 3 * sqrt(2)), lr 0.1, 1 step: dc + c = 30
    c = OrderedDict(w=np.full(2, 0.5, np.float32))
    model = OrderedDict(w=np.zeros(2, np.float32))
    y = OrderedDict(w=np.full(2, -3.0, np.float32))
    u = ClientUpdate(0, 10, y, extras={keys.SCAFFOLD_DC: OrderedDict(w=np.full(2, 29.5, np.float32))})
    # Execute: clip the update to norm 1, then the record by the same factor
    u.arrays, norm = clip_update(u.arrays, model, 1.0)
    clipped = clip_records(u, 1.0 / norm, {keys.SCAFFOLD_C: c})
    # Assert: dc + c is the clipped update / lr, as an honest client with that update sends
    assert clipped == [keys.SCAFFOLD_DC]
    np.testing.assert_allclose(u.extras[keys.SCAFFOLD_DC]["w"] + 0.5, -u.arrays["w"] / 0.1, rtol=1e-6)


def test_clip_norm_is_refused_by_name_where_it_cannot_protect_and_taken_with_scaffold():
    base = ["num_clients=10", "churn.kind=none", "strategy.sampler.clients_per_round=5"]
    check_parts(load_scenario(None, base + ["strategy.aggregator.clip_norm=1", "strategy.local_rule.name=scaffold"]))
    with pytest.raises(ConfigError, match="fednova-d record, not the clipped model; leave it null"):
        check_parts(load_scenario(None, base + ["strategy.aggregator.clip_norm=1", "strategy.local_rule.name=fednova"]))


# ---------------------------------------------------------------------------- a real run
RUN = [
    "num_clients=6",
    "rounds=2",
    "dataset.samples_per_client=60",
    "partition.scheme=iid",
    "churn.kind=none",
    "strategy.sampler.clients_per_round=6",
    "strategy.local_rule.name=scaffold",
    "evaluation.stop_on_divergence=false",
    "output.progress=off",
    "output.plots=false",
    "output.checkpoint_every=0",
]


class _Hostile(LocalGrid):
    """Client 3 changes its training replies' ``scaffold-dc`` with ``change(record)``."""

    def __init__(self, change, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.change = change

    def send_and_receive(self, messages, *, timeout=None):
        replies = list(super().send_and_receive(messages, timeout=timeout))
        for reply in replies:
            pid = self.contexts[reply.metadata.src_node_id].node_config["partition-id"]
            if pid == 3 and reply.metadata.message_type == "train" and not reply.has_error():
                self.change(reply.content[keys.SCAFFOLD_DC])
        return replies


def _scale(record):
    for key in list(record):
        record[key] = Array(record[key].numpy() * np.float32(1e12))


def _keep_one(record):
    for key in list(record)[1:]:
        del record[key]


def _nan(record):
    for key in list(record):
        record[key] = Array(np.full(record[key].shape, np.nan, np.float32))


def _rows(tmp_path, name, change, overrides=()):
    cfg = load_scenario(None, RUN + list(overrides))
    run_server(_Hostile(change, client_app, cfg.num_clients), cfg, tmp_path / name)
    return read_metrics(tmp_path / name)


@pytest.mark.usefixtures("isolated_cache")
@pytest.mark.parametrize(
    "change, fragment",
    [(_scale, "more than 100 x ||x - y|| / lr"), (_keep_one, "every scaffold-dc of this run holds the arrays")],
    ids=["times-1e12", "one-array"],
)
def test_a_scaffold_client_with_a_hostile_control_variate_change_is_rejected_every_round(tmp_path, change, fragment):
    # Execute: client 3's scaffold-dc changed (x 1e12; one array only), and, as the reference,
    # client 3's scaffold-dc NaN (rejected by the reply check since before)
    hostile = _rows(tmp_path, "hostile", change)
    dropped = _rows(tmp_path, "dropped", _nan)
    # Assert: client 3 is rejected with the reason in every round (before: accepted, `rejected`
    # empty), and the run is the run without client 3's replies, to the last digit
    for row in hostile:
        assert [r[0] for r in row["rejected"]] == [3], row["rejected"]
        assert fragment in row["rejected"][0][1]
        assert row["sampled"] == [0, 1, 2, 4, 5]
    assert [r["test_loss"] for r in hostile] == [r["test_loss"] for r in dropped]
    assert [r["test_accuracy"] for r in hostile] == [r["test_accuracy"] for r in dropped]
