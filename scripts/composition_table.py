"""Tables of a composition study (issue 30, docs/composition.md): every composition against
each of its parts, paired by seed, and the diagnostics that explain the outcome.

    python scripts/composition_table.py runs/composition_churn --target 0.6 > churn.md
    python scripts/composition_table.py runs/composition_sessions --sessions --target 0.85 \
        --where partition.overlap=0.0

Runs are the directories ``method=<name>,seed=<s>`` of a ``fedflex sweep`` over a
``method`` axis (scenarios/studies/composition_*.yaml); ``--where k=v,...`` takes the
runs of one point of the sweep's other axes (``k=v,...,method=<name>,seed=<s>``). A method's parts are the names
joined by ``+`` (``hics+fedaware``: hics and fedaware), a trailing ``-<mechanism>`` aside
(``hics+fedaware-age10``: the same parts with a mechanism switched on), unless the study ran
that hyphenated name alone (``hics+fedavgm-aware``: hics and fedavgm-aware); ``all4`` is hics,
fedaware, session and fedprox (``all4-age10`` too). The figures per run come from ``fedflex compare``'s
:func:`fedflex.study.compare.run_figures` (rounds to the target on the raw and the
Savitzky-Golay-smoothed curve, the mean test accuracy over the last 10% of rounds, e-LUDD).

``--sessions`` is for a setting whose sessions recur and hold their own labels (the churn
paper's, scenarios/studies/composition_sessions.yaml): every figure is on the online
clients' labels (``online_accuracy``), the rounds to the target are counted from the start
of each session from the third on (the ones where the session-aware start can act; with
P = 1 the first two starts are the same for every initializer) and averaged over them, a
session that never reaches it counting as its length + 1, and the transition accuracy is
the churn paper's figure: the mean online accuracy over the 10 rounds after those session
starts (``summary.json``'s ``transitions``).

``--sustain K`` (not with ``--sessions``) adds a third reading of the rounds to the target:
the first round from which the test accuracy stays at or above it for K evaluations in a row
(``fedflex compare --sustain K``, :func:`fedflex.results.sustained_rounds_to_accuracy`),
and, to show how far the raw first touch is a single noisy evaluation, the share of the 10
evaluations after it that are at or above the target.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import sys
from pathlib import Path
from typing import Any, Collection, Optional

import numpy as np

from fedflex.study.compare import load_run, run_figures

ALL4 = ("hics", "fedaware", "session", "fedprox")
NAME = re.compile(r"^(?:(?P<where>.+),)?method=(?P<method>[^,]+),seed=(?P<seed>\d+)$")
FIRST_SESSION = 2  # --sessions: figures over the session starts from the third on (0-based 2)
AFTER_TOUCH = 10  # --sustain: evaluations after the raw first touch whose share at the target is shown


def has_mechanism(method: str, methods: Collection[str] = ()) -> bool:
    """Whether ``method`` ends in a mechanism (``<composition>-<mechanism>``). A hyphenated
    last name that is itself one of ``methods``, other than ``method`` (a method the study
    ran alone, such as ``fedavgm-aware`` in ``hics+fedavgm-aware``), is a part."""
    last = method.split("+")[-1]
    return "-" in last and (last == method or last not in methods)


def parts(method: str, methods: Collection[str] = ()) -> tuple[str, ...]:
    """The single methods a composition is made of (one for a single method)."""
    if method.split("-")[0] == "all4":
        return ALL4
    names = method.split("+")
    if len(names) > 1 and has_mechanism(method, methods):
        names[-1] = names[-1].split("-")[0]
    return tuple(names)


def session_figures(rows: list[dict[str, Any]], summary: dict[str, Any], target: float) -> dict[str, Any]:
    """``--sessions``: rounds to ``target`` online accuracy from each session start (from
    the third on), their mean, and the mean transition accuracy over the same starts."""
    starts = [i for i, r in enumerate(rows) if r.get("session_started")]
    per_session = []
    for k, i in enumerate(starts):
        if k < FIRST_SESSION:
            continue
        end = starts[k + 1] if k + 1 < len(starts) else len(rows)
        reached = [j - i + 1 for j in range(i, end) if (rows[j].get("online_accuracy") or 0.0) >= target]
        per_session.append(reached[0] if reached else end - i + 1)
    trans = [t["mean_online_accuracy"] for t in summary.get("transitions", [])[FIRST_SESSION - 1 :]]
    return {
        "rounds_to_target": float(np.mean(per_session)) if per_session else None,
        "rounds_to_target_sessions": per_session,
        "transition_accuracy": float(np.mean(trans)) if trans else None,
    }


def after_first_touch(rows: list[dict[str, Any]], target: float) -> Optional[float]:
    """Share of the ``AFTER_TOUCH`` evaluations after the first one at ``target`` that are at
    or above it (None if the target is never reached or nothing is evaluated after it)."""
    acc = [r["test_accuracy"] for r in rows if r.get("test_accuracy") is not None]
    first = next((i for i, a in enumerate(acc) if a >= target), None)
    after = acc[first + 1 : first + 1 + AFTER_TOUCH] if first is not None else []
    return float(np.mean([a >= target for a in after])) if after else None


def load(
    root: Path, target: float, where: Optional[str] = None, sessions: bool = False, sustain: Optional[int] = None
) -> dict[str, dict[int, dict[str, Any]]]:
    """method -> seed -> figures (completed runs only) plus the diagnostics."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for path in sorted(root.iterdir()):
        m = NAME.match(path.name)
        if not m or m["where"] != where or not (path / "summary.json").exists():
            continue
        run = load_run(path)
        if run.state != "completed":
            continue
        if sessions:
            online = [{**r, "test_accuracy": r.get("online_accuracy")} for r in run.rows]
            fig = run_figures(dataclasses.replace(run, rows=online), None)
            fig.update(session_figures(run.rows, run.summary or {}, target))
        else:
            fig = run_figures(run, target, sustain=sustain)
            if sustain:
                fig["after_first_touch"] = after_first_touch(run.rows, target)
        fig.update(diagnostics(run.rows, int(run.config.get("num_clients", 0))))
        fig["rounds"] = len(run.rows)
        out.setdefault(m["method"], {})[int(m["seed"])] = fig
    return out


def diagnostics(rows: list[dict[str, Any]], num_clients: int) -> dict[str, Any]:
    """What explains a composition: AWARE's momenta ages and step, the sampler's skew."""
    aware = [r for r in rows if r.get("aware_phase") == "aware"]
    counts = np.zeros(max(num_clients, 1))
    for r in rows:
        for c in r.get("sampled") or []:
            counts[int(c)] += 1
    steps = [r["aware_step_norm"] for r in rows if r.get("aware_step_norm") is not None]

    def mean(key: str, src: list[dict[str, Any]]) -> Optional[float]:
        vals = [float(r[key]) for r in src if r.get(key) is not None]
        return float(np.mean(vals)) if vals else None

    return {
        "aware_rounds": len(aware),
        "aware_age": mean("aware_age", aware),
        "aware_active": mean("aware_active", aware),
        "aware_nonzero": mean("aware_nonzero", aware),
        "aware_step_norm": float(np.mean(steps)) if steps else None,
        "sampled_cv": float(counts.std() / counts.mean()) if counts.mean() > 0 else None,
        "never_sampled": int((counts == 0).sum()),
        "sessions": len({r.get("session") for r in rows}),
    }


def fmt(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def counted(value: Optional[float], rounds: int) -> float:
    """Rounds to a target as compared and averaged: never reached counts as ``rounds`` + 1."""
    return rounds + 1 if value is None else value


def better(metric: str, a: Optional[float], b: Optional[float], rounds: int) -> bool:
    """a strictly better than b (rounds to target: fewer; see :func:`counted`)."""
    if metric.startswith("rounds_to_target"):
        return counted(a, rounds) < counted(b, rounds)
    return a is not None and b is not None and a > b


METRICS = (
    ("rounds_to_target", "rounds to target (raw)"),
    ("rounds_to_target_smoothed", "rounds to target (smoothed)"),
    ("last10_accuracy", "last-10% accuracy"),
    ("e_ludd", "e-LUDD"),
)
SESSION_METRICS = (
    ("rounds_to_target", "rounds to target after a session start (mean)"),
    ("transition_accuracy", "transition accuracy"),
    ("last10_accuracy", "last-10% accuracy"),
)


def per_method_table(
    data: dict[str, dict[int, dict[str, Any]]], order: list[str], sessions: bool = False, sustain: Optional[int] = None
) -> str:
    second = ("transition_accuracy", "transition accuracy") if sessions else ("rounds_to_target_smoothed", "smoothed")
    first = "rounds to target after a session start, mean" if sessions else "rounds to target, raw"
    extra = (
        f" sustained {sustain} rounds (per seed) | mean raw / smoothed / sustained | at target in the"
        f" {AFTER_TOUCH} rounds after the raw first touch (mean share) |"
        if sustain
        else ""
    )
    lines = [
        f"| method | seeds | {first} (per seed) | {second[1]} (per seed) | last-10% accuracy (per seed) "
        "| mean | e-LUDD |" + extra,
        "|---|---|---|---|---|---|---|" + ("---|---|---|" if sustain else ""),
    ]
    for method in order:
        runs = data[method]
        seeds = sorted(runs)

        def col(key: str, digits: int = 3, runs: dict[int, dict[str, Any]] = runs, seeds: list[int] = seeds) -> str:
            return ", ".join(fmt(runs[s][key], digits) for s in seeds)

        last = [runs[s]["last10_accuracy"] for s in seeds]
        elud = [runs[s]["e_ludd"] for s in seeds if runs[s]["e_ludd"] is not None]
        line = (
            f"| {method} | {','.join(map(str, seeds))} | {col('rounds_to_target', 1 if sessions else 0)} | "
            f"{col(second[0], 3 if sessions else 0)} | {col('last10_accuracy')} | {fmt(float(np.mean(last)))} | "
            f"{fmt(float(np.mean(elud))) if elud else '-'} |"
        )
        if sustain:

            def mean_rounds(key: str, runs: dict[int, dict[str, Any]] = runs) -> str:
                return f"{float(np.mean([counted(r[key], r['rounds']) for r in runs.values()])):.1f}"

            shares = [runs[s]["after_first_touch"] for s in seeds if runs[s]["after_first_touch"] is not None]
            line += (
                f" {col('rounds_to_target_sustained', 0)} | "
                + " / ".join(
                    mean_rounds(k)
                    for k in ("rounds_to_target", "rounds_to_target_smoothed", "rounds_to_target_sustained")
                )
                + f" | {fmt(float(np.mean(shares)), 2) if shares else '-'} |"
            )
        lines.append(line)
    return "\n".join(lines)


def versus_parts_table(
    data: dict[str, dict[int, dict[str, Any]]], order: list[str], sessions: bool = False, sustain: Optional[int] = None
) -> str:
    metrics = SESSION_METRICS if sessions else METRICS[:3]
    if sustain and not sessions:
        metrics = (*METRICS[:2], ("rounds_to_target_sustained", f"sustained {sustain}"), METRICS[2])
    lines = [
        "| composition | parts | paired seeds | beats every part on ("
        + " / ".join(label for _, label in metrics)
        + ") | last-10% minus best part's (per seed) |",
        "|---|---|---|---|---|",
    ]
    for method in order:
        ps = parts(method, data)
        if len(ps) < 2 or any(p not in data for p in ps):
            continue
        seeds = sorted(set(data[method]).intersection(*(set(data[p]) for p in ps)))
        if not seeds:
            continue
        wins = []
        for key, _ in metrics:
            n = sum(
                all(better(key, data[method][s][key], data[p][s][key], data[method][s]["rounds"]) for p in ps)
                for s in seeds
            )
            wins.append(f"{n}/{len(seeds)}")
        gaps = [data[method][s]["last10_accuracy"] - max(data[p][s]["last10_accuracy"] for p in ps) for s in seeds]
        lines.append(
            f"| {method} | {', '.join(ps)} | {','.join(map(str, seeds))} | {' / '.join(wins)} | "
            f"{', '.join(f'{g:+.3f}' for g in gaps)} |"
        )
    return "\n".join(lines)


def mechanism_table(data: dict[str, dict[int, dict[str, Any]]], order: list[str], sessions: bool = False) -> str:
    """A mechanism (``<composition>-<mechanism>``) against the faithful composition, paired."""
    rounds_label = "rounds to target after a session start, mean" if sessions else "raw rounds"
    digits = 1 if sessions else 0
    lines = [
        f"| mechanism | against | paired seeds | {rounds_label} (mech vs faithful, per seed) | "
        "last-10% accuracy difference (per seed) | mean |",
        "|---|---|---|---|---|---|",
    ]
    for method in order:
        if not has_mechanism(method, data):
            continue
        base = method.rsplit("-", 1)[0]
        if base not in data:
            continue
        seeds = sorted(set(data[method]) & set(data[base]))
        if not seeds:
            continue
        rounds = ", ".join(
            f"{fmt(data[method][s]['rounds_to_target'], digits)} vs {fmt(data[base][s]['rounds_to_target'], digits)}"
            for s in seeds
        )
        diffs = [data[method][s]["last10_accuracy"] - data[base][s]["last10_accuracy"] for s in seeds]
        lines.append(
            f"| {method} | {base} | {','.join(map(str, seeds))} | {rounds} | "
            f"{', '.join(f'{d:+.3f}' for d in diffs)} | {float(np.mean(diffs)):+.3f} |"
        )
    return "\n".join(lines)


def diagnostics_table(data: dict[str, dict[int, dict[str, Any]]], order: list[str]) -> str:
    keys = ("aware_rounds", "aware_age", "aware_active", "aware_nonzero", "aware_step_norm", "sampled_cv")
    keys += ("never_sampled", "sessions")
    lines = ["| method | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for method in order:
        runs = list(data[method].values())
        cells = []
        for k in keys:
            vals = [r[k] for r in runs if r.get(k) is not None]
            cells.append(fmt(float(np.mean(vals)), 3) if vals else "-")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path, help="the sweep directory")
    ap.add_argument("--target", type=float, required=True, help="test accuracy for rounds to target")
    ap.add_argument("--order", help="methods in this order (comma-separated; default: by name)")
    ap.add_argument("--where", help="the runs of this point of the other axes (k=v,... as in the run names)")
    ap.add_argument(
        "--sessions", action="store_true", help="online accuracy, per session (a setting whose sessions recur)"
    )
    ap.add_argument(
        "--sustain",
        type=int,
        metavar="K",
        help="also rounds to the target held for K evaluations in a row, and how often the raw first touch holds",
    )
    args = ap.parse_args(argv)
    if args.sustain is not None and (args.sessions or args.sustain < 1):
        ap.error("--sustain takes a K of at least 1 and does not go with --sessions")
    data = load(args.root, args.target, args.where, args.sessions, args.sustain)
    if not data:
        print(f"no completed method=...,seed=... runs under {args.root}", file=sys.stderr)
        return 1
    order = [m for m in args.order.split(",") if m in data] if args.order else sorted(data)
    print(f"Target {args.target:g}; per-seed values in seed order.\n")
    print(per_method_table(data, order, args.sessions, args.sustain) + "\n")
    print(versus_parts_table(data, order, args.sessions, args.sustain) + "\n")
    print(mechanism_table(data, order, args.sessions) + "\n")
    print(diagnostics_table(data, order))
    return 0


if __name__ == "__main__":
    sys.exit(main())
