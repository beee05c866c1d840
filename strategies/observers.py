"""What a run does around its rounds, as small objects the ServerApp wires together.

:meth:`strategies.fedflex.FedFlex.run_rounds` calls, for every round, ``evaluate_fn(record,
arrays)`` inside the round, then ``on_round(record)``, ``after_round(round)`` and
``stop(record)``. These are:

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
import time
from typing import Any, Callable, Optional

import numpy as np
import torch
from flwr.app import ArrayRecord, MetricRecord

from fedflex import interrupts
from fedflex.config import ScenarioConfig
from fedflex.data import ArrayDataset
from fedflex.evaluation import evaluate
from fedflex.results import rounds_to_accuracy, smoothed_rounds_to_accuracy
from fedflex.tracking import Tracker, flatten, numeric, row_scalars

logger = logging.getLogger(__name__)


class RunClock:
    """Seconds since this process started the run, plus those of earlier runs it resumes."""

    def __init__(self, previous: float = 0.0) -> None:
        self.previous = float(previous)
        self.t0 = time.perf_counter()

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
    the last one; ``online-accuracy`` too with ``evaluation.online_labels``.
    """

    def __init__(
        self, cfg: ScenarioConfig, model: torch.nn.Module, test: ArrayDataset, client_labels: list[frozenset[int]]
    ) -> None:
        self.model, self.test = model, test
        self.every, self.last = cfg.evaluation.every, cfg.rounds
        self.batch_size, self.loss = cfg.evaluation.batch_size, cfg.model.loss
        self.online_rows = OnlineLabelRows(test.y, client_labels) if cfg.evaluation.online_labels else None

    def __call__(self, record, arrays: ArrayRecord) -> Optional[MetricRecord]:
        """Evaluate ``arrays`` on the test set when this round is due; return the metrics or None."""
        if record.round % self.every and record.round != self.last:
            return None
        self.model.load_state_dict(arrays.to_torch_state_dict())
        loss, acc, _ = evaluate(self.model, self.test, batch_size=self.batch_size, loss=self.loss)
        metrics = MetricRecord({"test-loss": loss, "test-accuracy": acc})
        if self.online_rows is not None:
            rows = self.online_rows(record.online)
            if len(rows):
                _, online_acc, _ = evaluate(self.model, self.test, rows, batch_size=self.batch_size, loss=self.loss)
                metrics["online-accuracy"] = online_acc
        return metrics


class RowWriter:
    """``on_round``: every record (extra rounds of parts included) to metrics.jsonl and
    to the progress display.
    """

    def __init__(self, recorder, progress) -> None:
        self.recorder, self.progress = recorder, progress

    def __call__(self, record) -> None:
        """Write the round's row (results file, progress)."""
        row = record.to_json()
        if self.recorder is not None:
            self.recorder.log_round(row)
        self.progress.update(row)


class Tracking:
    """``on_round``: every record's numeric fields to the experiment trackers
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

    def __call__(self, record) -> None:
        """Send the round's scalars to every tracker."""
        row = record.to_json()
        self.last_round = max(self.last_round, int(row["round"]))
        scalars = row_scalars(row)
        self._each(lambda t: t.log(int(row["round"]), scalars))

    def finish(self, summary: dict[str, Any]) -> None:
        """Send the summary's figures and the status to every tracker."""
        values, status = numeric(summary), str(summary.get("status"))
        self._each(lambda t: t.finish(values, status, self.last_round))


class EachRound:
    """``on_round`` calling several observers in turn (None: left out)."""

    def __init__(self, *observers: Optional[Callable[[Any], None]]) -> None:
        self.observers = [o for o in observers if o is not None]

    def __call__(self, record) -> None:
        """Pass the round's record to every observer."""
        for observer in self.observers:
            observer(record)


def divergence_cause(record, global_arrays) -> Optional[str]:
    """Why the run has diverged after ``record``'s round (None: it has not).

    Diverged: every reply of the round was rejected for NaN / Inf values, the global
    model holds NaN / Inf, or the test loss is not finite.
    """
    nonfinite = int(record.extra.get("rejected_nonfinite", 0))
    if nonfinite and not record.sampled:
        return f"all {nonfinite} repl{'y' if nonfinite == 1 else 'ies'} had NaN or Inf values (local training diverged)"
    bad = [k for k, a in global_arrays.items() if np.issubdtype(a.dtype, np.floating) and not np.all(np.isfinite(a))]
    if bad:
        return f"the global model has NaN or Inf values ({', '.join(bad[:3])})"
    if record.test_loss is not None and not np.isfinite(record.test_loss):
        return f"the test loss is {record.test_loss}"
    return None


class StopRules:
    """``stop``: the first rule that fires ends the run after the round.

    In order: divergence (``evaluation.stop_on_divergence``: ``status: diverged``), a
    signal (``status: interrupted``, resumable), the target accuracy
    (``evaluation.stop_at_accuracy``: ``stopped_early``). :attr:`fields` collects what
    summary.json records; the decision for a round is made once (the checkpointer and
    the loop ask the same question).
    """

    def __init__(self, cfg: ScenarioConfig, global_arrays: Callable[[], Any]) -> None:
        self.cfg = cfg
        self.global_arrays = global_arrays
        self.fields: dict[str, Any] = {}
        self._decided: dict[int, tuple[bool, bool]] = {}  # round -> (stop, resumable)
        self._curve: list[dict[str, Any]] = []  # evaluated rounds (stop_smoothing)

    def decide(self, record) -> tuple[bool, bool]:
        """``(stop, resumable)`` for ``record``'s round."""
        if record.round not in self._decided:
            self._decided = {record.round: self._rules(record)}
        return self._decided[record.round]

    def __call__(self, record) -> bool:
        """Return True when a stop rule says the run ends after this round."""
        return self.decide(record)[0]

    def _rules(self, record) -> tuple[bool, bool]:
        cfg = self.cfg
        if cfg.evaluation.stop_on_divergence:
            cause = divergence_cause(record, self.global_arrays())
            if cause is not None:
                self.fields.update(status="diverged", diverged_round=record.round, divergence=cause)
                logger.error(
                    "round %d: the run diverged: %s; likely cause: client.lr = %g is too large for this model "
                    "(or the server step: strategy.aggregator.server_lr); stopping",
                    record.round,
                    cause,
                    cfg.client.lr,
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
    """``after_round``: the server state every ``every`` rounds (0: never), after the
    last round, and after a round a stop rule ends resumably (a signal: even with
    ``every`` 0, so that the run can be resumed).
    """

    def __init__(
        self,
        save: Callable[[int, float], None],
        every: int,
        last: int,
        stops: StopRules,
        last_record: Callable[[], Any],
        clock: RunClock,
    ) -> None:
        self.save, self.every, self.last = save, every, last
        self.stops, self.last_record, self.clock = stops, last_record, clock

    def __call__(self, server_round: int) -> None:
        """Write a checkpoint when one is due (every ``checkpoint_every`` rounds, at a stop or a signal)."""
        record = self.last_record()
        stop, resumable = self.stops.decide(record) if record is not None else (False, False)
        signalled = resumable and interrupts.requested() is not None
        final = server_round == self.last or (stop and resumable)
        if (self.every and (server_round % self.every == 0 or final)) or signalled:
            self.save(server_round, self.clock.total())
