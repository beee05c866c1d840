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
  ``scaffold-dc``, ...), each a subset of the model's names with the model's shapes,
  real float values, all finite.

Otherwise it says why in one line. The strategy drops a rejected reply from its round,
logs one warning naming the client, and lists it in the round's ``rejected`` field; the
round goes on with the other replies.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
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
    record: ArrayRecord, ref: Mapping[str, np.ndarray], name: str, whole: bool
) -> tuple[Optional["OrderedDict[str, np.ndarray]"], str]:
    """Return a record's arrays checked against the model ``ref``: the model's names in order
    (``whole``, the model itself) or a subset of them (a rule's record, which must hold
    real floats); shapes and, for the model, dtypes as the model's; finite floats.
    """
    where = f"{name}/" if name else ""
    if whole and list(record) != list(ref):
        return None, "array names differ from the global model's"
    unknown = [k for k in record if k not in ref]
    if unknown:
        return None, f"{name} has arrays the model does not have ({', '.join(unknown[:3])})"
    out: "OrderedDict[str, np.ndarray]" = OrderedDict()
    for key, array in record.items():
        want = ref[key]
        try:  # the header says shape and dtype; the decoded array must agree with it
            a = array_to_numpy(array)
        except Exception as exc:  # malformed bytes raise many types
            return None, f"{where}{key} cannot be decoded ({type(exc).__name__})"
        if a.shape != want.shape or tuple(array.shape) != want.shape:
            return None, f"{where}{key} has shape {a.shape}, expected {want.shape}"
        # dtype.kind "f": the real floats (np.floating), checked without numpy's type hierarchy
        if whole and (a.dtype != want.dtype or array.dtype != dtype_name(want.dtype)):
            return None, f"{where}{key} has dtype {a.dtype}, expected {want.dtype}"
        if not whole and not (a.dtype.kind == "f" and want.dtype.kind == "f"):
            return None, f"{where}{key} has dtype {a.dtype}, expected real floats like the model's {want.dtype}"
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            return None, f"{where}{key} {NONFINITE}"
        out[key] = a
    return out, ""


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
        extra, reason = _decode(cast(ArrayRecord, content[name]), global_arrays, name, whole=False)
        if extra is None:
            return None, reason
        extras[name] = extra
    client_id = -1 if client is None else client
    return ClientUpdate(
        client=client_id, num_examples=int(cast(int, n)), arrays=arrays, metrics=metrics, extras=extras
    ), ""
