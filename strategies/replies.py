"""Checks on a client's training reply before any part reads it.

A reply is one client's word: it may be broken (a diverged model, a bug, another
version) or hostile (a client that wants to steer or end the run). :func:`check_reply`
turns a reply into a :class:`~strategies.parts.ClientUpdate` only when

- it is no bigger than :meth:`ReplyLimits.byte_limit` (checked first, on the raw bytes);
- ``num-examples`` is a finite integer >= 1 and at most what the client holds (its
  partition size, when the server knows it) or the explicit cap;
- the local rule's metrics (e.g. FedNova's ``fednova-a-norm``) are finite numbers;
- ``arrays`` has the global model's names, shapes and dtypes and finite values;
- it carries exactly the further array records its local rule sends (SCAFFOLD's
  ``scaffold-dc``, ...), each holding exactly the arrays every rule record of the run
  holds (:attr:`ReplyLimits.record_arrays`: the model's trainable float arrays; pinned by
  :func:`pin_record_arrays` from the first round's replies when not given), with the
  model's shapes and dtypes, all finite;
- the rule's counts are consistent (BHerd's ``herd-k`` <= ``herd-tau``, integers >= 0,
  ``herd-alpha-i`` in [0, 1]; FedNova's ``fednova-a-norm`` >= 0; a ``herd-g`` other than
  zero needs ``herd-k`` >= 1).

Otherwise it says why in one line. The strategy drops a rejected reply from its round,
logs one warning naming the client, and lists it in the round's ``rejected`` field; the
round goes on with the other replies.

What one reply cannot show, the round does (:func:`round_problems`, after every reply
was checked): a rule record is bounded relative to the round's updates. Its norm is at
most :attr:`ReplyLimits.record_ratio` times what the client's own model update allows
(SCAFFOLD: ``||dc + c|| <= ||x - y|| / lr``, FedNova: ``||a|| ||d|| <= ||x - y||``; both
hold exactly for an honest client, whose records are made from that update) and at most
:attr:`ReplyLimits.round_ratio` times the median of the round's other replies (BHerd's
``herd-g`` per selected gradient); the counts that scale the server's step (FedNova's
``fednova-a-norm``, BHerd's ``herd-tau``, FedCM's ``num-steps``, each per example, the
last also from below) likewise.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional, cast

import numpy as np
from flwr.app import ArrayRecord, RecordDict

from fedflex import keys
from fedflex.arrays import array_to_numpy, dtype_name
from fedflex.strategies.parts import ClientUpdate

NONFINITE = "has NaN or Inf values"  # the reason's ending for non-finite values (divergence detection)
MB = 2**20
#: automatic reply size limit: this many times the model's bytes, plus AUTO_SLACK
AUTO_FACTOR = 4
AUTO_SLACK = MB
#: a rule record's norm may be at most this many times what the client's own model update
#: allows (an honest client's is at most 1 time it: SCAFFOLD's, FedNova's)
RECORD_RATIO = 100.0
#: ... and at most this many times the median of the round's other replies (a guard against
#: gross values: honest clients differ by their data, e.g. 35x in SCAFFOLD's control-variate
#: changes on a non-IID partition, and up to the batch size in local steps per example
#: between a client smaller than one batch and a large one)
ROUND_RATIO = 1e4
#: relative tolerance of the own-update bounds (float32 rounding of the clients' arithmetic)
RECORD_RTOL = 1e-4


_CLIENT = "fedflex's ClientApp (fedflex.clients.client_app:app) with local rule"
#: what a reply that lacks a method's extra output is told: who sends that record or metric
HELPERS = {
    keys.SCAFFOLD_DC: f"SCAFFOLD's clients send their control-variate change ({_CLIENT} scaffold, "
    "or fedflex.clients.helpers.SCAFFOLDClient around your train())",
    keys.FEDNOVA_D: f"FedNova's clients send their normalised update ({_CLIENT} fednova, "
    "or fedflex.clients.helpers.FedNovaClient / fednova_mod)",
    keys.FEDNOVA_A_NORM: f"FedNova's clients send ||a_i||_1 ({_CLIENT} fednova, "
    "or fedflex.clients.helpers.FedNovaClient / fednova_mod)",
    **{
        key: f"BHerd's clients send their {what} ({_CLIENT} bherd, "
        "or fedflex.clients.helpers.BHerdClient around your train())"
        for key, what in (
            (keys.HERD_G, "herded gradient sum"),
            (keys.HERD_TAU, "local step count"),
            (keys.HERD_K, "number of selected gradients"),
            (keys.HERD_ALPHA_I, "selected fraction"),
        )
    },
}


@dataclass(frozen=True)
class ReplyLimits:
    """What a training reply may carry.

    Parameters
    ----------
    sizes
        Client id -> the examples it holds (its partition size); a reply claiming more is
        rejected. Clients not in it are bounded by ``cap``.
    cap
        Most ``num-examples`` of any client (None: no cap). Set, it replaces ``sizes``.
    max_bytes
        Most bytes of arrays and values in one reply (None: ``AUTO_FACTOR`` x the
        model's bytes + ``AUTO_SLACK``).
    records
        The array records besides ``arrays`` the local rule's replies carry (required;
        any other is rejected).
    metrics
        Metrics the local rule's replies carry (required, finite numbers).
    record_arrays
        The arrays every rule record holds, exactly (the model's trainable float arrays,
        in the model's order). None: not known yet (:func:`pin_record_arrays` sets it
        from a round's replies); until then a rule record holds a subset of the model's
        float arrays.
    record_ratio, round_ratio
        How far a rule record may exceed what the client's own update allows, and the
        median of the round's other replies (:func:`round_problems`).
    arrays_key
        The array record holding the model (Flower's ``arrayrecord_key``).
    weight_key
        The metric holding the client's example count, its aggregation weight
        (Flower's ``weighted_by_key``).
    """

    sizes: Mapping[int, int] = field(default_factory=dict)
    cap: Optional[int] = None
    max_bytes: Optional[int] = None
    records: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ()
    record_arrays: Optional[tuple[str, ...]] = None
    record_ratio: float = RECORD_RATIO
    round_ratio: float = ROUND_RATIO
    arrays_key: str = keys.ARRAYS
    weight_key: str = keys.NUM_EXAMPLES

    def bound(self, client: Optional[int]) -> Optional[int]:
        """Return the most examples ``client`` may claim (None: unbounded)."""
        if self.cap is not None:
            return self.cap
        return self.sizes.get(client) if client is not None else None

    def byte_limit(self, global_arrays: Mapping[str, np.ndarray]) -> int:
        """Return the largest reply accepted, in bytes (``max_bytes``, else a multiple of the model's size)."""
        if self.max_bytes is not None:
            return self.max_bytes
        return AUTO_FACTOR * sum(int(a.nbytes) for a in global_arrays.values()) + AUTO_SLACK


def num_examples_problem(n: Any, bound: Optional[int] = None, key: str = keys.NUM_EXAMPLES) -> str:
    """Why ``n`` is not a usable ``num-examples`` ("" when it is): a finite integer
    (an integral float counts) >= 1 and, with ``bound``, at most ``bound``.

    Examples
    --------
    >>> num_examples_problem(12.0), num_examples_problem(float("nan"))
    ('', 'num-examples is nan, not a finite number')
    >>> num_examples_problem(10**12, bound=40)
    'num-examples is 1000000000000, more than the 40 examples this client holds'
    """
    if isinstance(n, bool) or not isinstance(n, (int, float)):
        return f"{key} missing or not a number ({n!r})"
    if not math.isfinite(n):
        return f"{key} is {n}, not a finite number"
    if n != int(n):
        return f"{key} is {n}, not an integer"
    if n < 1:
        return f"{key} is {n}, must be >= 1"
    if bound is not None and n > bound:
        return f"{key} is {int(n)}, more than the {bound} examples this client holds"
    return ""


def reply_bytes(content: RecordDict) -> int:
    """Bytes a reply carries: array data plus metric and config values (strings and
    bytes by length, numbers 8 bytes each); cheap, nothing is decoded.
    """
    total = sum(len(a.data) for record in content.array_records.values() for a in record.values())
    for record in (*content.metric_records.values(), *content.config_records.values()):
        # flwr's stubs: the unpacked records are InflatableObject, which declares no values()
        for value in record.values():  # type: ignore[attr-defined]
            for item in value if isinstance(value, list) else [value]:
                total += len(item) if isinstance(item, (str, bytes)) else 8
    return total


def _decode(
    record: ArrayRecord,
    ref: Mapping[str, np.ndarray],
    name: str,
    whole: bool,
    names: Optional[tuple[str, ...]] = None,
) -> tuple[Optional["OrderedDict[str, np.ndarray]"], str]:
    """Return a record's arrays checked against the model ``ref``: the model's names in order
    (``whole``, the model itself) or, for a rule's record, exactly ``names`` (None: a
    non-empty subset of the model's float arrays), in the model's order; shapes and
    dtypes as the model's; finite floats.
    """
    where = f"{name}/" if name else ""
    if whole and list(record) != list(ref):
        return None, "array names differ from the global model's"
    unknown = [k for k in record if k not in ref]
    if unknown:
        return None, f"{name} has arrays the model does not have ({', '.join(unknown[:3])})"
    if not whole:
        if names is not None and set(record) != set(names):
            missing = [k for k in names if k not in record]
            more = sorted(set(record) - set(names))
            what = f"lacks {', '.join(missing[:3])}" if missing else f"also holds {', '.join(more[:3])}"
            listed = ", ".join(names[:3]) + (f", ... ({len(names)} in all)" if len(names) > 3 else "")
            return None, f"{name} {what}: every {name} of this run holds the arrays {listed}"
        if not len(record):
            return None, f"{name} holds no arrays"
    out: "OrderedDict[str, np.ndarray]" = OrderedDict()
    for key in ref if not whole else record:
        if key not in record:
            continue
        array, want = record[key], ref[key]
        try:  # the header says shape and dtype; the decoded array must agree with it
            a = array_to_numpy(array)
        except Exception as exc:  # malformed bytes raise many types
            return None, f"{where}{key} cannot be decoded ({type(exc).__name__})"
        if a.shape != want.shape or tuple(array.shape) != want.shape:
            return None, f"{where}{key} has shape {a.shape}, expected {want.shape}"
        # dtype.kind "f": the real floats (np.floating), checked without numpy's type hierarchy
        if not whole and not (a.dtype.kind == "f" and want.dtype.kind == "f"):
            return None, f"{where}{key} has dtype {a.dtype}, expected real floats like the model's {want.dtype}"
        if a.dtype != want.dtype or array.dtype != dtype_name(want.dtype):
            like = "" if whole else " like the model's"
            return None, f"{where}{key} has dtype {a.dtype}, expected {want.dtype}{like}"
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            return None, f"{where}{key} {NONFINITE}"
        out[key] = a
    return out, ""


def _count(metrics: Mapping[str, Any], key: str) -> Optional[int]:
    """Return a counting metric (an integral number >= 0) as an int; None when it is not one."""
    value = metrics.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return int(value) if value >= 0 and value == int(value) else None


def _rule_metrics_problem(metrics: Mapping[str, Any], wanted: tuple[str, ...]) -> str:
    """Why the local rule's counts in ``metrics`` (already finite numbers) do not fit together ("" when they do)."""
    if keys.HERD_K in wanted and keys.HERD_TAU in wanted:
        k, tau = _count(metrics, keys.HERD_K), _count(metrics, keys.HERD_TAU)
        if k is None or tau is None:
            given = f"{metrics[keys.HERD_K]!r}, {metrics[keys.HERD_TAU]!r}"
            return f"{keys.HERD_K} and {keys.HERD_TAU} must be integers >= 0 ({given})"
        if k > tau:
            return f"{keys.HERD_K} is {k}, more than the {tau} local steps ({keys.HERD_TAU})"
    if keys.HERD_ALPHA_I in wanted and not 0.0 <= float(metrics[keys.HERD_ALPHA_I]) <= 1.0:
        return f"{keys.HERD_ALPHA_I} is {metrics[keys.HERD_ALPHA_I]!r}, must be in [0, 1]"
    if keys.FEDNOVA_A_NORM in wanted and float(metrics[keys.FEDNOVA_A_NORM]) < 0:
        return f"{keys.FEDNOVA_A_NORM} is {metrics[keys.FEDNOVA_A_NORM]!r}, must be >= 0"
    return ""


def check_reply(
    content: RecordDict,
    global_arrays: "OrderedDict[str, np.ndarray]",
    limits: Optional[ReplyLimits] = None,
    client: Optional[int] = None,
) -> tuple[Optional[ClientUpdate], str]:
    """Return a validated :class:`ClientUpdate` from a training reply of ``client``, or
    (None, the reason in one line); see the module docstring for what is checked.
    """
    limits = limits if limits is not None else ReplyLimits()
    if limits.arrays_key not in content.array_records:
        return None, f"no {limits.arrays_key}"
    if keys.METRICS not in content.metric_records:
        return None, "no metrics"
    size, limit = reply_bytes(content), limits.byte_limit(global_arrays)
    if size > limit:
        return None, f"reply holds {size / MB:.1f} MB, more than the {limit / MB:.1f} MB limit"
    metrics: dict[str, Any] = dict(content[keys.METRICS])
    n = metrics.get(limits.weight_key)
    problem = num_examples_problem(n, limits.bound(client), limits.weight_key)
    if problem:
        return None, problem
    for name in limits.metrics:
        value = metrics.get(name)
        if value is None and name in HELPERS:
            return None, f"no {name} metric: {HELPERS[name]}"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return None, f"{name} missing or not a finite number ({value!r})"
    problem = _rule_metrics_problem(metrics, limits.metrics)
    if problem:
        return None, problem
    names = [name for name in content.array_records if name != limits.arrays_key]
    unexpected = [name for name in names if name not in limits.records]
    if unexpected:
        sent = ", ".join(limits.records) or "none"
        return None, f"unexpected array record {unexpected[0]} (the local rule's: {sent})"
    missing = [name for name in limits.records if name not in names]
    if missing:
        helper = HELPERS.get(missing[0], "the local rule sends it")
        return None, f"no {missing[0]} record: {helper}"
    arrays, reason = _decode(cast(ArrayRecord, content[limits.arrays_key]), global_arrays, "", whole=True)
    if arrays is None:
        return None, reason
    extras = {}
    for name in names:
        record = cast(ArrayRecord, content[name])
        extra, reason = _decode(record, global_arrays, name, whole=False, names=limits.record_arrays)
        if extra is None:
            return None, reason
        extras[name] = extra
    g = extras.get(keys.HERD_G)
    if g is not None and keys.HERD_K in limits.metrics and _count(metrics, keys.HERD_K) == 0 and _norm(g) > 0:
        return None, f"{keys.HERD_G} is not zero, but {keys.HERD_K} is 0 (no gradient selected)"
    client_id = -1 if client is None else client
    return ClientUpdate(
        client=client_id, num_examples=int(cast(int, n)), arrays=arrays, metrics=metrics, extras=extras
    ), ""


# ---------------------------------------------------------------------------- the round's bounds
def _norm(arrays: Mapping[str, np.ndarray], keys_: Optional[Any] = None) -> float:
    """L2 norm of ``arrays`` (of ``keys_`` only, when given) as one vector, in float64."""
    total = 0.0
    for k in arrays if keys_ is None else keys_:
        a = np.asarray(arrays[k], dtype=np.float64)
        total += float(np.dot(a.ravel(), a.ravel()))
    return math.sqrt(total)


def pin_record_arrays(limits: ReplyLimits, contents: Any, global_arrays: Mapping[str, np.ndarray]) -> ReplyLimits:
    """Return ``limits`` with :attr:`~ReplyLimits.record_arrays` set from a round's replies
    (``contents``: their RecordDicts) when the local rule sends records and it is not set
    yet: the set of arrays most replies' rule records hold (each reply's records must agree
    and be float arrays of the model; ties: the larger set). Unchanged when no reply offers one.

    The server does not know which of the model's arrays the clients train (BatchNorm's
    running statistics are float arrays, but no rule record holds them); every honest
    client sends the same ones, so a lone hostile reply cannot set them in a round of
    three or more.
    """
    if not limits.records or limits.record_arrays is not None:
        return limits
    floats = [k for k, a in global_arrays.items() if np.asarray(a).dtype.kind == "f"]
    votes: dict[tuple[str, ...], int] = {}
    for content in contents:
        sets = set()
        for name in limits.records:
            if name not in content.array_records:
                break
            held = set(cast(ArrayRecord, content[name]).keys())
            sets.add(tuple(k for k in floats if k in held) if held and held <= set(floats) else ())
        else:
            if len(sets) == 1 and () not in sets:
                (names,) = sets
                votes[names] = votes.get(names, 0) + 1
    if not votes:
        return limits
    best = max(votes, key=lambda names: (votes[names], len(names)))
    return replace(limits, record_arrays=best)


def _median(values: list[float], upper: bool) -> float:
    """Return the median of ``values``; for an even count the upper (``upper``) or lower middle value."""
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if upper or n % 2 else ordered[n // 2 - 1]


#: the count metric (per example: it grows with the data) that scales each local rule's server
#: step, and whether a small value harms too (FedCM divides its momentum by the local steps)
STEP_COUNTS: dict[str, tuple[str, bool]] = {
    "fednova": (keys.FEDNOVA_A_NORM, False),
    "bherd": (keys.HERD_TAU, False),
    "grab": (keys.HERD_TAU, False),
    "fedcm": (keys.NUM_STEPS, True),
}
#: the server's record each client record is relative to (SCAFFOLD: dc + c = (x - y) / (a lr))
CONTROLS = {keys.SCAFFOLD_DC: keys.SCAFFOLD_C}


def _own_update_problem(
    name: str,
    record: Mapping[str, np.ndarray],
    update: ClientUpdate,
    global_arrays: Mapping[str, np.ndarray],
    ratio: float,
    sent: Mapping[str, Mapping[str, np.ndarray]],
    lr: Optional[float],
) -> str:
    """Why ``record`` exceeds what the client's own model update allows ("" when it does not)."""
    if name not in (keys.SCAFFOLD_DC, keys.FEDNOVA_D):
        return ""
    delta = _norm({k: np.asarray(global_arrays[k], np.float64) - update.arrays[k] for k in record})
    if name == keys.FEDNOVA_D:  # ||a||_1 d = x - y (d = 0 when ||a||_1 = 0): the step tau_eff d
        a = update.metrics.get(keys.FEDNOVA_A_NORM)
        scale = max(float(a), 1.0) if isinstance(a, (int, float)) and math.isfinite(a) else 1.0
        size, bound, what = scale * _norm(record), delta, "||x - y||"
        name = f"{keys.FEDNOVA_A_NORM} x {name}"
    else:
        c = sent.get(CONTROLS[name])
        if c is None or not lr or any(k not in c for k in record):
            return ""
        # option II: dc + c = (x - y) / (||a||_1 lr) with ||a||_1 >= 1
        size = _norm({k: np.asarray(record[k], np.float64) + np.asarray(c[k], np.float64) for k in record})
        bound, what = delta / lr, f"||x - y|| / lr (lr {lr:g})"
        name = f"{name} + {CONTROLS[name]}"
    slack = RECORD_RTOL * (_norm(record) + size) + 1e-12
    if size > ratio * bound + slack:
        return f"{name} has norm {size:.4g}, more than {ratio:g} x {what} = {bound:.4g} of its own update"
    return ""


def round_problems(
    updates: list[ClientUpdate],
    global_arrays: Mapping[str, np.ndarray],
    limits: ReplyLimits,
    rule: str = "sgd",
    sent: Optional[Mapping[str, Mapping[str, np.ndarray]]] = None,
    lr: Optional[float] = None,
) -> dict[int, str]:
    """Client id -> why its rule records or counts are out of the round's bounds (one line each).

    Parameters
    ----------
    updates
        The round's checked replies (:func:`check_reply`).
    global_arrays
        The model they trained from.
    limits
        :attr:`ReplyLimits.record_ratio` and :attr:`ReplyLimits.round_ratio` are the
        factors of the bounds.
    rule
        The local rule (its counts in :data:`STEP_COUNTS`).
    sent
        The server's records of the round's train messages (SCAFFOLD's ``scaffold-c``).
    lr
        The clients' learning rate in the round (None: SCAFFOLD's own-update bound is not checked).

    Each rule record's norm (BHerd's ``herd-g`` per selected gradient) must be within
    ``record_ratio`` times the bound of the client's own update (:func:`_own_update_problem`)
    and at most ``round_ratio`` times the upper median of the other replies' (zeros left
    out); the rule's step count per example at most ``round_ratio`` times the others' upper
    median, and, where a small count harms, at least their lower median divided by it. Comparing with the other
    replies only, the upper median against a large value and the lower against a small
    one, a single hostile reply can neither pass nor get an honest one rejected in a round
    of two or more.
    """
    ratio, sent = limits.round_ratio, sent or {}
    problems: dict[int, str] = {}
    sizes: dict[str, list[float]] = {}
    for u in updates:
        for name, record in u.extras.items():
            problem = _own_update_problem(name, record, u, global_arrays, limits.record_ratio, sent, lr)
            if problem and u.client not in problems:
                problems[u.client] = problem
    for name in sorted({n for u in updates for n in u.extras}):
        label = f"{name} per selected gradient" if name == keys.HERD_G else f"{name} norm"
        for u in updates:
            k = _count(u.metrics, keys.HERD_K) if name == keys.HERD_G else 1
            sizes.setdefault(label, []).append(_norm(u.extras[name]) / k if name in u.extras and k else 0.0)
    counted, lower = STEP_COUNTS.get(rule, ("", False))
    if counted and all(isinstance(u.metrics.get(counted), (int, float)) for u in updates):
        sizes[f"{counted} per example"] = [float(u.metrics[counted]) / u.num_examples for u in updates]
    for label, values in sizes.items():
        for i, u in enumerate(updates):
            others = [v for j, v in enumerate(values) if j != i and v > 0]
            if u.client in problems or not others or values[i] <= 0:
                continue
            high, low = _median(others, upper=True), _median(others, upper=False)
            value, others_ = values[i], "of the round's other replies"
            if value > ratio * high:
                problems[u.client] = f"{label} is {value:.4g}, more than {ratio:g} x the median {high:.4g} {others_}"
            elif lower and label.startswith(counted) and value * ratio < low:
                problems[u.client] = f"{label} is {value:.4g}, less than 1/{ratio:g} of the median {low:.4g} {others_}"
    return problems
