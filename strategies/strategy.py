"""FedFlex: one Flower strategy assembled from a sampler, an aggregator, an initializer
and a local rule, for federations whose clients come and go.

A :class:`flwr.serverapp.strategy.Strategy` (Flower's FedAvg, as its base), and the
Flower adapter over the round engine: :class:`strategies.engine.RoundEngine` holds the
parts, the federation and the global model and runs one numbered round top to bottom
(:meth:`FedFlex.run_round` is the engine's). :meth:`FedFlex.run_rounds` is fedflex's
loop: it hands each round's record (one line of metrics.jsonl) to the caller's
observers. :meth:`FedFlex.start` is Flower's ``Strategy.start`` with Flower's contract;
its ``configure_train`` / ``aggregate_train`` run the engine's steps, and federated
evaluation is Flower's FedAvg's.
"""

from __future__ import annotations

from logging import INFO
from typing import Any, Callable, Iterable, Optional, Sequence, cast

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result

from fedflex import keys
from fedflex.arrays import record_to_numpy
from fedflex.churn import Availability, SessionTracker
from fedflex.strategies.engine import (
    EvaluateFn,
    PartsFactory,
    RecordKeys,
    RoundEngine,
    RoundObserver,
    RoundRecord,
    RunFailedError,
    RunState,
    TooFewClientsError,
    add_to_result,
    check_parts_given,
    destinations,
    run_failed,
)
from fedflex.strategies.nodes import wait_for_nodes
from fedflex.strategies.parts import Aggregator, Initializer, ModelInfo, Sampler, ServerRule
from fedflex.strategies.privacy import find_dp_wrapper, under_dp
from fedflex.strategies.replies import ReplyLimits

__all__ = ["FedFlex", "PartsFactory", "RoundObserver", "RoundRecord", "RunFailedError", "TooFewClientsError"]

#: the train config key of the clients' learning rate in Flower's apps (fedflex's is ``client.lr``)
FLOWER_LR = "lr"


class _Engine:
    """A strategy attribute that is its engine's (read and written through)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, strategy: Optional["FedFlex"], owner: Optional[type] = None) -> Any:
        return self if strategy is None else getattr(strategy.engine, self.name)

    def __set__(self, strategy: "FedFlex", value: Any) -> None:
        setattr(strategy.engine, self.name, value)

    @classmethod
    def many(cls, n: int) -> tuple["_Engine", ...]:
        """``n`` of them, one per name (each learns its name from the class)."""
        return tuple(cls() for _ in range(n))


class FedFlex(FedAvg):
    """A Flower strategy made of parts, run by a round engine (:class:`~strategies.engine.RoundEngine`).

    A :class:`flwr.serverapp.strategy.FedAvg` subclass: Flower's ``start`` (its
    ``configure_train`` / ``aggregate_train``) runs the parts; federated evaluation is
    Flower's. fedflex's loop (round records, observers, stop rules, checkpoints) is :meth:`run_rounds`.

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
    lr
        The clients' constant learning rate, told to the parts in :attr:`facts` when there
        is no ``client_lr`` schedule (BHerd's and FedCM's server steps, HiCS-FL's
        per-step estimate read it). Under Flower's ``start`` the app's
        ``train_config["lr"]`` (what Flower's quickstart ClientApp trains with) wins; an
        ``lr`` given here that disagrees is warned about once. None: the app's, else the
        parts' own default.
    parts_factory
        Builds the parts once N and the number of rounds are known (the named
        strategies of :mod:`strategies.named`); then the part arguments stay None.
    min_clients, availability, tracker, on_too_few, identify, query_timeout, client_lr, model, reply_limits, clip_norm
        The round engine's (:class:`~strategies.engine.RoundEngine`, where each is described).
    """

    # the engine's state and steps, under the names Flower users and fedflex's launchers read
    global_arrays, sampler, aggregator, initializer, server_rule, parts = _Engine.many(6)
    ready, num_clients, nodes, tracker, availability, sizes = _Engine.many(6)
    facts, model, lr, client_lr, min_clients, on_too_few = _Engine.many(6)
    local_rule, clip_norm, reply_limits, query_timeout, identify, run_round = _Engine.many(6)
    train_round, query, probe, data_sizes, online_clients, state_dict, load_state_dict = _Engine.many(7)

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
        check_parts_given((sampler, aggregator, initializer), parts_factory, num_clients)
        self.engine = RoundEngine(
            per_round=self._per_round,
            min_clients=min_clients,
            availability=availability,
            tracker=tracker,
            on_too_few=on_too_few,
            local_rule=local_rule,
            query_timeout=query_timeout,
            client_lr=client_lr,
            lr=lr,
            model=model,
            reply_limits=reply_limits,
            clip_norm=clip_norm,
            identify=identify,
            record_keys=RecordKeys(arrays=arrayrecord_key, config=configrecord_key, weight=weighted_by_key),
        )
        self.clients_per_round = clients_per_round
        self.parts_factory = parts_factory
        self._num_clients = num_clients  # None: the nodes connected at the start
        self._given_lr = lr  # the constructor's, before an app's train_config["lr"] replaces it
        #: the last finished round's record (for inspection; fedflex's loop hands records to observers)
        self.record: Optional[RoundRecord] = None
        self._flower_round: Optional[RoundRecord] = None  # Flower's configure -> aggregate hand-off
        self._flower_sent: list[Message] = []
        #: the Flower (DP) wrapper this strategy runs inside: tell it, or it is looked for (strategies.privacy)
        self.wrapper: Optional[Any] = None
        self._found, self._looked, self._own_loop = cast(Any, None), False, False  # at round 1 outside start
        self._dp_checked: Any = None  # the DP wrapper already checked (strategies.privacy)
        self._trained_rounds, self._untrained = 0, cast(list[str], [])  # under start: why rounds did not train
        if parts_factory is None:
            self.engine.set_parts(num_clients, sampler, aggregator, initializer, server_rule)  # type: ignore[arg-type]

    def _prepare(self, grid: Grid, arrays: ArrayRecord) -> None:
        """Before a round under Flower's loop: wait for ``min_available_nodes`` (as Flower's
        FedAvg does) and, with a ``parts_factory``, build the parts for the nodes seen.
        """
        if self.ready:
            return
        need, timeout = max(self.min_available_nodes, 1), self.engine.run.timeout
        have = wait_for_nodes(grid, need, timeout)
        if have < need:
            raise run_failed(
                f"{type(self).__name__}: only {have} of min_available_nodes={need} node(s) connected "
                f"after {timeout:g} s (start(timeout=...))"
            )
        n = self._num_clients or have
        assert self.parts_factory is not None  # not ready: the parts come from the factory
        parts = self.parts_factory(n, self.engine.run.num_rounds or 0, record_to_numpy(arrays))
        self.engine.set_parts(n, *parts)
        log(INFO, "%s: %d clients, parts %s", type(self).__name__, n, ", ".join(p.summary() for p in self.parts))

    def _per_round(self, num_online: int) -> int:
        """K: ``clients_per_round``, or Flower's ``max(int(n x fraction_train), min_train_nodes)``."""
        if self.clients_per_round is not None:
            return self.clients_per_round
        return max(int(num_online * self.fraction_train), self.min_train_nodes)

    def summary(self) -> None:
        """Log the parts and settings (then Flower's FedAvg options)."""
        if not self.ready:
            log(INFO, "\t├──> %s: parts built when the nodes are known", type(self).__name__)
        else:
            k = self.clients_per_round if self.clients_per_round is not None else f"fraction {self.fraction_train}"
            for line in self.engine.summary_lines(k):
                log(INFO, "%s", line)
        super().summary()

    # ------------------------------------------------------------------ Flower's Strategy API
    # Flower's ``Strategy.start`` loop calls these; fedflex's own loop is :meth:`run_rounds`.
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Run steps 1-4 of :meth:`run_round`: the online set, a session's model, the sampled
        clients' train messages (the model, the parts' payloads, ``config``, the round).
        """
        if self.wrapper is None and not self._own_loop and (server_round == 1 or not self._looked):
            self._found, self._looked = find_dp_wrapper(self), True
        wrapper = self.wrapper if self.wrapper is not None else (None if self._own_loop else self._found)
        # the app's lr (read in every configure_train: also under a DP wrapper's loop), before the parts are built
        app_lr = config.get(FLOWER_LR) if config is not None else None
        self.engine.take_app_lr(app_lr, self._given_lr, type(self).__name__)
        self._prepare(grid, arrays)
        if self.fraction_train == 0.0:
            return []
        self.engine.take_model(arrays, server_round, self.record)
        self.engine.run.grid, self.engine.run.config = grid, ConfigRecord(dict(config))
        record = self._flower_round = self.engine.begin(server_round, grid)
        self._flower_sent = []
        if record.skipped:
            return []
        sampled = self.engine.sample(server_round, record)
        log(INFO, "configure_train: sampled %d clients (out of %d online)", len(sampled), len(record.online))
        self._flower_sent = self.engine.train_messages(server_round, self.engine.global_record(), sampled)
        if wrapper is not None:
            self._dp_checked = under_dp(self, wrapper, self._flower_sent, self._dp_checked)
        return self._flower_sent

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[Optional[ArrayRecord], Optional[MetricRecord]]:
        """Run steps 6-7 of :meth:`run_round`: the replies checked, observed, aggregated; the
        accepted replies' metrics by ``train_metrics_aggr_fn`` (Flower's weighted average).
        """
        record = self._flower_round if self._flower_round is not None else RoundRecord(round=server_round)
        accepted: list[RecordDict] = []
        replies = list(replies)
        dst_of = destinations(self._flower_sent)
        new = self.engine.aggregate(server_round, self.global_arrays, replies, record, dst_of, accepted)
        if new is not None:
            self.global_arrays = new
            self._trained_rounds += 1
        else:
            why = self.engine.why_untrained(record, len(self._flower_sent), len(replies))
            self._untrained.append(why)
        self.initializer.on_round_end(server_round, record.session, self.global_arrays)
        self._flower_round, self._flower_sent = None, []
        self.record = record
        if new is None:
            return None, None
        metrics = self.train_metrics_aggr_fn(accepted, self.weighted_by_key) if accepted else None
        return self.engine.global_record(), metrics

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Federated evaluation as Flower's FedAvg, among the online clients under churn."""
        messages = list(super().configure_evaluate(server_round, arrays, config, grid))
        if self.availability is None or not self.ready:
            return messages
        online = set(self.nodes.nodes_of(self.online_clients(server_round, grid)))
        return [m for m in messages if m.metadata.dst_node_id in online]

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
        """Flower's ``Strategy.start``, unchanged (``configure_train`` -> ``aggregate_train`` ->
        ``configure_evaluate`` -> ``aggregate_evaluate`` -> ``evaluate_fn`` a round), after
        telling the engine the timeout (every wait honours it: the nodes' first connection,
        the parts' extra rounds) and the round count. A run in which no round trained
        (``fraction_train`` > 0) logs one ERROR line naming the cause and raises
        :class:`RunFailedError`: it never returns the untrained model as a result.
        """
        self.engine.start_run(RunState(grid=None, timeout=timeout, num_rounds=num_rounds))
        self._trained_rounds, self._untrained, self._own_loop = 0, [], True
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
            self.engine.run.grid, self._own_loop = None, False
        if num_rounds > 0 and self.fraction_train > 0 and self._trained_rounds == 0:
            causes = "; ".join(self._untrained[:3]) + ("; ..." if len(self._untrained) > 3 else "")
            name = type(self).__name__
            raise run_failed(f"{name}: no round trained in {num_rounds} round(s), the model is untrained: {causes}")
        return result

    def run_rounds(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: Optional[ConfigRecord] = None,
        evaluate_fn: Optional[EvaluateFn] = None,
        observers: Sequence[RoundObserver] = (),
        first_round: int = 1,
    ) -> Result:
        """Run rounds ``first_round..num_rounds`` (:meth:`run_round`, with ``evaluate_fn``:
        :data:`~strategies.engine.EvaluateFn`); after each, every observer's
        ``after_round(record, arrays)`` is called in order (also for the records of the
        parts' extra rounds, ``phase`` != "train"); a round for which one returns True is the last.
        """
        log(INFO, "Starting FedFlex strategy:")
        self.engine.run.num_rounds = num_rounds
        self._prepare(grid, initial_arrays)
        self.summary()
        config = train_config if train_config is not None else ConfigRecord()
        self.engine.start_run(RunState(grid, timeout, num_rounds, config, tuple(observers)))
        if initial_arrays is not self.engine.global_record():
            self.global_arrays = record_to_numpy(initial_arrays)
        result = Result()
        for server_round in range(first_round, num_rounds + 1):
            record = self.record = self.run_round(server_round, grid, evaluate_fn)
            add_to_result(result, record)
            arrays = self.engine.global_record()
            stop = [observer.after_round(record, arrays) for observer in self.engine.run.observers]  # each sees it
            if any(stop):
                break
        result.arrays = self.engine.global_record()
        self.engine.run.grid, self.engine.run.observers = None, ()
        return result
