"""A paper's reference numbers beside a comparison's measured ones.

A study file (``scenarios/studies/*.yaml``) may carry, under ``reference:``, the numbers a
paper reports for the groups the study runs::

    reference:
      source: HiCS-FL (Chen & Vikalo, NeurIPS 2024), Table 2, FMNIST setting (2)
      groups:
        sampler=random: {paper rounds to 75%: 149}
        sampler=hics: {paper rounds to 75%: 60}

Each key of ``groups`` is one or more ``key=value`` parts separated by ``", "`` (a grid
axis, a named-variant axis or a config key, as ``fedflex compare`` labels its groups); an
entry applies to every group whose parts include all of its own, later entries adding to
or replacing the columns of earlier ones. ``fedflex compare --reference FILE`` adds the
columns to its table and names the source under it.
"""

from __future__ import annotations

from typing import Any, Iterable

from fedflex.study.runs import StudyError

REFERENCE_KEYS = ("source", "groups")
_FORM = "expected source: TEXT and groups: {'key=value, ...': {column: value}}"


def label_parts(label: str) -> tuple[str, ...]:
    """``"a=1, b=x"`` -> ``("a=1", "b=x")``."""
    return tuple(p.strip() for p in label.split(", ") if p.strip())


def parse_reference(value: Any, where: str) -> dict[str, Any]:
    """Return a ``reference:`` mapping checked: ``{"source": str, "groups": {key: {column: value}}}``.

    Raises
    ------
    StudyError
        For another shape, or a group key with a part that is not ``key=value``.
    """
    if not isinstance(value, dict) or not isinstance(value.get("groups"), dict) or set(value) - set(REFERENCE_KEYS):
        raise StudyError(f"{where}: reference: {_FORM}")
    groups: dict[str, dict[str, Any]] = {}
    for key, columns in value["groups"].items():
        parts = label_parts(str(key))
        if not parts or any("=" not in p or p.startswith("=") for p in parts):
            raise StudyError(f"{where}: reference: group {key!r}: expected key=value parts separated by ', '")
        if not isinstance(columns, dict) or not columns:
            raise StudyError(f"{where}: reference: group {key!r}: expected a mapping of column: value")
        groups[", ".join(parts)] = {str(c): v for c, v in columns.items()}
    return {"source": str(value.get("source") or ""), "groups": groups}


def merge_references(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``extra`` over ``base``: its source if it has one, its groups' columns over base's."""
    groups = {k: dict(v) for k, v in base.get("groups", {}).items()}
    for key, columns in extra.get("groups", {}).items():
        groups.setdefault(key, {}).update(columns)
    return {"source": extra.get("source") or base.get("source", ""), "groups": groups}


def columns(reference: dict[str, Any]) -> list[str]:
    """Return the reference's column names, in the order they first appear."""
    return list(dict.fromkeys(c for cols in reference["groups"].values() for c in cols))


def match(reference: dict[str, Any], parts: Iterable[str]) -> dict[str, Any]:
    """Return the reference columns of a group with label ``parts``: every entry whose parts are
    all among them, in file order.
    """
    have = set(parts)
    out: dict[str, Any] = {}
    for key, cols in reference["groups"].items():
        if set(label_parts(key)) <= have:
            out.update(cols)
    return out
