"""FedFlex: one Flower strategy assembled from a sampler, an aggregator, an initializer
and a local rule, for federations whose clients come and go.

A :class:`flwr.serverapp.strategy.Strategy`. :meth:`FedFlex.run_round` reads one round
top to bottom:

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

:meth:`FedFlex.run_rounds` is fedflex's loop: it hands each round's record (one line of
metrics.jsonl) to the caller's observers. :meth:`FedFlex.start` is Flower's
``Strategy.start`` with Flower's contract; its ``configure_train`` / ``aggregate_train``
run the same steps, and federated evaluation is Flower's FedAvg's.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from logging import ERROR, INFO, WARNING
from typing import Any, Callable, Iterable, Mapping, Optional, Protocol, Sequence, cast

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result

from fedflex import keys
from fedflex.arrays import numpy_to_record, record_to_numpy
from fedflex.churn import Availability, SessionTracker
from fedflex.records import record_key
from fedflex.strategies.diagnostics import e_lud
from fedflex.strategies.nodes import NodeDirectory, registration_order, simulated_node_count
from fedflex.strategies.parts import (
    Aggregator,
    ClientUpdate,
    Initializer,
    ModelInfo,
    Part,
    RoundContext,
    RoundFacts,
    Sampler,
    ServerRule,
)
from fedflex.strategies.privacy import SERVER_SIDE, calling_dp_wrapper, check_dp_wrapper
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
#: the train config key of the clients' learning rate in Flower's apps (fedflex's is ``client.lr``)
FLOWER_LR = "lr"


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


#: ``parts_factory(num_clients, num_rounds, initial arrays)`` -> (sampler, aggregator,
#: initializer, server rule): parts built once the federation's size is known
PartsFactory = Callable[
    [int, int, "OrderedDict[str, np.ndarray]"], tuple[Sampler, Aggregator, Initializer, Optional[ServerRule]]
]


class RoundObserver(Protocol):
    """What sees every finished round of :meth:`FedFlex.run_rounds` (results files,
    progress, trackers, checkpoints, stop rules).
    """

    def after_round(self, record: RoundRecord, arrays: ArrayRecord) -> bool:
        """See ``record`` and the global model after it; True ends the run after this
        round (ignored for an extra round of a part, ``record.phase`` != "train").
        """
        ...


class FedFlex(FedAvg):
    """A Flower strategy made of parts; :meth:`run_round` reads one round top to bottom.

    A :class:`flwr.serverapp.strategy.FedAvg` subclass: Flower's ``start`` (and
    ``configure_train`` / ``aggregate_train`` under Flower's own loop) runs the parts;
    ``configure_evaluate`` / ``aggregate_evaluate`` are Flower's federated evaluation.
    fedflex's own loop, with its round records, observers, stop rules and checkpoints,
    is :meth:`run_rounds`.

    Parameters
    ----------
    sampler, aggregator, initializer, server_rule
        The parts (see :mod:`strategies.parts`); ``server_rule`` is the server half of
        the local rule (None: the rule needs nothing from the server).
    num_clients
        N; client ids are 0..N-1. None (only with ``parts_factory``): the number of
        nodes connected when the run starts.
    clients_per_round
        K, the number the sampler is asked for. None: Flower's rule,
        ``max(int(online x fraction_train), min_train_nodes)``.
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, min_available_nodes
        As in Flower's :class:`~flwr.serverapp.strategy.FedAvg`: ``fraction_train`` and
        ``min_train_nodes`` size the round when ``clients_per_round`` is None;
        ``min_available_nodes`` is waited for before the first round under Flower's
        ``start`` (the run builds named strategies' parts for the nodes seen then).
    weighted_by_key, arrayrecord_key, configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn
        As in Flower's FedAvg: ``weighted_by_key`` names the reply metric that carries a client's example
        count (the weight of every aggregator that weighs by data size); the record keys
        name the model and the config in every message.
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
        of the round carries as ``client.lr`` (a schedule, ``ClientConfig.lr_at``), also
        logged as ``client_lr``. None: the train config's own ``client.lr`` (constant).
    lr
        The clients' constant learning rate, told to the parts in :attr:`facts` when there
        is no ``client_lr`` schedule (BHerd's and FedCM's server steps, HiCS-FL's
        per-step estimate read it). Under Flower's ``start`` the app's
        ``train_config["lr"]`` (what Flower's quickstart ClientApp trains with) wins; an
        ``lr`` given here that disagrees is warned about once. None: the app's, else the
        parts' own default.
    model
        The model's description (:class:`~strategies.parts.ModelInfo`) the parts may read.
    reply_limits
        What a training reply may carry (:class:`~strategies.replies.ReplyLimits`; the
        local rule's records and metrics are added from ``server_rule``). None: the
        defaults (no bound on ``num-examples`` beyond a finite integer >= 1).
    clip_norm
        Scale each client's update (reply - global model) down to this L2 norm before
        any part sees it (None: no clipping); clipped clients are logged as ``clipped``.
    parts_factory
        Builds the parts once N and the number of rounds are known (the named
        strategies of :mod:`strategies.named`); then the part arguments stay None.
    """

    def __init__(
        self,
        *,
        sampler: Optional[Sampler] = None,
        aggregator: Optional[Aggregator] = None,
        initializer: Optional[Initializer] = None,
        num_clients: Optional[int] = None,
        clients_per_round: Optional[int] = None,
        server_rule: Optional[ServerRule] = None,
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
        parts_factory: Optional[PartsFactory] = None,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_train_nodes: int = 2,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 2,
        weighted_by_key: str = keys.NUM_EXAMPLES,
        arrayrecord_key: str = keys.ARRAYS,
        configrecord_key: str = keys.CONFIG,
        train_metrics_aggr_fn: Optional[Callable[[list[RecordDict], str], MetricRecord]] = None,
        evaluate_metrics_aggr_fn: Optional[Callable[[list[RecordDict], str], MetricRecord]] = None,
    ) -> None:
        super().__init__(
            fraction_train=fraction_train,
            fraction_evaluate=fraction_evaluate,
            min_train_nodes=min_train_nodes,
            min_evaluate_nodes=min_evaluate_nodes,
            min_available_nodes=min_available_nodes,
            weighted_by_key=weighted_by_key,
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
            train_metrics_aggr_fn=train_metrics_aggr_fn,
            evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn,
        )
        given = [p is not None for p in (sampler, aggregator, initializer)]
        if parts_factory is None and not all(given):
            raise ValueError("FedFlex needs a sampler, an aggregator and an initializer (or a parts_factory)")
        if parts_factory is not None and any(given):
            raise ValueError("FedFlex takes either parts or a parts_factory, not both")
        if parts_factory is None and num_clients is None:
            raise ValueError("FedFlex with parts needs num_clients (the parts are sized for it)")
        self.num_clients = num_clients
        self.clients_per_round = clients_per_round
        self.min_clients = min_clients
        self.availability = availability
        self.tracker = tracker or SessionTracker()
        self.on_too_few = on_too_few
        self.local_rule = local_rule
        self.client_lr = client_lr
        self.lr = lr
        self._given_lr = lr  # the constructor's, before an app's train_config["lr"] replaces it
        self.model = model or ModelInfo()
        self.facts: Optional[RoundFacts] = None  # the round in progress, what the parts may read
        self.query_timeout = query_timeout
        self.identify = identify
        self.clip_norm = clip_norm
        self._base_limits = dataclasses.replace(
            reply_limits or ReplyLimits(), arrays_key=arrayrecord_key, weight_key=weighted_by_key
        )
        self.parts_factory = parts_factory
        self.global_arrays: "OrderedDict[str, np.ndarray]" = OrderedDict()
        self.record: Optional[RoundRecord] = None  # the round in progress, then the last one (parts, observers)
        self.sizes: dict[int, int] = {}
        self._record_cache: tuple[Any, Optional[ArrayRecord]] = (None, None)  # (global_arrays, its record)
        # set by start() / run_rounds(): what the extra rounds of parts need
        self._grid: Optional[Grid] = None
        self._timeout: float = 3600.0
        self._num_rounds: Optional[int] = None
        self._config: ConfigRecord = ConfigRecord()
        self._observers: Sequence[RoundObserver] = ()
        self._flower_round: Optional[RoundRecord] = None  # Flower's configure -> aggregate hand-off
        self._flower_sent: list[Message] = []
        self._dp_checked: Any = None  # the DP wrapper already checked (strategies.privacy)
        # under Flower's start: rounds that trained, and why the others did not
        self._trained_rounds = 0
        self._untrained: list[str] = []
        self.sampler: Sampler
        self.aggregator: Aggregator
        self.initializer: Initializer
        self.server_rule: Optional[ServerRule] = None
        if parts_factory is None:
            self._set_parts(num_clients, sampler, aggregator, initializer, server_rule)  # type: ignore[arg-type]

    def _set_parts(
        self,
        num_clients: int,
        sampler: Sampler,
        aggregator: Aggregator,
        initializer: Initializer,
        server_rule: Optional[ServerRule],
    ) -> None:
        self.num_clients = num_clients
        self.sampler, self.aggregator, self.initializer, self.server_rule = (
            sampler,
            aggregator,
            initializer,
            server_rule,
        )
        records, metrics = server_rule.reply_needs() if server_rule is not None else ((), ())
        self.reply_limits = dataclasses.replace(self._base_limits, records=records, metrics=metrics)
        self.nodes = NodeDirectory(num_clients, query_timeout=self._query_timeout(), identify=self.identify)
        for part in self.parts:
            part.bind(cast(RoundContext, self))  # num_clients is set by now
        # the server-side parts' state before any round: what an isolated extra round starts from
        self._pristine = [copy.deepcopy(p.state_dict()) for p in self._stateful_parts()]

    def _query_timeout(self) -> float:
        """Seconds a QUERY waits: ``query_timeout``, or the run's timeout."""
        return self.query_timeout if self.query_timeout is not None else self._timeout

    def _stateful_parts(self) -> list[Part]:
        """Return the parts an extra round's replies reach: sampler, aggregator, server rule."""
        return [p for p in (self.sampler, self.aggregator, self.server_rule) if p is not None]

    @property
    def ready(self) -> bool:
        """Whether the parts exist (built at once, or by ``parts_factory`` at the start)."""
        return hasattr(self, "sampler")

    def _prepare(self, grid: Grid, arrays: ArrayRecord) -> None:
        """Before a round under Flower's loop: wait for ``min_available_nodes`` (as Flower's
        FedAvg does) and, with a ``parts_factory``, build the parts for the nodes seen.
        """
        if self.ready:
            return
        have = self._wait_for_nodes(grid)
        n = self.num_clients or have
        rounds = self._num_rounds or 0
        assert self.parts_factory is not None  # not ready: the parts come from the factory
        sampler, aggregator, initializer, rule = self.parts_factory(n, rounds, record_to_numpy(arrays))
        self._set_parts(n, sampler, aggregator, initializer, rule)
        log(INFO, "%s: %d clients, parts %s", type(self).__name__, n, ", ".join(p.summary() for p in self.parts))

    def _wait_for_nodes(self, grid: Grid) -> int:
        """Wait (at most the run's timeout) for ``min_available_nodes`` nodes, as Flower's
        FedAvg does; in Flower's simulation also until it registered all of its nodes
        (one loop at start-up), so that N is the simulation's node count. Returns the
        number of nodes; fewer than ``min_available_nodes`` after the timeout raises.
        """
        need = max(self.min_available_nodes, 1)
        start = time.monotonic()
        have = len(list(grid.get_node_ids()))
        while have < need:
            waited = time.monotonic() - start
            if waited >= self._timeout:
                msg = (
                    f"{type(self).__name__}: only {have} of min_available_nodes={need} node(s) connected "
                    f"after {self._timeout:g} s (start(timeout=...))"
                )
                log(ERROR, "%s", msg)
                raise RunFailedError(msg)
            if int(waited) % 30 == 0:
                log(INFO, "waiting for %d node(s) to connect", need)
            time.sleep(min(1.0, max(self._timeout - waited, 0.0)))
            have = len(list(grid.get_node_ids()))
        if registration_order(grid) is not None and type(grid).__name__ == "InMemoryGrid":
            have = simulated_node_count(grid, 1 << 31, timeout=min(self._timeout, 30.0))
        return have

    def _per_round(self, num_online: int) -> int:
        """K: ``clients_per_round``, or Flower's ``max(int(n x fraction_train), min_train_nodes)``."""
        if self.clients_per_round is not None:
            return self.clients_per_round
        return max(int(num_online * self.fraction_train), self.min_train_nodes)

    @property
    def parts(self) -> list[Part]:
        """Return the strategy's parts: sampler, aggregator, initializer and server rule (if any)."""
        parts: list[Part] = [self.sampler, self.aggregator, self.initializer]
        return parts + ([self.server_rule] if self.server_rule is not None else [])

    # ------------------------------------------------------------------ summary
    def summary(self) -> None:
        """Log the parts and settings (then Flower's FedAvg options)."""
        if not self.ready:
            log(INFO, "\t├──> %s: parts built when the nodes are known", type(self).__name__)
            super().summary()
            return
        log(INFO, "\t├──> FedFlex parts:")
        k = self.clients_per_round if self.clients_per_round is not None else f"fraction {self.fraction_train}"
        log(INFO, "\t│\t├── sampler: %s (K=%s of N=%d)", self.sampler.summary(), k, self.num_clients)
        log(INFO, "\t│\t├── aggregator: %s", self.aggregator.summary())
        log(INFO, "\t│\t├── initializer: %s", self.initializer.summary())
        log(INFO, "\t│\t├── local rule: %s", self.local_rule)
        limits = self.reply_limits
        bound = f"<= {limits.cap}" if limits.cap is not None else ("<= partition size" if limits.sizes else "unbounded")
        clip = "off" if self.clip_norm is None else f"L2 norm <= {self.clip_norm}"
        log(INFO, "\t│\t└── replies: num-examples %s; update clipping %s", bound, clip)
        churn = type(self.availability).__name__ if self.availability else "live nodes"
        log(INFO, "\t├──> online set: %s; min clients %d (%s below)", churn, self.min_clients, self.on_too_few)
        super().summary()

    # ------------------------------------------------------------------ one round
    def run_round(
        self,
        server_round: int,
        grid: Grid,
        evaluate_fn: Optional[Callable[[RoundRecord, ArrayRecord], Optional[MetricRecord]]] = None,
    ) -> RoundRecord:
        """One round, top to bottom; returns its record (one line of metrics.jsonl)."""
        t0 = time.perf_counter()
        # 1. who is online; 2. a new session? (the initializer may replace the model)
        record = self._begin(server_round, grid)
        clock = _PhaseClock(record, t0)
        if not record.skipped:
            # 3. who trains (a sampler's probes included); 4. their messages
            online = np.asarray(record.online, dtype=np.int64)
            sampled = self.sampler.sample(server_round, online, self._per_round(len(online)))
            record.sampled = sampled.tolist()
            messages = self._train_messages(server_round, self._global_record(), sampled)
            self._log_lr(server_round, record)
            clock.lap("sample_s")
            # 5. local training
            replies = list(grid.send_and_receive(messages, timeout=self._timeout))
            clock.lap("train_s")
            # 6. check the replies, aggregate
            new = self._aggregate(server_round, replies, record, _destinations(messages))
            if new is not None:
                self.global_arrays = new
        # 7. the initializer sees the round's model; 8. evaluate it
        self.initializer.on_round_end(server_round, record.session, self.global_arrays)
        clock.lap("aggregate_s")
        if evaluate_fn is not None:
            res: Optional[Mapping[str, Any]] = evaluate_fn(record, self._global_record())
            if res is not None:
                record.test_accuracy = float(res["test-accuracy"])
                record.test_loss = float(res["test-loss"])
                if "online-accuracy" in res:
                    record.extra["online_accuracy"] = float(res["online-accuracy"])
        clock.lap("evaluate_s")
        record.wall_s = time.perf_counter() - t0
        return record

    def _begin(self, server_round: int, grid: Grid) -> RoundRecord:
        """Run steps 1-2: the online set, the session counter, the initializer's model at a
        session start; the round is ``skipped`` with fewer than ``min_clients`` online.
        """
        record = self.record = RoundRecord(round=server_round)
        online = self.online_clients(server_round, grid)
        record.online = online.tolist()
        scripted = self.availability is not None and self.availability.starts_session(server_round)
        record.session, record.session_started = self.tracker.update(server_round, online.tolist(), force=scripted)
        # the round's facts, declared to the parts (the initializer's extra rounds included)
        lr = self._round_lr(server_round)
        self.facts = RoundFacts(
            round=server_round, online=online, lr=self.lr if lr is None else lr, num_rounds=self._num_rounds
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

    def _global_record(self) -> ArrayRecord:
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

    def train_round(
        self,
        server_round: int,
        arrays: "OrderedDict[str, np.ndarray]",
        clients: np.ndarray,
        phase: str,
        isolated: bool = False,
    ) -> Optional["OrderedDict[str, np.ndarray]"]:
        """Run a real round outside the scenario's count (e.g. session-aware gradient rounds).
        ``isolated``: the sampler, aggregator and server rule see the round from the state
        they had before round 1 (no server momentum, no estimates), and get their own
        state back afterwards.
        """
        if self._grid is None:
            raise RuntimeError("train_round is only available while the strategy runs")
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
        saved = self.global_arrays
        self.global_arrays = arrays
        messages = self._train_messages(server_round, numpy_to_record(arrays), clients)
        self._log_lr(server_round, record)
        replies = list(self._grid.send_and_receive(messages, timeout=self._timeout))
        new = self._aggregate(server_round, replies, record, _destinations(messages))
        self.global_arrays = saved
        record.wall_s = time.perf_counter() - t0
        for observer in self._observers:  # an extra round is seen, it cannot stop the run
            observer.after_round(record, self._global_record())
        return new

    def query(
        self, server_round: int, clients: np.ndarray, arrays: "OrderedDict[str, np.ndarray]"
    ) -> dict[int, dict[str, Any]]:
        """Ask ``clients`` for their loss of ``arrays`` (a query message each); return their replies by client."""
        if self._grid is None:
            raise RuntimeError("query is only available while the strategy runs")
        config = ConfigRecord({keys.SERVER_ROUND: server_round, keys.WANT_LOSS: True})
        if keys.TASK in self._config:  # fedflex's task spec (a Flower app's config has none)
            config[keys.TASK] = self._config[keys.TASK]
        content = RecordDict({self.arrayrecord_key: numpy_to_record(arrays), self.configrecord_key: config})
        # fedflex's ClientApp answers a loss QUERY; any other ClientApp evaluates (Flower's convention)
        messages = [
            Message(
                content=content,
                dst_node_id=node,
                message_type=MessageType.QUERY if self.nodes.answers_queries(node) else MessageType.EVALUATE,
                ttl=self._timeout,
            )
            for node in self.nodes.nodes_of(clients)
        ]
        out: dict[int, dict[str, Any]] = {}
        for reply in self._grid.send_and_receive(messages, timeout=self._timeout):
            client = self.nodes.client_of(reply.metadata.src_node_id)
            if client is None or reply.has_error() or keys.METRICS not in reply.content.metric_records:
                continue
            metrics: dict[str, Any] = dict(reply.content[keys.METRICS])
            if keys.EVAL_LOSS not in metrics and FLOWER_EVAL_LOSS in metrics:  # Flower's quickstart spelling
                metrics[keys.EVAL_LOSS] = metrics[FLOWER_EVAL_LOSS]
            metrics[keys.NUM_EXAMPLES] = metrics.get(self.weighted_by_key)
            problem = num_examples_problem(metrics.get(keys.NUM_EXAMPLES), self.reply_limits.bound(client))
            if problem:
                log(WARNING, "round %d: query reply of client %d rejected: %s", server_round, client, problem)
                continue
            out[client] = metrics
        return out

    def probe(
        self, server_round: int, clients: np.ndarray, arrays: "OrderedDict[str, np.ndarray]", steps: int = 0
    ) -> list[ClientUpdate]:
        """Train ``clients`` from ``arrays`` for ``steps`` steps (0: a round's worth), outside the round count."""
        if self._grid is None:
            raise RuntimeError("probe is only available while the strategy runs")
        # the scenario's training settings, but plain SGD and none of the parts' payloads:
        # a probe must not move client state (SCAFFOLD's variates) or server state
        config = ConfigRecord({**self._config, **ServerRule().train_config(server_round)})  # sgd's options
        config[keys.SERVER_ROUND] = server_round
        self._put_round_lr(config, server_round)
        if steps > 0:
            config[record_key(keys.CLIENT, "steps")] = int(steps)
        content = RecordDict({self.arrayrecord_key: numpy_to_record(arrays), self.configrecord_key: config})
        messages = [
            Message(content=content, dst_node_id=node, message_type=MessageType.TRAIN, ttl=self._timeout)
            for node in self.nodes.nodes_of(clients)
        ]
        out: list[ClientUpdate] = []
        for reply in self._grid.send_and_receive(messages, timeout=self._timeout):
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

    # ------------------------------------------------------------------ online set
    def online_clients(self, server_round: int, grid: Grid) -> np.ndarray:
        """Client ids online in ``server_round``: schedule (if any) cut to live nodes."""
        self.nodes.refresh(grid)
        live = self.nodes.clients()
        if self.availability is None:
            return live
        return np.intersect1d(self.availability.online(server_round), live).astype(np.int64)

    # ------------------------------------------------------------------ messages and replies
    def _round_lr(self, server_round: int) -> Optional[float]:
        """Return the scheduled client learning rate of ``server_round`` (None: no schedule; the
        train config's ``client.lr`` stands). The session clock reads the tracker, which
        has seen this round by the time its messages are built.
        """
        if self.client_lr is None:
            return None
        return float(self.client_lr(server_round, max(self.tracker.session_start_round, 1)))

    def _put_round_lr(self, config: ConfigRecord, server_round: int) -> None:
        """Replace the train config's ``client.lr`` with a scheduled lr (no schedule: nothing)."""
        lr = self._round_lr(server_round)
        if lr is not None:
            config[record_key(keys.CLIENT, "lr")] = lr

    def _log_lr(self, server_round: int, record: RoundRecord) -> None:
        lr = self._round_lr(server_round)
        if lr is not None:
            record.extra["client_lr"] = lr

    def _train_messages(self, server_round: int, arrays: ArrayRecord, clients: np.ndarray) -> list[Message]:
        """One train message per client, all sharing one content: the model, the parts'
        payloads and config entries, the scenario's train config and the round.
        """
        content = RecordDict({self.arrayrecord_key: arrays})
        config = ConfigRecord(dict(self._config))
        for part in self.parts:
            for name, payload in part.train_payload(server_round).items():
                content[name] = numpy_to_record(payload)
            for key, value in part.train_config(server_round).items():
                config[key] = value
        config[keys.SERVER_ROUND] = server_round
        self._put_round_lr(config, server_round)
        content[self.configrecord_key] = config
        return [
            # ttl: a node never picks up a message whose round has given up on it
            Message(content=content, dst_node_id=node, message_type=MessageType.TRAIN, ttl=self._timeout)
            for node in self.nodes.nodes_of(clients)
        ]

    def _aggregate(
        self,
        server_round: int,
        replies: Iterable[Message],
        record: RoundRecord,
        dst_of: dict[str, int],
        accepted: Optional[list[RecordDict]] = None,
    ) -> Optional["OrderedDict[str, np.ndarray]"]:
        """Validate replies, let the parts observe them, aggregate; fill ``record``.
        ``dst_of``: message id -> node id of the messages sent (error replies made by the
        SuperLink come from node 1, not from the node that failed); ``accepted``, when
        given, receives the content of every reply that passed the checks.
        """
        updates: list[ClientUpdate] = []
        replies = list(replies)
        contents: dict[int, RecordDict] = {}  # id(update) -> its reply's content (``accepted``)
        # the rule records' arrays: pinned from the first round that has some (strategies/replies.py)
        usable = [r.content for r in replies if not r.has_error()]
        self.reply_limits = pin_record_arrays(self.reply_limits, usable, self.global_arrays)
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
            update, reason = check_reply(reply.content, self.global_arrays, self.reply_limits, client)
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
        lr = self._round_lr(server_round)
        bounds = round_problems(updates, self.global_arrays, self.reply_limits, self.local_rule, sent, lr or self.lr)
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
            record.extra["clipped"] = self._clip(updates, sent)
        if self.server_rule is not None:
            self.server_rule.observe(server_round, updates, self.global_arrays)
        new = self.aggregator.aggregate(server_round, self.global_arrays, updates)
        self.sampler.observe(server_round, updates, self.global_arrays)
        n = sum(u.num_examples for u in updates)
        losses = [(u.num_examples, u.metrics.get(keys.TRAIN_LOSS)) for u in updates]
        known = [(w, float(v)) for w, v in losses if isinstance(v, (int, float)) and np.isfinite(v)]
        record.num_examples = n
        if known:
            record.train_loss = sum(w * v for w, v in known) / sum(w for w, _ in known)
        for part in self.parts:
            record.extra.update(part.round_metrics())
        record.extra["e_lud"] = e_lud(self.global_arrays, [u.arrays for u in updates])  # every aggregator
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
        self, updates: list[ClientUpdate], sent: Optional[Mapping[str, Mapping[str, np.ndarray]]] = None
    ) -> list[int]:
        """Clip every update to ``clip_norm`` (in place), and the rule records made from it
        (``sent``: the server's records of the round, SCAFFOLD's ``scaffold-c``); the
        clients that were clipped.
        """
        assert self.clip_norm is not None  # called only with clipping on
        clipped = []
        for u in updates:
            u.arrays, norm = clip_update(u.arrays, self.global_arrays, self.clip_norm)
            if norm > self.clip_norm:
                clipped.append(u.client)
                clip_records(u, self.clip_norm / norm, sent or {})
        return clipped

    # ------------------------------------------------------------------ Flower's Strategy API
    # Flower's ``Strategy.start`` loop calls these; fedflex's own loop is :meth:`run_rounds`.
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Run steps 1-4 of :meth:`run_round`: the online set, a session's model, the sampled
        clients' train messages (the model, the parts' payloads, ``config`` and the
        round's ``server-round``).
        """
        wrapper = calling_dp_wrapper(self)
        self._take_app_lr(config)  # before the parts are built: they may read it
        self._prepare(grid, arrays)
        if self.fraction_train == 0.0:
            return []
        if arrays is not self._global_record():
            self.global_arrays = record_to_numpy(arrays)
            last = self.record
            if last is not None and last.round == server_round - 1 and not last.skipped:
                # the model Flower released (e.g. with a DP wrapper's noise) is the round's
                # model: a session's stored last model must be the one the clients saw
                self.initializer.on_round_end(last.round, last.session, self.global_arrays)
        self._grid, self._config = grid, ConfigRecord(dict(config))
        record = self._flower_round = self._begin(server_round, grid)
        self._flower_sent = []
        if record.skipped:
            return []
        online = np.asarray(record.online, dtype=np.int64)
        sampled = self.sampler.sample(server_round, online, self._per_round(len(online)))
        record.sampled = sampled.tolist()
        self._log_lr(server_round, record)
        log(INFO, "configure_train: sampled %d clients (out of %d online)", len(sampled), len(online))
        self._flower_sent = self._train_messages(server_round, self._global_record(), sampled)
        if wrapper is not None:
            self._under_dp(wrapper)
        return self._flower_sent

    def _under_dp(self, wrapper: Any) -> None:
        """Inside one of Flower's DP wrappers: refuse what it breaks, warn (once) what
        its noise does not cover (:mod:`strategies.privacy`); a server-side wrapper
        clips each reply against the model this round's messages carry (SessionAware
        may have replaced the one the wrapper was given).
        """
        if self._dp_checked is not wrapper:
            check_dp_wrapper(self, wrapper, self._flower_sent)
            self._dp_checked = wrapper
        if isinstance(wrapper, SERVER_SIDE) and self._flower_sent:
            wrapper.current_arrays = self._global_record()

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[Optional[ArrayRecord], Optional[MetricRecord]]:
        """Run steps 6-7 of :meth:`run_round`: the replies checked, observed, aggregated;
        the metrics of the accepted replies aggregated by ``train_metrics_aggr_fn``
        (Flower's weighted average by default).
        """
        record = self._flower_round if self._flower_round is not None else RoundRecord(round=server_round)
        accepted: list[RecordDict] = []
        replies = list(replies)
        new = self._aggregate(server_round, replies, record, _destinations(self._flower_sent), accepted)
        if new is not None:
            self.global_arrays = new
            self._trained_rounds += 1
        else:
            self._untrained.append(self._why_untrained(server_round, record, len(replies)))
        self.initializer.on_round_end(server_round, record.session, self.global_arrays)
        self._flower_round, self._flower_sent = None, []
        self.record = record
        if new is None:
            return None, None
        metrics = self.train_metrics_aggr_fn(accepted, self.weighted_by_key) if accepted else None
        return self._global_record(), metrics

    def _why_untrained(self, server_round: int, record: RoundRecord, num_replies: int) -> str:
        """One line: why ``server_round`` trained nothing under Flower's loop."""
        if record.skipped:
            online = len(record.online)
            return f"round {server_round}: {online} client(s) online, fewer than min_clients={self.min_clients}"
        sent = len(self._flower_sent)
        if sent == 0:
            return f"round {server_round}: no client was sampled"
        if num_replies == 0:
            timeout = self._timeout
            return f"round {server_round}: none of the {sent} sampled node(s) replied within timeout={timeout:g} s"
        if record.rejected:
            client, reason = record.rejected[0]
            return f"round {server_round}: every reply was rejected (client {client}: {reason})"
        failures = record.extra.get("node_failures") or [{}]
        return f"round {server_round}: every node failed ({failures[0].get('error', 'no usable reply')})"

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Federated evaluation as Flower's FedAvg (``fraction_evaluate``,
        ``min_evaluate_nodes``), among the online clients when a churn schedule is set.
        """
        messages = list(super().configure_evaluate(server_round, arrays, config, grid))
        if self.availability is None or not self.ready:
            return messages
        online = set(self.nodes.nodes_of(self.online_clients(server_round, grid)))
        return [m for m in messages if m.metadata.dst_node_id in online]

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

    # ------------------------------------------------------------------ loops
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: Optional[ConfigRecord] = None,
        evaluate_config: Optional[ConfigRecord] = None,
        evaluate_fn: Optional[Callable[[int, ArrayRecord], Optional[MetricRecord]]] = None,
    ) -> Result:
        """Flower's ``Strategy.start``, unchanged: ``num_rounds`` rounds of
        ``configure_train`` -> ``aggregate_train`` -> ``configure_evaluate`` ->
        ``aggregate_evaluate`` -> ``evaluate_fn(server_round, arrays)`` (also before
        round 1, with round 0); returns Flower's :class:`~flwr.serverapp.strategy.Result`.

        Before the loop it records the timeout (every wait of the run honours it: the
        nodes' first connection, the parts' extra rounds such as Power-of-Choice's loss
        probes), the round count (HiCS-FL's schedule) and the clients' learning rate
        (``train_config["lr"]``, see ``lr``). A run in which no round trained (``fraction_train``
        > 0) logs one ERROR line naming the cause and raises :class:`RunFailedError`: it
        never returns the untrained model as a result.
        """
        self._timeout, self._num_rounds = timeout, num_rounds
        self._trained_rounds, self._untrained = 0, []
        if self.ready:
            self.nodes.query_timeout = self._query_timeout()
        try:
            result = super().start(
                grid,
                initial_arrays,
                num_rounds=num_rounds,
                timeout=timeout,
                train_config=train_config,
                evaluate_config=evaluate_config,
                evaluate_fn=evaluate_fn,
            )
        finally:
            self._grid = None
        if num_rounds > 0 and self.fraction_train > 0 and self._trained_rounds == 0:
            causes = "; ".join(self._untrained[:3]) + ("; ..." if len(self._untrained) > 3 else "")
            msg = f"{type(self).__name__}: no round trained in {num_rounds} round(s), the model is untrained: {causes}"
            log(ERROR, "%s", msg)
            raise RunFailedError(msg)
        return result

    def _take_app_lr(self, train_config: Optional[ConfigRecord]) -> None:
        """Take the app's ``train_config["lr"]`` (Flower's convention, read in every
        ``configure_train``, so also under a DP wrapper's loop) as the clients' learning
        rate; warn once when the ``lr`` given to the strategy disagrees.
        """
        app_lr = train_config.get(FLOWER_LR) if train_config is not None else None
        if isinstance(app_lr, bool) or not isinstance(app_lr, (int, float)) or not app_lr > 0:
            self.lr = self._given_lr
            return
        given = self._given_lr
        if given is not None and not np.isclose(given, float(app_lr)) and self.lr != float(app_lr):
            log(
                WARNING,
                "%s: lr=%g was given, but the app's train_config sends lr=%g, which the clients train "
                "with: the server step uses %g",
                type(self).__name__,
                given,
                float(app_lr),
                float(app_lr),
            )
        self.lr = float(app_lr)

    def run_rounds(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: Optional[ConfigRecord] = None,
        evaluate_fn: Optional[Callable[[RoundRecord, ArrayRecord], Optional[MetricRecord]]] = None,
        observers: Sequence[RoundObserver] = (),
        first_round: int = 1,
    ) -> Result:
        """Run rounds ``first_round..num_rounds`` (:meth:`run_round`); after each, every
        observer's ``after_round(record, arrays)`` is called in order (also for the
        records of extra rounds that parts run, ``phase`` != "train"); a training round
        for which one returns True is the last.

        ``evaluate_fn(record, arrays)`` returns a MetricRecord with ``test-accuracy`` /
        ``test-loss`` (and optionally ``online-accuracy``) or None when the round is not
        evaluated.
        """
        log(INFO, "Starting FedFlex strategy:")
        self._num_rounds = num_rounds
        self._prepare(grid, initial_arrays)
        self.summary()
        self._grid, self._timeout, self._observers = grid, timeout, tuple(observers)
        self._config = train_config if train_config is not None else ConfigRecord()
        if initial_arrays is not self._global_record():
            self.global_arrays = record_to_numpy(initial_arrays)
        result = Result()
        for server_round in range(first_round, num_rounds + 1):
            record = self.run_round(server_round, grid, evaluate_fn)
            if record.num_examples:
                metrics = MetricRecord({keys.NUM_EXAMPLES: record.num_examples})
                if record.train_loss is not None:
                    metrics[keys.TRAIN_LOSS] = record.train_loss
                result.train_metrics_clientapp[server_round] = metrics
            if record.test_accuracy is not None:
                result.evaluate_metrics_serverapp[server_round] = MetricRecord(
                    {"test-accuracy": record.test_accuracy, "test-loss": cast(float, record.test_loss)}
                )
            arrays = self._global_record()
            stop = [observer.after_round(record, arrays) for observer in self._observers]  # each one sees it
            if any(stop):
                break
        result.arrays = self._global_record()
        self._grid, self._observers = None, ()
        return result


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


def _destinations(messages: list[Message]) -> dict[str, int]:
    """Message id -> destination node id (ids are set once the grid has sent them)."""
    return {m.metadata.message_id: m.metadata.dst_node_id for m in messages}
