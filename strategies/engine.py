"""The round engine: one numbered round of a :class:`~strategies.strategy.FedFlex`
strategy, top to bottom, apart from Flower's Strategy API.

:meth:`RoundEngine.run_round` reads one round:

1. who is online (churn schedule in simulation, live nodes in a deployment -- the same
   code path);
2. whether a session starts (the tracker), and then the initializer's model;
3. who trains (the sampler);
4. their train messages (the model, the parts' payloads and config entries);
5. local training (``grid.send_and_receive``);
6. the replies checked (:func:`strategies.replies.check_reply`; rejected ones are
   dropped, logged and listed in ``rejected``), clipped (``clip_norm``), observed by the
   parts, aggregated;
7. the initializer's end-of-round hook;
8. the server-side evaluation, at the scenario's cadence.

The engine is the round context its parts are bound to (:class:`strategies.parts.RoundContext`):
the round's facts, the global model, and the extra round trips (``train_round``,
``query``, ``probe``), each of which is given the model it acts on. The Flower adapter
(:class:`strategies.strategy.FedFlex`) runs the same steps from Flower's
``configure_train`` / ``aggregate_train``; fedflex's loop calls :meth:`RoundEngine.run_round`.
This module is over 600 lines because the round's steps and the extra round trips share
the reply checks and the message building: split, each half would reach into the other.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from logging import ERROR, INFO, WARNING
from typing import Any, Callable, Iterable, Mapping, Optional, Protocol, Sequence

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from fedflex import keys
from fedflex.arrays import numpy_to_record, record_to_numpy
from fedflex.churn import Availability, SessionTracker
from fedflex.records import record_key
from fedflex.strategies.diagnostics import e_lud
from fedflex.strategies.nodes import NodeDirectory
from fedflex.strategies.parts import (
    Aggregator,
    Arrays,
    ClientUpdate,
    Initializer,
    ModelInfo,
    Part,
    RoundContext,
    RoundFacts,
    Sampler,
    ServerRule,
)
from fedflex.strategies.replies import (
    NONFINITE,
    ReplyLimits,
    check_reply,
    num_examples_problem,
    pin_record_arrays,
    round_problems,
)
from fedflex.strategies.robust import clip_records, clip_update

#: the loss metric of Flower's quickstart evaluate replies (fedflex's is ``eval-loss``)
FLOWER_EVAL_LOSS = "eval_loss"


class RunFailedError(RuntimeError):
    """The run ended without a usable result; its message is the one-line reason that
    ``summary.json`` records as ``failure`` (``"status": "failed"``).
    """


class TooFewClientsError(RunFailedError):
    """A round had fewer online clients than required and the scenario says fail."""


@dataclass
class RoundRecord:
    """What happened in one round (one line of metrics.jsonl)."""

    round: int
    session: int = 0
    session_started: bool = False
    online: list[int] = field(default_factory=list)
    sampled: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    rejected: list[list] = field(default_factory=list)  # [client id, reason] of each rejected reply
    skipped: bool = False
    num_examples: int = 0
    train_loss: Optional[float] = None
    test_accuracy: Optional[float] = None
    test_loss: Optional[float] = None
    wall_s: float = 0.0
    phase: str = "train"
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Return the round's row of metrics.jsonl."""
        row = {
            "round": self.round,
            "phase": self.phase,
            "session": self.session,
            "session_started": self.session_started,
            "online": self.online,
            "sampled": self.sampled,
            "failed": self.failed,
            "rejected": self.rejected,
            "skipped": self.skipped,
            "num_examples": self.num_examples,
            "train_loss": self.train_loss,
            "test_accuracy": self.test_accuracy,
            "test_loss": self.test_loss,
            "wall_s": round(self.wall_s, 4),
        }
        row.update(self.extra)
        return row


class RoundObserver(Protocol):
    """What sees every finished round of :meth:`~strategies.strategy.FedFlex.run_rounds` (results files,
    progress, trackers, checkpoints, stop rules).
    """

    def after_round(self, record: RoundRecord, arrays: ArrayRecord) -> bool:
        """See ``record`` and the global model after it; True ends the run after this
        round (ignored for an extra round of a part, ``record.phase`` != "train").
        """
        ...


#: ``parts_factory(num_clients, num_rounds, initial arrays)`` -> (sampler, aggregator,
#: initializer, server rule): parts built once the federation's size is known
PartsFactory = Callable[[int, int, Arrays], tuple[Sampler, Aggregator, Initializer, Optional[ServerRule]]]

#: ``evaluate_fn(record, arrays)`` of fedflex's loop: ``test-accuracy`` / ``test-loss`` (and
#: optionally ``online-accuracy``), or None when the round is not evaluated
EvaluateFn = Callable[[RoundRecord, ArrayRecord], Optional[MetricRecord]]


@dataclass(frozen=True)
class RecordKeys:
    """The record names of every message (Flower's FedAvg options of the same names):
    the model's ArrayRecord, the ConfigRecord, and the reply metric holding a client's
    example count (the weight of every aggregator that weighs by data size).
    """

    arrays: str = keys.ARRAYS
    config: str = keys.CONFIG
    weight: str = keys.NUM_EXAMPLES


@dataclass
class RunState:
    """What a running loop (Flower's ``start`` or fedflex's ``run_rounds``) tells the
    engine: the grid the extra round trips use, the timeout of every wait, the round count
    (HiCS-FL's schedule), the train config every message carries, and the observers that
    see the records of the parts' extra rounds.
    """

    grid: Optional[Grid] = None
    timeout: float = 3600.0
    num_rounds: Optional[int] = None
    config: ConfigRecord = field(default_factory=ConfigRecord)
    observers: Sequence[RoundObserver] = ()


class RoundEngine:
    """One strategy's rounds: its parts, its federation (nodes, churn, sessions) and the
    global model. It is the :class:`~strategies.parts.RoundContext` its parts are bound to.

    The parts come with :meth:`set_parts`; the other keywords are
    :class:`~strategies.strategy.FedFlex`'s (the Flower adapter's), here described where
    the engine owns them.

    Parameters
    ----------
    per_round
        ``per_round(num_online)`` is K, the number the sampler is asked for.
    min_clients
        Fewest online clients a round needs; below it the round is skipped (logged) or,
        with ``on_too_few="fail"``, the run stops with :class:`TooFewClientsError`.
    availability
        The churn schedule (simulation). ``None``: the live nodes are the online set
        (deployment). Either way the online set is also cut to clients with a live node.
    tracker
        Turns online sets into sessions.
    identify
        How nodes get client ids (:mod:`strategies.nodes`): ``"auto"`` (default: ask no
        node; in simulation node i of the registration order is client id i, its
        ``partition-id``, elsewhere as ``"node-id"``), ``"node-id"`` (ask none: 0, 1, ...
        in order of appearance) or ``"partition-id"`` (ask every new node with a QUERY
        message: only fedflex's ClientApp answers it).
    query_timeout
        Seconds a ``"partition-id"`` QUERY waits for its reply; None: the run's
        ``timeout`` (``start(timeout=...)``).
    client_lr
        ``client_lr(round, session start round)``: the learning rate every train message
        of the round carries as ``client.lr`` (a schedule, ``fedflex.lr_schedule.client_lr``), also
        logged as ``client_lr``. None: the train config's own ``client.lr`` (constant).
    model
        The model's description (:class:`~strategies.parts.ModelInfo`) the parts may read.
    reply_limits
        What a training reply may carry (:class:`~strategies.replies.ReplyLimits`; the
        local rule's records and metrics are added from ``server_rule``). None: the
        defaults (no bound on ``num-examples`` beyond a finite integer >= 1).
    clip_norm
        Scale each client's update (reply - global model) down to this L2 norm before
        any part sees it (None: no clipping); clipped clients are logged as ``clipped``.
    lr
        The clients' constant learning rate, told to the parts in :attr:`facts` when there
        is no ``client_lr`` schedule.
    record_keys
        The record names of every message (:class:`RecordKeys`).
    """

    def __init__(
        self,
        *,
        per_round: Callable[[int], int],
        min_clients: int = 1,
        availability: Optional[Availability] = None,
        tracker: Optional[SessionTracker] = None,
        on_too_few: str = "skip",
        local_rule: str = "sgd",
        query_timeout: Optional[float] = None,
        client_lr: Optional[Callable[[int, int], float]] = None,
        lr: Optional[float] = None,
        model: Optional[ModelInfo] = None,
        reply_limits: Optional[ReplyLimits] = None,
        clip_norm: Optional[float] = None,
        identify: str = "auto",
        record_keys: Optional[RecordKeys] = None,
    ) -> None:
        record_keys = record_keys or RecordKeys()
        self.per_round = per_round
        self.min_clients = min_clients
        self.availability = availability
        self.tracker = tracker or SessionTracker()
        self.on_too_few = on_too_few
        self.local_rule = local_rule
        self.query_timeout = query_timeout
        self.client_lr = client_lr
        self.lr = lr
        self.model = model or ModelInfo()
        self.clip_norm = clip_norm
        self.identify = identify
        self.keys = record_keys
        self.base_limits = dataclasses.replace(
            reply_limits or ReplyLimits(), arrays_key=record_keys.arrays, weight_key=record_keys.weight
        )
        self.reply_limits = self.base_limits
        self.run = RunState()
        self.num_clients = 0
        self.global_arrays: Arrays = OrderedDict()
        self.facts: Optional[RoundFacts] = None  # the round in progress, what the parts may read
        self.sizes: dict[int, int] = {}
        self._record_cache: tuple[Any, Optional[ArrayRecord]] = (None, None)  # (global_arrays, its record)
        self.sampler: Sampler
        self.aggregator: Aggregator
        self.initializer: Initializer
        self.server_rule: Optional[ServerRule] = None
        self.nodes: NodeDirectory
        self._pristine: list[dict[str, Any]] = []

    def set_parts(
        self,
        num_clients: int,
        sampler: Sampler,
        aggregator: Aggregator,
        initializer: Initializer,
        server_rule: Optional[ServerRule],
    ) -> None:
        """Take the parts for ``num_clients`` clients (ids 0..N-1) and bind them to this engine."""
        self.num_clients = num_clients
        self.sampler, self.aggregator, self.initializer, self.server_rule = (
            sampler,
            aggregator,
            initializer,
            server_rule,
        )
        records, metrics = server_rule.reply_needs() if server_rule is not None else ((), ())
        self.reply_limits = dataclasses.replace(self.base_limits, records=records, metrics=metrics)
        self.nodes = NodeDirectory(num_clients, query_timeout=self.query_timeout_s(), identify=self.identify)
        context: RoundContext = self
        for part in self.parts:
            part.bind(context)  # num_clients is set by now
        # the server-side parts' state before any round: what an isolated extra round starts from
        self._pristine = [copy.deepcopy(p.state_dict()) for p in self._stateful_parts()]

    @property
    def ready(self) -> bool:
        """Whether the parts exist (built at once, or by a ``parts_factory`` at the start)."""
        return hasattr(self, "sampler")

    @property
    def parts(self) -> list[Part]:
        """Return the parts: sampler, aggregator, initializer and server rule (if any)."""
        parts: list[Part] = [self.sampler, self.aggregator, self.initializer]
        return parts + ([self.server_rule] if self.server_rule is not None else [])

    def _stateful_parts(self) -> list[Part]:
        """Return the parts an extra round's replies reach: sampler, aggregator, server rule."""
        return [p for p in (self.sampler, self.aggregator, self.server_rule) if p is not None]

    def query_timeout_s(self) -> float:
        """Seconds a QUERY waits: ``query_timeout``, or the run's timeout."""
        return self.query_timeout if self.query_timeout is not None else self.run.timeout

    def start_run(self, run: RunState) -> None:
        """Take what a starting loop tells the engine (:class:`RunState`)."""
        self.run = run
        if self.ready:
            self.nodes.query_timeout = self.query_timeout_s()

    def summary_lines(self, k: Any) -> list[str]:
        """Return the lines that describe the parts and settings (``k``: the round's size as told)."""
        limits = self.reply_limits
        bound = f"<= {limits.cap}" if limits.cap is not None else ("<= partition size" if limits.sizes else "unbounded")
        clip = "off" if self.clip_norm is None else f"L2 norm <= {self.clip_norm}"
        churn = type(self.availability).__name__ if self.availability else "live nodes"
        return [
            "\t├──> FedFlex parts:",
            f"\t│\t├── sampler: {self.sampler.summary()} (K={k} of N={self.num_clients})",
            f"\t│\t├── aggregator: {self.aggregator.summary()}",
            f"\t│\t├── initializer: {self.initializer.summary()}",
            f"\t│\t├── local rule: {self.local_rule}",
            f"\t│\t└── replies: num-examples {bound}; update clipping {clip}",
            f"\t├──> online set: {churn}; min clients {self.min_clients} ({self.on_too_few} below)",
        ]

    def why_untrained(self, record: RoundRecord, sent: int, num_replies: int) -> str:
        """One line: why the round of ``record`` trained nothing (``sent`` train messages,
        ``num_replies`` replies).
        """
        server_round = record.round
        if record.skipped:
            online = len(record.online)
            return f"round {server_round}: {online} client(s) online, fewer than min_clients={self.min_clients}"
        if sent == 0:
            return f"round {server_round}: no client was sampled"
        if num_replies == 0:
            timeout = self.run.timeout
            return f"round {server_round}: none of the {sent} sampled node(s) replied within timeout={timeout:g} s"
        if record.rejected:
            client, reason = record.rejected[0]
            return f"round {server_round}: every reply was rejected (client {client}: {reason})"
        failures = record.extra.get("node_failures") or [{}]
        return f"round {server_round}: every node failed ({failures[0].get('error', 'no usable reply')})"

    def take_model(self, arrays: ArrayRecord, server_round: int, last: Optional[RoundRecord]) -> None:
        """Take the model a loop hands in (``arrays``) as the global model, when it is not
        the engine's own. The model Flower released after ``last`` (e.g. with a DP
        wrapper's noise) is that round's model: a session's stored last model must be
        the one the clients saw.
        """
        if arrays is self.global_record():
            return
        self.global_arrays = record_to_numpy(arrays)
        if last is not None and last.round == server_round - 1 and not last.skipped:
            self.initializer.on_round_end(last.round, last.session, self.global_arrays)

    def take_app_lr(self, app_lr: Any, given: Optional[float], who: str) -> None:
        """Take an app's ``train_config["lr"]`` (Flower's convention) as the clients' learning
        rate, else ``given`` (the strategy's ``lr``); warn once when ``given`` disagrees.
        """
        if isinstance(app_lr, bool) or not isinstance(app_lr, (int, float)) or not app_lr > 0:
            self.lr = given
            return
        app = float(app_lr)
        if given is not None and not np.isclose(given, app) and self.lr != app:
            msg = "%s: lr=%g was given, but the app's train_config sends lr=%g, which the clients train with: "
            log(WARNING, msg + "the server step uses %g", who, given, app, app)
        self.lr = app

    # ------------------------------------------------------------------ one round
    def run_round(self, server_round: int, grid: Grid, evaluate_fn: Optional[EvaluateFn] = None) -> RoundRecord:
        """One round, top to bottom; returns its record (one line of metrics.jsonl)."""
        t0 = time.perf_counter()
        # 1. who is online; 2. a new session? (the initializer may replace the model)
        record = self.begin(server_round, grid)
        clock = _PhaseClock(record, t0)
        if not record.skipped:
            # 3. who trains (a sampler's probes included); 4. their messages
            sampled = self.sample(server_round, record)
            messages = self.train_messages(server_round, self.global_record(), sampled)
            clock.lap("sample_s")
            # 5. local training
            replies = list(grid.send_and_receive(messages, timeout=self.run.timeout))
            clock.lap("train_s")
            # 6. check the replies, aggregate
            new = self.aggregate(server_round, self.global_arrays, replies, record, destinations(messages))
            if new is not None:
                self.global_arrays = new
        # 7. the initializer sees the round's model; 8. evaluate it
        self.initializer.on_round_end(server_round, record.session, self.global_arrays)
        clock.lap("aggregate_s")
        if evaluate_fn is not None:
            res: Optional[Mapping[str, Any]] = evaluate_fn(record, self.global_record())
            if res is not None:
                record.test_accuracy = float(res["test-accuracy"])
                record.test_loss = float(res["test-loss"])
                if "online-accuracy" in res:
                    record.extra["online_accuracy"] = float(res["online-accuracy"])
        clock.lap("evaluate_s")
        record.wall_s = time.perf_counter() - t0
        return record

    def begin(self, server_round: int, grid: Grid) -> RoundRecord:
        """Run steps 1-2: the online set, the session counter, the initializer's model at a
        session start; the round is ``skipped`` with fewer than ``min_clients`` online.
        """
        record = RoundRecord(round=server_round)
        online = self.online_clients(server_round, grid)
        record.online = online.tolist()
        scripted = self.availability is not None and self.availability.starts_session(server_round)
        record.session, record.session_started = self.tracker.update(server_round, online.tolist(), force=scripted)
        # the round's facts, declared to the parts (the initializer's extra rounds included)
        lr = self.round_lr(server_round)
        self.facts = RoundFacts(
            round=server_round, online=online, lr=self.lr if lr is None else lr, num_rounds=self.run.num_rounds
        )
        if record.session_started and server_round > 1:
            log(INFO, "session %d starts at round %d with %d clients", record.session, server_round, len(online))
        if record.session_started and len(online) >= self.min_clients:
            replacement = self.initializer.on_session_start(server_round, record.session, online, self.global_arrays)
            if replacement is not None:
                self.global_arrays = replacement
                for part in self.parts:
                    part.on_model_switch(server_round)
        if len(online) < self.min_clients:
            record.skipped = True
            msg = f"round {server_round}: {len(online)} client(s) online, fewer than min_clients={self.min_clients}"
            if self.on_too_few == "fail":
                raise TooFewClientsError(f"{msg} (churn.on_too_few=fail)")
            log(WARNING, "%s: round skipped, model kept", msg)
        return record

    def sample(self, server_round: int, record: RoundRecord) -> np.ndarray:
        """Run step 3: the sampler's clients among the round's online ones (into ``record``)."""
        online = np.asarray(record.online, dtype=np.int64)
        sampled = self.sampler.sample(server_round, online, self.per_round(len(online)))
        record.sampled = sampled.tolist()
        self._log_lr(server_round, record)
        return sampled

    def global_record(self) -> ArrayRecord:
        """Return the global model as an ArrayRecord, converted once per model (all of a round's
        messages share it).
        """
        arrays, record = self._record_cache
        if record is None or arrays is not self.global_arrays:  # the cache holds the model: no id reuse
            record = numpy_to_record(self.global_arrays)
            self._record_cache = (self.global_arrays, record)
        return record

    # ------------------------------------------------------------------ RoundContext
    def data_sizes(self) -> dict[int, int]:
        """Return the training-set size of every client that replied so far."""
        return self.sizes

    def _grid(self, what: str) -> Grid:
        if self.run.grid is None:
            raise RuntimeError(f"{what} is only available while the strategy runs")
        return self.run.grid

    def train_round(
        self, server_round: int, arrays: Arrays, clients: np.ndarray, phase: str, isolated: bool = False
    ) -> Optional[Arrays]:
        """Run a real round from ``arrays`` outside the scenario's count (e.g. session-aware
        gradient rounds); the global model stays as it is. ``isolated``: the sampler,
        aggregator and server rule see the round from the state they had before round 1
        (no server momentum, no estimates), and get their own state back afterwards.
        """
        grid = self._grid("train_round")
        if isolated:
            parts = self._stateful_parts()
            states = [copy.deepcopy(p.state_dict()) for p in parts]
            for part, state in zip(parts, self._pristine):
                part.load_state_dict(copy.deepcopy(state))
            try:
                return self.train_round(server_round, arrays, clients, phase)
            finally:
                for part, state in zip(parts, states):
                    part.load_state_dict(state)
        t0 = time.perf_counter()
        record = RoundRecord(round=server_round, phase=phase, online=[int(c) for c in clients])
        record.session = max(self.tracker.session, 0)
        record.sampled = [int(c) for c in clients]
        messages = self.train_messages(server_round, numpy_to_record(arrays), clients)
        self._log_lr(server_round, record)
        replies = list(grid.send_and_receive(messages, timeout=self.run.timeout))
        new = self.aggregate(server_round, arrays, replies, record, destinations(messages))
        record.wall_s = time.perf_counter() - t0
        for observer in self.run.observers:  # an extra round is seen, it cannot stop the run
            observer.after_round(record, self.global_record())
        return new

    def query(self, server_round: int, clients: np.ndarray, arrays: Arrays) -> dict[int, dict[str, Any]]:
        """Ask ``clients`` for their loss of ``arrays`` (a query message each); return their replies by client."""
        grid = self._grid("query")
        config = ConfigRecord({keys.SERVER_ROUND: server_round, keys.WANT_LOSS: True})
        if keys.TASK in self.run.config:  # fedflex's task spec (a Flower app's config has none)
            config[keys.TASK] = self.run.config[keys.TASK]
        content = RecordDict({self.keys.arrays: numpy_to_record(arrays), self.keys.config: config})
        # fedflex's ClientApp answers a loss QUERY; any other ClientApp evaluates (Flower's convention)
        messages = [
            Message(
                content=content,
                dst_node_id=node,
                message_type=MessageType.QUERY if self.nodes.answers_queries(node) else MessageType.EVALUATE,
                ttl=self.run.timeout,
            )
            for node in self.nodes.nodes_of(clients)
        ]
        out: dict[int, dict[str, Any]] = {}
        for reply in grid.send_and_receive(messages, timeout=self.run.timeout):
            client = self.nodes.client_of(reply.metadata.src_node_id)
            if client is None or reply.has_error() or keys.METRICS not in reply.content.metric_records:
                continue
            metrics: dict[str, Any] = dict(reply.content[keys.METRICS])
            if keys.EVAL_LOSS not in metrics and FLOWER_EVAL_LOSS in metrics:  # Flower's quickstart spelling
                metrics[keys.EVAL_LOSS] = metrics[FLOWER_EVAL_LOSS]
            metrics[keys.NUM_EXAMPLES] = metrics.get(self.keys.weight)
            problem = num_examples_problem(metrics.get(keys.NUM_EXAMPLES), self.reply_limits.bound(client))
            if problem:
                log(WARNING, "round %d: query reply of client %d rejected: %s", server_round, client, problem)
                continue
            out[client] = metrics
        return out

    def probe(self, server_round: int, clients: np.ndarray, arrays: Arrays, steps: int = 0) -> list[ClientUpdate]:
        """Train ``clients`` from ``arrays`` for ``steps`` steps (0: a round's worth), outside the round count."""
        grid = self._grid("probe")
        # the scenario's training settings, but plain SGD and none of the parts' payloads:
        # a probe must not move client state (SCAFFOLD's variates) or server state
        config = ConfigRecord({**self.run.config, **ServerRule().train_config(server_round)})  # sgd's options
        config[keys.SERVER_ROUND] = server_round
        self._put_round_lr(config, server_round)
        if steps > 0:
            config[record_key(keys.CLIENT, "steps")] = int(steps)
        content = RecordDict({self.keys.arrays: numpy_to_record(arrays), self.keys.config: config})
        messages = [
            Message(content=content, dst_node_id=node, message_type=MessageType.TRAIN, ttl=self.run.timeout)
            for node in self.nodes.nodes_of(clients)
        ]
        out: list[ClientUpdate] = []
        for reply in grid.send_and_receive(messages, timeout=self.run.timeout):
            client = self.nodes.client_of(reply.metadata.src_node_id)
            if client is None or reply.has_error():
                continue
            plain = dataclasses.replace(self.reply_limits, records=(), metrics=())  # probes run plain SGD
            update, reason = check_reply(reply.content, arrays, plain, client)
            if update is None:
                log(WARNING, "round %d: probe reply of client %d rejected: %s", server_round, client, reason)
                continue
            out.append(update)
        return sorted(out, key=lambda u: u.client)

    def online_clients(self, server_round: int, grid: Grid) -> np.ndarray:
        """Client ids online in ``server_round``: schedule (if any) cut to live nodes."""
        self.nodes.refresh(grid)
        live = self.nodes.clients()
        if self.availability is None:
            return live
        return np.intersect1d(self.availability.online(server_round), live).astype(np.int64)

    # ------------------------------------------------------------------ messages and replies
    def round_lr(self, server_round: int) -> Optional[float]:
        """Return the scheduled client learning rate of ``server_round`` (None: no schedule; the
        train config's ``client.lr`` stands). The session clock reads the tracker, which
        has seen this round by the time its messages are built.
        """
        if self.client_lr is None:
            return None
        return float(self.client_lr(server_round, max(self.tracker.session_start_round, 1)))

    def _put_round_lr(self, config: ConfigRecord, server_round: int) -> None:
        """Replace the train config's ``client.lr`` with a scheduled lr (no schedule: nothing)."""
        lr = self.round_lr(server_round)
        if lr is not None:
            config[record_key(keys.CLIENT, "lr")] = lr

    def _log_lr(self, server_round: int, record: RoundRecord) -> None:
        lr = self.round_lr(server_round)
        if lr is not None:
            record.extra["client_lr"] = lr

    def train_messages(self, server_round: int, arrays: ArrayRecord, clients: np.ndarray) -> list[Message]:
        """One train message per client, all sharing one content: the model, the parts'
        payloads and config entries, the run's train config and the round.
        """
        content = RecordDict({self.keys.arrays: arrays})
        config = ConfigRecord(dict(self.run.config))
        for part in self.parts:
            for name, payload in part.train_payload(server_round).items():
                content[name] = numpy_to_record(payload)
            for key, value in part.train_config(server_round).items():
                config[key] = value
        config[keys.SERVER_ROUND] = server_round
        self._put_round_lr(config, server_round)
        content[self.keys.config] = config
        return [
            # ttl: a node never picks up a message whose round has given up on it
            Message(content=content, dst_node_id=node, message_type=MessageType.TRAIN, ttl=self.run.timeout)
            for node in self.nodes.nodes_of(clients)
        ]

    def aggregate(
        self,
        server_round: int,
        base: Arrays,
        replies: Iterable[Message],
        record: RoundRecord,
        dst_of: dict[str, int],
        accepted: Optional[list[RecordDict]] = None,
    ) -> Optional[Arrays]:
        """Validate replies to messages that carried ``base``, let the parts observe them,
        aggregate; fill ``record``; the new model, or None when no reply was usable.
        ``dst_of``: message id -> node id of the messages sent (error replies made by the
        SuperLink come from node 1, not from the node that failed); ``accepted``, when
        given, receives the content of every reply that passed the checks.
        """
        updates: list[ClientUpdate] = []
        replies = list(replies)
        contents: dict[int, RecordDict] = {}  # id(update) -> its reply's content (``accepted``)
        # the rule records' arrays: pinned from the first round that has some (strategies/replies.py)
        usable = [r.content for r in replies if not r.has_error()]
        self.reply_limits = pin_record_arrays(self.reply_limits, usable, base)
        for reply in replies:
            node = reply.metadata.src_node_id
            if reply.has_error():  # errors made by the SuperLink (node gone) come from node 1
                node = dst_of.get(reply.metadata.reply_to_message_id, node)
            client = self.nodes.client_of(node)
            if reply.has_error():
                log(WARNING, "round %d: client %s (node %d) failed: %s", server_round, client, node, reply.error.reason)
                record.failed.append(-1 if client is None else client)
                # the reason in the results (summary.json's node_failures), not only in a log
                failure = {"client": client, "node": node, "code": reply.error.code, "error": reply.error.reason}
                record.extra.setdefault("node_failures", []).append(failure)
                continue
            update, reason = check_reply(reply.content, base, self.reply_limits, client)
            if update is None and reason.endswith(NONFINITE):
                record.extra["rejected_nonfinite"] = record.extra.get("rejected_nonfinite", 0) + 1
            if update is None or client is None:
                reason = reason or "unknown node"
                log(WARNING, "round %d: reply of client %s (node %d) rejected: %s", server_round, client, node, reason)
                record.failed.append(-1 if client is None else client)
                record.rejected.append([-1 if client is None else client, reason])
                continue
            updates.append(update)
            contents[id(update)] = reply.content
        # what one reply cannot show: its rule records against the round's (strategies/replies.py)
        sent = self.server_rule.train_payload(server_round) if self.server_rule is not None else {}
        lr = self.round_lr(server_round)
        bounds = round_problems(updates, base, self.reply_limits, self.local_rule, sent, lr or self.lr)
        for client, reason in sorted(bounds.items()):
            node = self.nodes.client_to_node.get(client, -1)
            log(WARNING, "round %d: reply of client %d (node %d) rejected: %s", server_round, client, node, reason)
            record.failed.append(client)
            record.rejected.append([client, reason])
        updates = [u for u in updates if u.client not in bounds]
        if accepted is not None:
            accepted.extend(contents[id(u)] for u in updates)
        updates.sort(key=lambda u: u.client)
        record.rejected.sort(key=lambda r: r[0])
        trained = {u.client for u in updates}
        record.failed = sorted(set(record.failed))
        record.sampled = [c for c in record.sampled if c in trained]
        if not updates:
            if not record.skipped:
                log(WARNING, "round %d: no usable reply; model kept", server_round)
            return None
        for u in updates:
            self.sizes[u.client] = u.num_examples
        if self.clip_norm is not None:
            record.extra["clipped"] = self._clip(updates, base, sent)
        if self.server_rule is not None:
            self.server_rule.observe(server_round, updates, base)
        new = self.aggregator.aggregate(server_round, base, updates)
        self.sampler.observe(server_round, updates, base)
        n = sum(u.num_examples for u in updates)
        losses = [(u.num_examples, u.metrics.get(keys.TRAIN_LOSS)) for u in updates]
        known = [(w, float(v)) for w, v in losses if isinstance(v, (int, float)) and np.isfinite(v)]
        record.num_examples = n
        if known:
            record.train_loss = sum(w * v for w, v in known) / sum(w for w, _ in known)
        for part in self.parts:
            record.extra.update(part.round_metrics())
        record.extra["e_lud"] = e_lud(base, [u.arrays for u in updates])  # every aggregator
        draws = [
            [
                u.client,
                int(u.metrics[keys.LOCAL_EPOCHS]),
                int(u.metrics[keys.LOCAL_BATCH_SIZE]),
                int(u.metrics.get(keys.NUM_STEPS, 0)),
            ]
            for u in updates
            if keys.LOCAL_EPOCHS in u.metrics and keys.LOCAL_BATCH_SIZE in u.metrics
        ]
        if draws:  # client.epochs_range / batch_size_range: [client, epochs, batch size, steps], by client
            record.extra["local_draws"] = draws
        return new

    def _clip(
        self, updates: list[ClientUpdate], base: Arrays, sent: Optional[Mapping[str, Mapping[str, np.ndarray]]] = None
    ) -> list[int]:
        """Clip every update against ``base`` to ``clip_norm`` (in place), and the rule records
        made from it (``sent``: the server's records of the round, SCAFFOLD's ``scaffold-c``);
        the clients that were clipped.
        """
        assert self.clip_norm is not None  # called only with clipping on
        clipped = []
        for u in updates:
            u.arrays, norm = clip_update(u.arrays, base, self.clip_norm)
            if norm > self.clip_norm:
                clipped.append(u.client)
                clip_records(u, self.clip_norm / norm, sent or {})
        return clipped

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything the server needs to continue a run (clients keep their own state)."""
        return {
            "global_arrays": dict(self.global_arrays),
            "parts": {type(p).__name__: p.state_dict() for p in self.parts},
            "tracker": self.tracker.state_dict(),
            "sizes": dict(self.sizes),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the global model and every part's state from a checkpoint."""
        self.global_arrays = OrderedDict(state["global_arrays"])
        for part in self.parts:
            name = type(part).__name__
            if name in state["parts"]:
                part.load_state_dict(state["parts"][name])
            elif part.state_dict():  # a stateless part may be missing (e.g. a newer part type)
                raise ValueError(
                    f"the checkpoint holds no state for part {name} (written by another version "
                    f"of fedflex, or for other parts: {', '.join(state['parts'])})"
                )
        self.tracker.load_state_dict(state["tracker"])
        self.sizes = {int(k): int(v) for k, v in state["sizes"].items()}


class _PhaseClock:
    """The seconds of a round's phases, into its row: ``sample_s`` (the online set, a new
    session's start, sampling with its probes, the messages), ``train_s`` (sending them and
    waiting for the replies), ``aggregate_s`` (checking the replies, aggregating, the
    initializer's round end) and ``evaluate_s``. A skipped round has no ``sample_s`` and
    ``train_s``: its ``aggregate_s`` holds the online set and the session check.
    """

    def __init__(self, record: RoundRecord, start: float) -> None:
        self.record = record
        self.last = start

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.record.extra[name] = round(now - self.last, 4)
        self.last = now


def destinations(messages: list[Message]) -> dict[str, int]:
    """Message id -> destination node id (ids are set once the grid has sent them)."""
    return {m.metadata.message_id: m.metadata.dst_node_id for m in messages}


def add_to_result(result: Result, record: RoundRecord) -> None:
    """Put a round's training metrics and server-side evaluation into Flower's ``result``."""
    if record.num_examples:
        metrics = MetricRecord({keys.NUM_EXAMPLES: record.num_examples})
        if record.train_loss is not None:
            metrics[keys.TRAIN_LOSS] = record.train_loss
        result.train_metrics_clientapp[record.round] = metrics
    if record.test_accuracy is not None and record.test_loss is not None:
        result.evaluate_metrics_serverapp[record.round] = MetricRecord(
            {"test-accuracy": record.test_accuracy, "test-loss": record.test_loss}
        )


def check_parts_given(
    parts: Sequence[Optional[Part]], factory: Optional[PartsFactory], num_clients: Optional[int]
) -> None:
    """Refuse a strategy given neither all of its parts (sampler, aggregator, initializer)
    nor a ``parts_factory``, given both, or given parts without ``num_clients``.
    """
    given = [p is not None for p in parts]
    if factory is None and not all(given):
        raise ValueError("FedFlex needs a sampler, an aggregator and an initializer (or a parts_factory)")
    if factory is not None and any(given):
        raise ValueError("FedFlex takes either parts or a parts_factory, not both")
    if factory is None and num_clients is None:
        raise ValueError("FedFlex with parts needs num_clients (the parts are sized for it)")


def run_failed(msg: str) -> RunFailedError:
    """Log ``msg`` as one ERROR line and return the :class:`RunFailedError` to raise."""
    log(ERROR, "%s", msg)
    return RunFailedError(msg)
