"""Study files: a scenario, its overrides, named variants, a grid, seeds and a reference,
read into one mapping (``fedflex sweep STUDY.yaml``; docs/studies.md). A study may name a
``base:`` study whose settings it extends.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedflex.config import ConfigError
from fedflex.loader import read_yaml
from fedflex.study.reference import label_parts, merge_references, parse_reference
from fedflex.study.runs import StudyError

STUDY_KEYS = ("base", "scenario", "overrides", "variants", "grid", "seeds", "reference", "out", "jobs")


def _value_text(value: Any) -> str:
    """Return a YAML value as an OmegaConf dotlist value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def _flat_overrides(mapping: Any, prefix: str = "") -> list[str]:
    if isinstance(mapping, dict):
        out = []
        for key, value in mapping.items():
            out += (
                _flat_overrides(value, f"{prefix}{key}.")
                if isinstance(value, dict)
                else [f"{prefix}{key}={_value_text(value)}"]
            )
        return out
    raise StudyError(f"overrides: expected a list of key=value or a mapping, not {type(mapping).__name__}")


def is_study_file(path: Path) -> bool:
    """Return a study file (a mapping with ``scenario:`` or ``base:``), as opposed to a scenario file."""
    try:
        data = read_yaml(Path(path), names_only=False)
    except ConfigError:
        return False
    return "scenario" in data or "base" in data


def _override_list(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, list):
        return [str(o) for o in value]
    if isinstance(value, dict):
        return _flat_overrides(value)
    raise StudyError(f"{where}: expected a list of key=value or a mapping, not {type(value).__name__}")


def _read_variants(data: Any, path: Path) -> dict[str, dict[str, list[str]]]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise StudyError(f"{path}: variants: expected axis: {{name: overrides}}")
    variants: dict[str, dict[str, list[str]]] = {}
    for axis, named in data.items():
        axis = str(axis)
        if "." in axis or "=" in axis or "," in axis or axis == "seed" or not axis:
            raise StudyError(f"{path}: variants: axis {axis!r}: a plain name (no '.', '=' or ','), not 'seed'")
        if not isinstance(named, dict) or not named:
            raise StudyError(f"{path}: variants: {axis}: expected name: overrides")
        variants[axis] = {str(n): _override_list(o, f"{path}: variants: {axis}: {n}") for n, o in named.items()}
    return variants


def read_study(path: Path, _within: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Return a study file's ``scenario`` (resolved against the folder of the file that names it),
    ``overrides``, ``variants``, ``grid``, ``seeds``, ``reference`` and optional ``out`` /
    ``jobs``, on top of those of its ``base:`` study when it has one.
    """
    path = Path(path)
    if path.resolve() in _within:
        raise StudyError(f"{path}: base: a study cannot be its own base")
    data = read_yaml(path, names_only=False)
    unknown = sorted(set(data) - set(STUDY_KEYS))
    if unknown:
        raise StudyError(f"{path}: unknown key {unknown[0]!r}; a study file has: {', '.join(STUDY_KEYS)}")
    if "base" in data:
        if not isinstance(data["base"], str):
            raise StudyError(f"{path}: base: expected the path of another study file")
        study = read_study(path.parent / data["base"], (*_within, path.resolve()))
    else:
        study = {"overrides": [], "variants": {}, "grid": {}, "seeds": None, "reference": {"groups": {}}}
        study.update(out=None, jobs=None)
        if not isinstance(data.get("scenario"), str):
            raise StudyError(f"{path}: scenario: expected the path of a scenario file")
    if "scenario" in data:
        if not isinstance(data["scenario"], str):
            raise StudyError(f"{path}: scenario: expected the path of a scenario file")
        study["scenario"] = (path.parent / data["scenario"]).resolve()
    study["overrides"] = [*study["overrides"], *_override_list(data.get("overrides"), f"{path}: overrides")]
    for axis, named in _read_variants(data.get("variants"), path).items():
        study["variants"][axis] = {**study["variants"].get(axis, {}), **named}
    grid = data.get("grid") or {}
    if not isinstance(grid, dict):
        raise StudyError(f"{path}: grid: expected a mapping of key: [values]")
    study["grid"] = {
        **study["grid"],
        **{str(k): [_value_text(v) for v in (vs if isinstance(vs, list) else [vs])] for k, vs in grid.items()},
    }
    seeds = data.get("seeds")
    if "seeds" in data and (seeds is None or seeds == []):  # not the scenario's seed without a word
        raise StudyError(
            f"{path}: seeds: {'[]' if seeds == [] else 'empty'} names no seed: list at least one (or leave "
            "seeds out to run the scenario's seed)"
        )
    if seeds is not None:
        seeds = seeds if isinstance(seeds, list) else [seeds]
        if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds):
            raise StudyError(f"{path}: seeds: expected non-negative integers")
        study["seeds"] = seeds
    if data.get("reference") is not None:
        study["reference"] = merge_references(study["reference"], parse_reference(data["reference"], str(path)))
    for key in ("out", "jobs"):
        if data.get(key) is not None:
            study[key] = data[key]
    _check_reference_axes(study, path)
    return study


def _check_reference_axes(study: dict[str, Any], path: Path) -> None:
    """Every ``variant=name`` part of a reference group names a known variant (a typo
    would otherwise match no group, silently).
    """
    for key in study["reference"].get("groups", {}):
        for part in label_parts(key):
            axis, _, value = part.partition("=")
            if axis in study["variants"] and value not in study["variants"][axis]:
                raise StudyError(
                    f"{path}: reference: group {key!r}: {value!r} is not a variant of {axis}; "
                    f"there are: {', '.join(study['variants'][axis])}"
                )


def read_reference(path: Path) -> dict[str, Any]:
    """Return the ``reference:`` of a study file (its ``base:`` included) or of a YAML file that
    holds only ``reference:``.

    Raises
    ------
    StudyError
        When the file cannot be read or has no ``reference:``.
    """
    path = Path(path)
    try:
        data = read_yaml(path, names_only=False)
    except ConfigError as exc:
        raise StudyError(f"--reference {path}: {exc}") from None
    reference = (
        read_study(path)["reference"] if is_study_file(path) else parse_reference(data.get("reference"), str(path))
    )
    if not reference["groups"]:
        raise StudyError(f"--reference {path}: no reference: groups in it")
    return reference
