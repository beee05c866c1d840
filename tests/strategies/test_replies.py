"""Reply checks (strategies/replies.py): each way a broken or hostile client's training
reply is rejected, and what the strategy does with a rejected reply in a real round."""

import math
from collections import OrderedDict

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedflex import keys
from fedflex.arrays import numpy_to_record
from fedflex.clients.client_app import app as client_app
from fedflex.config import ConfigError
from fedflex.data import load_dataset
from fedflex.launch.local_grid import LocalGrid
from fedflex.launch.server import run_server
from fedflex.loader import load_scenario
from fedflex.partition import partition_data
from fedflex.results import read_metrics
from fedflex.strategies.replies import MB, ReplyLimits, check_reply, num_examples_problem, reply_bytes

SCAFFOLD = ReplyLimits(records=(keys.SCAFFOLD_DC,))


SCAFFOLD_MISSING = (
    "no scaffold-dc record: SCAFFOLD's clients send their control-variate change "
    "(fedflex's ClientApp (fedflex.clients.client_app:app) with local rule scaffold, "
    "or fedflex.clients.helpers.SCAFFOLDClient around your train())"
)


def _model():
    return OrderedDict(w=np.zeros(2, np.float32), b=np.zeros(1, np.float32), n=np.array(0, np.int64))


def _reply(arrays=None, n=10, extras=None, **metrics):
    content = RecordDict(
        {
            keys.ARRAYS: numpy_to_record(arrays if arrays is not None else _model()),
            keys.METRICS: MetricRecord({keys.NUM_EXAMPLES: n, **metrics}),
        }
    )
    for name, record in (extras or {}).items():
        content[name] = record if isinstance(record, ArrayRecord) else numpy_to_record(record)
    return content


# ---------------------------------------------------------------------------- num-examples
@pytest.mark.parametrize(
    "n, fragment",
    [
        (math.nan, "nan, not a finite number"),
        (math.inf, "inf, not a finite number"),
        (-math.inf, "-inf, not a finite number"),
        (2.5, "2.5, not an integer"),
        (-3, "-3, must be >= 1"),
        (0, "0, must be >= 1"),
    ],
)
def test_num_examples_that_is_not_a_finite_integer_of_at_least_one_is_rejected(n, fragment):
    update, reason = check_reply(_reply(n=n), _model())
    assert update is None
    assert reason == f"num-examples is {fragment}"


def test_num_examples_beyond_the_clients_partition_is_rejected():
    # Prepare: client 3 holds 40 examples (its partition)
    limits = ReplyLimits(sizes={3: 40})
    # Execute
    update, reason = check_reply(_reply(n=1e12), _model(), limits, client=3)
    # Assert
    assert update is None
    assert reason == "num-examples is 1000000000000, more than the 40 examples this client holds"


def test_num_examples_up_to_the_partition_size_is_accepted_as_an_int():
    update, reason = check_reply(_reply(n=40.0), _model(), ReplyLimits(sizes={3: 40}), client=3)
    assert reason == ""
    assert update.num_examples == 40 and isinstance(update.num_examples, int)
    assert update.client == 3


def test_an_explicit_cap_bounds_clients_the_server_knows_nothing_about():
    limits = ReplyLimits(sizes={}, cap=100)
    assert check_reply(_reply(n=100), _model(), limits, client=9)[1] == ""
    assert "more than the 100 examples" in check_reply(_reply(n=101), _model(), limits, client=9)[1]


def test_num_examples_problem_needs_a_number():
    assert num_examples_problem(None) == "num-examples missing or not a number (None)"
    assert num_examples_problem(True) == "num-examples missing or not a number (True)"


# ---------------------------------------------------------------------------- arrays
def test_int64_arrays_where_the_model_has_floats_are_rejected():
    arrays = _model()
    arrays["w"] = np.array([1, 2], dtype=np.int64)
    update, reason = check_reply(_reply(arrays), _model())
    assert update is None
    assert reason == "w has dtype int64, expected float32"


def test_complex_arrays_are_rejected():
    arrays = _model()
    arrays["w"] = np.array([1 + 1j, 2], dtype=np.complex64)
    update, reason = check_reply(_reply(arrays), _model())
    assert update is None
    assert reason == "w has dtype complex64, expected float32"


def test_an_array_whose_header_lies_about_its_dtype_is_rejected():
    # Prepare: the header says float32, the bytes hold int64
    real = Array(np.array([1, 2], dtype=np.int64))
    liar = Array(dtype="float32", shape=(2,), stype=real.stype, data=real.data)
    content = _reply()
    content[keys.ARRAYS]["w"] = liar
    # Execute
    update, reason = check_reply(content, _model())
    # Assert
    assert update is None
    assert reason == "w has dtype int64, expected float32"


# ---------------------------------------------------------------------------- rule records
def test_a_scaffold_delta_of_the_wrong_shape_is_rejected():
    dc = OrderedDict(w=np.zeros(3, np.float32), b=np.zeros(1, np.float32))
    update, reason = check_reply(_reply(extras={keys.SCAFFOLD_DC: dc}), _model(), SCAFFOLD)
    assert update is None
    assert reason == "scaffold-dc/w has shape (3,), expected (2,)"


def test_a_scaffold_reply_without_its_control_variate_record_is_rejected():
    update, reason = check_reply(_reply(), _model(), SCAFFOLD)
    assert update is None
    assert reason == SCAFFOLD_MISSING


def test_a_good_scaffold_reply_carries_its_delta_as_an_extra():
    dc = OrderedDict(w=np.ones(2, np.float32), b=np.ones(1, np.float32))
    update, reason = check_reply(_reply(extras={keys.SCAFFOLD_DC: dc}), _model(), SCAFFOLD)
    assert reason == ""
    np.testing.assert_array_equal(update.extras[keys.SCAFFOLD_DC]["w"], [1.0, 1.0])


@pytest.mark.parametrize(
    "record, fragment",
    [
        (OrderedDict(w=np.zeros(2, np.float32), x=np.zeros(1, np.float32)), "arrays the model does not have (x)"),
        (OrderedDict(w=np.zeros(2, np.int32)), "scaffold-dc/w has dtype int32, expected real floats"),
        (OrderedDict(n=np.zeros((), np.float32)), "scaffold-dc/n has dtype float32, expected real floats"),
        (OrderedDict(w=np.array([np.inf, 0.0], np.float32)), "scaffold-dc/w has NaN or Inf values"),
    ],
)
def test_a_rule_record_must_hold_finite_floats_of_the_models_arrays(record, fragment):
    update, reason = check_reply(_reply(extras={keys.SCAFFOLD_DC: record}), _model(), SCAFFOLD)
    assert update is None
    assert fragment in reason


def test_an_array_record_the_local_rule_does_not_send_is_rejected():
    dc = OrderedDict(w=np.zeros(2, np.float32))
    update, reason = check_reply(_reply(extras={keys.SCAFFOLD_DC: dc}), _model())  # rule sgd: no records
    assert update is None
    assert reason == "unexpected array record scaffold-dc (the local rule's: none)"


def test_a_missing_rule_metric_is_rejected():
    limits = ReplyLimits(records=(keys.FEDNOVA_D,), metrics=(keys.FEDNOVA_A_NORM,))
    d = OrderedDict(w=np.zeros(2, np.float32))
    update, reason = check_reply(_reply(extras={keys.FEDNOVA_D: d}), _model(), limits)
    assert update is None
    assert reason == (
        "no fednova-a-norm metric: FedNova's clients send ||a_i||_1 "
        "(fedflex's ClientApp (fedflex.clients.client_app:app) with local rule fednova, "
        "or fedflex.clients.helpers.FedNovaClient / fednova_mod)"
    )


# ---------------------------------------------------------------------------- size
def test_the_automatic_size_limit_is_four_models_and_a_megabyte():
    # w: 2 x 4 bytes, b: 4 bytes, n: 8 bytes = 20 bytes
    assert ReplyLimits().byte_limit(_model()) == 4 * 20 + MB


def test_a_256_mb_extra_record_is_rejected_before_anything_is_decoded():
    # Prepare: a 256 MB record (zero bytes; its header would not even decode)
    big = ArrayRecord({"w": Array(dtype="float32", shape=(64 * MB,), stype="numpy.ndarray", data=bytes(256 * MB))})
    content = _reply(extras={"junk": big})
    # Execute
    update, reason = check_reply(content, _model())
    # Assert
    assert update is None
    assert reason.startswith("reply holds 256.0 MB, more than the 1.0 MB limit")


def test_a_reply_over_an_explicit_limit_is_rejected_and_one_under_it_accepted():
    content = _reply(arrays=_model())
    size = reply_bytes(content)
    assert check_reply(content, _model(), ReplyLimits(max_bytes=size))[1] == ""
    assert "more than the" in check_reply(content, _model(), ReplyLimits(max_bytes=size - 1))[1]


def test_reply_bytes_counts_strings_in_config_records():
    content = _reply()
    before = reply_bytes(content)
    content["junk"] = ConfigRecord({"s": "x" * 1000})
    assert reply_bytes(content) == before + 1000


def test_limits_are_config_options_checked_at_load():
    with pytest.raises(ConfigError, match="strategy.replies.max_reply_mb"):
        load_scenario(None, ["strategy.replies.max_reply_mb=0"])
    with pytest.raises(ConfigError, match="strategy.replies.max_num_examples"):
        load_scenario(None, ["strategy.replies.max_num_examples=0"])


# ---------------------------------------------------------------------------- in a round
BASE = [
    "num_clients=5",
    "rounds=2",
    "dataset.samples_per_client=20",
    "churn.kind=none",
    "strategy.sampler.clients_per_round=5",
    "output.progress=off",
    "output.plots=false",
    "output.checkpoint_every=0",
]


@pytest.fixture(autouse=True)
def _isolated(isolated_cache):  # tests/conftest.py
    yield


class _Hostile(LocalGrid):
    """``edit[pid](content)`` changes that client's training replies."""

    def __init__(self, edit, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.edit = edit

    def send_and_receive(self, messages, *, timeout=None):
        replies = list(super().send_and_receive(messages, timeout=timeout))
        for reply in replies:
            pid = self.contexts[reply.metadata.src_node_id].node_config["partition-id"]
            if pid in self.edit and reply.metadata.message_type == "train" and not reply.has_error():
                self.edit[pid](reply.content)
        return replies


def _set_examples(value):
    def edit(content):
        content[keys.METRICS][keys.NUM_EXAMPLES] = value

    return edit


def _run(tmp_path, overrides, edit):
    cfg = load_scenario(None, BASE + overrides)
    run_server(_Hostile(edit, client_app, cfg.num_clients), cfg, tmp_path / "out")
    return read_metrics(tmp_path / "out")


def _sizes():
    """The examples each client of BASE holds (the synthetic data's natural split)."""
    cfg = load_scenario(None, BASE)
    data = load_dataset(cfg.dataset, cfg.num_clients, cfg.seed)
    return [len(ix) for ix in partition_data(cfg.partition, data, cfg.num_clients, cfg.seed).indices]


def test_rejected_replies_are_dropped_logged_and_listed_and_the_round_goes_on(tmp_path, caplog):
    # Prepare
    sizes = _sizes()
    # Execute: client 1 says NaN examples, client 3 one trillion
    rows = _run(tmp_path, [], {1: _set_examples(math.nan), 3: _set_examples(1e12)})
    # Assert
    assert [r["round"] for r in rows] == [1, 2]
    for row in rows:
        assert row["sampled"] == [0, 2, 4]
        assert row["failed"] == [1, 3]
        assert row["rejected"] == [
            [1, "num-examples is nan, not a finite number"],
            [3, f"num-examples is 1000000000000, more than the {sizes[3]} examples this client holds"],
        ]
        assert row["num_examples"] == sizes[0] + sizes[2] + sizes[4]
        assert math.isfinite(row["test_loss"])
    warnings = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert len(warnings) == 4  # one line per rejected reply
    assert "reply of client 3" in warnings[1] and f"more than the {sizes[3]} examples" in warnings[1]


def test_a_scaffold_reply_without_its_record_is_rejected_not_a_server_crash(tmp_path):
    # Prepare: client 2 drops its control-variate delta
    def drop(content):
        del content[keys.SCAFFOLD_DC]

    # Execute
    rows = _run(tmp_path, ["strategy.local_rule.name=scaffold"], {2: drop})
    # Assert
    for row in rows:
        assert row["sampled"] == [0, 1, 3, 4]
        assert row["rejected"] == [[2, SCAFFOLD_MISSING]]


def test_a_wrong_shaped_scaffold_delta_never_reaches_the_server_state(tmp_path):
    # Prepare: client 0 sends a scaffold-dc with one extra row in its first array
    def widen(content):
        record = content[keys.SCAFFOLD_DC]
        key = next(iter(record))
        a = record[key].numpy()
        record[key] = Array(np.concatenate([a, a[:1]]))

    # Execute
    rows = _run(tmp_path, ["strategy.local_rule.name=scaffold"], {0: widen})
    # Assert
    for row in rows:
        assert row["sampled"] == [1, 2, 3, 4]
        assert row["rejected"][0][0] == 0 and "has shape" in row["rejected"][0][1]
