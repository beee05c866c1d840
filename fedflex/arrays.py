"""Model parameters as ordered name -> numpy array dicts, and their Flower records.

Strategies work on plain numpy (pure functions, testable without Flower); messages carry
:class:`flwr.app.ArrayRecord`. These helpers convert between the two without reordering
keys, and flatten the float entries into one vector where a method needs one.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Mapping

import numpy as np
from flwr.app import Array, ArrayRecord


def record_to_numpy(record: ArrayRecord) -> "OrderedDict[str, np.ndarray]":
    """Arrays of a record, in the record's key order."""
    return OrderedDict((key, array.numpy()) for key, array in record.items())


def numpy_to_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    """Return a record holding ``arrays`` under their names (order kept)."""
    # np.ascontiguousarray would turn 0-d arrays (BatchNorm counters) into 1-d ones
    return ArrayRecord(OrderedDict((key, Array(np.require(value, requirements="C"))) for key, value in arrays.items()))


def is_float(array: np.ndarray) -> bool:
    """Whether an entry is a trainable-style float array (averaged), not a counter."""
    return np.issubdtype(array.dtype, np.floating)


def flatten(arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    """Return the float entries concatenated into one float64 vector (non-float entries skipped)."""
    parts = [np.asarray(v, dtype=np.float64).ravel() for v in arrays.values() if is_float(v)]
    return np.concatenate(parts) if parts else np.zeros(0)


def unflatten(vector: np.ndarray, like: Mapping[str, np.ndarray]) -> "OrderedDict[str, np.ndarray]":
    """Inverse of :func:`flatten`: float entries from ``vector``, others copied from ``like``."""
    out: "OrderedDict[str, np.ndarray]" = OrderedDict()
    offset = 0
    for key, value in like.items():
        if is_float(value):
            size = value.size
            out[key] = vector[offset : offset + size].reshape(value.shape).astype(value.dtype)
            offset += size
        else:
            out[key] = value.copy()
    if offset != vector.size:
        raise ValueError(f"vector has {vector.size} entries, the model's float arrays {offset}")
    return out
