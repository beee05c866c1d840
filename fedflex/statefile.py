"""Server state on disk in a format whose loading cannot run code.

A state file is one ``.npz`` (NumPy's zip of ``.npy`` arrays, read with
``allow_pickle=False``): every array of the state is an entry of its own, and the rest
of the state is JSON, stored as the UTF-8 bytes of the entry ``state.json``, where each
array appears as a reference to its entry. Loading parses JSON and reads raw array
bytes, nothing else, so a crafted file can at worst be refused; a pickle (the former
``checkpoint.pkl``) could run any command while being loaded.

The JSON keeps Python's types exactly, so that a resumed run continues bit for bit:
``{"__ndarray__": "a3"}`` an array (entry ``a3``, dtype and shape kept),
``{"__scalar__": "a4"}`` a NumPy scalar (a 0-d entry), ``{"__tuple__": [...]}`` a tuple,
``{"__odict__": [[key, value], ...]}`` an ``OrderedDict``, ``{"__items__": [[key,
value], ...]}`` a dict with keys other than strings (or with strings that start with
``__``), ``{"__float__": "nan"}`` a non-finite float. Python ints of any size (NumPy
Generator states) are JSON integers.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from fedflex.atomic import atomic_write

STATE_ENTRY = "state.json"
_TAGS = ("__ndarray__", "__scalar__", "__tuple__", "__odict__", "__items__", "__float__")


class StateFileError(ValueError):
    """A state file that cannot be read back (damaged, or not a state file)."""


def _encode(obj: Any, arrays: dict[str, np.ndarray], where: str) -> Any:
    if isinstance(obj, (np.ndarray, np.generic)):  # first: np.float64 is a float too
        if obj.dtype.hasobject:
            raise TypeError(f"{where}: an array of Python objects ({obj.dtype}) cannot be stored without pickle")
        name = f"a{len(arrays)}"
        arrays[name] = np.asarray(obj)
        return {"__ndarray__" if isinstance(obj, np.ndarray) else "__scalar__": name}
    if obj is None or isinstance(obj, (bool, str, int)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {"__float__": repr(obj)}
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        items = [[_encode(k, arrays, f"{where} key"), _encode(v, arrays, f"{where}[{k!r}]")] for k, v in obj.items()]
        if isinstance(obj, OrderedDict):
            return {"__odict__": items}
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: v for k, v in items}
        return {"__items__": items}
    raise TypeError(f"{where}: a {type(obj).__name__} cannot be stored in a state file")


def _decode(obj: Any, arrays: Any) -> Any:
    if isinstance(obj, list):
        return [_decode(v, arrays) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if len(obj) == 1:
        ((tag, value),) = obj.items()
        if tag == "__ndarray__":
            return arrays[value]
        if tag == "__scalar__":
            return arrays[value][()]
        if tag == "__tuple__":
            return tuple(_decode(v, arrays) for v in value)
        if tag == "__odict__":
            return OrderedDict((_key(k, arrays), _decode(v, arrays)) for k, v in value)
        if tag == "__items__":
            return {_key(k, arrays): _decode(v, arrays) for k, v in value}
        if tag == "__float__":
            return float(value)
    return {k: _decode(v, arrays) for k, v in obj.items()}


def _key(encoded: Any, arrays: Any) -> Any:
    key = _decode(encoded, arrays)
    return tuple(key) if isinstance(key, list) else key  # a key is hashable


def encode(obj: Any) -> tuple[Any, dict[str, np.ndarray]]:
    """``obj`` as JSON-able data plus the arrays it refers to.

    Raises
    ------
    TypeError
        For a value of another type (torch tensors, sets, objects, object arrays),
        naming where in ``obj`` it is.
    """
    arrays: dict[str, np.ndarray] = {}
    return _encode(obj, arrays, "state"), arrays


def decode(data: Any, arrays: Any) -> Any:
    """Return the inverse of :func:`encode` (``arrays``: a mapping of entry name -> array)."""
    return _decode(data, arrays)


def write_state(path: Path, obj: Any) -> None:
    """Write ``obj`` to ``path`` atomically (a temporary file in the same folder, synced,
    then ``os.replace``); on failure (a full disk) the temporary file is removed and an
    earlier file at ``path`` is left as it was.
    """
    with atomic_write(path) as fh:
        write_state_to(fh, obj)


def write_state_to(fh: BinaryIO, obj: Any) -> None:
    """Write ``obj`` as a state file into the open binary file ``fh`` (:func:`write_state`'s
    content, e.g. into memory).
    """
    data, arrays = encode(obj)
    text = json.dumps(data, allow_nan=False)
    np.savez(fh, **{STATE_ENTRY: np.frombuffer(text.encode("utf-8"), dtype=np.uint8)}, **arrays)  # type: ignore[arg-type]


def read_state(path: Path) -> Any:
    """Return the object a :func:`write_state` stored in ``path``, read without unpickling.

    Raises
    ------
    FileNotFoundError
        When there is no such file.
    StateFileError
        When the file is damaged or is not a state file (one line, the reader's reason).
    """
    try:
        with np.load(path, allow_pickle=False) as npz:
            if STATE_ENTRY not in npz.files:
                raise StateFileError(f"{path} holds no {STATE_ENTRY}")
            raw = npz[STATE_ENTRY]
            if raw.dtype != np.uint8 or raw.ndim != 1:
                raise StateFileError(f"{path}: {STATE_ENTRY} is not UTF-8 bytes")
            data = json.loads(raw.tobytes().decode("utf-8"))
            arrays = {name: npz[name] for name in npz.files if name != STATE_ENTRY}
        return decode(data, arrays)
    except (FileNotFoundError, StateFileError):
        raise
    except Exception as exc:  # a damaged zip, npy header or JSON raises many types
        reason = " ".join(str(exc).split())
        raise StateFileError(f"{path} is damaged ({type(exc).__name__}: {reason})") from None
