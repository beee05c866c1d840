"""Fuzzing (issue 45): generated hostile inputs, each refused in one line or accepted correctly.

Property-based tests (Hypothesis) for what reaches fedflex from outside:

- training replies (every record kind, dtype, shape, size and value, lying array headers,
  wrong metrics): :func:`strategies.replies.check_reply` rejects with a one-line reason
  or returns an update that is exactly what the server expects; a whole round of them
  through :meth:`FedFlex._aggregate` (every local rule's server half) raises nothing and
  yields a model of the right names, shapes and dtypes;
- checkpoints (valid npz zips with wrong contents): :func:`fedflex.statefile.read_state`
  and :func:`fedflex.results.load_checkpoint` read them or refuse them in one line;
- scenario and study files (YAML), trace CSVs and FedScale traces: loaded and checked,
  or refused with :class:`ConfigError` / :class:`StudyError` / :class:`ValueError` in one line.

The fast suite tries :data:`FAST` examples per property and the tests marked ``slow``
(``scripts/test.sh --all``, what CI runs) :data:`FULL`, both from a fixed seed: the same
inputs in every run, so a red CI is a regression, never a new draw. ``FEDFLEX_FUZZ=full``
explores: every property at :data:`FULL` random inputs (new ones each run); a finding
becomes a named test beside the code it fixes. docs/failures.md ("Fuzzing") lists the
counts tried and what they found.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import string
import warnings
from collections import OrderedDict
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import yaml
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedflex import keys
from fedflex.arrays import numpy_to_array
from fedflex.checks import ConfigError
from fedflex.churn import TraceAvailability
from fedflex.fedscale import convert, read_fedscale
from fedflex.loader import load_scenario
from fedflex.results import CheckpointError, load_checkpoint
from fedflex.statefile import STATE_ENTRY, StateFileError, read_state
from fedflex.strategies.build import build_strategy
from fedflex.strategies.combinations import check_parts
from fedflex.strategies.replies import ReplyLimits, check_reply
from fedflex.strategies.strategy import RoundRecord
from fedflex.study.runs import StudyError
from fedflex.study.sweep import read_study
from fedflex.trace import FOREVER, read_trace

#: examples per property in the fast suite, and under --all / FEDFLEX_FUZZ=full
FAST = 50
FULL = int(os.environ.get("FEDFLEX_FUZZ_EXAMPLES", "1000"))
#: scenario files under --all: each example resolves a whole scenario (about 0.15 s), so
#: fewer than the other properties keep CI's time (FEDFLEX_FUZZ=full runs FULL of them too)
FULL_SCENARIOS = 250
FULL_ON = os.environ.get("FEDFLEX_FUZZ", "") == "full"

BUDGETS = [pytest.param("fast", id="fast"), pytest.param("full", id="full", marks=pytest.mark.slow)]


def _run(budget: str, test, full_examples: int = FULL) -> None:
    """Run the Hypothesis ``test`` with the budget's example count (no example database);
    ``full_examples``: the slow count of a property whose examples are slow to try. Random
    inputs only under ``FEDFLEX_FUZZ=full``; the suite's are drawn from a fixed seed.
    """
    full = budget == "full" or FULL_ON
    settings(
        max_examples=(FULL if FULL_ON else full_examples) if full else FAST,
        deadline=None,
        derandomize=not FULL_ON,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )(test)()


def _one_line(text: str) -> bool:
    return bool(text) and "\n" not in text and "Traceback" not in text


# ---------------------------------------------------------------------------- replies
MODEL = OrderedDict(w=np.zeros((2, 3), np.float32), b=np.zeros(3, np.float32), n=np.array(0, np.int64))
FLOATS = ("w", "b")
DTYPES = ("float32", "float32", "float64", "float16", "int64", "int32", "uint8", "bool", "complex64")
SHAPES = ((2, 3), (3,), (), (3, 2), (6,), (0,), (1, 2, 3), (2, 3))
VALUES = (0.0, 1.0, -2.5, 1e6, -1e12, 3.0e38, 1e-45, math.nan, math.inf, -math.inf, 1e300)
RECORD_NAMES = (keys.SCAFFOLD_DC, keys.FEDNOVA_D, keys.HERD_G, "junk")
ARRAY_KEYS = ("w", "b", "n", "x", "")


@st.composite
def _array(draw) -> Array:
    """An Array of any dtype, shape and values; sometimes with a header that lies or cut bytes."""
    dtype, shape = draw(st.sampled_from(DTYPES)), draw(st.sampled_from(SHAPES))
    value = draw(st.sampled_from(VALUES))
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        a = np.full(shape, value).astype(dtype)
    array = numpy_to_array(a)
    how = draw(st.sampled_from(("plain", "plain", "plain", "header", "cut", "bytes")))
    if how == "header":  # the header says another dtype / shape than the bytes hold
        lie_dtype, lie_shape = draw(st.sampled_from(DTYPES)), draw(st.sampled_from(SHAPES))
        array = Array(dtype=lie_dtype, shape=lie_shape, stype=array.stype, data=array.data)
    elif how == "cut":
        array = Array(dtype=array.dtype, shape=array.shape, stype=array.stype, data=array.data[: len(array.data) // 2])
    elif how == "bytes":
        data = draw(st.binary(max_size=64))
        array = Array(dtype=array.dtype, shape=array.shape, stype=array.stype, data=data)
    return array


def _record(draw, honest_keys=("w", "b")) -> ArrayRecord:
    names = draw(st.lists(st.sampled_from(ARRAY_KEYS), max_size=4, unique=True))
    if draw(st.booleans()):  # an honest-looking record: the usual arrays, odd values
        names = list(honest_keys)
    record = ArrayRecord()
    for name in names:
        if name in MODEL and draw(st.booleans()):
            value = draw(st.sampled_from(VALUES))
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                record[name] = numpy_to_array(np.full(MODEL[name].shape, value).astype(MODEL[name].dtype))
        else:
            record[name] = draw(_array())
    return record


METRIC_VALUES = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, 5, 40, 41, 10**12, 0.5, 2.0, -1.0]),
    st.lists(st.integers(min_value=-5, max_value=5), max_size=3),
)
METRIC_NAMES = (
    keys.NUM_EXAMPLES,
    keys.FEDNOVA_A_NORM,
    keys.HERD_TAU,
    keys.HERD_K,
    keys.HERD_ALPHA_I,
    keys.NUM_STEPS,
    keys.TRAIN_LOSS,
    "x",
)


@st.composite
def replies(draw) -> RecordDict:
    """A training reply: the model record (or not), metrics (or not), rule records, configs."""
    content = RecordDict()
    if draw(st.integers(0, 9)):
        content[keys.ARRAYS] = _record(draw, honest_keys=("w", "b", "n"))
    if draw(st.integers(0, 9)):
        metrics = draw(st.dictionaries(st.sampled_from(METRIC_NAMES), METRIC_VALUES, max_size=6))
        if draw(st.booleans()):
            metrics[keys.NUM_EXAMPLES] = draw(st.sampled_from([1, 10, 40, 40.0]))
        content[keys.METRICS] = MetricRecord(metrics)
    for name in draw(st.lists(st.sampled_from(RECORD_NAMES), max_size=3, unique=True)):
        content[name] = _record(draw)
    if draw(st.integers(0, 4)) == 0:
        content["cfg"] = ConfigRecord({"s": draw(st.text(max_size=8)), "b": draw(st.binary(max_size=8))})
    return content


LIMITS = (
    ReplyLimits(sizes={3: 40}),
    ReplyLimits(records=(keys.SCAFFOLD_DC,)),
    ReplyLimits(records=(keys.SCAFFOLD_DC,), record_arrays=("w", "b"), cap=40),
    ReplyLimits(records=(keys.FEDNOVA_D,), metrics=(keys.FEDNOVA_A_NORM,)),
    ReplyLimits(records=(keys.HERD_G,), metrics=(keys.HERD_TAU, keys.HERD_K, keys.HERD_ALPHA_I)),
    ReplyLimits(max_bytes=64),
)


def _assert_conforms(update, limits: ReplyLimits) -> None:
    """An accepted reply is exactly what the server expects."""
    assert list(update.arrays) == list(MODEL)
    for key, want in MODEL.items():
        a = update.arrays[key]
        assert a.shape == want.shape and a.dtype == want.dtype
        assert np.isfinite(a).all()
    bound = limits.bound(3)
    assert isinstance(update.num_examples, int) and 1 <= update.num_examples
    assert bound is None or update.num_examples <= bound
    assert set(update.extras) == set(limits.records)
    for record in update.extras.values():
        assert record and set(record) <= set(FLOATS)
        assert limits.record_arrays is None or set(record) == set(limits.record_arrays)
        for key, a in record.items():
            assert a.shape == MODEL[key].shape and a.dtype == MODEL[key].dtype and np.isfinite(a).all()
    for name in limits.metrics:
        value = update.metrics[name]
        assert isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@pytest.mark.parametrize("budget", BUDGETS)
def test_hostile_replies_are_rejected_in_one_line_or_accepted_exactly(budget):
    @given(content=replies(), limits=st.sampled_from(LIMITS))
    def prop(content, limits):
        update, reason = check_reply(content, MODEL, limits, client=3)
        if update is None:
            assert _one_line(reason), reason
        else:
            assert reason == ""
            _assert_conforms(update, limits)

    _run(budget, prop)


# ---------------------------------------------------------------------------- a round of them
RULES = {
    "sgd": [],
    "scaffold": ["strategy.local_rule.name=scaffold"],
    "scaffold-clipped": ["strategy.local_rule.name=scaffold", "strategy.aggregator.clip_norm=1.0"],
    "fednova": ["strategy.local_rule.name=fednova"],
    "bherd": ["strategy.local_rule.name=bherd", "strategy.aggregator.name=bherd"],
    "grab": ["strategy.local_rule.name=grab", "strategy.aggregator.name=bherd"],
    "feddyn": ["strategy.local_rule.name=feddyn"],
    "fedcm": ["strategy.local_rule.name=fedcm"],
    "median": ["strategy.aggregator.name=median"],
}
_CONFIGS: dict[str, Any] = {}


def _strategy(rule: str):
    if rule not in _CONFIGS:
        _CONFIGS[rule] = load_scenario(None, ["num_clients=6", "strategy.sampler.clients_per_round=5", *RULES[rule]])
    strategy = build_strategy(_CONFIGS[rule], None, client_sizes={c: 40 for c in range(6)})
    strategy.global_arrays = OrderedDict((k, v.copy()) for k, v in MODEL.items())
    for client in range(6):
        strategy.nodes.node_to_client[100 + client] = client
        strategy.nodes.client_to_node[client] = 100 + client
    return strategy


@st.composite
def honest_like(draw, rule: str) -> RecordDict:
    """A well-formed reply of ``rule`` with values, counts and records scaled or cut."""
    scale = draw(st.sampled_from([1.0, 1.0, 0.0, -1.0, 1e3, 1e12, 1e-12]))
    step = draw(st.sampled_from([0.01, 0.1, 1.0]))
    arrays = OrderedDict((k, (v + step).astype(v.dtype) if v.dtype.kind == "f" else v) for k, v in MODEL.items())
    n = draw(st.sampled_from([1, 10, 40]))
    metrics: dict[str, Any] = {keys.NUM_EXAMPLES: n, keys.NUM_STEPS: draw(st.sampled_from([0, 1, 4, 40]))}
    records = {}
    params = OrderedDict((k, np.full(MODEL[k].shape, -step * scale, np.float32)) for k in FLOATS)
    if draw(st.booleans()):  # one array only
        params.popitem()
    if "scaffold" in rule:
        records[keys.SCAFFOLD_DC] = params
    if rule == "fednova":
        records[keys.FEDNOVA_D] = params
        metrics[keys.FEDNOVA_A_NORM] = draw(st.sampled_from([0.0, 1.0, 4.0, 1e6]))
    if rule in ("bherd", "grab"):
        records[keys.HERD_G] = params
        tau = draw(st.sampled_from([0, 1, 4, 10**6]))
        k = draw(st.integers(0, 4))
        metrics.update({keys.HERD_TAU: tau, keys.HERD_K: k, keys.HERD_ALPHA_I: k / tau if tau else 0.0})
    content = RecordDict({keys.ARRAYS: ArrayRecord(), keys.METRICS: MetricRecord(metrics)})
    for k, v in arrays.items():
        content[keys.ARRAYS][k] = numpy_to_array(v)
    for name, record in records.items():
        content[name] = ArrayRecord()
        for k, v in record.items():
            content[name][k] = numpy_to_array(v)
    return content


def _message(content: RecordDict, node: int, error: bool = False):
    return SimpleNamespace(
        content=content,
        metadata=SimpleNamespace(src_node_id=node, reply_to_message_id=""),
        has_error=lambda: error,
        error=SimpleNamespace(code=0, reason="gone"),
    )


@pytest.mark.parametrize("budget", BUDGETS)
def test_a_round_of_hostile_replies_never_breaks_a_rules_server_half(budget):
    @given(data=st.data(), rule=st.sampled_from(sorted(RULES)))
    def prop(data, rule):
        strategy = _strategy(rule)
        count = data.draw(st.integers(1, 5), label="replies")
        messages = []
        for i in range(count):
            hostile = data.draw(st.integers(0, 3), label="kind") == 0
            content = data.draw(replies() if hostile else honest_like(rule), label="reply")
            messages.append(_message(content, 100 + i, error=data.draw(st.integers(0, 9)) == 0))
        record = RoundRecord(round=1, sampled=list(range(count)))
        # Execute: twice, so that the server halves' state after a round is used again
        for server_round in (1, 2):
            record = RoundRecord(round=server_round, sampled=list(range(count)))
            new = strategy.engine.aggregate(server_round, strategy.global_arrays, messages, record, {})
            for _, reason in record.rejected:
                assert _one_line(reason), reason
            if new is not None:
                assert list(new) == list(MODEL)
                assert all(new[k].shape == MODEL[k].shape and new[k].dtype == MODEL[k].dtype for k in MODEL)
                strategy.global_arrays = new
        json.dumps(record.extra, default=float)  # the row is written as JSON

    _run(budget, prop)


# ---------------------------------------------------------------------------- checkpoints
JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
    st.sampled_from(["a0", "a1", "a9", "__ndarray__", "nan", "inf"]),
)
TAGS = ("__ndarray__", "__scalar__", "__tuple__", "__odict__", "__items__", "__float__")
JSON = st.recursive(
    JSON_LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.text(max_size=6), inner, max_size=4),
        st.builds(lambda tag, value: {tag: value}, st.sampled_from(TAGS), inner),
    ),
    max_leaves=20,
)


@st.composite
def checkpoints(draw) -> bytes:
    """A valid npz zip whose entries are anything: a state.json of any JSON (or bytes that
    are not), arrays of any dtype and shape named as the references say or not."""
    entries: dict[str, np.ndarray] = {}
    kind = draw(st.sampled_from(("json", "json", "json", "garbage", "2d", "missing")))
    state: Any = draw(JSON)
    if draw(st.booleans()):  # get past the first checks: a checkpoint-shaped dict
        state = {
            "format": draw(st.sampled_from(["fedflex-checkpoint", "x"])),
            "version": draw(st.sampled_from([1, 2, 3, "2", None])),
            "round": draw(JSON),
            "strategy": draw(
                st.one_of(JSON, st.just({"global_arrays": {"__odict__": [["w", {"__ndarray__": "a0"}]]}}))
            ),
            "binding": draw(JSON),
            "run_wall_s": draw(JSON),
        }
    text = json.dumps(state).encode()
    if kind == "json":
        entries[STATE_ENTRY] = np.frombuffer(text, np.uint8)
    elif kind == "garbage":
        entries[STATE_ENTRY] = np.frombuffer(draw(st.binary(max_size=32)) or b"x", np.uint8)
    elif kind == "2d":
        entries[STATE_ENTRY] = np.zeros((2, 2), np.float32)
    for i in range(draw(st.integers(0, 3))):
        dtype, shape = draw(st.sampled_from(DTYPES)), draw(st.sampled_from(SHAPES))
        entries[f"a{i}"] = np.zeros(shape, dtype)
    buf = io.BytesIO()
    np.savez(buf, **entries)
    return buf.getvalue()


@pytest.mark.parametrize("budget", BUDGETS)
def test_checkpoints_with_wrong_contents_are_read_or_refused_in_one_line(budget, tmp_path):
    folder = tmp_path
    (folder / "config.yaml").write_text("name: quickstart\nrounds: 3\n")
    (folder / "metrics.jsonl").write_text("")

    @given(blob=checkpoints())
    def prop(blob):
        path = folder / "checkpoint.npz"
        path.write_bytes(blob)
        try:
            read_state(path)
        except StateFileError as exc:
            assert _one_line(str(exc))
        try:
            checkpoint = load_checkpoint(folder)
        except CheckpointError as exc:
            assert _one_line(str(exc))
        else:
            assert isinstance(checkpoint, dict) and isinstance(checkpoint["strategy"], dict)

    _run(budget, prop)


# ---------------------------------------------------------------------------- scenario files
def _scenario_keys() -> list[str]:
    from dataclasses import asdict

    from fedflex.config import ScenarioConfig
    from fedflex.study.runs import flatten

    return sorted(flatten(asdict(ScenarioConfig())))


SCENARIO_KEYS = _scenario_keys()
YAML_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=string.printable, max_size=12),
    st.sampled_from(["fedavg", "scaffold", "bherd", "median", "trace", "dirichlet", "1e400", "0x10", "~", "[1, 2"]),
    st.lists(st.integers(min_value=-3, max_value=100), max_size=3),
    st.dictionaries(st.sampled_from(["name", "x", "mu"]), st.integers(-3, 3), max_size=2),
)


@st.composite
def scenario_texts(draw) -> str:
    """A scenario file: known keys (nested or dotted) with any values, unknown keys, or text."""
    kind = draw(st.sampled_from(("mapping", "mapping", "mapping", "text", "list")))
    if kind == "text":
        return draw(st.text(alphabet=string.printable + "\t\u00e9\u2028", max_size=80))
    if kind == "list":
        return yaml.safe_dump(draw(st.lists(YAML_VALUES, max_size=3)))
    data: dict[str, Any] = {}
    for key in draw(st.lists(st.sampled_from(SCENARIO_KEYS + ["nonsense", "strategy.x", "rounds.y"]), max_size=6)):
        node = data
        *parents, leaf = key.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                break
            node = child
        else:
            node[leaf] = draw(YAML_VALUES)
    text = yaml.safe_dump(data, allow_unicode=True)
    if draw(st.integers(0, 9)) == 0:  # a key given twice, a tab, a python tag, a key not a name
        text += draw(
            st.sampled_from(
                [
                    "rounds: 3\nrounds: 4\n",
                    "\trounds: 3\n",
                    "x: !!python/object:os.system [ls]\n",
                    "~: 1\n",
                    "[1, 2]: 3\n",
                    "1.5: x\n",
                ]
            )
        )
    return text


@pytest.mark.parametrize("budget", BUDGETS)
def test_scenario_files_load_or_are_refused_in_one_line(budget, tmp_path):
    folder = tmp_path

    @given(text=scenario_texts())
    def prop(text):
        path = folder / "scenario.yaml"
        path.write_text(text, encoding="utf-8")
        try:
            cfg = load_scenario(path)
            check_parts(cfg)  # what the composition root checks right after loading
        except ConfigError as exc:
            assert _one_line(str(exc)), str(exc)

    _run(budget, prop, FULL_SCENARIOS)


# ---------------------------------------------------------------------------- study files
STUDY_VALUES = st.one_of(YAML_VALUES, st.lists(st.text(alphabet=string.ascii_letters + "=.,_0123456789", max_size=20)))


@st.composite
def study_texts(draw) -> str:
    keys_ = ["scenario", "overrides", "variants", "grid", "seeds", "reference", "out", "jobs", "base", "junk"]
    data: dict[str, Any] = {}
    if draw(st.booleans()):
        data["scenario"] = draw(st.sampled_from(["scenario.yaml", "missing.yaml", "study.yaml", ""]))
    for key in draw(st.lists(st.sampled_from(keys_), max_size=5, unique=True)):
        if key == "variants":
            data[key] = draw(
                st.one_of(
                    STUDY_VALUES,
                    st.dictionaries(
                        st.sampled_from(["method", "seed", "a.b", "x"]),
                        st.one_of(STUDY_VALUES, st.dictionaries(st.sampled_from(["p", "q"]), STUDY_VALUES, max_size=2)),
                        max_size=2,
                    ),
                )
            )
        elif key == "grid":
            data[key] = draw(
                st.one_of(STUDY_VALUES, st.dictionaries(st.sampled_from(["rounds", "method", "x.y"]), STUDY_VALUES))
            )
        elif key == "base":
            data[key] = draw(st.sampled_from(["study.yaml", "other.yaml", 3]))
        else:
            data[key] = draw(STUDY_VALUES)
    return yaml.safe_dump(data, allow_unicode=True)


@pytest.mark.parametrize("budget", BUDGETS)
def test_study_files_read_or_are_refused_in_one_line(budget, tmp_path):
    folder = tmp_path
    (folder / "scenario.yaml").write_text("rounds: 2\n")
    (folder / "other.yaml").write_text("scenario: scenario.yaml\nseeds: [0]\n")

    @given(text=study_texts())
    def prop(text):
        path = folder / "study.yaml"
        path.write_text(text, encoding="utf-8")
        try:
            study = read_study(path)
        except (StudyError, ConfigError) as exc:
            assert _one_line(str(exc)), str(exc)
        else:
            assert isinstance(study["overrides"], list) and isinstance(study["grid"], dict)

    _run(budget, prop)


# ---------------------------------------------------------------------------- trace CSVs
SMALL = st.integers(min_value=-2, max_value=12).map(str)
CELLS = st.one_of(
    SMALL,
    SMALL,
    SMALL,
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from([str(2**63 - 1), str(2**63), str(10**22), str(-(2**63) - 1)]),
    st.sampled_from(["", " ", "1.5", "1e3", "x", "+3", "0x10", "1_000", "\u0663", "nan", "\x00", '"4"', "3\n4"]),
)


@st.composite
def trace_texts(draw) -> str:
    header = draw(
        st.one_of(
            st.just(["client", "online_from", "online_until"]),
            st.just(["client", "online_from", "online_until"]),
            st.permutations(["client", "online_from", "online_until", "fedscale_id"]),
            st.lists(st.sampled_from(["client", "online_from", "online_until", "x", ""]), max_size=4),
        )
    )
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header)
    for _ in range(draw(st.integers(0, 6))):
        size = len(header) if draw(st.integers(0, 3)) else draw(st.integers(0, len(header) + 1))
        writer.writerow(draw(st.lists(CELLS, min_size=size, max_size=size)))
    text = out.getvalue()
    if draw(st.integers(0, 9)) == 0:
        text = draw(st.sampled_from(["\ufeff", "", '"', "\x00"])) + text
    return text


@pytest.mark.parametrize("budget", BUDGETS)
def test_trace_csvs_load_or_are_refused_in_one_line(budget, tmp_path):
    folder = tmp_path

    @given(text=trace_texts(), num_clients=st.integers(1, 8))
    def prop(text, num_clients):
        path = folder / "trace.csv"
        path.write_text(text, encoding="utf-8")
        try:
            clients, starts, ends = read_trace(path, num_clients)
        except ValueError as exc:
            assert _one_line(str(exc)), str(exc)
            return
        assert all(0 <= c < num_clients for c in clients)
        assert all(0 <= a < b <= FOREVER for a, b in zip(starts, ends))
        availability = TraceAvailability(path, num_clients)  # what a run builds from it
        for server_round in (1, 2, 10**6):
            online = availability.online(server_round)
            assert set(online.tolist()) <= set(range(num_clients))

    _run(budget, prop)


FEDSCALE_NUMBERS = st.one_of(
    st.integers(min_value=-10, max_value=10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1e-300, 1e300, "5", None, True]),
)


@st.composite
def fedscale_traces(draw) -> Any:
    behaviour = st.fixed_dictionaries(
        {},
        optional={
            "active": st.one_of(st.lists(FEDSCALE_NUMBERS, max_size=3), FEDSCALE_NUMBERS),
            "inactive": st.one_of(st.lists(FEDSCALE_NUMBERS, max_size=3), FEDSCALE_NUMBERS),
            "finish_time": FEDSCALE_NUMBERS,
            "duration": FEDSCALE_NUMBERS,
        },
    )
    return draw(
        st.one_of(
            st.dictionaries(st.one_of(st.integers(0, 50).map(str), st.text(max_size=3)), behaviour, max_size=4),
            st.dictionaries(st.integers(0, 50).map(str), FEDSCALE_NUMBERS, max_size=2),
            JSON,
        )
    )


@pytest.mark.parametrize("budget", BUDGETS)
def test_fedscale_traces_convert_or_are_refused_in_one_line(budget, tmp_path):
    folder = tmp_path

    @given(
        trace=fedscale_traces(),
        seconds=st.sampled_from([60.0, 1.0, 0.0, -1.0, math.nan, 1e-300]),
        rounds=st.sampled_from([1, 5, 0]),
        repeat=st.booleans(),
    )
    def prop(trace, seconds, rounds, repeat):
        path = folder / "trace.json"
        path.write_text(json.dumps(trace), encoding="utf-8")
        try:
            rows = convert(read_fedscale(path), seconds, rounds, repeat=repeat)
        except ValueError as exc:
            assert _one_line(str(exc)), str(exc)
            return
        assert all(1 <= a < b <= rounds + 1 for _, a, b, _ in rows)

    _run(budget, prop)
