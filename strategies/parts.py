"""The four orthogonal parts of a fedflex strategy, and what they exchange.

A round touches four moments, each owned by one part:

- :class:`Sampler` -- who trains this round (among the online clients);
- :class:`Aggregator` -- how the replies become the next global model;
- :class:`Initializer` -- where a session starts after the online set changed;
- the local rule -- what a client sends (configured in the train message, run by the
  ClientApp; the server side only names it).

Parts work on plain numpy dicts (name -> array) and client ids (the partition ids
0..N-1), never on Flower messages, so each is testable without Flower.
"""

from __future__ import annotations

import zlib
from abc import ABC, abstractmethod
from collections import OrderedDict
from dataclasses import dataclass, field
from logging import WARNING
from typing import Any, ClassVar, Optional, Protocol, TypeAlias

import numpy as np
from flwr.common import log

from fedflex import keys
from fedflex.config import AggregatorConfig, InitializerConfig, LocalRuleConfig
from fedflex.options import MethodOptions
from fedflex.records import to_record

Arrays: TypeAlias = "OrderedDict[str, np.ndarray]"


@dataclass
class ClientUpdate:
    """One validated training reply: the client's model (``arrays``), its metrics, and any
    further array records its local rule sent (``extras``, e.g. SCAFFOLD's control delta).
    """

    client: int
    num_examples: int
    arrays: "OrderedDict[str, np.ndarray]"
    metrics: dict[str, Any] = field(default_factory=dict)
    extras: "dict[str, OrderedDict[str, np.ndarray]]" = field(default_factory=dict)


@dataclass(frozen=True)
class ModelInfo:
    """What parts may need to know about the model (the server builds it)."""

    output_bias_key: Optional[str] = None  # state-dict key of the classification layer's bias
    num_classes: int = 0
    input_shape: tuple[int, ...] = ()


@dataclass(frozen=True)
class RoundFacts:
    """The facts of the round in progress that a part may read (:attr:`RoundContext.facts`):
    its number, the clients online in it (sorted ids) and the learning rate the clients
    train with in it (the scheduled one under ``client.lr_schedule``; None when the
    strategy was not told), and the run's last round (None when the loop does not say).
    """

    round: int
    online: np.ndarray
    lr: Optional[float] = None
    num_rounds: Optional[int] = None


#: the seed offsets of the parts that are no registry's class (their generators keep the
#: first release's streams)
PART_SEED_OFFSETS = {"session-aware": 3, "explore-first": 14}


@dataclass(frozen=True)
class Federation:
    """What a part is built for, from a scenario or from a named strategy's arguments
    when its run starts (:meth:`Sampler.build`).

    Parameters
    ----------
    num_clients
        N, the client ids 0..N-1 the per-client state is sized for.
    rounds
        The run's round count (HiCS-FL's annealing).
    clients_per_round
        K, the clients sampled per round (Power-of-Choice's warning, SessionAware's pilot).
    seed
        The run's seed; each part's generator adds its offset (:meth:`seed_of`).
    lr
        The clients' learning rate known at the start: the fallback of the parts that read
        the round's lr at run time.
    model
        The model's description (HiCS-FL's output-layer bias).
    local_rule, momentum
        The clients' local rule and their SGD momentum (BHerd's server step divides by the
        rule's alpha and warns about momentum); None: plain SGD.
    """

    num_clients: int
    rounds: int
    clients_per_round: int
    seed: int
    lr: float
    model: ModelInfo
    local_rule: Optional[LocalRuleConfig] = None
    momentum: float = 0.0

    def seed_of(self, part: "str | type[Part]") -> int:
        """Return the seed of a part's generator: the run's seed plus the part class's
        :meth:`Part.seed_offset`, or, for a part named by a string, its
        :data:`PART_SEED_OFFSETS` entry.
        """
        return self.seed + (PART_SEED_OFFSETS[part] if isinstance(part, str) else part.seed_offset())


class RoundContext(Protocol):
    """What the strategy offers its parts beyond their own hooks: the round's facts, the
    current model and the model's description, and extra round trips.
    """

    num_clients: int
    global_arrays: Arrays  # the current global model
    model: ModelInfo  # the model's description
    facts: Optional[RoundFacts]  # the round in progress (set before the sampler is asked)

    def data_sizes(self) -> dict[int, int]:
        """Client id -> number of training examples, as reported so far."""

    def train_round(
        self, server_round: int, arrays: Arrays, clients: np.ndarray, phase: str, isolated: bool = False
    ) -> Optional[Arrays]:
        """Run one real training round with ``clients`` from ``arrays`` outside the
        scenario's round count (logged with ``phase``); the aggregated model, or None
        when no reply was usable. ``isolated``: the server-side parts (sampler,
        aggregator, server rule) see it from their state before round 1 and keep their
        own state.
        """

    def query(self, server_round: int, clients: np.ndarray, arrays: Arrays) -> dict[int, dict[str, Any]]:
        """Ask ``clients`` to evaluate ``arrays`` on their data (a QUERY round trip);
        client id -> metrics (``eval-loss``, ``num-examples``) of those that answered.
        """

    def probe(self, server_round: int, clients: np.ndarray, arrays: Arrays, steps: int = 0) -> list[ClientUpdate]:
        """Let ``clients`` train from ``arrays`` with plain local SGD (the round's training
        settings; ``steps`` > 0: that many local steps) and return their validated
        updates, sorted by client, without aggregating them or showing them to any part
        (e.g. DivFL's "ideal" update proxies).
        """


class Part(ABC):  # noqa: B024 - the part types below (Sampler, ...) declare abstract hooks
    """Common surface: a name, a one-line summary, a checkpointable state, and optional
    extra content for the train messages.
    """

    name: str = "part"
    ctx: Optional[RoundContext] = None
    #: its generator's seed offset (the run's seed plus this); None: derived from the name
    SEED_OFFSET: ClassVar[Optional[int]] = None
    #: what Flower's DP noise does not cover of what the part computes per client
    #: (:mod:`strategies.privacy`); None: nothing (a FedAvg-like part); "" (undeclared): a
    #: generic warning that the part keeps per-client state
    DP_NOTE: ClassVar[Optional[str]] = ""

    @classmethod
    def seed_offset(cls) -> int:
        """Return :attr:`SEED_OFFSET`, or one derived from the part's name (a stream of its own)."""
        return cls.SEED_OFFSET if cls.SEED_OFFSET is not None else 100 + zlib.crc32(cls.name.encode()) % 10_000

    def bind(self, ctx: RoundContext) -> None:
        """Receive the round context (called once by the strategy that owns the part)."""
        self.ctx = ctx

    def summary(self) -> str:
        """Describe the part and its settings in one line (its name unless overridden)."""
        return self.name

    def round_lr(self, fallback: float) -> float:
        """Return the learning rate the clients train with in the round in progress (the
        strategy's :attr:`RoundContext.facts`), or ``fallback`` when no strategy tells.
        """
        facts = self.ctx.facts if self.ctx is not None else None
        return facts.lr if facts is not None and facts.lr is not None else fallback

    def train_payload(self, server_round: int) -> "dict[str, OrderedDict[str, np.ndarray]]":
        """Array records to add to this round's train messages (name -> arrays)."""
        return {}

    def train_config(self, server_round: int) -> dict[str, Any]:
        """Config entries to add to this round's train messages."""
        return {}

    def on_model_switch(self, server_round: int) -> None:  # noqa: B027 - optional hook
        """React to the initializer replacing the global model (optimiser state may be reset)."""

    def round_metrics(self) -> dict[str, Any]:
        """Return what the part saw and decided this round (merged into the round's row of
        metrics.jsonl); keep it small.
        """
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Return the state a checkpoint keeps (nothing unless overridden)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Restore the state that :meth:`state_dict` returned (nothing unless overridden)."""
        pass


class PartWrapper(Part):
    """A part around another one (``base``): the strategy talks to the wrapper, and every
    hook the wrapper does not override goes to ``base`` (binding, train message content,
    model switches, round metrics), so a wrapper never silently drops what its base
    reports. Subclasses nest ``base``'s state in their checkpoint.
    """

    def __init__(self, base: Part) -> None:
        self.base = base

    def bind(self, ctx: RoundContext) -> None:
        """Receive the round context, and hand it to the wrapped part."""
        super().bind(ctx)
        self.base.bind(ctx)

    def train_payload(self, server_round: int) -> "dict[str, OrderedDict[str, np.ndarray]]":
        """Return the array records added to this round's train messages (name -> arrays)."""
        return self.base.train_payload(server_round)

    def train_config(self, server_round: int) -> dict[str, Any]:
        """Return the config entries added to this round's train messages."""
        return self.base.train_config(server_round)

    def on_model_switch(self, server_round: int) -> None:
        """React to the initializer replacing the global model (state is reset when configured)."""
        self.base.on_model_switch(server_round)

    def round_metrics(self) -> dict[str, Any]:
        """Return this round's figures for the round's row of metrics.jsonl."""
        return self.base.round_metrics()


class Sampler(Part):
    """Chooses the clients that train in a round.

    A sampler class is also its own spec: its :attr:`name` (``strategy.sampler.name``),
    its options class :attr:`OPTIONS` and their section under ``strategy.sampler``
    (:meth:`section`), its seed offset and its note under differential privacy; and
    :meth:`build` makes it from its options for a :class:`Federation`, the same way for
    a scenario and for the named strategy :class:`~strategies.flower_strategy.SamplerStrategy`.
    A new sampler is its module plus its class in :data:`strategies.build.SAMPLERS`.
    """

    #: its options class (the section ``strategy.sampler.<section>``); None: no options
    OPTIONS: ClassVar[Optional[type[MethodOptions]]] = None
    #: its options' section under ``strategy.sampler``; None: the name, ``-`` read as ``_``
    SECTION: ClassVar[Optional[str]] = None

    @classmethod
    def section(cls) -> str:
        """Return the name of its options' section under ``strategy.sampler``."""
        return cls.SECTION or cls.name.replace("-", "_")

    @classmethod
    def build(cls, options: Optional[MethodOptions], federation: Federation) -> "Sampler":
        """Return the sampler for ``federation`` with ``options`` (of :attr:`OPTIONS`):
        ``cls(seed=..., options=...)`` unless a sampler needs more.
        """
        return cls(seed=federation.seed_of(cls), options=options)  # type: ignore[call-arg]

    @abstractmethod
    def sample(self, server_round: int, online: np.ndarray, num: int) -> np.ndarray:
        """Up to ``num`` distinct client ids drawn from ``online`` (sorted int array)."""

    def observe(self, server_round: int, updates: list[ClientUpdate], global_arrays: Arrays) -> None:
        """Learn from the round's replies (e.g. data sizes, update statistics)."""

    def round_metrics(self) -> dict[str, Any]:
        """Return what the sampler saw and decided this round (written to metrics.jsonl after
        ``observe``); keep it O(clients sampled), not O(clients online).
        """
        return {}


class Aggregator(Part):
    """Turns the round's replies into the next global model.

    An aggregator class is also its own spec, as a sampler is: its :attr:`name`
    (``strategy.aggregator.name``), its DP note, and :meth:`build`, which makes it from
    the scenario's ``strategy.aggregator`` section (the options every aggregator reads
    and its method's section) for a :class:`Federation`; a new aggregator is its module
    plus its class in :data:`strategies.build.AGGREGATORS`.
    """

    @classmethod
    def build(cls, options: AggregatorConfig, federation: Federation) -> "Aggregator":
        """Return the aggregator from ``options`` (``strategy.aggregator``) for ``federation``:
        ``cls(weighted=..., server_lr=...)`` unless an aggregator needs more.
        """
        return cls(weighted=options.weighted, server_lr=options.server_lr)  # type: ignore[call-arg]

    @abstractmethod
    def aggregate(self, server_round: int, global_arrays: Arrays, updates: list[ClientUpdate]) -> Arrays:
        """Return the next global model from the current one and the replies."""

    def round_metrics(self) -> dict[str, Any]:
        """Method-specific figures of the last aggregation (written to metrics.jsonl)."""
        return {}


#: what each local rule's training replies carry besides the model: (array records, metrics)
RULE_REPLIES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "scaffold": ((keys.SCAFFOLD_DC,), ()),
    "fednova": ((keys.FEDNOVA_D,), (keys.FEDNOVA_A_NORM,)),
    "bherd": ((keys.HERD_G,), (keys.HERD_TAU, keys.HERD_K, keys.HERD_ALPHA_I)),
    "grab": ((keys.HERD_G,), (keys.HERD_TAU, keys.HERD_K, keys.HERD_ALPHA_I)),
}


class ServerRule(Part):
    """The server half of a local rule: it adds the rule's options to every train message
    (one typed object, :class:`~fedflex.config.LocalRuleConfig`, the fields the rule
    reads, under ``local-rule``), as Flower's FedProx adds its ``proximal-mu``; subclasses
    add what else the clients need (e.g. SCAFFOLD's server control variate) and learn from
    their extras before aggregation. The plain class serves rules that need nothing else
    (``sgd``, ``fedprox``, ``bherd``, ``grab``).
    """

    name = "rule"
    DP_NOTE: ClassVar[Optional[str]] = None  # sgd, fedprox, the herding rules' plain half: the model only
    rule = "sgd"  # the local rule this half belongs to: the name of its default options

    def __init__(self, options: Optional[LocalRuleConfig] = None) -> None:
        self.options = options if options is not None else LocalRuleConfig(name=self.rule)

    def train_config(self, server_round: int) -> dict[str, Any]:
        """Return the rule's options as sent to clients with every train message."""
        return to_record(self.options, keys.LOCAL_RULE, only=self.options.sent())

    def summary(self) -> str:
        """Describe the rule by the options it sends to clients."""
        sent = {k[len(keys.LOCAL_RULE) + 1 :]: v for k, v in self.train_config(0).items()}
        return ", ".join(f"{k}={v}" for k, v in sent.items())

    def observe(self, server_round: int, updates: list[ClientUpdate], global_arrays: Arrays) -> None:
        """See the round's validated replies (before the aggregator)."""

    def reply_needs(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Return the array records and metrics every training reply of this rule carries
        (:data:`RULE_REPLIES`; BHerd on SCAFFOLD also sends ``scaffold-dc``); a reply
        without one of them, or with another array record, is rejected.
        """
        records, metrics = RULE_REPLIES.get(self.options.name, ((), ()))
        if self.options.name == "bherd" and self.options.bherd.base == "scaffold":
            records += (keys.SCAFFOLD_DC,)
        return records, metrics


class ClientHalfCheck:
    """Warns once when a rule's replies come from clients without its client half.

    fedflex's ClientApp and the helpers of :mod:`fedflex.clients.helpers` send
    ``num-steps`` with every reply; a reply without it comes from a ClientApp that trains
    plainly (Flower's quickstart), which a rule whose replies carry no record of their own
    (FedDyn, FedCM) cannot tell from its own client's otherwise.
    """

    def __init__(self, method: str, helper: str, amounts_to: str) -> None:
        self.method, self.helper, self.amounts_to = method, helper, amounts_to
        self.warned = False

    def __call__(self, updates: list[ClientUpdate]) -> None:
        """Warn (once) when no reply of the round carries ``num-steps``."""
        if self.warned or not updates or any(keys.NUM_STEPS in u.metrics for u in updates):
            return
        self.warned = True
        log(
            WARNING,
            "%s: the replies carry no %s metric: their ClientApp trains without %s's client half, so %s; "
            "run fedflex's ClientApp with local rule %s, or %s (docs/flower-strategies.md)",
            self.method,
            keys.NUM_STEPS,
            self.method,
            self.amounts_to,
            self.method.lower(),
            self.helper,
        )


class ModelStateRule(ServerRule):
    """A server half that keeps one model-shaped state, named ``state_key`` (SCAFFOLD's c,
    FedDyn's h, FedCM's Delta): empty (read as zeros) at first, emptied when an
    initializer replaces the model if ``reset_on_switch``, checkpointed under its name.
    """

    state_key = "state"

    def __init__(self, reset_on_switch: bool = False, options: Optional[LocalRuleConfig] = None) -> None:
        super().__init__(options)
        self.reset_on_switch = reset_on_switch
        setattr(self, self.state_key, OrderedDict())

    def on_model_switch(self, server_round: int) -> None:
        """React to the initializer replacing the global model (state is reset when configured)."""
        if self.reset_on_switch:
            setattr(self, self.state_key, OrderedDict())

    def state_dict(self) -> dict[str, Any]:
        """Return the state a checkpoint keeps (JSON/npz-friendly values)."""
        return {self.state_key: dict(getattr(self, self.state_key))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state that :meth:`state_dict` returned."""
        setattr(self, self.state_key, OrderedDict(state[self.state_key]))


class Initializer(Part):
    """Chooses the model a new session starts from.

    Its own spec, as a sampler is (:attr:`name`, DP note, :meth:`build` from
    ``strategy.initializer``); a new one is its module plus its class in
    :data:`strategies.build.INITIALIZERS`.
    """

    @classmethod
    def build(cls, options: InitializerConfig, federation: Federation) -> "Initializer":
        """Return the initializer from ``options`` (``strategy.initializer``) for ``federation``: ``cls()``
        unless one needs more.
        """
        return cls()

    def on_session_start(
        self, server_round: int, session: int, online: np.ndarray, global_arrays: Arrays
    ) -> Optional[Arrays]:
        """Return a replacement global model for the new session, or None to keep the current one."""
        return None

    def on_round_end(self, server_round: int, session: int, global_arrays: Arrays) -> None:
        """See the global model after each round (to remember a session's last model)."""
