"""The checks every config class uses: :class:`ConfigError` and the value tests that
raise it, each naming the dotted scenario key (``path`` + the field's name).
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from omegaconf import ListConfig


class ConfigError(ValueError):
    """A scenario key has a value that is not allowed.

    The message is one line: ``key = value: what is allowed``.
    """

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{key} = {value!r}: {allowed}")


def join(path: str, name: str) -> str:
    """Return the dotted key of field ``name`` under ``path``."""
    return f"{path}.{name}" if path else name


def choice(path: str, name: str, value: Any, allowed: Sequence[str]) -> None:
    """``value`` must be one of ``allowed``."""
    if value not in allowed:
        raise ConfigError(join(path, name), value, "must be one of " + ", ".join(allowed))


def number(
    path: str,
    name: str,
    value: Optional[float],
    *,
    gt: Optional[float] = None,
    ge: Optional[float] = None,
    lt: Optional[float] = None,
    le: Optional[float] = None,
    optional: bool = False,
) -> None:
    """``value`` must be a finite number within the given bounds (None only when ``optional``)."""
    key = join(path, name)
    if value is None:
        if optional:
            return
        raise ConfigError(key, value, "must be set")
    if isinstance(value, bool) or not isinstance(value, (int, float)):  # a config built in code
        raise ConfigError(key, value, "must be a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(key, value, "must be a finite number")
    bounds = []
    if gt is not None:
        bounds.append((value > gt, f"> {gt}"))
    if ge is not None:
        bounds.append((value >= ge, f">= {ge}"))
    if lt is not None:
        bounds.append((value < lt, f"< {lt}"))
    if le is not None:
        bounds.append((value <= le, f"<= {le}"))
    if not all(ok for ok, _ in bounds):
        raise ConfigError(key, value, "must be " + " and ".join(text for _, text in bounds))


def int_range(path: str, name: str, value: Any) -> Optional[list[int]]:
    """``value`` as ``[lo, hi]`` with integers 1 <= lo <= hi, or None."""
    if value is None:
        return None
    items = list(value) if isinstance(value, (list, tuple, ListConfig)) else None
    ok = (
        items is not None
        and len(items) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in items)
        and 1 <= items[0] <= items[1]
    )
    if not ok:
        raise ConfigError(join(path, name), value, "must be null (off) or [lo, hi] with integers 1 <= lo <= hi")
    assert items is not None
    return [int(v) for v in items]
