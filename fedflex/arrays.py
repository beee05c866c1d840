"""Model parameters as ordered name -> numpy array dicts, and their Flower records.

Strategies work on plain numpy (pure functions, testable without Flower); messages carry
:class:`flwr.app.ArrayRecord`. These helpers convert between the two without reordering
keys, and flatten the float entries into one vector where a method needs one.

An :class:`~flwr.app.Array` holds its array in ``.npy`` format. :func:`numpy_to_array` and
:func:`array_to_numpy` write and read exactly the bytes that Flower's ``Array(ndarray)`` and
``Array.numpy()`` do (``np.save`` / ``np.load``), with the ``.npy`` header of each dtype and
shape built once instead of formatted and parsed for every array: at 10,000 clients a round
moves 100 models each way, and the per-array header work was most of a message's cost.
"""

from __future__ import annotations

import io
import math
from collections import OrderedDict
from typing import Mapping

import numpy as np
from flwr.app import Array, ArrayRecord

NPY = "numpy.ndarray"  # Flower's SType.NUMPY: the Array's data is an .npy file
_HEADERS: dict[tuple[str, tuple[int, ...]], bytes] = {}
_DTYPES: dict[str, np.dtype] = {}  # an Array's dtype string -> its numpy dtype
_NAMES: dict[np.dtype, str] = {}  # a numpy dtype -> str(dtype), what Array(ndarray) writes


def _npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """Return the ``.npy`` header ``np.save`` writes for a C-ordered array of ``dtype`` and ``shape``."""
    key = (dtype.str, shape)
    header = _HEADERS.get(key)
    if header is None:
        buf = io.BytesIO()
        fields = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
        np.lib.format.write_array_header_1_0(buf, fields)
        header = _HEADERS[key] = buf.getvalue()
    return header


def dtype_name(dtype: np.dtype) -> str:
    """Return ``str(dtype)``, the dtype an ``Array(ndarray)`` of it says, remembered per dtype.

    Examples
    --------
    >>> dtype_name(np.dtype("float32")), dtype_name(np.dtype(">i4"))
    ('float32', '>i4')
    """
    name = _NAMES.get(dtype)
    if name is None:
        name = _NAMES[dtype] = str(dtype)
    return name


def numpy_to_array(value: np.ndarray) -> Array:
    """Return the :class:`~flwr.app.Array` of ``value``: the bytes of ``Array(value)`` for a
    C-ordered array (``value`` is made C-ordered first, 0-d arrays stay 0-d).
    """
    a = np.require(value, requirements="C")
    if a.dtype.hasobject or a.dtype.fields is not None:  # what the cached header cannot describe
        return Array(a)
    shape = tuple(int(n) for n in a.shape)
    return Array(dtype=dtype_name(a.dtype), shape=shape, stype=NPY, data=_npy_header(a.dtype, shape) + a.tobytes())


def array_to_numpy(array: Array) -> np.ndarray:
    """Return the array of ``array`` (a writable copy), as ``array.numpy()`` does; an Array
    whose bytes do not start with the header its dtype and shape give (a Fortran-ordered
    one, another writer's) is read by ``array.numpy()``.
    """
    if array.stype == NPY:
        dtype = _DTYPES.get(array.dtype)
        if dtype is None:
            try:
                dtype = np.dtype(array.dtype)
            except TypeError:
                return array.numpy()
            _DTYPES[array.dtype] = dtype
        shape = tuple(array.shape)
        header = _npy_header(dtype, shape)
        data = array.data
        if not dtype.hasobject and len(data) == len(header) + dtype.itemsize * math.prod(shape):
            if data.startswith(header):
                return np.frombuffer(data, dtype=dtype, offset=len(header)).reshape(shape).copy()
    return array.numpy()


def record_to_numpy(record: ArrayRecord) -> "OrderedDict[str, np.ndarray]":
    """Arrays of a record, in the record's key order."""
    return OrderedDict((key, array_to_numpy(array)) for key, array in record.items())


def numpy_to_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    """Return a record holding ``arrays`` under their names (order kept)."""
    # filled in place: ArrayRecord(dict of Arrays) would build every Array a second time
    # (its from_array_dict copies each one); np.ascontiguousarray would turn 0-d arrays
    # (BatchNorm counters) into 1-d ones, numpy_to_array keeps them 0-d
    record = ArrayRecord()
    for key, value in arrays.items():
        record[key] = numpy_to_array(value)
    return record


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
