"""``fedflex compare``: tables and seed-banded curves over groups of runs.

Runs are found under the given directories (a run directory holds ``config.yaml`` and
``metrics.jsonl``; folders whose name starts with ``.`` are skipped). They are grouped by
the config keys whose values differ between them, leaving out the seed and the keys that
only say how a run executes (:data:`fedflex.study.runs.EXECUTION_KEYS`), or by the keys
given. Per group and over its runs (its seeds): n; final, best and last-10%-of-rounds
mean test accuracy, e-LUDD (FedAWARE's mean e-LUD, :func:`fedflex.results.summarize`) and
wall time, each as mean, sample standard deviation (ddof = 1) and the 95% Student-t
interval of the mean (``scipy.stats.t``); rounds to a target accuracy on the raw and on the
Savitzky-Golay-smoothed curve (:func:`fedflex.results.rounds_to_accuracy`,
:func:`fedflex.results.smoothed_rounds_to_accuracy`), as mean and std over the runs that
reach it (and their median); any numeric field of ``summary.json`` asked for (``fields``,
a dotted path, list items by 0-based index: ``transitions.2.mean_online_accuracy``) as mean,
std and interval. Runs that did not complete, or ran another number of rounds than the
rest of their group, are listed and left out unless ``include_incomplete``.

Runs of a sweep (a ``sweep.json`` beside them lists their grid point) are labelled by their
grid point, ``method=fedavgm`` rather than the config keys a named variant sets, where the
groups and the grid points correspond one to one; ``by`` may name a grid axis. A paper's
numbers (:mod:`fedflex.study.reference`) join the table as columns of their own.

It is over 600 lines because grouping runs, the figures per group (each a documented
definition) and the table, Markdown and CSV writers read the same rows and are kept as
one command.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from fedflex.config import ScenarioConfig
from fedflex.loader import alias_mapping
from fedflex.results import (
    read_metrics,
    rounds_to_accuracy,
    smoothed_rounds_to_accuracy,
    summarize,
    sustained_rounds_to_accuracy,
    wrap_title,
)
from fedflex.study import reference as ref
from fedflex.study.runs import StudyError, flatten, is_execution_key, is_run_dir, read_summary, run_state

#: config keys that name the seed (grouping leaves them out)
SEED_KEYS = ("seed",)
TABLE_FILE = "compare.md"
CSV_FILE = "compare.csv"
#: HiCS-FL's plots smooth with a window of 13 and order 3
SMOOTH_WINDOW = 13
SMOOTH_ORDER = 3
CONFIDENCE = 0.95
STATS = ("final_accuracy", "best_accuracy", "last10_accuracy", "e_ludd", "wall_s", "mb_total")
#: the range each figure can take: its interval is clipped to it (a t-interval over 2 seeds
#: can reach past 1 for an accuracy, below 0 for a time)
RANGES: dict[str, tuple[Optional[float], Optional[float]]] = {
    "final_accuracy": (0.0, 1.0),
    "best_accuracy": (0.0, 1.0),
    "last10_accuracy": (0.0, 1.0),
    "e_ludd": (0.0, None),
    "wall_s": (0.0, None),
    "mb_total": (0.0, None),
    "acc_at_budget": (0.0, 1.0),
}


@dataclasses.dataclass
class Run:
    """One run directory, read."""

    path: Path
    config: dict[str, Any]  # flat: dotted key -> value
    rows: list[dict[str, Any]]  # training rounds only
    summary: Optional[dict[str, Any]]
    state: str
    point: dict[str, str] = dataclasses.field(default_factory=dict)  # its sweep grid point, seed aside
    order: tuple[str, int] = ("", 0)  # its sweep directory and place in the sweep's plan

    @property
    def stopped_early(self) -> bool:
        """Return True when the run stopped early (a stop rule fired)."""
        return bool((self.summary or {}).get("stopped_early"))


@dataclasses.dataclass
class Study:
    """Groups of runs and the runs left out."""

    keys: list[str]
    groups: list[tuple[str, dict[str, Any], list[Run]]]  # label, key values, included runs
    excluded: list[tuple[Run, str]]  # run, why


def find_runs(paths: Iterable[str | Path]) -> list[Path]:
    """Run directories at or under ``paths`` (sorted; ``.``-folders skipped).

    Raises
    ------
    StudyError
        For a path that does not exist or holds no run.
    """
    found: list[Path] = []
    for path in map(Path, paths):
        if not path.is_dir():
            raise StudyError(f"{path}: no such directory")
        if is_run_dir(path):
            found.append(path)
            continue
        here = sorted(
            p.parent
            for p in path.rglob("config.yaml")
            if is_run_dir(p.parent) and not any(part.startswith(".") for part in p.parent.relative_to(path).parts)
        )
        if not here:
            raise StudyError(f"{path}: no run directory (config.yaml and metrics.jsonl) in it or under it")
        found += here
    return list(dict.fromkeys(found))


def load_run(path: Path) -> Run:
    """Return a run directory's flat config, training rows, summary and state."""
    import yaml

    try:
        config = yaml.safe_load((Path(path) / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise StudyError(f"{path}/config.yaml cannot be read ({exc})") from None
    try:
        rows = read_metrics(path)
    except (OSError, ValueError) as exc:
        raise StudyError(f"{path}/metrics.jsonl cannot be read ({exc})") from None
    rows = [r for r in rows if r.get("phase", "train") == "train"]
    point, order = sweep_point(Path(path))
    # a run of the first release saved the flat option keys: read them in the new places; an
    # option added after the run reads as its default (as a sweep reads it), so that runs of
    # one configuration made before and after group together
    flat = {**default_config(), **flatten(alias_mapping(config, warn=False) if isinstance(config, dict) else {})}
    return Run(Path(path), flat, rows, read_summary(path), run_state(path), point, order)


@functools.lru_cache(maxsize=1)
def default_config() -> dict[str, Any]:
    """Return the default scenario's flat keys and values."""
    return flatten(dataclasses.asdict(ScenarioConfig()))


def sweep_point(path: Path) -> tuple[dict[str, str], tuple[str, int]]:
    """Return the grid point (seed aside) and plan position of a run that a ``sweep.json`` in its
    parent directory lists; ``({}, ("", 0))`` for other runs.
    """
    index_path = path.parent / "sweep.json"
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}, ("", 0)
    members = index.get("members") if isinstance(index, dict) else None
    for k, member in enumerate(members if isinstance(members, list) else []):
        if isinstance(member, dict) and member.get("name") == path.name and isinstance(member.get("point"), dict):
            point = {str(a): str(v) for a, v in member["point"].items() if a not in SEED_KEYS}
            return point, (str(path.parent), k)
    return {}, ("", 0)


def _key_text(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _plain(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return value if isinstance(value, str) else json.dumps(value)


def differing_keys(runs: Sequence[Run]) -> list[str]:
    """Config keys whose values differ between ``runs`` (seed and execution keys aside)."""
    keys = sorted({k for r in runs for k in r.config})
    return [
        k
        for k in keys
        if k not in SEED_KEYS and not is_execution_key(k) and len({_key_text(r.config.get(k)) for r in runs}) > 1
    ]


def _sort_key(values: tuple[Any, ...]) -> tuple:
    return tuple(
        (0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, _plain(v)) for v in values
    )


def group_runs(runs: Sequence[Run], by: Optional[Sequence[str]] = None, include_incomplete: bool = False) -> Study:
    """Group ``runs`` by ``by`` (default: :func:`differing_keys`), leaving out runs that did
    not complete or ran another number of rounds than their group (unless
    ``include_incomplete``).
    """
    if by:
        known = {k for r in runs for k in r.config}
        axes = {a for r in runs for a in r.point}
        for key in by:
            if key not in known and key not in axes:
                raise StudyError(f"--by {key}: no run's config.yaml has this key, and no sweep this grid axis")
        keys = list(by)
    else:
        keys = differing_keys(runs)

    def value(run: Run, key: str) -> Any:
        return run.config.get(key) if key in run.config or key not in run.point else run.point[key]

    buckets: dict[tuple, list[Run]] = {}
    for run in runs:
        buckets.setdefault(tuple(_key_text(value(run, k)) for k in keys), []).append(run)
    groups, excluded = [], []
    for members in buckets.values():
        values = {k: value(members[0], k) for k in keys}
        complete = [r for r in members if r.state == "completed" and not r.stopped_early]
        counts = Counter(len(r.rows) for r in complete)
        expected = max(counts, key=lambda n: (counts[n], n)) if counts else None
        kept = []
        for run in members:
            why = _why_left_out(run, expected)
            if why is None or include_incomplete:
                kept.append(run)
            else:
                excluded.append((run, why))
        if not kept:
            continue
        if keys:
            label = ", ".join(f"{k}={_plain(v)}" for k, v in values.items())
        else:
            label = str(members[0].config.get("name", "all runs"))
        groups.append((label, values, kept))
    groups.sort(key=lambda g: _sort_key(tuple(g[1].values())))
    points = [_common_point(runs) for _, _, runs in groups]
    if groups and all(points) and len(set(points)) == len(points):  # grid points name the groups
        groups = [(", ".join(f"{a}={v}" for a, v in p), values, runs) for p, (_, values, runs) in zip(points, groups)]
        groups.sort(key=lambda g: min(r.order for r in g[2]))  # in the sweep's order
    return Study(keys, groups, excluded)


def _common_point(runs: Sequence[Run]) -> tuple[tuple[str, str], ...]:
    """Return the grid point all ``runs`` share, () when they have none or several."""
    points = {tuple(r.point.items()) for r in runs}
    return next(iter(points)) if len(points) == 1 else ()


def group_parts(values: dict[str, Any], runs: Sequence[Run]) -> list[str]:
    """Return a group's ``key=value`` parts for matching reference entries: its key values, its
    runs' shared grid point, and the config values all its runs share.
    """
    parts = [f"{k}={_plain(v)}" for k, v in values.items()]
    parts += [f"{a}={v}" for a, v in _common_point(runs)]
    shared = set.intersection(*({f"{k}={_plain(v)}" for k, v in r.config.items()} for r in runs)) if runs else set()
    return list(dict.fromkeys([*parts, *sorted(shared)]))


def _why_left_out(run: Run, expected: Optional[int]) -> Optional[str]:
    if run.state != "completed":
        planned = run.config.get("rounds")
        done = (run.summary or {}).get("last_round", run.rows[-1]["round"] if run.rows else 0)
        what = {"incomplete": "no summary.json (killed, or still running)"}.get(run.state, run.state)
        return f"{what} after round {done} of {planned}"
    if not run.stopped_early and expected is not None and len(run.rows) != expected:
        return f"{len(run.rows)} rounds, its group has {expected}"
    return None


# ---------------------------------------------------------------------------- figures
def mean_interval(
    values: Sequence[float],
    confidence: float = CONFIDENCE,
    bounds: tuple[Optional[float], Optional[float]] = (None, None),
) -> dict[str, Optional[float]]:
    """Mean, sample std (ddof = 1) and the Student-t interval of the mean, clipped to
    ``bounds`` (the values' possible range: the interval says where the mean may lie, and it
    cannot lie outside it); std and the interval are None for fewer than two values,
    everything None for none.
    """
    from scipy import stats

    x = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if x.size == 0:
        return {"mean": None, "std": None, "ci_low": None, "ci_high": None}
    mean = float(x.mean())
    if x.size < 2:
        return {"mean": mean, "std": None, "ci_low": None, "ci_high": None}
    std = float(x.std(ddof=1))
    half = float(stats.t.ppf((1 + confidence) / 2, x.size - 1)) * std / math.sqrt(x.size)
    low, high = mean - half, mean + half
    if bounds[0] is not None:
        low = max(low, bounds[0])
    if bounds[1] is not None:
        high = min(high, bounds[1])
    return {"mean": mean, "std": std, "ci_low": low, "ci_high": high}


def last_fraction_accuracy(rows: Sequence[dict[str, Any]], fraction: float = 0.1) -> Optional[float]:
    """Mean test accuracy over the last ``fraction`` of a run's rounds (at least one round;
    the evaluated ones among them).
    """
    if not rows:
        return None
    k = max(1, math.ceil(fraction * len(rows)))
    accs = [r["test_accuracy"] for r in rows[-k:] if r.get("test_accuracy") is not None]
    return float(np.mean(accs)) if accs else None


def summary_value(summary: Optional[dict[str, Any]], path: str) -> Optional[float]:
    """Return the number at dotted ``path`` of a summary (integer parts index lists, from 0);
    None where there is none.
    """
    node: Any = summary or {}
    for part in path.split("."):
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and part.lstrip("-").isdigit() and -len(node) <= int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    if isinstance(node, (int, float)) and not isinstance(node, bool) and math.isfinite(node):
        return float(node)
    return None


def _reaching(rows: Sequence[dict[str, Any]], target: float) -> Optional[int]:
    """Return the index of the first train row whose test accuracy reaches ``target``, or None."""
    for i, row in enumerate(rows):
        accuracy = row.get("test_accuracy")
        if row.get("phase", "train") == "train" and accuracy is not None and accuracy >= target:
            return i
    return None


def megabytes_to_accuracy(rows: Sequence[dict[str, Any]], target: float) -> Optional[float]:
    """Megabytes (10^6 bytes, down and up, every row's messages) sent until the first train
    round whose test accuracy reaches ``target``; None when it is never reached or the rows
    count no bytes (runs from before the cost accounting).
    """
    reached = _reaching(rows, target)
    if reached is None or any("bytes_down" not in row for row in rows[: reached + 1]):
        return None
    return sum(int(row["bytes_down"]) + int(row["bytes_up"]) for row in rows[: reached + 1]) / 1e6


def accuracy_at_budget(rows: Sequence[dict[str, Any]], megabytes: float) -> Optional[float]:
    """Test accuracy of the last evaluated train round whose messages so far (down and up,
    every row's, 10^6 bytes) stay within ``megabytes``: the model a budget buys. None when
    no evaluated round fits, or the rows count no bytes (runs from before the cost accounting).
    """
    spent, accuracy = 0, None
    for row in rows:
        if "bytes_down" not in row:
            return None
        spent += int(row["bytes_down"]) + int(row["bytes_up"])
        if spent > megabytes * 1e6:
            break
        if row.get("phase", "train") == "train" and row.get("test_accuracy") is not None:
            accuracy = float(row["test_accuracy"])
    return accuracy


def sim_seconds_to_accuracy(rows: Sequence[dict[str, Any]], target: float) -> Optional[float]:
    """Return the simulated clock (``sim_clock_s``, ``system:``) at the first train round whose test
    accuracy reaches ``target``; None when it is never reached or the run had no system model.
    """
    reached = _reaching(rows, target)
    clock = rows[reached].get("sim_clock_s") if reached is not None else None
    return float(clock) if clock is not None else None


def run_figures(
    run: Run,
    target: Optional[float],
    window: int = SMOOTH_WINDOW,
    order: int = SMOOTH_ORDER,
    fields: Sequence[str] = (),
    sustain: Optional[int] = None,
    budget_mb: Optional[float] = None,
) -> dict[str, Any]:
    """One run's figures (the per-seed values a group's statistics are over); with a target
    and ``sustain`` K, also the rounds to it held for K evaluations in a row; with
    ``budget_mb``, the accuracy at that byte budget (``acc_at_budget``).
    """
    headline = summarize(run.rows)
    wall = (run.summary or {}).get("run_wall_s")
    figures: dict[str, Any] = {
        "final_accuracy": headline["final_test_accuracy"],
        "best_accuracy": headline["best_test_accuracy"],
        "last10_accuracy": last_fraction_accuracy(run.rows),
        "e_ludd": headline.get("e_ludd"),
        "wall_s": float(wall) if wall is not None else headline["total_wall_s"],
        "mb_total": (headline["bytes_down"] + headline["bytes_up"]) / 1e6 if "bytes_down" in headline else None,
    }
    if target is not None:
        figures["mb_to_target"] = megabytes_to_accuracy(run.rows, target)
        figures["sim_s_to_target"] = sim_seconds_to_accuracy(run.rows, target)
        figures["rounds_to_target"] = rounds_to_accuracy(run.rows, target)
        figures["rounds_to_target_smoothed"] = smoothed_rounds_to_accuracy(
            run.rows, target, window, order, final_only=run.stopped_early or run.state != "completed"
        )
        if sustain:
            figures["rounds_to_target_sustained"] = sustained_rounds_to_accuracy(run.rows, target, sustain)
    if budget_mb is not None:
        figures["acc_at_budget"] = accuracy_at_budget(run.rows, budget_mb)
    for path in fields:
        figures[path] = summary_value(run.summary, path)
    return figures


def table(
    study: Study,
    target: Optional[float] = None,
    window: int = SMOOTH_WINDOW,
    order: int = SMOOTH_ORDER,
    fields: Sequence[str] = (),
    reference: Optional[dict[str, Any]] = None,
    sustain: Optional[int] = None,
    budget_mb: Optional[float] = None,
) -> list[dict[str, Any]]:
    """One dict per group: ``group``, the key values, ``n``, ``seeds``, ``rounds``, and per
    figure (and summary field, and ``acc_at_budget`` with ``budget_mb``) ``<name>_mean`` /
    ``_std`` / ``_ci_low`` / ``_ci_high``;
    with a target, ``rounds_to_target[_smoothed]_mean`` / ``_std`` / ``_median`` /
    ``_reached`` (and ``rounds_to_target_sustained_*`` with ``sustain``); with a reference,
    ``reference``: its columns for the group.
    """
    out = []
    rounds_names = ["rounds_to_target", "rounds_to_target_smoothed", "mb_to_target", "sim_s_to_target"] + (
        ["rounds_to_target_sustained"] if sustain else []
    )
    for label, values, runs in study.groups:
        per_run = [run_figures(r, target, window, order, fields, sustain, budget_mb) for r in runs]
        row: dict[str, Any] = {"group": label, **values, "n": len(runs)}
        row["seeds"] = [r.config.get("seed") for r in runs]
        row["rounds"] = sorted({len(r.rows) for r in runs})
        row["evaluations"] = sorted({sum(x.get("test_accuracy") is not None for x in r.rows) for r in runs})
        for name in (*STATS, *(["acc_at_budget"] if budget_mb is not None else []), *fields):
            for stat, value in mean_interval([f[name] for f in per_run], bounds=RANGES.get(name, (None, None))).items():
                row[f"{name}_{stat}"] = value
        if target is not None:
            for name in rounds_names:
                reached = [f[name] for f in per_run if f[name] is not None]
                stats = mean_interval(reached)
                row[f"{name}_mean"], row[f"{name}_std"] = stats["mean"], stats["std"]
                row[f"{name}_median"] = float(np.median(reached)) if reached else None
                row[f"{name}_reached"] = len(reached)
        if reference is not None:
            row["reference"] = ref.match(reference, group_parts(values, runs))
        row["runs"] = [str(r.path) for r in runs]
        out.append(row)
    return out


def compare(
    dirs: Iterable[str | Path],
    by: Optional[Sequence[str]] = None,
    target: Optional[float] = None,
    include_incomplete: bool = False,
    window: int = SMOOTH_WINDOW,
    order: int = SMOOTH_ORDER,
    fields: Sequence[str] = (),
    reference: Optional[dict[str, Any]] = None,
    sustain: Optional[int] = None,
    budget_mb: Optional[float] = None,
) -> list[dict[str, Any]]:
    """Return the comparison table of the runs in ``dirs`` as data (see :func:`table`)."""
    study = group_runs([load_run(p) for p in find_runs(dirs)], by, include_incomplete)
    return table(study, target, window, order, fields, reference, sustain, budget_mb)


# ---------------------------------------------------------------------------- writing
def _cell(row: dict[str, Any], name: str, digits: int = 4) -> str:
    mean, std = row.get(f"{name}_mean"), row.get(f"{name}_std")
    if mean is None:
        return "-"
    text = f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "")
    low, high = row.get(f"{name}_ci_low"), row.get(f"{name}_ci_high")
    if low is not None:
        text += f" [{low:.{digits}f}, {high:.{digits}f}]"
    return text


def _rounds_cell(row: dict[str, Any], name: str, digits: int = 1) -> str:
    reached = row[f"{name}_reached"]
    if not reached:
        return f"- (0/{row['n']})"
    std = row[f"{name}_std"]
    mean = f"{row[f'{name}_mean']:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "")
    return mean + f", median {row[f'{name}_median']:g} ({reached}/{row['n']})"


def _reference_cell(value: Any) -> str:
    return "-" if value is None else _plain(value)


def markdown(
    rows: Sequence[dict[str, Any]],
    study: Study,
    target: Optional[float],
    window: int = SMOOTH_WINDOW,
    fields: Sequence[str] = (),
    reference: Optional[dict[str, Any]] = None,
    sustain: Optional[int] = None,
    budget_mb: Optional[float] = None,
) -> str:
    """Return the table as Markdown, with the reference's source and the runs left out under it."""
    head = ["group", "n", "final acc", "best acc", "last-10% acc"]
    if target is not None:
        head += [f"rounds to {target:g}", f"rounds to {target:g} (smoothed, w={window})"]
        head += [f"rounds to {target:g} (held {sustain})"] if sustain else []
    simulated = any(row.get("sim_s_to_target_reached") for row in rows)  # runs with a system model
    head += [f"MB to {target:g}"] if target is not None else []
    head += [f"simulated s to {target:g}"] if simulated else []
    head += [f"acc at {budget_mb:g} MB"] if budget_mb is not None else []
    head += ["e-LUDD", "wall s", "MB sent", *fields]
    extra = ref.columns(reference) if reference else []
    head += extra
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["group"], str(row["n"])]
        cells += [_cell(row, name) for name in ("final_accuracy", "best_accuracy", "last10_accuracy")]
        if target is not None:
            cells += [_rounds_cell(row, "rounds_to_target"), _rounds_cell(row, "rounds_to_target_smoothed")]
            cells += [_rounds_cell(row, "rounds_to_target_sustained")] if sustain else []
            cells += [_rounds_cell(row, "mb_to_target", 2)]
            cells += [_rounds_cell(row, "sim_s_to_target", 1)] if simulated else []
        cells += [_cell(row, "acc_at_budget")] if budget_mb is not None else []
        cells += [_cell(row, "e_ludd"), _cell(row, "wall_s", 1), _cell(row, "mb_total", 2)]
        cells += [_cell(row, name) for name in fields]
        cells += [_reference_cell(row.get("reference", {}).get(c)) for c in extra]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines.append("")
    lines.append(
        f"Mean ± sample std over the runs (seeds) of each group, [{CONFIDENCE:.0%} Student-t interval of the mean, "
        "clipped to the figure's range (accuracy 0 to 1, times and e-LUDD from 0)]; "
        "rounds (and MB: 10^6 bytes of messages, down and up) to target: mean ± std and median over the runs "
        "that reach it (reached/n)"
        + (f"; held {sustain}: the first round of {sustain} evaluations in a row at or above it." if sustain else ".")
    )
    if budget_mb is not None:
        lines.append(
            f"acc at {budget_mb:g} MB: the test accuracy of the last evaluated round whose messages so far "
            f"(down and up) stay within {budget_mb:g} MB ('-' where no evaluated round fits)."
        )
    short = sorted({n for row in rows for n in row.get("evaluations", []) if n < window})
    if target is not None and short:
        lines.append(
            f"The smoothed column is '-' for runs with fewer evaluated rounds ({', '.join(map(str, short))}) than "
            f"the smoothing window w={window} (--smooth sets it)."
        )
    if extra:
        assert reference is not None  # extra columns come from it
        lines.append(f"{', '.join(extra)}: {reference['source'] or 'reference numbers'}, as published (no seeds).")
    if study.excluded:
        lines += ["", "Left out (use --include-incomplete to keep them):", ""]
        lines += [f"- {run.path}: {why}" for run, why in study.excluded]
    return "\n".join(lines) + "\n"


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Write the table as CSV, one line per group (lists as JSON)."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in row.items()})


def numeric_fields(runs: Iterable[Run]) -> list[str]:
    """Fields of metrics.jsonl that hold numbers in some row of ``runs``."""
    fields: set[str] = set()
    for run in runs:
        for row in run.rows:
            fields.update(
                k for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "round"
            )
    return sorted(fields)


def curve(runs: Sequence[Run], metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return rounds, and per round the mean, min and max of ``metric`` over the runs that have it."""
    per_round: dict[int, list[float]] = {}
    for run in runs:
        for row in run.rows:
            value = row.get(metric)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                per_round.setdefault(int(row["round"]), []).append(float(value))
    rounds = np.array(sorted(per_round), dtype=np.int64)
    values = [per_round[r] for r in rounds]
    return (
        rounds,
        np.array([np.mean(v) for v in values]),
        np.array([np.min(v) for v in values]),
        np.array([np.max(v) for v in values]),
    )


def plot(study: Study, metric: str, path: Path, target: Optional[float] = None) -> None:
    """One mean curve per group with a min-max band over its runs, ``metric`` per round;
    ``target``: a dotted line at it on the test-accuracy plot.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    label = metric.replace("_", " ")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, _, runs in study.groups:
        rounds, mean, low, high = curve(runs, metric)
        if rounds.size == 0:
            continue
        (line,) = ax.plot(rounds, mean, label=f"{name} (n={len(runs)})", marker="." if rounds.size < 40 else None)
        if len(runs) > 1:
            ax.fill_between(rounds, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    if target is not None and metric == "test_accuracy":
        ax.axhline(target, color="black", linestyle=":", linewidth=1, label=f"target {target:g}")
    names = sorted({str(r.config.get("name")) for _, _, runs in study.groups for r in runs})
    title = f"{', '.join(names)}: {label} per round (line: mean over seeds; band: min-max)"
    ax.set_title(wrap_title(title), fontsize=9)
    ax.set_xlabel("round")
    ax.set_ylabel(label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_comparison(
    dirs: Sequence[str | Path],
    out: Path,
    by: Optional[Sequence[str]] = None,
    target: Optional[float] = None,
    metrics: Sequence[str] = (),
    include_incomplete: bool = False,
    window: int = SMOOTH_WINDOW,
    order: int = SMOOTH_ORDER,
    fields: Sequence[str] = (),
    reference: Optional[dict[str, Any]] = None,
    sustain: Optional[int] = None,
    budget_mb: Optional[float] = None,
) -> tuple[str, list[Path]]:
    """Write ``compare.md``, ``compare.csv`` and one PNG per metric (test accuracy first)
    into ``out``; returns the Markdown table and the files written.

    Raises
    ------
    StudyError
        When no run is left to compare, a metric is not a numeric field of the runs, or a
        summary field is in none of their summaries.
    """
    study = group_runs([load_run(p) for p in find_runs(dirs)], by, include_incomplete)
    if not study.groups:
        listed = "; ".join(f"{r.path}: {why}" for r, why in study.excluded[:3])
        raise StudyError(f"no completed run to compare ({listed}); --include-incomplete compares them anyway")
    kept = [r for _, _, runs in study.groups for r in runs]
    available = numeric_fields(kept)
    wanted = list(dict.fromkeys(["test_accuracy", *metrics]))
    for metric in wanted:
        if metric not in available:
            raise StudyError(
                f"--metric {metric}: not a numeric field of metrics.jsonl; there are: {', '.join(available)}"
            )
    for path in fields:
        if all(summary_value(r.summary, path) is None for r in kept):
            raise StudyError(f"--field {path}: not a number in any compared run's summary.json")
    rows = table(study, target, window, order, fields, reference, sustain, budget_mb)
    text = markdown(rows, study, target, window, fields, reference, sustain, budget_mb)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / TABLE_FILE, out / CSV_FILE]
    written[0].write_text(text, encoding="utf-8")
    write_csv(rows, written[1])
    for metric in wanted:
        png = out / f"{metric}.png"
        plot(study, metric, png, target)
        written.append(png)
    return text, written
