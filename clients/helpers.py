"""Client halves of fedflex's methods for a Flower user's own training loop.

The server halves (:mod:`strategies.named`: ``BHerd``, ``SCAFFOLD``, ``FedNova``,
``FedDyn``, ``FedCM``; Flower's own ``FedProx``) put what their clients need in the train
message (the options under ``local-rule.*`` in ``config``, SCAFFOLD's ``scaffold-c``,
FedCM's ``fedcm-delta``) and expect more than ``arrays`` and ``num-examples`` back
(:data:`strategies.parts.RULE_REPLIES`). A helper here reads the message, hooks the
optimiser steps of the user's model while the user's ``train()`` runs, and builds the
reply; the method itself is fedflex's client code (:mod:`clients.bherd`,
:mod:`clients.scaffold`, :mod:`clients.fednova`, :mod:`clients.feddyn`,
:mod:`clients.fedcm`, FedProx's term in :class:`clients.train.StepTerms`), run around
the user's loop instead of fedflex's::

    helper = BHerdClient.from_message(msg, model, context)
    with helper:  # every optimizer.step() on model's parameters goes through the method
        train_loss = train(model, trainloader, epochs, lr, device)
    content = helper.reply(len(trainloader.dataset), {"train_loss": train_loss})
    return Message(content=content, reply_to=msg)

A loop that prefers to say it: ``helper.step(optimizer)`` in place of
``optimizer.step()`` (no ``with``). The gradient each step uses is the one ``backward``
left on the parameters: the helper adds the method's terms (SCAFFOLD's ``c - c_i``,
FedProx's ``mu (w - w_global)``, FedDyn's ``-g_k + alpha (w - w_global)``, FedCM's blend
with the global momentum) or records it (BHerd) before the optimiser steps. The
learning rate, momentum and weight decay are read from the optimiser.

Mods: a Flower mod sees the message and the reply, not the optimiser's steps, so only
FedNova fits one (:func:`fednova_mod`: the step count and momentum are watched through
the same optimiser hook, the update is reply minus message); every other method changes
or records each step's gradient and needs the helper around ``train()``.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from typing import Any, Callable, ClassVar, Mapping, Optional, TypeVar, cast

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from fedflex import keys
from fedflex.clients.bherd import DTYPES, GradientStore, flat_gradient, herd_reply
from fedflex.clients.common import RuleInput, RuleOutput, RuleStart, RuleSteps
from fedflex.clients.fedcm import FEDCM
from fedflex.clients.feddyn import FEDDYN
from fedflex.clients.fednova import FEDNOVA
from fedflex.clients.node import payload_of, reply_records, rule_options
from fedflex.clients.rules import SGD
from fedflex.clients.scaffold import SCAFFOLD, ScaffoldVariates, scaffold_finish, scaffold_variates
from fedflex.clients.train import StepTerms, TrainResult, TrainSettings
from fedflex.config import LocalRuleConfig

logger = logging.getLogger(__name__)

#: Flower's FedProx puts its mu in the train config under this key
FLOWER_PROXIMAL_MU = "proximal-mu"


def optimizer_settings(optimizer: torch.optim.Optimizer) -> TrainSettings:
    """Return the training settings a method reads (optimiser kind, lr, momentum, weight
    decay) from a torch optimiser's parameter groups, which must agree on them.

    Raises
    ------
    ValueError
        When the groups differ in lr / momentum / weight decay, or an SGD uses Nesterov
        or dampening (fedflex's formulas for ||a||_1 assume heavy-ball momentum).
    """
    groups = optimizer.param_groups
    settings: set[tuple[Any, Any, Any]] = {
        (g.get("lr"), g.get("momentum", 0.0), g.get("weight_decay", 0.0)) for g in groups
    }
    if len(settings) > 1:
        raise ValueError("the optimizer's parameter groups differ in lr, momentum or weight decay: use one group")
    lr, momentum, weight_decay = settings.pop()
    if isinstance(optimizer, torch.optim.SGD):
        if groups[0].get("nesterov") or groups[0].get("dampening"):
            raise ValueError("SGD with nesterov or dampening: fedflex's client halves take heavy-ball momentum only")
        return TrainSettings(optimizer="sgd", lr=float(lr), momentum=float(momentum), weight_decay=float(weight_decay))
    return TrainSettings(optimizer=type(optimizer).__name__.lower(), lr=float(lr), weight_decay=float(weight_decay))


_Hook = TypeVar("_Hook", bound="OptimizerHook")


class OptimizerHook:
    """While entered (``with``), calls :meth:`on_step` before every ``step()`` of a torch
    optimiser that :meth:`accepts` (torch's global optimiser step pre-hook).
    """

    _handle: Any = None

    def accepts(self, optimizer: torch.optim.Optimizer) -> bool:
        """Return True for an optimiser this hook acts on (every one, unless overridden)."""
        return True

    def on_step(self, optimizer: torch.optim.Optimizer) -> None:  # pragma: no cover - overridden
        """Do the hook's work before ``optimizer`` steps (overridden)."""
        raise NotImplementedError

    def _hook(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.accepts(optimizer):
            self.on_step(optimizer)

    def __enter__(self: _Hook) -> _Hook:
        if self._handle is not None:
            raise RuntimeError(f"{type(self).__name__} is entered already")
        self._handle = register_optimizer_step_pre_hook(self._hook)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._handle.remove()
        self._handle = None


class ClientHalf(OptimizerHook):
    """The client half of one method around a user's training loop (see the module
    docstring). Build it with :meth:`from_message`; after training, :meth:`reply`.

    Parameters
    ----------
    net
        The model the user trains, holding the received global weights.
    options
        The local rule's options as the server sent them.
    payload
        The train message's further array records (name -> tensors).
    state
        The node's persistent state (``context.state``), for methods that keep
        per-client state between rounds (SCAFFOLD's c_i, FedDyn's g_k).
    """

    #: the method's name in messages to the user
    method: ClassVar[str] = ""
    #: the local-rule names (``local-rule.name``) of the server halves this client serves
    rules: ClassVar[tuple[str, ...]] = ()
    #: whether the method needs plain SGD (its server step is lr times gradients)
    needs_sgd: ClassVar[bool] = False

    def __init__(
        self,
        net: nn.Module,
        options: LocalRuleConfig,
        payload: Optional[dict[str, "OrderedDict[str, torch.Tensor]"]] = None,
        state: Optional[RecordDict] = None,
    ) -> None:
        self.net, self.options = net, options
        self.payload, self.state = payload or {}, state
        self.named: "OrderedDict[str, torch.Tensor]" = OrderedDict(net.named_parameters())
        self._ids = {id(p) for p in self.named.values()}
        self.start = OrderedDict((k, p.detach().clone()) for k, p in self.named.items())
        self.settings: Optional[TrainSettings] = None
        self.num_steps = 0

    # ------------------------------------------------------------------ reading the message
    @classmethod
    def from_message(cls, msg: Message, net: nn.Module, context: Optional[Context] = None, **kwargs: Any):
        """Return the helper for this train message: the options and records the server half
        sent, the node's state from ``context`` (needed by SCAFFOLD and FedDyn).

        Raises
        ------
        ValueError
            In one line, when the message is not from this method's server half, lacks
            a record it sends, or the method needs ``context`` and none is given.
        """
        config = msg.content.config_records.get(keys.CONFIG, ConfigRecord())
        options = cls.read_options(config)
        payload = payload_of(msg)
        missing = [name for name in cls.needs_records(options) if name not in payload]
        if missing:
            name = cls.__name__
            raise ValueError(f"{name}: the train message has no {missing[0]} record (is the server {cls.method}?)")
        if cls.needs_state(options) and context is None:
            raise ValueError(
                f"{cls.__name__}: needs the node's Context (its state keeps the client's variables between rounds): "
                f"{cls.__name__}.from_message(msg, net, context)"
            )
        return cls(net, options, payload, context.state if context is not None else None, **kwargs)

    @classmethod
    def read_options(cls, config: Mapping[str, Any]) -> LocalRuleConfig:
        """Return the local rule's options from the train config; this method's rule or an error."""
        options = rule_options(config)
        if options.name not in cls.rules:
            raise ValueError(
                f"{cls.__name__}: the train message is for local rule {options.name!r}, not "
                f"{' or '.join(cls.rules)}: run fedflex's {cls.method} strategy on the server"
            )
        return options

    @classmethod
    def needs_records(cls, options: LocalRuleConfig) -> tuple[str, ...]:
        """Return the array records the server half sends with every train message."""
        return ()

    @classmethod
    def needs_state(cls, options: LocalRuleConfig) -> bool:
        """Return True when the method keeps per-client state in the node's ``context`` between rounds."""
        return False

    # ------------------------------------------------------------------ the steps
    def accepts(self, optimizer: torch.optim.Optimizer) -> bool:
        """Return True for an optimiser that steps this helper's model."""
        return any(id(p) in self._ids for group in optimizer.param_groups for p in group["params"])

    def on_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Do the method's work on this step's gradients, before ``optimizer`` steps."""
        self.settings = optimizer_settings(optimizer)
        if self.needs_sgd and self.settings.optimizer != "sgd":
            raise ValueError(
                f"{type(self).__name__}: {self.method} needs torch.optim.SGD (its server step is lr times "
                f"gradients), got {type(optimizer).__name__}"
            )
        self.before_step()
        self.num_steps += 1

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer.step()`` with the method's work first (for a loop that calls it
        instead of using ``with helper:``).
        """
        if self._handle is None:
            self.on_step(optimizer)
        optimizer.step()

    def before_step(self) -> None:  # pragma: no cover - overridden
        """Do the method's work on this step's gradients, before the optimiser steps."""
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        """Return the device of the model's parameters (the CPU when there are none)."""
        return next(iter(self.named.values())).device if self.named else torch.device("cpu")

    def rule_input(self) -> RuleInput:
        """Return what fedflex's rule code reads: the model, the settings read from the
        optimiser, the server's records, the node state, the options. There is no data
        set: the user's loop owns the data.
        """
        return RuleInput(
            model=self.net,
            data=None,
            indices=torch.empty(0, dtype=torch.long),
            settings=self.settings or TrainSettings(),
            generator=None,
            device=self.device,
            payload=self.payload,
            state=self.state,
            options=self.options,
        )

    # ------------------------------------------------------------------ the reply
    def output(self, num_examples: int) -> RuleOutput:  # pragma: no cover - overridden
        """Return the rule's output after training: the result, the method's records and metrics."""
        raise NotImplementedError

    def reply(self, num_examples: int, metrics: Optional[Mapping[str, Any]] = None) -> RecordDict:
        """Return the train reply's content: ``arrays`` (the trained model), the method's
        records, and ``metrics`` = the user's ``metrics`` + ``num-examples`` +
        ``num-steps`` + the method's metrics.
        """
        out = self.output(int(num_examples))
        content = reply_records(self.net, out)
        merged = {**(metrics or {}), keys.NUM_EXAMPLES: int(num_examples), keys.NUM_STEPS: self.num_steps}
        content[keys.METRICS] = MetricRecord({**merged, **out.metrics})
        return content


class RuleStepsClient(ClientHalf):
    """A method written as fedflex's :class:`~clients.common.RuleSteps` (start / finish
    around a plain loop): its start's :class:`~clients.train.StepTerms` act on every
    step's gradients, its finish builds the records.
    """

    steps: ClassVar[RuleSteps]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._begun: Optional[RuleStart] = None
        self._x: "OrderedDict[str, torch.Tensor]" = OrderedDict()

    def _begin(self) -> RuleStart:
        if self._begun is None:  # at the first step, where the model lives on the training device
            device = self.device
            self._x = OrderedDict((k, v.to(device)) for k, v in self.start.items())
            self._begun = type(self).steps.start(self.rule_input(), self._x)
        return self._begun

    def before_step(self) -> None:
        """Do the method's work on this step's gradients, before the optimiser steps."""
        self._begin().terms.add_to_gradients(self.named, self._x)

    def output(self, num_examples: int) -> RuleOutput:
        """Return the rule's output after training: the result, the method's records and metrics."""
        begun = self._begin()
        y = OrderedDict((k, p.detach()) for k, p in self.named.items())
        result = TrainResult(num_examples=num_examples, num_steps=self.num_steps, train_loss=math.nan)
        return type(self).steps.finish(self.rule_input(), begun, self._x, y, result)


class SCAFFOLDClient(RuleStepsClient):
    """SCAFFOLD's client (option II, :mod:`clients.scaffold`): every step's gradient
    gets ``c - c_i``; the reply carries ``scaffold-dc``; c_i stays in ``context.state``.
    """

    method, rules, steps = "SCAFFOLD", ("scaffold",), SCAFFOLD

    @classmethod
    def needs_records(cls, options: LocalRuleConfig) -> tuple[str, ...]:
        """Return the names of the array records the server half sends with every train message."""
        return (keys.SCAFFOLD_C,)

    @classmethod
    def needs_state(cls, options: LocalRuleConfig) -> bool:
        """Return True when the method keeps per-client state in the node's ``context`` between rounds."""
        return True


class FedNovaClient(RuleStepsClient):
    """FedNova's client (:mod:`clients.fednova`): the steps are the user's; the reply
    carries ``fednova-d`` = (x - y) / ||a||_1 and ``fednova-tau`` / ``fednova-a-norm``.
    """

    method, rules, steps, needs_sgd = "FedNova", ("fednova",), FEDNOVA, True


class FedDynClient(RuleStepsClient):
    """FedDyn's client (:mod:`clients.feddyn`): every step's gradient gets
    ``-g_k + alpha (w - w_global)``; g_k stays in ``context.state``.
    """

    method, rules, steps = "FedDyn", ("feddyn",), FEDDYN

    @classmethod
    def needs_state(cls, options: LocalRuleConfig) -> bool:
        """Return True when the method keeps per-client state in the node's ``context`` between rounds."""
        return True


class FedCMClient(RuleStepsClient):
    """FedCM's client (:mod:`clients.fedcm`): every step moves along
    ``alpha g + (1 - alpha) Delta`` with the server's ``fedcm-delta``; the reply's
    ``num-steps`` is what the server's momentum update divides by.
    """

    method, rules, steps, needs_sgd = "FedCM", ("fedcm",), FEDCM, True

    @classmethod
    def needs_records(cls, options: LocalRuleConfig) -> tuple[str, ...]:
        """Return the names of the array records the server half sends with every train message."""
        return (keys.FEDCM_DELTA,)


class FedProxClient(RuleStepsClient):
    """FedProx's client: every step's gradient gets ``mu (w - w_global)``, the gradient
    of mu/2 ||w - w_global||^2. Serves Flower's ``FedProx`` (``proximal-mu`` in the
    config) and a fedflex strategy with local rule ``fedprox``.
    """

    method, rules, steps = "FedProx", ("fedprox",), SGD

    @classmethod
    def read_options(cls, config: Mapping[str, Any]) -> LocalRuleConfig:
        """Read the options from a train config; Flower's ``proximal-mu`` key is taken as FedProx's mu."""
        if FLOWER_PROXIMAL_MU in config:
            return LocalRuleConfig(name="fedprox", mu=float(config[FLOWER_PROXIMAL_MU]))
        return super().read_options(config)


class BHerdClient(ClientHalf):
    """BHerd's client (:mod:`clients.bherd`): every step's gradient is recorded (on
    SCAFFOLD's base: after its correction); the reply carries the herded sum ``herd-g``
    and ``herd-tau`` / ``herd-k`` / ``herd-alpha-i`` (and SCAFFOLD's ``scaffold-dc`` on
    that base).

    Parameters
    ----------
    steps
        The number of local steps the loop will take (e.g. ``epochs *
        len(trainloader)``); needed only when the server bounds the stored gradients
        (``bherd_max_stored`` > 0), else the store grows by one row per step.
    """

    method, rules, needs_sgd = "BHerd", ("bherd",), True

    def __init__(self, *args: Any, steps: Optional[int] = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.options.bherd_max_stored > 0 and steps is None:
            raise ValueError(
                f"BHerdClient: the server bounds the stored gradients (bherd_max_stored="
                f"{self.options.bherd_max_stored}): pass steps= (the loop's local steps, "
                "e.g. epochs * len(trainloader))"
            )
        self.steps = steps
        self.named = OrderedDict((k, p) for k, p in self.named.items() if p.requires_grad)
        self.store: Optional[GradientStore] = None
        self.variates: Optional[ScaffoldVariates] = None
        self._x: dict[str, torch.Tensor] = {}

    @classmethod
    def needs_records(cls, options: LocalRuleConfig) -> tuple[str, ...]:
        """Return the names of the array records the server half sends with every train message."""
        return (keys.SCAFFOLD_C,) if options.bherd_base == "scaffold" else ()

    @classmethod
    def needs_state(cls, options: LocalRuleConfig) -> bool:
        """Return True when the method keeps per-client state in the node's ``context`` between rounds."""
        return options.bherd_base == "scaffold"

    def _begin(self) -> GradientStore:
        if self.store is None:
            device, opts = self.device, self.options
            dim = sum(p.numel() for p in self.named.values())
            max_rows = opts.bherd_max_stored if self.steps is not None else 0
            self.store = GradientStore(self.steps, dim, DTYPES[opts.bherd_dtype], device, max_rows)
            if opts.bherd_base == "scaffold":
                self.variates = scaffold_variates(self.rule_input(), self.named)
                self._x = {k: v.to(device) for k, v in self.start.items() if k in self.named}
        return self.store

    def before_step(self) -> None:
        """Do the method's work on this step's gradients, before the optimiser steps."""
        store = self._begin()
        if self.steps is not None and self.num_steps >= self.steps:
            raise ValueError(f"BHerdClient: the loop took more than the {self.steps} local steps it declared")
        if self.variates is not None:
            StepTerms(correction=self.variates.correction).add_to_gradients(self.named)
        weight_decay = self.settings.weight_decay if self.settings is not None else 0.0
        store.add(self.num_steps, flat_gradient(list(self.named.values()), weight_decay))

    def output(self, num_examples: int) -> RuleOutput:
        """Return the rule's output after training: the result, the method's records and metrics."""
        store = self._begin()
        if self.steps is not None and self.num_steps != self.steps:
            raise ValueError(f"BHerdClient: the loop took {self.num_steps} local steps, not the {self.steps} declared")
        g, metrics = herd_reply(store, self.num_steps, self.options.bherd_alpha, self.named)
        extras = {keys.HERD_G: g}
        if self.variates is not None:
            extras[keys.SCAFFOLD_DC] = scaffold_finish(
                self.rule_input(), self.variates, self._x, self.named, self.num_steps
            )
        result = TrainResult(num_examples=num_examples, num_steps=self.num_steps, train_loss=math.nan)
        return RuleOutput(result, extras=extras, metrics=metrics)


#: the client half of each named strategy that needs one (strategy class name -> helper)
HALVES: dict[str, type[ClientHalf]] = {
    "BHerd": BHerdClient,
    "SCAFFOLD": SCAFFOLDClient,
    "FedNova": FedNovaClient,
    "FedDyn": FedDynClient,
    "FedCM": FedCMClient,
    "FedProx": FedProxClient,
}


class _StepWatch(OptimizerHook):
    """Counts the optimiser steps taken while entered and keeps the last settings."""

    def __init__(self) -> None:
        self.num_steps = 0
        self.settings: Optional[TrainSettings] = None

    def on_step(self, optimizer: torch.optim.Optimizer) -> None:
        self.settings = optimizer_settings(optimizer)
        self.num_steps += 1


def fednova_mod(msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
    """FedNova's client half as a Flower mod: ``ClientApp(mods=[fednova_mod])``.

    Watches the optimiser steps of the wrapped ``train`` (their count tau and SGD
    momentum: one torch.optim.SGD), then adds ``fednova-d`` = (x - y) / ||a||_1 over the
    model's float arrays (x: the message's, y: the reply's) and FedNova's metrics to the
    reply. Float buffers (BatchNorm statistics) are normalised as the parameters are:
    for such a model use :class:`FedNovaClient`, which sends the parameters only.
    """
    if msg.metadata.message_type != MessageType.TRAIN:
        return call_next(msg, context)
    options = FedNovaClient.read_options(msg.content.config_records.get(keys.CONFIG, ConfigRecord()))
    with _StepWatch() as watch:
        reply = call_next(msg, context)
    if reply.has_error():
        return reply
    if watch.settings is not None and watch.settings.optimizer != "sgd":
        stepped = watch.settings.optimizer
        raise ValueError(f"fednova_mod: FedNova needs torch.optim.SGD, the ClientApp stepped {stepped}")
    x = cast(ArrayRecord, msg.content[keys.ARRAYS]).to_torch_state_dict()
    y = cast(ArrayRecord, reply.content[keys.ARRAYS]).to_torch_state_dict()
    floats = OrderedDict((k, v) for k, v in y.items() if torch.is_floating_point(v))
    inp = RuleInput(
        model=None,
        data=None,
        indices=torch.empty(0, dtype=torch.long),
        settings=watch.settings or TrainSettings(),
        generator=None,
        device=torch.device("cpu"),
        options=options,
    )
    result = TrainResult(num_examples=0, num_steps=watch.num_steps, train_loss=math.nan)
    out = FEDNOVA.finish(inp, FEDNOVA.start(inp, floats), x, floats, result)
    for name, tensors in out.extras.items():
        reply.content[name] = ArrayRecord(OrderedDict((k, v.cpu()) for k, v in tensors.items()))
    metrics = reply.content[keys.METRICS]
    for key, value in {keys.NUM_STEPS: watch.num_steps, **out.metrics}.items():
        metrics[key] = value
    return reply
