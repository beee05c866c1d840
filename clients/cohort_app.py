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
  steps both ways on the batch's own clients; every round then predicts its time both
  ways from its clients' step counts (one by one: the sum; a cohort: the longest
  client's, per chunk) and takes the faster (logged when the choice changes); a 2-core
  CPU may well prefer one by one.

Rules with their own loop (``bherd``, ``grab``), models with BatchNorm statistics and
rounds whose clients drew different epochs or batch sizes (``client.epochs_range``,
``client.batch_size_range``) run one by one, with one log line saying so. Cohorts are
cut into chunks that fit the device (:func:`clients.cohort.cohort_chunk_size`) unless
``cohort_size`` is set.
A real SuperNode is one client and never sees cohorts.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import time
from collections import OrderedDict
from typing import Any, Callable, Mapping, Optional, Sequence, cast

import torch
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict

from fedflex import keys
from fedflex.clients.cohort import CohortClient, cohort_chunk_size, train_cohort, unsupported_reason
from fedflex.clients.node import (
    build_reply,
    load_global,
    node_task,
    partition_id,
    payload_of,
    rule_input,
    rule_name,
    settings_from_config,
    train_one,
)
from fedflex.clients.rules import RULE_STEPS
from fedflex.clients.runtime import Task
from fedflex.clients.train import TrainSettings, local_train, num_steps
from fedflex.messages import client_record, error_reply, state_record

logger = logging.getLogger(__name__)

VECTORIZE_MODES = ("auto", "on", "off")
Deliver = Callable[[Message, Context], Message]
CALIBRATION_STEPS = 1  # steps timed each way by vectorize=auto (after 1 warm-up step)
CALIBRATION_CLIENTS = 16  # most clients timed one by one (their mean step cost is what counts)
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
        self._costs: dict[tuple, tuple[float, float, float]] = {}  # (task, rule, size bucket) -> step costs
        self._choice: dict[tuple, bool] = {}  # the last choice per key (logged when it changes)
        self._said: set[str] = set()
        self._fits: dict[tuple, int] = {}  # (task, batch size, optimiser) -> clients that fit the device
        self.last_mode: str = ""  # "cohort" or "sequential": how the last batch ran (tests, logs)

    # ------------------------------------------------------------------ entry point
    def __call__(self, pairs: Sequence[tuple[Message, Context]], deliver: Deliver) -> list[Message]:
        """Return replies to ``pairs``, in order; ``deliver(msg, context)`` answers one message
        the ordinary way (with the caller's error handling).
        """
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
            task, rule = node_task(msg, ctx), rule_name(msg)
        except Exception:  # let the ordinary path report it, message by message
            return None
        if rule not in RULE_STEPS:
            self._say_once(
                f"rule:{rule}",
                "cohorts: local rule %r keeps its own per-step loop; its rounds train one client at a time",
                rule,
            )
            return None
        if settings_from_config(msg.content[keys.CONFIG]).keep_optimizer_state:
            self._say_once(
                "keep-optimizer-state",
                "cohorts: client.keep_optimizer_state keeps each client's optimiser state on its node; "
                "these rounds train one client at a time",
            )
            return None
        reason = unsupported_reason(task.model)
        if reason is not None:
            self._say_once(
                f"model:{reason}", "cohorts: the model cannot be batched (%s); clients train one at a time", reason
            )
            return None
        return task, rule

    def _chunk(self, task: Task, settings: TrainSettings, k: int) -> int:
        """``cohort_size``, or what fits the device, measured once per task and settings
        (a forward pass with hooks; free memory as the first round found it).
        """
        if self.cohort_size:
            return self.cohort_size
        key = (id(task), settings.batch_size, settings.optimizer)
        if key not in self._fits:
            example = task.train.inputs(torch.zeros(1, dtype=torch.long, device=task.device))
            self._fits[key] = cohort_chunk_size(task.model, example, settings, task.device)
        return min(k, self._fits[key])

    def _prefer_batched(self, task: Task, rule: str, group, settings: TrainSettings, chunk: int) -> bool:
        """``on``: yes. ``auto``: predict this round both ways from step costs timed once
        per (task, rule, cohort size): one by one costs the sum of the clients' steps; a
        cohort's step costs ``c(m)`` for the ``m`` clients still training (linear between
        the timed 1 and ``size`` clients).
        """
        if self.vectorize == "on":
            return True
        size = min(len(group), chunk)
        bucket = 1 << (size - 1).bit_length()
        key = (id(task), rule, bucket)
        if key not in self._costs:
            self._costs[key] = self._calibrate(task, group[:size], settings)
            seq, one, full = self._costs[key]
            logger.info(
                "cohorts (simulation.vectorize=auto): one step on %s took %.2f ms per client one by one, "
                "%.2f ms for 1 and %.2f ms for %d clients batched",
                task.device,
                1e3 * seq,
                1e3 * one,
                1e3 * full,
                size,
            )
        seq, one, full = self._costs[key]
        per_client = (full - one) / max(size - 1, 1)
        steps = sorted(
            (num_steps(len(task.client_indices(partition_id(ctx))), settings) for _, ctx in group), reverse=True
        )
        coh_s = 0.0
        for lo in range(0, len(steps), chunk):
            part = steps[lo : lo + chunk]
            live = [sum(1 for n in part if n > s) for s in range(part[0] if part else 0)]
            coh_s += sum(one + per_client * (m - 1) for m in live)
        seq_s = seq * sum(steps)
        batched = coh_s <= CALIBRATION_MARGIN * seq_s
        if self._choice.get(key) != batched:  # the first choice at INFO, later changes at DEBUG
            logger.log(
                logging.INFO if key not in self._choice else logging.DEBUG,
                "cohorts (simulation.vectorize=auto): %d clients, %d steps in all, at most %d each: "
                "predicted %.0f ms batched vs %.0f ms one by one: training %s (predicted again every round)",
                len(group),
                sum(steps),
                steps[0] if steps else 0,
                1e3 * coh_s,
                1e3 * seq_s,
                "in cohorts" if batched else "one client at a time",
            )
        self._choice[key] = batched
        return batched

    def _calibrate(self, task: Task, group, settings: TrainSettings) -> tuple[float, float, float]:
        """Seconds per step: one client one by one (mean over at most CALIBRATION_CLIENTS),
        and batched for 1 and ``len(group)`` clients (on copies: no model, state or random
        stream of the run is touched). A cohort's step cost grows faster than linearly in
        its size on a CPU, so it is timed at the full size, not extrapolated.
        """
        warm = dataclasses.replace(settings, steps=1, epochs=1)
        probe = dataclasses.replace(settings, steps=CALIBRATION_STEPS, epochs=1)
        indices = [task.client_indices(partition_id(ctx)) for _, ctx in group]
        model = copy.deepcopy(task.model)

        def one_by_one(settings: TrainSettings) -> None:
            for ix in indices[:CALIBRATION_CLIENTS]:
                local_train(
                    copy.deepcopy(model), task.train, ix, settings, torch.Generator().manual_seed(0), task.device
                )

        def batched(ixs) -> Callable[[TrainSettings], None]:
            def run(settings: TrainSettings) -> None:
                clients = [CohortClient(ix, torch.Generator().manual_seed(0)) for ix in ixs]
                train_cohort(model, task.train, clients, settings, task.device)

            return run

        times = []
        for fn in (one_by_one, batched([max(indices, key=len)]), batched(indices)):
            fn(warm)  # warm-up: first calls allocate and pick kernels
            _sync(task.device)
            t0 = time.perf_counter()
            fn(probe)
            _sync(task.device)
            times.append((time.perf_counter() - t0) / CALIBRATION_STEPS)
        return times[0] / min(len(indices), CALIBRATION_CLIENTS), times[1], times[2]

    # ------------------------------------------------------------------ the cohort
    def _batched(self, group: Sequence[tuple[Message, Context]], deliver: Deliver) -> Optional[list[Message]]:
        """Return replies for one group of train messages with the same content, or None when
        the group should run one by one.
        """
        first, ctx0 = group[0]
        found = self._can_batch(first, ctx0)
        if found is None:
            return None
        task, rule = found
        steps = RULE_STEPS[rule]
        load_global(task, first)
        payload = payload_of(first)  # the group shares one content: decode its records once
        inputs = [rule_input(msg, ctx, task, payload) for msg, ctx in group]
        settings = inputs[0].settings
        if any(inp.settings != settings for inp in inputs[1:]):
            self._say_once(
                "drawn",
                "cohorts: the clients drew different epochs / batch sizes (client.epochs_range / "
                "client.batch_size_range); a cohort trains with one setting: these rounds train one client at a time",
            )
            return None
        chunk = self._chunk(task, settings, len(group))
        if not self._prefer_batched(task, rule, group, settings, chunk):
            return None
        x = OrderedDict((k, p.detach().clone()) for k, p in task.model.named_parameters())
        replies: list[Optional[Message]] = [None] * len(group)
        started = []
        for i, ((msg, _ctx), inp) in enumerate(zip(group, inputs)):
            try:
                started.append((i, steps.start(inp, x)))
            except Exception as exc:  # this client's error reply; the others go on
                replies[i] = _error_reply(msg, exc)
        # chunks of similar step counts: a cohort costs its longest client's steps
        started.sort(key=lambda item: -num_steps(len(inputs[item[0]].indices), settings))
        state = task.model.state_dict()
        for lo in range(0, len(started), chunk):
            part = started[lo : lo + chunk]
            clients = [
                CohortClient(inputs[i].indices.to(task.device), cast(torch.Generator, inputs[i].generator), st.terms)
                for i, st in part
            ]
            trained, results = train_cohort(task.model, task.train, clients, settings, task.device)
            for (i, st), y, result in zip(part, trained, results):
                msg, ctx = group[i]
                try:
                    out = steps.finish(inputs[i], st, x, y, result)
                    if out.arrays is None:
                        out.arrays = OrderedDict((k, y.get(k, v)) for k, v in state.items())
                    replies[i] = build_reply(msg, partition_id(ctx), task, out, inputs[i].drawn)
                except Exception as exc:
                    replies[i] = _error_reply(msg, exc)
        return [r for r in replies if r is not None]


def _error_reply(msg: Message, exc: Exception) -> Message:
    """Return what Flower makes of a ClientApp that raised (logged at DEBUG)."""
    logger.debug("cohort member failed", exc_info=True)
    return error_reply(msg, exc)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------- Ray: packed messages
_TRAINERS: dict[tuple[str, int], CohortTrainer] = {}  # one per worker process and setting


def train_packed(msg: Message, context: Context) -> Message:
    """Answer a cohort message of :class:`fedflex.launch.cohort_grid.CohortGrid`: train every
    client it names (their node states travel in the message) and pack their replies
    and states into one reply (``<client>|<record>``, ``state|<client>|<record>``, or a
    ``<client>|cohort-error`` config record for a client whose training failed).
    """
    config: Mapping[str, Any] = msg.content[keys.CONFIG]
    clients = [int(c) for c in json.loads(str(config[keys.COHORT_CLIENTS]))]
    setting = (str(config[keys.COHORT_VECTORIZE]), int(config[keys.COHORT_SIZE]))
    trainer = _TRAINERS.setdefault(setting, CohortTrainer(*setting))
    shared = RecordDict()
    states: dict[int, RecordDict] = {c: RecordDict() for c in clients}
    for name, record in msg.content.items():
        owner = next((c for c in clients if name.startswith(state_record(c, ""))), None)
        if owner is not None:
            states[owner][name[len(state_record(owner, "")) :]] = record
        elif name == keys.CONFIG:
            shared[name] = ConfigRecord({k: v for k, v in config.items() if not k.startswith("cohort-")})
        else:
            shared[name] = record
    pairs = []
    for c in clients:
        node_config = {**context.node_config, keys.NODE_PARTITION_ID: c}
        ctx = Context(
            run_id=context.run_id,
            node_id=context.node_id,
            node_config=node_config,
            state=states[c],
            run_config=context.run_config,
        )
        # flwr's Message overloads leave out the metadata keyword its constructor takes
        pairs.append((Message(content=shared, metadata=copy.copy(msg.metadata)), ctx))  # type: ignore[call-overload]

    def deliver(m: Message, ctx: Context) -> Message:
        try:
            return train_one(m, ctx)
        except Exception as exc:
            return _error_reply(m, exc)

    packed = RecordDict()
    for (_msg, ctx), reply in zip(pairs, trainer(pairs, deliver)):
        c = int(ctx.node_config[keys.NODE_PARTITION_ID])
        if reply.has_error():
            packed[client_record(c, keys.COHORT_ERROR)] = ConfigRecord({"reason": cast(str, reply.error.reason)})
            continue
        for name, record in reply.content.items():
            packed[client_record(c, name)] = record
        for name, record in ctx.state.items():
            packed[state_record(c, name)] = record
    return Message(content=packed, reply_to=msg)
