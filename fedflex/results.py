"""The results contract: config.yaml, metrics.jsonl, summary.json and PNG plots.

Other tooling reads these files; keep them stable. ``metrics.jsonl`` holds one JSON
object per round, written and flushed as the round ends, so a killed run loses nothing
it had finished. Fields: ``round``, ``session``, ``online`` (client ids online),
``sampled`` (client ids whose training reply was aggregated), ``test_accuracy``,
``test_loss`` (null in rounds not evaluated), ``train_loss``, ``wall_s``, plus
``session_started``, ``failed``, ``skipped``, ``num_examples`` and method-specific fields.
"""

from __future__ import annotations

import json
import logging
import math
import os
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from fedflex.atomic import atomic_write
from fedflex.statefile import StateFileError, read_state, write_state

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
MODEL_FILE = "model.npz"
ACCURACY_PLOT = "accuracy.png"
CHURN_PLOT = "churn.png"
CHECKPOINT_FILE = "checkpoint.npz"  # save_checkpoint / load_checkpoint
TRACE_FILE = "trace.csv"  # a churn trace, copied into the run directory
LEGACY_CHECKPOINT_FILE = "checkpoint.pkl"  # a pickle (fedflex before issue 26): never loaded


def _clean(value: Any) -> Any:
    """JSON-safe: NaN/Inf -> None, numpy scalars -> Python."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if all(type(v) is int for v in value):  # e.g. a round's 10,000 online client ids
            return list(value)
        return [_clean(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` into ``path`` whole or not at all (:func:`fedflex.atomic.atomic_write`)."""
    with atomic_write(path) as fh:
        fh.write(data)


def save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """``np.savez`` of ``arrays`` into ``path``, atomically (see :func:`_write_atomic`)."""
    import io

    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    _write_atomic(Path(path), buf.getvalue())


def append_line(fd: int, line: str) -> None:
    """Append ``line`` (ending in a newline) to the file open as ``fd`` (``O_APPEND``)
    whole or not at all: when a write fails (a full disk), what it wrote is cut off
    again before the error goes on; then synced to disk.
    """
    data = line.encode("utf-8")
    size = os.fstat(fd).st_size
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        try:
            os.ftruncate(fd, size)
        except OSError:
            pass
        raise


class RunRecorder:
    """Writes one run's directory.

    Every file is whole or absent, also when the disk fills up: config.yaml and
    summary.json are written through a temporary file, and a row of metrics.jsonl is
    appended whole or cut off again (:func:`append_line`).
    """

    def __init__(self, out_dir: Path, config_yaml: str, keep_until: Optional[int] = None) -> None:
        """``keep_until``: resume a run: keep the existing rows of rounds <= it (and drop
        later ones, written after the checkpoint, and a torn last line); None: a new run.
        """
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        _write_atomic(self.out_dir / CONFIG_FILE, config_yaml.encode("utf-8"))
        self.rows: list[dict[str, Any]] = []
        if keep_until is not None and (self.out_dir / METRICS_FILE).is_file():
            self.rows = [r for r in read_metrics(self.out_dir) if r["round"] <= keep_until]
        _write_atomic(self.out_dir / METRICS_FILE, "".join(json.dumps(r) + "\n" for r in self.rows).encode("utf-8"))
        self._metrics: Optional[int] = os.open(self.out_dir / METRICS_FILE, os.O_WRONLY | os.O_APPEND)

    def log_round(self, row: dict[str, Any]) -> None:
        """Append one round's row to metrics.jsonl (whole or not at all)."""
        row = _clean(row)
        if self._metrics is None:
            raise RuntimeError("RunRecorder.log_round after finish")
        append_line(self._metrics, json.dumps(row) + "\n")
        self.rows.append(row)

    def close(self) -> None:
        """Close metrics.jsonl (idempotent)."""
        if self._metrics is not None:
            os.close(self._metrics)
            self._metrics = None

    def save_model(self, arrays: dict[str, np.ndarray]) -> None:
        """Save the final global model as model.npz (atomically: whole or absent)."""
        save_arrays(self.out_dir / MODEL_FILE, arrays)

    def finish(self, summary: dict[str, Any], timeline: Optional[np.ndarray] = None, plots: bool = True) -> None:
        """Write summary.json (and plots); close the metrics file."""
        self.close()
        _write_atomic(self.out_dir / SUMMARY_FILE, (json.dumps(_clean(summary), indent=2) + "\n").encode("utf-8"))
        if plots:
            try:
                title = plot_title(summary)
                plot_accuracy(self.rows, self.out_dir / ACCURACY_PLOT, title)
                if timeline is not None:
                    plot_churn(timeline, self.rows, self.out_dir / CHURN_PLOT, title)
            except Exception:  # a plot must never cost the results
                logger.exception("plotting failed; the JSON results are complete")


class MemoryRecorder:
    """A :class:`RunRecorder` that keeps the run in memory (``fedflex.run`` without
    ``out``): the rows as metrics.jsonl would hold them, the summary, the final model.
    """

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.summary: dict[str, Any] = {}
        self.model: Optional[dict[str, np.ndarray]] = None

    def log_round(self, row: dict[str, Any]) -> None:
        """Keep one round's row as the file would give it back."""
        self.rows.append(json.loads(json.dumps(_clean(row))))  # exactly what the file would give back

    def save_model(self, arrays: dict[str, np.ndarray]) -> None:
        """Keep a copy of the final global model."""
        self.model = {k: np.array(v, copy=True) for k, v in arrays.items()}

    def finish(self, summary: dict[str, Any], timeline: Optional[np.ndarray] = None, plots: bool = True) -> None:
        """Keep the summary as summary.json would give it back (no plots)."""
        self.summary = json.loads(json.dumps(_clean(summary)))


def unusable_out_dir(out: Path, option: str = "--out") -> Optional[str]:
    """Why ``out`` cannot receive a new run's results (None: it can): it exists and is
    not an empty directory (earlier results are never overwritten), or it cannot be
    created or written. Tries to create it (and the folders above it) and takes back
    what it created: nothing is left behind. ``option``: how the message names it.
    """
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        return f"{option} {out} exists and is not an empty directory: choose another one"
    made = [p for p in [out, *out.parents] if not p.exists()]
    problem = None
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".fedflex-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        problem = f"{option} {out} cannot be created or written ({exc.strerror or exc}): choose another directory"
    for p in made:  # deepest first
        try:
            p.rmdir()
        except OSError:
            pass
    return problem


def default_out_dir(name: str) -> Path:
    """``runs/<name>-<YYYYmmdd-HHMMSS>``."""
    return Path("runs") / f"{name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def read_metrics(out_dir: Path) -> list[dict[str, Any]]:
    """Return the rows of a run's metrics.jsonl. A torn last line (a run that stopped while
    writing it, a full disk) is left out with a warning; a bad line elsewhere raises
    ``ValueError`` naming it.
    """
    path = Path(out_dir) / METRICS_FILE
    with open(path, encoding="utf-8", errors="replace") as fh:
        lines = fh.read().split("\n")
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            if number == len(lines):  # no newline after it: the last write was cut short
                logger.warning("%s: ignoring a torn last line (%d characters)", path, len(line))
                break
            raise ValueError(f"{path}, line {number}: not a JSON row ({exc})") from None
        if not isinstance(row, dict) or "round" not in row:
            raise ValueError(f"{path}, line {number}: not a metrics row")
        rows.append(row)
    return rows


def summarize(rows: list[dict[str, Any]], extra: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Return the headline figures of a run from its rows."""
    extra_rounds = sum(1 for r in rows if r.get("phase", "train") != "train")
    # error replies of every round (a node gone, a ClientApp that raised): round, client, node, reason
    failures = [{"round": r["round"], **f} for r in rows for f in r.get("node_failures", [])]
    rows = [r for r in rows if r.get("phase", "train") == "train"]
    evaluated = [r for r in rows if r.get("test_accuracy") is not None]
    summary: dict[str, Any] = {
        "rounds": len(rows),
        "last_round": rows[-1]["round"] if rows else 0,
        "extra_rounds": extra_rounds,
        "sessions": (max(r["session"] for r in rows) + 1) if rows else 0,
        "skipped_rounds": sum(1 for r in rows if r.get("skipped")),
        "final_test_accuracy": evaluated[-1]["test_accuracy"] if evaluated else None,
        "final_test_loss": evaluated[-1]["test_loss"] if evaluated else None,
        "best_test_accuracy": max((r["test_accuracy"] for r in evaluated), default=None),
        "total_wall_s": sum(r.get("wall_s", 0.0) for r in rows),
        "mean_online": float(np.mean([len(r["online"]) for r in rows])) if rows else 0.0,
        "node_failures": failures,
    }
    # e-LUDD (FedAWARE paper): mean e-LUD over the train rounds that have one
    lud = [r["e_lud"] for r in rows if r.get("phase", "train") == "train" and r.get("e_lud") is not None]
    if lud:
        summary["e_ludd"] = float(np.mean(lud))
    if extra:
        summary.update(extra)
    return summary


def transition_summary(rows: list[dict[str, Any]], window: int = 10) -> list[dict[str, Any]]:
    """Per session transition (a train round that starts a session, after the first):
    the mean test accuracy (and ``online_accuracy`` when logged) over the ``window``
    train rounds from the transition on (the churn paper's headline metric).
    """
    train = [r for r in rows if r.get("phase", "train") == "train"]
    out = []
    for i, r in enumerate(train):
        if not r.get("session_started") or i == 0:
            continue
        span = train[i : i + window]
        entry: dict[str, Any] = {"round": r["round"], "session": r["session"], "rounds": len(span)}
        for field in ("test_accuracy", "online_accuracy"):
            values = [x[field] for x in span if x.get(field) is not None]
            entry[f"mean_{field}"] = float(np.mean(values)) if values else None
        out.append(entry)
    return out


def rounds_to_accuracy(rows: Iterable[dict[str, Any]], target: float) -> Optional[int]:
    """First round whose test accuracy reaches ``target`` (None if never)."""
    for r in rows:
        acc = r.get("test_accuracy")
        if acc is not None and acc >= target:
            return int(r["round"])
    return None


def sustained_rounds_to_accuracy(rows: Iterable[dict[str, Any]], target: float, k: int) -> Optional[int]:
    """First round from which the test accuracy stays at or above ``target`` for ``k``
    evaluated rounds in a row (that round and the ``k - 1`` evaluations after it; None if
    never): rounds to a target that a single noisy evaluation cannot reach by chance.
    ``k = 1`` is :func:`rounds_to_accuracy`.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    evaluated = [r for r in rows if r.get("test_accuracy") is not None]
    for i in range(len(evaluated) - k + 1):
        if all(r["test_accuracy"] >= target for r in evaluated[i : i + k]):
            return int(evaluated[i]["round"])
    return None


def smoothed_accuracy(accuracies: Sequence[float], window: int, order: int) -> np.ndarray:
    """Return the Savitzky-Golay-smoothed curve (``scipy.signal.savgol_filter``, its default
    ``interp`` edges) of a test-accuracy curve; the curve itself when it has fewer than
    ``window`` points.
    """
    from scipy.signal import savgol_filter

    acc = np.asarray(accuracies, dtype=np.float64)
    if acc.size < window:
        return acc
    return savgol_filter(acc, window, order)


def smoothed_rounds_to_accuracy(
    rows: Iterable[dict[str, Any]], target: float, window: int, order: int, *, final_only: bool = True
) -> Optional[int]:
    """First round whose Savitzky-Golay-smoothed test accuracy reaches ``target``.

    ``final_only``: count only points whose smoothed value cannot change as the run goes
    on (the last ``window // 2`` points of a curve are fitted at its edge): right for a
    run that stopped early; a run that ran all its rounds can pass False.
    """
    evaluated = [r for r in rows if r.get("test_accuracy") is not None]
    if len(evaluated) < window:
        return None
    smooth = smoothed_accuracy([r["test_accuracy"] for r in evaluated], window, order)
    last = len(evaluated) - 1 - (window // 2 if final_only else 0)
    for i in range(last + 1):
        if smooth[i] >= target:
            return int(evaluated[i]["round"])
    return None


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


MAX_SESSION_LINES = 30  # more session starts are drawn as ticks under the curve


def plot_title(summary: dict[str, Any]) -> str:
    """``scenario: sampler + aggregator + initializer + local rule`` (what a plot shows)."""
    parts = summary.get("strategy") or {}
    names = " + ".join(str(parts[k]) for k in ("sampler", "aggregator", "initializer", "local_rule") if k in parts)
    return f"{summary.get('scenario', '')}: {names}" if names else str(summary.get("scenario", ""))


def plot_accuracy(rows: list[dict[str, Any]], path: Path, title: str = "") -> None:
    """Test accuracy per round; dashed lines where a session starts (ticks along the
    bottom when there are more than MAX_SESSION_LINES).
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    pts = []
    for field, label in (("test_accuracy", "test accuracy"), ("online_accuracy", "accuracy on online clients' labels")):
        series = [(r["round"], r[field]) for r in rows if r.get(field) is not None]
        if series:
            x, y = zip(*series)
            ax.plot(x, y, marker="." if len(series) < 60 else None, label=label)
            pts += series
    starts = [r["round"] for r in rows if r.get("session_started") and rows and r["round"] > rows[0]["round"]]
    if len(starts) > MAX_SESSION_LINES:
        ax.plot(starts, [0.01] * len(starts), "|", color="grey", markersize=8, label=f"session start ({len(starts)})")
    else:
        for i, s in enumerate(starts):
            ax.axvline(s, color="grey", linestyle="--", linewidth=0.8, label="session start" if i == 0 else None)
    if title:
        ax.set_title(title, fontsize=9)
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    if pts or starts:
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_churn(timeline: np.ndarray, rows: list[dict[str, Any]], path: Path, title: str = "") -> None:
    """Client x round availability: white offline, grey online (idle), black trained,
    red failed or rejected reply.
    """
    plt = _pyplot()
    rounds, n = timeline.shape
    img = np.ones((n, rounds, 3), dtype=np.float32)
    img[timeline.T] = 0.75
    for r in rows:
        t = r["round"] - 1
        if 0 <= t < rounds and r.get("phase", "train") == "train":
            img[r["sampled"], t] = 0.0
            failed = [c for c in r.get("failed", []) if 0 <= c < n]
            img[failed, t] = (0.85, 0.1, 0.1)
    fig, ax = plt.subplots(figsize=(7, max(2.5, min(8, n * 0.08))))
    ax.imshow(img, aspect="auto", interpolation="nearest", extent=(0.5, rounds + 0.5, n - 0.5, -0.5))
    ax.set_xlabel("round")
    ax.set_ylabel("client id")
    ax.set_title((title + "\n" if title else "") + "churn: online (grey), trained (black), failed (red)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------------------- checkpoints
class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be read back."""


CHECKPOINT_FORMAT = "fedflex-checkpoint"
CHECKPOINT_VERSION = 1


def save_checkpoint(out_dir: Path, server_round: int, strategy, run_wall_s: float = 0.0) -> None:
    """Save the server state after ``server_round`` (atomic write, :func:`fedflex.statefile.write_state`:
    the arrays in an ``.npz``, the rest as JSON; nothing that loading could execute);
    ``run_wall_s``: the run's wall time so far (summed over resumes).
    """
    state = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "round": server_round,
        "strategy": strategy.state_dict(),
        "run_wall_s": run_wall_s,
    }
    write_state(Path(out_dir) / CHECKPOINT_FILE, state)


def load_checkpoint(out_dir: Path) -> dict:
    """Return a run directory's checkpoint (written by :func:`save_checkpoint`), read without
    unpickling anything. A ``checkpoint.pkl`` of an older fedflex is refused unread.

    Raises
    ------
    CheckpointError
        When the file is missing, damaged, not a fedflex checkpoint, or an old pickle.
    """
    path = Path(out_dir) / CHECKPOINT_FILE
    legacy = Path(out_dir) / LEGACY_CHECKPOINT_FILE
    if not path.is_file() and legacy.is_file():
        raise CheckpointError(
            f"{legacy} is a pickle checkpoint of an older fedflex and is not loaded (loading a pickle can run "
            "code): start the run again, or resume it with the fedflex version that wrote it"
        )
    try:
        checkpoint = read_state(path)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file") from None
    except StateFileError as exc:
        raise CheckpointError(f"{exc}; it cannot be resumed") from None
    if (
        not isinstance(checkpoint, dict)
        or checkpoint.get("format") != CHECKPOINT_FORMAT
        or not {"round", "strategy"} <= set(checkpoint)
    ):
        raise CheckpointError(f"{path} is not a fedflex checkpoint; it cannot be resumed")
    if checkpoint.get("version") != CHECKPOINT_VERSION:
        raise CheckpointError(
            f"{path} is a checkpoint of format version {checkpoint.get('version')} (this fedflex reads "
            f"{CHECKPOINT_VERSION}); it cannot be resumed"
        )
    return checkpoint
