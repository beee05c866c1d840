"""The shipped study files (scenarios/studies/*.yaml): each loads and plans, every
variant of every axis gives a valid run config, and each of its reference numbers names a
group the study runs."""

import dataclasses
from pathlib import Path

import pytest

from fedflex.loader import load_scenario
from fedflex.strategies.combinations import check_parts
from fedflex.study.reference import label_parts
from fedflex.study.runs import flatten
from fedflex.study.sweep import plan, read_study

STUDIES = sorted((Path(__file__).parents[2] / "scenarios" / "studies").glob("*.yaml"))


def _checked_parts(sweep):
    """Each member's config loaded and its parts checked; its ``key=value`` parts (grid
    point and config values, as compare labels groups)."""
    parts = []
    for member in sweep.members:
        cfg = load_scenario(sweep.scenario, [*sweep.overrides, *member.overrides])
        check_parts(cfg)
        config = flatten(dataclasses.asdict(cfg))
        parts.append({f"{k}={v}" for k, v in member.point} | {f"{k}={v}" for k, v in config.items()})
    return parts


def test_there_are_study_files():
    assert len(STUDIES) >= 5


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.stem)
def test_a_study_file_plans_and_every_variant_is_a_valid_run(path, tmp_path):
    # Prepare
    study = read_study(path)
    args = (study["scenario"], study["overrides"])
    seed = (study["seeds"] or [0])[:1]  # the seed changes no other key: one is enough
    first = {key: values[:1] for key, values in study["grid"].items()}
    # Execute: the grid as written, and each variant axis with all its variants (the
    # other axes at their first value)
    written = plan(*args, study["grid"], seed, tmp_path, 1, study["variants"])
    every = [
        plan(*args, {**first, axis: list(named)}, seed, tmp_path, 1, study["variants"])
        for axis, named in study["variants"].items()
    ]
    # Assert: one member per grid point; every config valid with its parts; every
    # reference entry among some member's parts (a typo would match no group)
    points = 1
    for values in study["grid"].values():
        points *= len(values)
    assert len(written.members) == points
    parts = _checked_parts(written) + [p for sweep in every for p in _checked_parts(sweep)]
    for key in study["reference"]["groups"]:
        assert any(set(label_parts(key)) <= have for have in parts), f"{path.name}: reference {key!r} names no group"
