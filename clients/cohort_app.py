"""Train messages handled as cohorts: the simulation side of :mod:`clients.cohort`.

A simulation round sends one train message per sampled client, all with the same
content (global model, rule, settings). :class:`CohortTrainer` takes such a batch of
``(message, node context)`` pairs and answers it with one reply per message, exactly the
replies the ClientApp's ``train`` handler gives one by one (same records, same metrics,
the node state updated the same way), but trains the clients as batched cohorts
(:func:`clients.cohort.train_cohort`) where that is possible and pays:

- ``vectorize="off"``: one by one, always;
- ``vectorize="on"``: cohorts whenever the rule and the model allow it;
- ``vectorize="auto"``: the first batch of each (task, rule, cohort size) times a few
  steps both ways on the batch's own clients and keeps the faster way (logged once); a
  2-core CPU may well prefer one by one.

Rules with their own loop (``bherd``, ``grab``) and models with BatchNorm statistics run
one by one, with one log line saying so. Cohorts are cut into chunks that fit the
device (:func:`clients.cohort.cohort_chunk_size`) unless ``cohort_size`` is set.
A real SuperNode is one client and never sees cohorts.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from collections import OrderedDict
from typing import Callable, Optional, Sequence

import torch
from flwr.app import Context, Error, Message, MessageType

from clients.client_app import _load_global, _partition_id, _reply, _rule_input, _rule_name, _task
from clients.cohort import CohortClient, cohort_chunk_size, train_cohort, unsupported_reason
from clients.rules import RULE_STEPS
from clients.runtime import Task
from clients.train import TrainSettings, local_train
from fedflex import keys

logger = logging.getLogger(__name__)

VECTORIZE_MODES = ("auto", "on", "off")
Deliver = Callable[[Message, Context], Message]
ERROR_CLIENT_APP_RAISED = 2  # Flower's ErrorCode.CLIENT_APP_RAISED_EXCEPTION
CALIBRATION_STEPS = 3  # steps per client timed each way by vectorize=auto
CALIBRATION_MARGIN = 0.9  # cohorts must take at most this share of the one-by-one time


class CohortTrainer:
    """Answers a batch of train messages, in cohorts where possible.

    Parameters
    ----------
    vectorize
        ``auto``, ``on`` or ``off`` (see the module docstring).
    cohort_size
        Most clients per batched computation; 0: as many as fit the device's memory.
    """

    def __init__(self, vectorize: str = "auto", cohort_size: int = 0) -> None:
        if vectorize not in VECTORIZE_MODES:
            raise ValueError(f"vectorize = {vectorize!r}: use one of {', '.join(VECTORIZE_MODES)}")
        if cohort_size < 0:
            raise ValueError(f"cohort_size = {cohort_size}: must be >= 0 (0: fit the device)")
        self.vectorize = vectorize
        self.cohort_size = cohort_size
        self._choice: dict[tuple, bool] = {}  # (task, rule, size bucket) -> batched?
        self._said: set[str] = set()
        self.last_mode: str = ""  # "cohort" or "sequential": how the last batch ran (tests, logs)

    # ------------------------------------------------------------------ entry point
    def __call__(self, pairs: Sequence[tuple[Message, Context]], deliver: Deliver) -> list[Message]:
        """Replies to ``pairs``, in order; ``deliver(msg, context)`` answers one message
        the ordinary way (with the caller's error handling)."""
        groups: dict[int, list[int]] = {}
        for i, (msg, _) in enumerate(pairs):
            key = id(msg.content) if msg.metadata.message_type == MessageType.TRAIN else -1 - i
            groups.setdefault(key, []).append(i)
        replies: list[Optional[Message]] = [None] * len(pairs)
        for key, members in groups.items():
            group = [pairs[i] for i in members]
            out = self._batched(group, deliver) if key >= 0 and len(group) > 1 else None
            self.last_mode = "sequential" if out is None else "cohort"
            if out is None:
                out = [deliver(msg, ctx) for msg, ctx in group]
            for i, reply in zip(members, out):
                replies[i] = reply
        return [r for r in replies if r is not None]

    # ------------------------------------------------------------------ decisions
    def _say_once(self, key: str, text: str, *args) -> None:
        if key not in self._said:
            self._said.add(key)
            logger.info(text, *args)

    def _can_batch(self, msg: Message, ctx: Context) -> Optional[tuple[Task, str]]:
        if self.vectorize == "off":
            return None
        try:
            task, rule = _task(msg, ctx), _rule_name(msg)
        except Exception:  # let the ordinary path report it, message by message
            return None
        if rule not in RULE_STEPS:
            self._say_once(
                f"rule:{rule}",
                "cohorts: local rule %r keeps its own per-step loop; its rounds train one client at a time",
                rule,
            )
            return None
        reason = unsupported_reason(task.model)
        if reason is not None:
            self._say_once(f"model:{reason}", "cohorts: the model cannot be batched (%s); clients train one at a time", reason)
            return None
        return task, rule

    def _chunk(self, task: Task, settings: TrainSettings, k: int) -> int:
        if self.cohort_size:
            return self.cohort_size
        example = task.train.inputs(torch.zeros(1, dtype=torch.long, device=task.device))
        return min(k, cohort_chunk_size(task.model, example, settings, task.device))

    def _prefer_batched(self, task: Task, rule: str, group, settings: TrainSettings, chunk: int) -> bool:
        if self.vectorize == "on":
            return True
        size = min(len(group), chunk)
        bucket = 1 << (size - 1).bit_length()
        key = (id(task), rule, bucket)
        if key not in self._choice:
            seq_s, coh_s = self._calibrate(task, group[:size], settings)
            batched = coh_s <= CALIBRATION_MARGIN * seq_s
            self._choice[key] = batched
            logger.info(
                "cohorts (simulation.vectorize=auto): %d clients x %d steps took %.1f ms batched, %.1f ms one by one "
                "on %s: training %s",
                size, CALIBRATION_STEPS, 1e3 * coh_s, 1e3 * seq_s, task.device,
                "in cohorts" if batched else "one client at a time",
            )
        return self._choice[key]

    def _calibrate(self, task: Task, group, settings: TrainSettings) -> tuple[float, float]:
        """Seconds for CALIBRATION_STEPS steps of each client, one by one and batched (on
        copies: no model, state or random stream of the run is touched)."""
        probe = dataclasses.replace(settings, steps=CALIBRATION_STEPS, epochs=1)
        indices = [task.client_indices(_partition_id(ctx)) for _, ctx in group]
        model = copy.deepcopy(task.model)

        def one_by_one() -> None:
            for ix in indices:
                local_train(copy.deepcopy(model), task.train, ix, probe, torch.Generator().manual_seed(0), task.device)

        def batched() -> None:
            clients = [CohortClient(ix, torch.Generator().manual_seed(0)) for ix in indices]
            train_cohort(model, task.train, clients, probe, task.device)

        times = []
        for fn in (one_by_one, batched):
            fn()  # warm-up: first calls allocate and pick kernels
            _sync(task.device)
            t0 = time.perf_counter()
            fn()
            _sync(task.device)
            times.append(time.perf_counter() - t0)
        return times[0], times[1]

    # ------------------------------------------------------------------ the cohort
    def _batched(self, group: Sequence[tuple[Message, Context]], deliver: Deliver) -> Optional[list[Message]]:
        """Replies for one group of train messages with the same content, or None when
        the group should run one by one."""
        first, ctx0 = group[0]
        found = self._can_batch(first, ctx0)
        if found is None:
            return None
        task, rule = found
        steps = RULE_STEPS[rule]
        _load_global(task, first)
        inputs = [_rule_input(msg, ctx, task) for msg, ctx in group]
        settings = inputs[0].settings
        chunk = self._chunk(task, settings, len(group))
        if not self._prefer_batched(task, rule, group, settings, chunk):
            return None
        _load_global(task, first)  # calibration ran on copies; reload to be safe
        x = OrderedDict((k, p.detach().clone()) for k, p in task.model.named_parameters())
        replies: list[Optional[Message]] = [None] * len(group)
        started = []
        for i, ((msg, ctx), inp) in enumerate(zip(group, inputs)):
            try:
                started.append((i, steps.start(inp, x)))
            except Exception as exc:  # this client's error reply; the others go on
                replies[i] = _error_reply(msg, exc)
        state = task.model.state_dict()
        for lo in range(0, len(started), chunk):
            part = started[lo : lo + chunk]
            clients = [CohortClient(inputs[i].indices.to(task.device), inputs[i].generator, st.terms) for i, st in part]
            trained, results = train_cohort(task.model, task.train, clients, settings, task.device)
            for (i, st), y, result in zip(part, trained, results):
                msg, ctx = group[i]
                try:
                    out = steps.finish(inputs[i], st, x, y, result)
                    if out.arrays is None:
                        out.arrays = OrderedDict((k, y.get(k, v)) for k, v in state.items())
                    replies[i] = _reply(msg, _partition_id(ctx), task, out)
                except Exception as exc:
                    replies[i] = _error_reply(msg, exc)
        return [r for r in replies if r is not None]


def _error_reply(msg: Message, exc: Exception) -> Message:
    """What Flower makes of a ClientApp that raised."""
    logger.debug("cohort member failed", exc_info=True)
    return Message(Error(code=ERROR_CLIENT_APP_RAISED, reason=f"{type(exc).__name__}: {exc}"), reply_to=msg)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
