"""A config dataclass to a Flower ConfigRecord's entries and back: the one to/from pair.

The server writes a typed options object (:class:`~fedflex.config.ClientConfig`,
:class:`~fedflex.config.LocalRuleConfig`) into a train message with :func:`to_record`;
the client reads the same class back with :func:`from_record`. Keys are
``<prefix>.<field>`` with the field name in kebab case (``local-rule.bherd-alpha``), the
house style of :mod:`fedflex.keys`. Defaults live in the dataclass alone: a field that
is ``None`` is not sent, and a field the record lacks takes the class default.

Examples
--------
>>> from dataclasses import dataclass
>>> @dataclass
... class Opts:
...     name: str = "sgd"
...     mu: float = 0.01
>>> to_record(Opts(mu=0.1), "rule")
{'rule.name': 'sgd', 'rule.mu': 0.1}
>>> from_record(Opts, {"rule.mu": 0.5}, "rule")
Opts(name='sgd', mu=0.5)
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Iterable, Mapping, Optional, TypeVar

T = TypeVar("T")

Scalar = "bool | int | float | str"
_CASTS = {bool: bool, int: int, float: float, str: str}


def record_key(prefix: str, name: str) -> str:
    """``prefix.field-name`` for the field ``field_name``."""
    return f"{prefix}.{name.replace('_', '-')}"


def to_record(obj: Any, prefix: str, only: Optional[Iterable[str]] = None) -> dict[str, Any]:
    """Return the scalar fields of dataclass ``obj`` (those named in ``only``, when given) as
    ConfigRecord entries; ``None`` values are left out. A list of ints (e.g.
    ``client.epochs_range``) travels as a ConfigRecord list.

    Raises
    ------
    TypeError
        For a field whose value is not a bool, int, float, str, list of ints or None.
    """
    names = set(only) if only is not None else None
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        if names is not None and f.name not in names:
            continue
        value = getattr(obj, f.name)
        if value is None:
            continue
        if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            out[record_key(prefix, f.name)] = [int(v) for v in value]
            continue
        if not isinstance(value, (bool, int, float, str)):
            raise TypeError(f"{type(obj).__name__}.{f.name} = {value!r} cannot travel in a ConfigRecord")
        out[record_key(prefix, f.name)] = value
    return out


def from_record(cls: type[T], record: Mapping[str, Any], prefix: str) -> T:
    """Return an instance of dataclass ``cls`` from the entries :func:`to_record` wrote; fields
    the record lacks take their defaults. Values are cast to the field's type.
    """
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(typing.cast(Any, cls)):
        key = record_key(prefix, f.name)
        if key in record:
            kwargs[f.name] = _cast(hints[f.name], record[key])
    return cls(**kwargs)


def _cast(hint: Any, value: Any) -> Any:
    """``value`` as the scalar type of ``hint`` (``Optional[int]`` -> int)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = args[0] if args else hint
    if typing.get_origin(base) is list:  # list[int]: each element cast
        cast = _CASTS.get(typing.get_args(base)[0], lambda v: v)
        return [cast(v) for v in value]
    return _CASTS.get(base, lambda v: v)(value)
