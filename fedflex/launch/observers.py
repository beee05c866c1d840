"""What a run does around its rounds, as small objects the composition root wires together.

:meth:`strategies.strategy.FedFlex.run_rounds` calls ``evaluate_fn(record, arrays)`` inside
every round, then each observer's ``after_round(record, arrays) -> stop``
(:class:`strategies.strategy.RoundObserver`), in the order given. These are:

- :class:`TestSetEvaluation`: the global model on the test set at the scenario's cadence
  (and on the online clients' labels when asked);
- :class:`RowWriter`: the round's row into metrics.jsonl and the progress display;
- :class:`Tracking`: the round's numbers to the experiment trackers (``output.trackers``);
- :class:`StopRules`: divergence, a signal, a target accuracy; the first that fires ends
  the run and says what summary.json records about it;
- :class:`Checkpointer`: the server state every ``checkpoint_every`` rounds, after the
  last round, and when a stop rule leaves a resumable run;
- :class:`RunClock`: the run's wall time, summed over resumes.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable, Optional

import numpy as np
import torch
from flwr.app import ArrayRecord, MetricRecord

from fedflex import interrupts
from fedflex.arrays import record_to_numpy
from fedflex.config import ScenarioConfig
from fedflex.data import ArrayDataset
from fedflex.evaluation import class_accuracy, client_accuracy_stats, client_test_rows, confusion_matrix, predict
from fedflex.results import rounds_to_accuracy, smoothed_rounds_to_accuracy
from fedflex.runinfo import command_start
from fedflex.tracking import Tracker, flatten, numeric, row_scalars

logger = logging.getLogger(__name__)


class RunClock:
    """Seconds this invocation has spent on the run (from the ``fedflex`` command's start,
    else from the run's), plus those of the earlier invocations it resumes.
    """

    def __init__(self, previous: float = 0.0) -> None:
        self.previous = float(previous)
        start = command_start()
        self.t0 = start if start is not None else time.perf_counter()

    def total(self) -> float:
        """Return the seconds the run has taken, earlier sessions of a resumed run included."""
        return self.previous + time.perf_counter() - self.t0


class OnlineLabelRows:
    """Test rows whose label some online client holds (cached per online set)."""

    def __init__(self, test_labels: torch.Tensor, client_labels: list[frozenset[int]]) -> None:
        self.test_labels = test_labels
        self.client_labels = client_labels
        self._cache: dict[tuple[int, ...], torch.Tensor] = {}

    def __call__(self, online: list[int]) -> torch.Tensor:
        """Return the test-set rows of the labels the ``online`` clients hold (cached by online set)."""
        key = tuple(online)
        if key not in self._cache:
            labels = sorted(set().union(*(self.client_labels[c] for c in online))) if online else []
            mask = torch.isin(self.test_labels, torch.tensor(labels, dtype=self.test_labels.dtype))
            self._cache = {key: torch.nonzero(mask).flatten().to(self.test_labels.device)}
        return self._cache[key]


class TestSetEvaluation:
    """``evaluate_fn``: test loss and accuracy every ``evaluation.every`` rounds and after
    the last one; ``online-accuracy`` too with ``evaluation.online_labels``; per class and
    per client as ``evaluation.per_class`` / ``per_client`` say, into the round's record
    (:class:`fedflex.config.EvaluationConfig`), from the same forward pass.

    ``label_counts``: each client's training examples per label (for ``per_client``).
    """

    def __init__(
        self,
        cfg: ScenarioConfig,
        model: torch.nn.Module,
        test: ArrayDataset,
        client_labels: list[frozenset[int]],
        label_counts: Optional[list[np.ndarray]] = None,
    ) -> None:
        self.model, self.test = model, test
        self.every, self.last = cfg.evaluation.every, cfg.rounds
        self.batch_size, self.loss = cfg.evaluation.batch_size, cfg.model.loss
        self.online_rows = OnlineLabelRows(test.y, client_labels) if cfg.evaluation.online_labels else None
        self.per_class, self.per_client = cfg.evaluation.per_class, cfg.evaluation.per_client
        self.client_rows: list[np.ndarray] = []
        if self.per_client != "off" and label_counts is not None:
            size = cfg.evaluation.client_test_size
            self.client_rows = client_test_rows(test.y.cpu().numpy(), label_counts, size, cfg.seed)
        self.confusion: Optional[np.ndarray] = None  # the last evaluated round's (summary.json)

    def __call__(self, record, arrays: ArrayRecord) -> Optional[MetricRecord]:
        """Evaluate ``arrays`` on the test set when this round is due; return the metrics or None."""
        if record.round % self.every and record.round != self.last:
            return None
        self.model.load_state_dict(arrays.to_torch_state_dict())
        loss_sum, predicted, labels = predict(self.model, self.test, batch_size=self.batch_size, loss=self.loss)
        correct = (predicted == labels).cpu().numpy()
        n = len(correct)
        metrics = MetricRecord(
            {"test-loss": loss_sum / n if n else math.nan, "test-accuracy": int(correct.sum()) / n if n else math.nan}
        )
        if self.online_rows is not None:
            rows = self.online_rows(record.online)
            if len(rows):
                metrics["online-accuracy"] = float(correct[rows.cpu().numpy()].mean())
        if self.per_class and n:
            self.confusion = confusion_matrix(predicted.cpu().numpy(), labels.cpu().numpy(), self.test.num_classes)
            per_class = class_accuracy(self.confusion)
            record.extra["class_accuracy"] = [None if a is None else round(a, 6) for a in per_class]
            record.extra["worst_class_accuracy"] = min(a for a in per_class if a is not None)
        if self.client_rows:
            clients = record.online if self.per_client == "online" else range(len(self.client_rows))
            accuracies = {c: float(correct[self.client_rows[c]].mean()) for c in clients if len(self.client_rows[c])}
            record.extra.update(client_accuracy_stats(accuracies))
        return metrics


class RowWriter:
    """Every record (extra rounds of parts included) to metrics.jsonl (``recorder``) and to
    the progress display; ``rows``, when given, also receives each row.
    """

    def __init__(self, recorder, progress, rows: Optional[list[dict[str, Any]]] = None) -> None:
        self.recorder, self.progress, self.rows = recorder, progress, rows

    def after_round(self, record, arrays: ArrayRecord) -> bool:
        """Write the round's row (results file, progress)."""
        row = record.to_json()
        if self.recorder is not None:
            self.recorder.log_round(row)
        if self.rows is not None:
            self.rows.append(row)
        self.progress.update(row)
        return False


class Tracking:
    """Every record's numeric fields to the experiment trackers
    (:mod:`fedflex.tracking`); the flattened config when made, the summary's numbers at
    :meth:`finish`. A tracker that fails during the run is logged and dropped: the run
    and its files go on.
    """

    def __init__(self, trackers: list[Tracker], config: dict[str, Any]) -> None:
        self.trackers = list(trackers)
        self.last_round = 0
        params = flatten(config)
        for tracker in self.trackers:
            tracker.start(params)

    def _each(self, call: Callable[[Tracker], None]) -> None:
        for tracker in list(self.trackers):
            try:
                call(tracker)
            except Exception:  # a tracker must never cost the run
                logger.exception("tracker %s failed; the run goes on without it", type(tracker).__name__)
                self.trackers.remove(tracker)

    def after_round(self, record, arrays: Optional[ArrayRecord] = None) -> bool:
        """Send the round's scalars to every tracker."""
        row = record.to_json()
        self.last_round = max(self.last_round, int(row["round"]))
        scalars = row_scalars(row)
        self._each(lambda t: t.log(int(row["round"]), scalars))
        return False

    def finish(self, summary: dict[str, Any]) -> None:
        """Send the summary's figures and the status to every tracker."""
        values, status = numeric(summary), str(summary.get("status"))
        self._each(lambda t: t.finish(values, status, self.last_round))


def divergence_cause(record, global_arrays) -> Optional[str]:
    """Why the run has diverged after ``record``'s round (None: it has not).

    Diverged: every reply of the round was rejected for NaN / Inf values, the global
    model holds NaN / Inf, or the test loss is not finite.
    """
    found = _diverged(record, global_arrays)
    return found[1] if found is not None else None


def _diverged(record, global_arrays) -> Optional[tuple[str, str]]:
    """Return ``(what, cause)``: what diverged (``replies``, ``model``, ``loss``) and why; None: nothing."""
    nonfinite = int(record.extra.get("rejected_nonfinite", 0))
    if nonfinite and not record.sampled:
        replies = f"all {nonfinite} repl{'y' if nonfinite == 1 else 'ies'}"
        return "replies", f"{replies} had NaN or Inf values (local training diverged)"
    bad = [k for k, a in global_arrays.items() if np.issubdtype(a.dtype, np.floating) and not np.all(np.isfinite(a))]
    if bad:
        if record.sampled:
            where = f"after aggregating {len(record.sampled)} finite repl{'y' if len(record.sampled) == 1 else 'ies'}"
            return "model", f"the global model has NaN or Inf values ({', '.join(bad[:3])}) {where}"
        return "model", f"the global model has NaN or Inf values ({', '.join(bad[:3])})"
    if record.test_loss is not None and not np.isfinite(record.test_loss):
        return "loss", f"the test loss is {record.test_loss}"
    return None


#: aggregators whose server step is more than the mean of the replies
SERVER_OPTIMISERS = ("fedavgm", "fedadam", "fedyogi", "fedadagrad", "fedams", "fedaware", "bherd")


def likely_causes(cfg: ScenarioConfig, what: str, record, global_arrays) -> list[str]:
    """Return the likely causes of a divergence, the one the round's evidence points to first.

    ``what`` (:func:`_diverged`): ``replies``, every reply was non-finite, so local training
    diverged: the clients' step (``client.lr``, then momentum and epochs); ``model``, the
    replies were finite but the aggregated model is not: the server step
    (``strategy.aggregator``), then an oversized update (``clip_norm``), then the clients'
    step; ``loss``, a finite model whose test loss is not: the server step first when the
    clients' own training loss stayed finite, the clients' step first when it did not.
    """
    client, agg = cfg.client, cfg.strategy.aggregator
    local = [f"client.lr = {client.lr:g} too large for this model (local training)"]
    if client.momentum:
        local.append(f"client.momentum = {client.momentum:g}")
    if client.epochs > 1 or client.steps:
        local.append(f"client.epochs = {client.epochs}" if not client.steps else f"client.steps = {client.steps}")
    server = []
    if agg.server_lr != 1.0 or agg.name in SERVER_OPTIMISERS or agg.aware.enabled:
        server.append(f"the server step: strategy.aggregator.name = {agg.name}, server_lr = {agg.server_lr:g}")
    oversized = [
        "an oversized client update: strategy.aggregator.clip_norm"
        + (f" = {agg.clip_norm:g}" if agg.clip_norm else " (off)")
        + " or a robust aggregator"
    ]
    if what == "replies":
        return local
    if what == "model":
        return [*server, *oversized, *local]
    train_loss = getattr(record, "train_loss", None)
    if train_loss is not None and np.isfinite(train_loss):  # the clients' models were fine
        return [*server, *local, *oversized]
    return [*local, *server, *oversized]


class StopRules:
    """The first rule that fires ends the run after the (training) round.

    In order: divergence (``evaluation.stop_on_divergence``: ``status: diverged``), a
    signal (``status: interrupted``, resumable), the target accuracy
    (``evaluation.stop_at_accuracy``: ``stopped_early``). :attr:`fields` collects what
    summary.json records; the decision for a round is made once (the checkpointer and
    the loop ask the same question).
    """

    def __init__(self, cfg: ScenarioConfig) -> None:
        self.cfg = cfg
        self.fields: dict[str, Any] = {}
        self._decided: dict[int, tuple[bool, bool]] = {}  # round -> (stop, resumable)
        self._curve: list[dict[str, Any]] = []  # evaluated rounds (stop_smoothing)

    def decide(self, record, arrays: Optional[ArrayRecord] = None) -> tuple[bool, bool]:
        """``(stop, resumable)`` for ``record``'s round, the global model after it ``arrays``."""
        if record.round not in self._decided:
            self._decided = {record.round: self._rules(record, arrays)}
        return self._decided[record.round]

    def after_round(self, record, arrays: Optional[ArrayRecord] = None) -> bool:
        """Return True when a stop rule says the run ends after this (training) round."""
        if getattr(record, "phase", "train") != "train":
            return False  # an extra round of a part: the round it belongs to decides
        return self.decide(record, arrays)[0]

    def _rules(self, record, arrays: Optional[ArrayRecord]) -> tuple[bool, bool]:
        cfg = self.cfg
        if cfg.evaluation.stop_on_divergence:
            model = record_to_numpy(arrays) if arrays is not None else {}
            found = _diverged(record, model)
            if found is not None:
                what, cause = found
                likely = likely_causes(cfg, what, record, model)
                self.fields.update(
                    status="diverged", diverged_round=record.round, divergence=cause, divergence_causes=likely
                )
                logger.error(
                    "round %d: the run diverged: %s; likely causes, most likely first: %s; stopping",
                    record.round,
                    cause,
                    "; ".join(likely),
                )
                return True, False
        signum = interrupts.requested()
        if signum is not None:
            self.fields.update(status="interrupted", interrupted_by=interrupts.signal_name(signum))
            return True, True
        target = cfg.evaluation.stop_at_accuracy
        if target and record.test_accuracy is not None:
            self._curve.append({"round": record.round, "test_accuracy": record.test_accuracy})
            raw = rounds_to_accuracy(self._curve, target)
            window = cfg.evaluation.stop_smoothing
            smoothed = (
                smoothed_rounds_to_accuracy(self._curve, target, window, cfg.evaluation.stop_smoothing_order)
                if window
                else raw
            )
            if raw is not None and smoothed is not None:
                self.fields["stopped_early"] = True
                logger.info(
                    "Round %d: test accuracy reached %.4f at round %d%s: stopping",
                    record.round,
                    target,
                    raw,
                    f" (smoothed, window {window}: round {smoothed})" if window else "",
                )
                return True, True
        return False, False


class Checkpointer:
    """The server state every ``every`` rounds (0: never), after the last round, and
    after a round a stop rule ends resumably (a signal: even with ``every`` 0, so that
    the run can be resumed); after the round's row is written (observers run in order).

    Between those, when the run owns the stop signals (:func:`fedflex.interrupts.install`:
    ``fedflex run``), it keeps the latest round boundary's checkpoint in memory (a snapshot,
    :func:`fedflex.results.checkpoint_in_memory`) while that costs at most
    :attr:`SNAPSHOT_SHARE` of the run's time, and hands it to :mod:`fedflex.interrupts`:
    a second signal, which ends the run at once in the middle of a round, first writes it,
    so that the run resumes from the round boundary before the stop.
    """

    #: the share of the run's wall time that in-memory snapshots may take
    SNAPSHOT_SHARE = 0.02

    def __init__(
        self,
        save: Callable[[int, float], None],
        every: int,
        last: int,
        stops: StopRules,
        clock: RunClock,
    ) -> None:
        self.save, self.every, self.last = save, every, last
        self.stops, self.clock = stops, clock
        self.saved_round: Optional[int] = None  # the round of the last checkpoint written by this process
        self.snapshot: Optional[tuple[int, bytes, Any]] = None  # (round, checkpoint bytes, directory)
        self._t0 = time.perf_counter()
        self._spent = 0.0  # seconds spent on snapshots
        self._cost = 0.0  # seconds the last one took

    def after_round(self, record, arrays: Optional[ArrayRecord] = None) -> bool:
        """Write a checkpoint when one is due (every ``checkpoint_every`` rounds, at a stop or a signal)."""
        if getattr(record, "phase", "train") != "train":
            return False
        server_round = record.round
        stop, resumable = self.stops.decide(record, arrays)
        signalled = resumable and interrupts.requested() is not None
        final = server_round == self.last or (stop and resumable)
        if (self.every and (server_round % self.every == 0 or final)) or signalled:
            self.save(server_round, self.clock.total())
            self.saved_round, self.snapshot = server_round, None
        elif not stop and interrupts.installed() and self._snapshot_affordable():
            self._take_snapshot(server_round)  # only where a second signal can use it (the CLI)
        return False

    def _snapshot_affordable(self) -> bool:
        elapsed = time.perf_counter() - self._t0
        return self._spent + self._cost <= self.SNAPSHOT_SHARE * elapsed

    def _take_snapshot(self, server_round: int) -> None:
        from fedflex.results import checkpoint_in_memory

        t0 = time.perf_counter()
        try:
            with checkpoint_in_memory() as taken:
                self.save(server_round, self.clock.total())
        except Exception:  # a snapshot is a convenience: it must never cost the run
            logger.debug("no snapshot of round %d", server_round, exc_info=True)
            taken = []
        self._cost = time.perf_counter() - t0
        self._spent += self._cost
        if taken:
            self.snapshot = taken[-1]
            interrupts.add_exit_hook(self.write_snapshot)

    def write_snapshot(self) -> Optional[str]:
        """Write the round boundary's snapshot as the checkpoint when it is newer than the
        one this process wrote (a second signal ends the run at once); return how to
        continue, as the end of a sentence (None: nothing written).
        """
        from fedflex.results import write_snapshot

        snapshot = self.snapshot
        if snapshot is None:
            return None
        server_round, data, out = snapshot
        if self.saved_round is not None and self.saved_round >= server_round:
            return None
        write_snapshot(out, data)
        self.saved_round = server_round
        return f"checkpoint of round {server_round} written: continue with: fedflex run --resume {out}"
