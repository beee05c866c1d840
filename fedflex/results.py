"""The results contract: config.yaml, metrics.jsonl, summary.json and PNG plots.

Other tooling reads these files; keep them stable. ``metrics.jsonl`` holds one JSON
object per round, written and flushed as the round ends, so a killed run loses nothing
it had finished. Fields: ``round``, ``session``, ``online`` (client ids online),
``sampled`` (client ids whose training reply was aggregated), ``test_accuracy``,
``test_loss`` (null in rounds not evaluated), ``train_loss``, ``wall_s``, plus
``session_started``, ``failed``, ``skipped``, ``num_examples`` and method-specific fields.

It is over 600 lines because it is the whole results contract in one place: the writers,
the readers and summaries other tooling relies on, the plots drawn from the same rows,
and the checkpoint's binding to its run's rows.
"""

from __future__ import annotations

import json
import logging
import math
import os
import textwrap
import threading
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Sequence

import numpy as np

from fedflex.atomic import atomic_write
from fedflex.rundir import (  # noqa: F401 - the run directory's file names, also importable from here
    ACCURACY_PLOT,
    CHECKPOINT_FILE,
    CHURN_PLOT,
    CONFIG_FILE,
    CONFUSION_PLOT,
    LEGACY_CHECKPOINT_FILE,
    METRICS_FILE,
    MODEL_FILE,
    SUMMARY_FILE,
    TRACE_FILE,
)
from fedflex.statefile import StateFileError, read_state, write_state, write_state_to

logger = logging.getLogger(__name__)


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
        kept: list[bytes] = []
        if keep_until is not None and (self.out_dir / METRICS_FILE).is_file():
            read_metrics(self.out_dir)  # a bad row before the last one raises; a torn last one is said
            for line in _whole_rows(self.out_dir):  # the rows as written: the checkpoint's digest covers them
                if not line.strip():
                    continue
                row = json.loads(line)
                if row["round"] <= keep_until:
                    self.rows.append(row)
                    kept.append(line)
        _write_atomic(self.out_dir / METRICS_FILE, b"".join(kept))
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
                if summary.get("confusion_matrix"):
                    plot_confusion(np.asarray(summary["confusion_matrix"]), self.out_dir / CONFUSION_PLOT, title)
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
    rows_all, rows = rows, [r for r in rows if r.get("phase", "train") == "train"]
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
    # cost: the bytes of every row (extra rounds' included), where the rows count them
    every = [r for r in rows_all if "bytes_down" in r]
    if every:
        summary["bytes_down"] = sum(int(r["bytes_down"]) for r in every)
        summary["bytes_up"] = sum(int(r["bytes_up"]) for r in every)
    # e-LUDD (FedAWARE paper): mean e-LUD over the train rounds that have one
    lud = [r["e_lud"] for r in rows if r.get("phase", "train") == "train" and r.get("e_lud") is not None]
    if lud:
        summary["e_ludd"] = float(np.mean(lud))
    if extra:
        summary.update(extra)
    if summary.get("status") == "completed":
        degraded = rejected_rounds(rows)
        if degraded:
            summary["status"] = "degraded"
            summary["degraded"] = degraded
            summary["rejected_rounds"] = [r["round"] for r in rows if _all_rejected(r)]
    return summary


def _all_rejected(row: dict[str, Any]) -> bool:
    """Whether a train row's round trained nothing because every reply it got was rejected."""
    return bool(row.get("rejected")) and not row.get("num_examples") and not row.get("skipped")


def rejected_rounds(rows: list[dict[str, Any]]) -> Optional[str]:
    """Why a run that ran all its rounds is not ``completed`` (None: it is): rounds in which
    every reply was rejected (:mod:`strategies.replies`) trained nothing, e.g. ``3 of 20
    rounds trained nothing: every reply was rejected (first: round 11, client 2: ...)``.
    """
    train = [r for r in rows if r.get("phase", "train") == "train"]
    bad = [r for r in train if _all_rejected(r)]
    if not bad:
        return None
    client, reason = (list(bad[0]["rejected"][0]) + [None, None])[:2]
    return (
        f"{len(bad)} of {len(train)} rounds trained nothing: every reply was rejected "
        f"(first: round {bad[0]['round']}, client {client}: {reason})"
    )


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


#: characters per title line at fontsize 9 on a 7-8 inch wide figure
TITLE_WIDTH = 90


def wrap_title(text: str, width: int = TITLE_WIDTH) -> str:
    """Return ``text`` broken into lines of at most ``width`` characters (a plot title that
    would otherwise run past both edges of the figure), keeping its own line breaks.
    """
    return "\n".join(textwrap.fill(line, width, break_on_hyphens=False) or line for line in text.split("\n"))


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
        ax.set_title(wrap_title(title), fontsize=9)
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    if pts or starts:
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_confusion(matrix: np.ndarray, path: Path, title: str = "") -> None:
    """Draw the last evaluated round's confusion matrix as each true class's shares (rows sum to 1)."""
    plt = _pyplot()
    totals = matrix.sum(axis=1, keepdims=True)
    shares = np.divide(matrix, totals, out=np.zeros(matrix.shape, dtype=np.float64), where=totals > 0)
    n = len(matrix)
    width = max(5.5, min(12, n * 0.45))
    fig, ax = plt.subplots(figsize=(width, max(4.5, min(11, n * 0.4))))
    image = ax.imshow(shares, cmap="Blues", vmin=0, vmax=1)
    if n <= 20:
        for t in range(n):
            for p in range(n):
                if matrix[t, p]:
                    ax.text(
                        p,
                        t,
                        f"{shares[t, p]:.2f}",
                        ha="center",
                        va="center",
                        fontsize=7,
                        color="white" if shares[t, p] > 0.5 else "black",
                    )
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="share of the true class")
    text = (title + "\n" if title else "") + "confusion matrix, last evaluated round"
    ax.set_title(wrap_title(text, int(width * 10)), fontsize=9)  # about 10 characters an inch at 9 pt
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
    ax.set_title(
        wrap_title((title + "\n" if title else "") + "churn: online (grey), trained (black), failed (red)"), fontsize=9
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------------------- checkpoints
class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be read back, or that does not belong to its run."""


CHECKPOINT_FORMAT = "fedflex-checkpoint"
#: 2: the checkpoint records what it belongs to (``binding``); 1 (read with a warning): it does not
CHECKPOINT_VERSION = 2
READABLE_VERSIONS = (1, 2)
#: config keys a resumed run may change in config.yaml: ``rounds`` (a run may be extended)
#: and the keys that say how a run executes (:data:`fedflex.study.runs.EXECUTION_KEYS`)
RESUMABLE_CHANGES = ("rounds",)


def _bound_config(out_dir: Path) -> Optional[dict[str, Any]]:
    """Return config.yaml of ``out_dir`` as flat ``key: value`` (JSON-able), without the keys a
    resumed run may change (:data:`RESUMABLE_CHANGES`); None when there is no config.yaml
    or it is not a mapping.
    """
    import yaml

    from fedflex.study.runs import flatten, is_execution_key

    path = Path(out_dir) / CONFIG_FILE
    try:
        st = path.stat()
        stamp = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        key = str(path.resolve())
        if key in _BOUND_CONFIGS and _BOUND_CONFIGS[key][0] == stamp:
            return _BOUND_CONFIGS[key][1]  # a checkpoint every round does not parse it every round
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # no config.yaml, or not YAML (yaml's errors are ValueErrors)
        return None
    if not isinstance(data, dict):
        return None
    flat = flatten(data)
    bound = json.loads(
        json.dumps(
            {k: v for k, v in flat.items() if k not in RESUMABLE_CHANGES and not is_execution_key(k)},
            default=str,
        )
    )
    _BOUND_CONFIGS[key] = (stamp, bound)
    return bound


_BOUND_CONFIGS: dict[str, tuple[tuple[int, ...], dict[str, Any]]] = {}


def _digest(obj: Any) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode("utf-8")).hexdigest()


#: metrics.jsonl path -> (device, inode, bytes hashed, the last of them, rows, sha256 of them):
#: the digest of a growing file is extended, not recomputed, at each checkpoint
_ROW_DIGESTS: dict[str, tuple[int, int, int, bytes, int, Any]] = {}
_TAIL = 256  # bytes before the hashed end that must still be there (an inode number can be reused)


def rows_digest(out_dir: Path) -> tuple[int, str]:
    """Return the number of whole rows in ``out_dir``'s metrics.jsonl and the SHA-256 of
    their bytes (0 rows: the digest of nothing). The file only grows during a run, so
    the digest of what was hashed before is extended; a file replaced or cut short is
    hashed again.
    """
    import hashlib

    path = Path(out_dir) / METRICS_FILE
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return 0, hashlib.sha256().hexdigest()
    with fh:
        st = os.fstat(fh.fileno())
        key = str(path.resolve())
        dev, ino, done, last, count, hasher = _ROW_DIGESTS.get(key, (-1, -1, 0, b"", 0, None))
        same = hasher is not None and (dev, ino) == (st.st_dev, st.st_ino) and st.st_size >= done
        if same:
            fh.seek(done - len(last))
            same = fh.read(len(last)) == last
        if not same:
            done, last, count, hasher = 0, b"", 0, hashlib.sha256()
        hasher = hasher.copy()
        fh.seek(done)
        tail = fh.read()
        whole = tail[: tail.rfind(b"\n") + 1]  # a torn last line is no row
        hasher.update(whole)
        count += whole.count(b"\n")
        done += len(whole)
        last = (last + whole)[-_TAIL:]
        _ROW_DIGESTS[key] = (st.st_dev, st.st_ino, done, last, count, hasher)
        return count, hasher.hexdigest()


def model_spec(arrays: Any) -> list[list[Any]]:
    """``[[name, shape, dtype], ...]`` of a model's arrays (a checkpoint's ``global_arrays``)."""
    return [[str(k), [int(d) for d in np.shape(v)], str(np.asarray(v).dtype)] for k, v in dict(arrays).items()]


def checkpoint_binding(out_dir: Path, strategy_state: dict[str, Any]) -> dict[str, Any]:
    """Return what a checkpoint of ``out_dir`` belongs to: the run's config (config.yaml as flat
    keys, less :data:`RESUMABLE_CHANGES`) and its digest, the number of metrics.jsonl rows
    it covers and their digest, and the model's names, shapes and dtypes.
    """
    config = _bound_config(out_dir)
    rows, digest = rows_digest(out_dir)
    return {
        "config": config,
        "config_sha256": _digest(config) if config is not None else None,
        "rows": rows,
        "rows_sha256": digest,
        "model": model_spec(strategy_state.get("global_arrays", {})) if isinstance(strategy_state, dict) else None,
    }


class _Snapshots(threading.local):
    """Where :func:`save_checkpoint` keeps a checkpoint in memory instead of writing it
    (:func:`checkpoint_in_memory`), per thread.
    """

    def __init__(self) -> None:
        self.active = False
        self.taken: Optional[tuple[int, bytes, Path]] = None


_snapshots = _Snapshots()


@contextmanager
def checkpoint_in_memory() -> Iterator[list[tuple[int, bytes, Path]]]:
    """Make :func:`save_checkpoint` calls in this block (this thread) keep the checkpoint
    file's bytes in memory instead of writing them: the block's list receives
    ``(round, bytes, directory)`` of the last one. :class:`fedflex.launch.observers.Checkpointer` takes such a
    snapshot at round boundaries, to write when a second signal ends the run at once.
    """
    taken: list[tuple[int, bytes, Path]] = []
    _snapshots.active = True
    try:
        yield taken
    finally:
        _snapshots.active = False
        if _snapshots.taken is not None:
            taken.append(_snapshots.taken)
            _snapshots.taken = None


def checkpoint_state(out_dir: Path, server_round: int, strategy, run_wall_s: float = 0.0) -> dict[str, Any]:
    """Return what :func:`save_checkpoint` stores (with its :func:`checkpoint_binding`)."""
    state = strategy.state_dict()
    return {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "round": server_round,
        "strategy": state,
        "run_wall_s": run_wall_s,
        "binding": checkpoint_binding(out_dir, state),
    }


def save_checkpoint(out_dir: Path, server_round: int, strategy, run_wall_s: float = 0.0) -> None:
    """Save the server state after ``server_round`` (atomic write, :func:`fedflex.statefile.write_state`:
    the arrays in an ``.npz``, the rest as JSON; nothing that loading could execute);
    ``run_wall_s``: the run's wall time so far (summed over resumes). The checkpoint
    records what it belongs to (:func:`checkpoint_binding`), which :func:`load_checkpoint`
    checks. Inside :func:`checkpoint_in_memory`, the file's bytes are kept instead.
    """
    state = checkpoint_state(out_dir, server_round, strategy, run_wall_s)
    if _snapshots.active:
        import io

        buf = io.BytesIO()
        write_state_to(buf, state)
        _snapshots.taken = (server_round, buf.getvalue(), Path(out_dir))
        return
    write_state(Path(out_dir) / CHECKPOINT_FILE, state)


def write_snapshot(out_dir: Path, data: bytes) -> None:
    """Write checkpoint bytes kept by :func:`checkpoint_in_memory` as ``out_dir``'s
    checkpoint (whole or not at all; its own temporary file, so that a checkpoint write
    in flight in another thread is not mixed in).
    """
    path = Path(out_dir) / CHECKPOINT_FILE
    tmp = path.with_name(f".{path.name}.{os.getpid()}.exit.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    try:  # a checkpoint write of this process that the exit cuts short leaves no temporary file
        path.with_name(f".{path.name}.{os.getpid()}.tmp").unlink(missing_ok=True)
    except OSError:
        pass


def load_checkpoint(out_dir: Path) -> dict:
    """Return a run directory's checkpoint (written by :func:`save_checkpoint`), read without
    unpickling anything, once it is found to belong to the run (:func:`check_binding`). A
    ``checkpoint.pkl`` of an older fedflex is refused unread. Reads only.

    Raises
    ------
    CheckpointError
        When the file is missing, damaged, not a fedflex checkpoint, an old pickle, or
        not this run's (one line naming what differs).
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
        or not isinstance(checkpoint["strategy"], dict)
    ):
        raise CheckpointError(f"{path} is not a fedflex checkpoint; it cannot be resumed")
    if checkpoint.get("version") not in READABLE_VERSIONS:
        raise CheckpointError(
            f"{path} is a checkpoint of format version {checkpoint.get('version')} (this fedflex reads "
            f"{', '.join(map(str, READABLE_VERSIONS))}); it cannot be resumed"
        )
    check_binding(out_dir, checkpoint)
    return checkpoint


def _differences(bound: dict[str, Any], now: dict[str, Any], most: int = 3) -> list[str]:
    """Return ``key = now (checkpoint: bound)`` for the keys both have with other values."""
    keys = [k for k in now if k in bound and now[k] != bound[k]]
    out = [f"{k} = {json.dumps(now[k])} (the checkpoint's run: {json.dumps(bound[k])})" for k in keys[:most]]
    if len(keys) > most:
        out.append(f"{len(keys) - most} more")
    return out


def _whole_rows(out_dir: Path) -> list[bytes]:
    """Return the whole lines (each with its newline) of ``out_dir``'s metrics.jsonl."""
    try:
        data = (Path(out_dir) / METRICS_FILE).read_bytes()
    except FileNotFoundError:
        return []
    return data[: data.rfind(b"\n") + 1].splitlines(keepends=True)


def check_binding(out_dir: Path, checkpoint: dict[str, Any]) -> None:
    """Check that ``checkpoint`` belongs to the run in ``out_dir``, reading only: its round is
    a round of the run (an integer, at most config.yaml's ``rounds``, the round of the last
    row it covers), config.yaml is the config it was written with (but for
    :data:`RESUMABLE_CHANGES`), metrics.jsonl begins with the rows it covers, and the
    model arrays in it have the names, shapes and dtypes it recorded. A checkpoint of
    format 1 records none of this: only its round is checked (with a warning).

    Raises
    ------
    CheckpointError
        Naming the first thing that differs, in one line.
    """
    import hashlib

    path = Path(out_dir) / CHECKPOINT_FILE
    server_round = checkpoint["round"]
    if not isinstance(server_round, int) or isinstance(server_round, bool) or server_round < 0:
        raise CheckpointError(f"{path}: its round {server_round!r} is not a round number; it cannot be resumed")
    config = _bound_config(out_dir)
    raw = _raw_rounds(out_dir)
    if isinstance(raw, int) and server_round > raw:
        raise CheckpointError(
            f"{path} is of round {server_round}, but {CONFIG_FILE} plans {raw} rounds; it cannot be resumed"
        )
    binding = checkpoint.get("binding")
    if binding is None:
        logger.warning(
            "%s was written by an older fedflex and records no binding to its run: config.yaml and metrics.jsonl "
            "are not checked against it",
            path,
        )
        return
    if not isinstance(binding, dict):
        raise CheckpointError(f"{path}: its binding is not a mapping; it cannot be resumed")
    foreign = f"{path} does not belong to the run in {out_dir}"
    # the config it was written with
    bound = binding.get("config")
    if isinstance(bound, dict) and config is not None and _digest(config) != binding.get("config_sha256"):
        differ = _differences(bound, config)
        if differ:
            raise CheckpointError(f"{foreign}: {CONFIG_FILE} has {'; '.join(differ)}; it cannot be resumed")
    # the rows it covers
    count = binding.get("rows")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise CheckpointError(f"{path}: the number of rows it covers ({count!r}) is not a count; it cannot be resumed")
    lines = _whole_rows(out_dir)
    if len(lines) < count:
        raise CheckpointError(
            f"{foreign}: it covers {count} rows of {METRICS_FILE}, which has {len(lines)}; it cannot be resumed"
        )
    covered = lines[:count]
    if hashlib.sha256(b"".join(covered)).hexdigest() != binding.get("rows_sha256"):
        raise CheckpointError(
            f"{foreign}: the first {count} rows of {METRICS_FILE} are not the rows it covers (edited, or another "
            "run's); it cannot be resumed"
        )
    if covered:
        try:
            last = json.loads(covered[-1])["round"]
        except (ValueError, KeyError, TypeError):
            last = None
        if last != server_round:
            raise CheckpointError(
                f"{path} says round {server_round}, but the {count} rows it covers end at round {last}; "
                "it cannot be resumed"
            )
    elif server_round > 0 and lines:
        raise CheckpointError(
            f"{path} says round {server_round}, but it covers no row of {METRICS_FILE}; it cannot be resumed"
        )
    # the model
    spec = binding.get("model")
    have = model_spec(checkpoint["strategy"].get("global_arrays") or {})
    if spec is not None and have != spec:
        raise CheckpointError(f"{path}: its model arrays {_spec_difference(spec, have)}; it cannot be resumed")


def _raw_rounds(out_dir: Path) -> Optional[int]:
    """Return config.yaml's ``rounds`` as written (None when it cannot be read)."""
    import yaml

    try:
        data = yaml.safe_load((Path(out_dir) / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    rounds = data.get("rounds") if isinstance(data, dict) else None
    return rounds if isinstance(rounds, int) and not isinstance(rounds, bool) else None


def _spec_difference(expected: list, have: list) -> str:
    """Return how model specs (:func:`model_spec`) differ, e.g. ``fc.weight is float64, not float32``."""
    want = {str(e[0]): e for e in expected if isinstance(e, (list, tuple)) and len(e) == 3}
    got = {str(h[0]): h for h in have}
    missing = [k for k in want if k not in got]
    extra = [k for k in got if k not in want]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"lack {', '.join(missing[:3])}")
        if extra:
            parts.append(f"have {', '.join(extra[:3])}, which the model has not")
        return " and ".join(parts)
    for name, (_, shape, dtype) in want.items():
        _, gshape, gdtype = got[name]
        if list(gshape) != list(shape):
            return f"{name} has shape {tuple(gshape)}, not {tuple(shape)}"
        if gdtype != dtype:
            return f"{name} is {gdtype}, not {dtype}"
    return "differ in order from the model's"


def check_model(checkpoint: dict[str, Any], model_state: Any) -> None:
    """Check that the model arrays of a checkpoint have the names, shapes and dtypes of the
    model the run's config builds (``model_state``: name -> array or tensor, e.g. a torch
    state dict built on the meta device).

    Raises
    ------
    CheckpointError
        Naming the first array that differs.
    """
    expected = [[str(k), [int(d) for d in v.shape], _dtype_name(v)] for k, v in dict(model_state).items()]
    have = model_spec(checkpoint["strategy"].get("global_arrays") or {})
    if have != expected:
        raise CheckpointError(
            f"{CHECKPOINT_FILE}: its model arrays {_spec_difference(expected, have)} (the model config.yaml builds)"
        )


def _dtype_name(value: Any) -> str:
    """Return the NumPy dtype name of an array or a torch tensor (also on the meta device)."""
    if isinstance(value, np.ndarray):
        return str(value.dtype)
    import torch

    return str(torch.empty((), dtype=value.dtype).numpy().dtype)
