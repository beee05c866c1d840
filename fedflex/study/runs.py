"""What state a run directory is in, read from its files alone.

``fedflex run`` writes ``summary.json`` when a run ends for any reason, with ``status``:
``completed`` (every round run, or stopped at ``evaluation.stop_at_accuracy``:
``stopped_early``), ``degraded`` (every round run, but in some every reply was
rejected), ``diverged`` (``evaluation.stop_on_divergence``), ``interrupted``
(a signal; resumable with ``fedflex run --resume DIR``) or ``failed`` (an exception). A
directory with rows but no ``summary.json`` belongs to a run that was killed (or is still
running). Sweeps (the reproductions among them) use :func:`run_state` and :func:`is_finished`
so that they agree on what counts as a result.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from fedflex.rundir import CONFIG_FILE, METRICS_FILE, SUMMARY_FILE

#: a run that ended on its own: running it again gives the same outcome (``degraded``: it
#: ran its rounds, but in some every reply was rejected)
FINISHED = ("completed", "diverged", "degraded")
#: states a later invocation continues (from the last checkpoint, when there is one)
RESUMABLE = ("interrupted", "incomplete")
#: config keys that say how a run executes, not what it computes: a sweep may set them
#: per invocation (its CPU share) and compare ignores them
EXECUTION_KEYS = (
    "output.",
    "deployment.",
    "simulation.num_cpus",
    "simulation.num_gpus",
    "simulation.timeout",
    "simulation.ray_address",
    "simulation.cohort_size",
    "simulation.vectorize_choice",  # what vectorize=rule decided for the run (recorded in config.yaml)
    "client.num_threads",
    "client.device",
    "churn.trace",  # the run directory holds its own copy (config.yaml names the copy)
)


class StudyError(ValueError):
    """A sweep or comparison that cannot be done as asked; the message is one line."""


def is_execution_key(key: str) -> bool:
    """Whether a dotted config key only says how a run executes (:data:`EXECUTION_KEYS`)."""
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in EXECUTION_KEYS)


def flatten(mapping: Any, prefix: str = "") -> dict[str, Any]:
    """Return ``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists stay values)."""
    if not isinstance(mapping, dict):
        return {prefix[:-1]: mapping} if prefix else {}
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def read_summary(run_dir: Path) -> Optional[dict]:
    """``summary.json`` of ``run_dir``, or None when it is missing or not valid JSON."""
    try:
        summary = json.loads((Path(run_dir) / SUMMARY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def run_state(run_dir: Path) -> str:
    """Return the state of the run in ``run_dir``.

    Returns
    -------
    str
        ``missing`` (no directory, or an empty one), ``incomplete`` (files but no
        readable ``summary.json``: killed, or still running), or the summary's
        ``status`` (``completed``, ``degraded``, ``diverged``, ``interrupted``, ``failed``; ``unknown``
        for a summary without one).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or not any(run_dir.iterdir()):
        return "missing"
    summary = read_summary(run_dir)
    if summary is None:
        return "incomplete"
    return str(summary.get("status") or "unknown")


def is_finished(run_dir: Path) -> bool:
    """Return True when ``run_dir`` holds a run that ended on its own (:data:`FINISHED`): a
    ``summary.json`` alone is not enough, an interrupted or failed run writes one too.
    """
    return run_state(run_dir) in FINISHED


def is_completed(run_dir: Path) -> bool:
    """Return True when ``run_dir`` holds a run whose summary says ``completed`` (every round,
    or stopped at its target): a result to report, unlike an interrupted, failed or
    diverged run.
    """
    return run_state(run_dir) == "completed"


def has_checkpoint(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a checkpoint (``checkpoint.*``) to resume from."""
    return any(Path(run_dir).glob("checkpoint.*"))


def is_run_dir(path: Path) -> bool:
    """Return a run's results directory: ``config.yaml`` and ``metrics.jsonl``."""
    path = Path(path)
    return (path / CONFIG_FILE).is_file() and (path / METRICS_FILE).is_file()
