"""Client halves of fedflex's methods for a Flower user's own training loop.

The server halves (:mod:`fedflex.strategies`: ``BHerd``, ``SCAFFOLD``, ``FedNova``,
``FedDyn``, ``FedCM``; Flower's own ``FedProx``) put what their clients need in the train
message (the options under ``local-rule.*`` in ``config``, SCAFFOLD's ``scaffold-c``,
FedCM's ``fedcm-delta``) and expect more than ``arrays`` and ``num-examples`` back
(:data:`strategies.parts.RULE_REPLIES`). The shortest way to send it is
:func:`client_half`, under ``@app.train()`` over a train function written as Flower's
quickstart writes it (2 changed lines; :func:`client_half_mod` is the same as a Flower
mod)::

    @app.train()
    @client_half
    def train(msg, context): ...  # unchanged

It reads which method the message is for, finds the model the function trains at its
first optimiser step, runs the method around every step and adds the method's records
and metrics to the function's reply. The method itself is fedflex's client code
(:mod:`clients.bherd`, :mod:`clients.scaffold`, :mod:`clients.fednova`,
:mod:`clients.feddyn`, :mod:`clients.fedcm`, FedProx's term in
:class:`clients.train.StepTerms`), run by one :class:`ClientHalf` per method, which a
loop can also use itself::

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

:func:`fednova_mod` is FedNova's older mod: it watches the steps the same way and takes
the update as the reply's model minus the message's (every float array, buffers
included).

It is over 600 lines because the client halves of six methods share one optimiser hook
and one decorator/mod path; each half is short, and apart they would import each other.
"""

from __future__ import annotations

import functools
import logging
import math
from collections import OrderedDict
from typing import Any, Callable, ClassVar, Mapping, Optional, TypeVar, Union, cast, overload

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from torch import nn
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_pre_hook

from fedflex import keys
from fedflex.arrays import numpy_to_record
from fedflex.clients.bherd import DTYPES, GradientStore, flat_gradient, herd_reply
from fedflex.clients.fedcm import FEDCM
from fedflex.clients.feddyn import FEDDYN
from fedflex.clients.fednova import FEDNOVA
from fedflex.clients.node import payload_of, reply_records, rule_options
from fedflex.clients.rule_io import RuleInput, RuleOutput, RuleStart, RuleSteps
from fedflex.clients.rules import SGD
from fedflex.clients.scaffold import SCAFFOLD, ScaffoldVariates, scaffold_finish, scaffold_variates
from fedflex.clients.train import StepTerms, TrainResult, TrainSettings
from fedflex.config import LocalRuleConfig
from fedflex.options import FedProxOptions

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
        The model the user trains, holding the received global weights (None when
        ``named`` is given).
    options
        The local rule's options as the server sent them.
    payload
        The train message's further array records (name -> tensors).
    state
        The node's persistent state (``context.state``), for methods that keep
        per-client state between rounds (SCAFFOLD's c_i, FedDyn's g_k).
    named
        The parameters the method acts on, by their state-dict names, in place of
        ``net.named_parameters()`` (:func:`client_half` when it knows no module).
    """

    #: the method's name in messages to the user
    method: ClassVar[str] = ""
    #: the local-rule names (``local-rule.name``) of the server halves this client serves
    rules: ClassVar[tuple[str, ...]] = ()
    #: whether the method needs plain SGD (its server step is lr times gradients)
    needs_sgd: ClassVar[bool] = False

    def __init__(
        self,
        net: Optional[nn.Module],
        options: LocalRuleConfig,
        payload: Optional[dict[str, "OrderedDict[str, torch.Tensor]"]] = None,
        state: Optional[RecordDict] = None,
        *,
        named: Optional[Mapping[str, torch.Tensor]] = None,
    ) -> None:
        if net is None and named is None:
            raise ValueError(f"{type(self).__name__}: give the model (net) or its named parameters (named=)")
        self.net, self.options = net, options
        self.payload, self.state = payload or {}, state
        self.named: "OrderedDict[str, torch.Tensor]" = OrderedDict(
            named.items() if named is not None else cast(nn.Module, net).named_parameters()
        )
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
        return cls(net, *cls.read_message(msg, context), **kwargs)

    @classmethod
    def read_message(
        cls, msg: Message, context: Optional[Context] = None
    ) -> tuple[LocalRuleConfig, dict[str, "OrderedDict[str, torch.Tensor]"], Optional[RecordDict]]:
        """Return what the helper is built from: the options, the further records (name ->
        tensors) and the node state; errors as :meth:`from_message`.
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
        return options, payload, context.state if context is not None else None

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
        if self.net is None:
            raise ValueError(f"{type(self).__name__}: built without the model, it cannot build the reply's arrays")
        out = self.output(int(num_examples))
        content = reply_records(self.net, out)
        merged = {**(metrics or {}), keys.NUM_EXAMPLES: int(num_examples), keys.NUM_STEPS: self.num_steps}
        content[keys.METRICS] = MetricRecord({**merged, **out.metrics})
        return content


class RuleStepsClient(ClientHalf):
    """A method written as fedflex's :class:`~clients.rule_io.RuleSteps` (start / finish
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
            return LocalRuleConfig(name="fedprox", fedprox=FedProxOptions(mu=float(config[FLOWER_PROXIMAL_MU])))
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
        (``bherd.max_stored`` > 0), else the store grows by one row per step.
    """

    method, rules, needs_sgd = "BHerd", ("bherd",), True

    def __init__(self, *args: Any, steps: Optional[int] = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.options.bherd.max_stored > 0 and steps is None:
            raise ValueError(
                f"BHerdClient: the server bounds the stored gradients (bherd.max_stored="
                f"{self.options.bherd.max_stored}): pass steps= (the loop's local steps, "
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
        return (keys.SCAFFOLD_C,) if options.bherd.base == "scaffold" else ()

    @classmethod
    def needs_state(cls, options: LocalRuleConfig) -> bool:
        """Return True when the method keeps per-client state in the node's ``context`` between rounds."""
        return options.bherd.base == "scaffold"

    def _begin(self) -> GradientStore:
        if self.store is None:
            device, opts = self.device, self.options
            dim = sum(p.numel() for p in self.named.values())
            max_rows = opts.bherd.max_stored if self.steps is not None else 0
            self.store = GradientStore(self.steps, dim, DTYPES[opts.bherd.dtype], device, max_rows)
            if opts.bherd.base == "scaffold":
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
        g, metrics = herd_reply(store, self.num_steps, self.options.bherd.alpha, self.named)
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


# ---------------------------------------------------------------------------- the decorator and the mod
#: a ClientApp's train function, as ``@app.train()`` registers it
TrainFn = Callable[[Message, Context], Message]
#: BHerd's declared local steps: a number, or a function of the train message and context
Steps = Union[int, Callable[[Message, Context], int]]

#: the client half of each local rule whose server half needs one (``local-rule.name`` -> helper)
RULE_HALVES: dict[str, type[ClientHalf]] = {cls.rules[0]: cls for cls in HALVES.values()}


def half_for(msg: Message, method: Optional[str] = None) -> Optional[type[ClientHalf]]:
    """Return the helper class for a train message: the one of its ``local-rule.name``
    (:class:`FedProxClient` for Flower's ``proximal-mu``), None for plain local training
    (Flower's FedAvg and every strategy that needs no client half); with ``method`` (a
    key of :data:`HALVES`, any case) that helper, whatever the message says.

    Raises
    ------
    ValueError
        In one line, for an unknown ``method`` or a local rule without a client half here.
    """
    if method is not None:
        return _half_named(method)
    config = msg.content.config_records.get(keys.CONFIG, ConfigRecord())
    name = rule_options(config).name
    if name == "sgd":
        return FedProxClient if FLOWER_PROXIMAL_MU in config else None
    if name not in RULE_HALVES:
        raise ValueError(
            f"client_half: the train message is for local rule {name!r}, which has no client half "
            f"(there are: {', '.join(RULE_HALVES)})"
        )
    return RULE_HALVES[name]


def _half_named(method: str) -> type[ClientHalf]:
    by_name = {name.lower(): cls for name, cls in HALVES.items()}
    if method.lower() not in by_name:
        raise ValueError(f"client_half: no client half named {method!r}: use one of {', '.join(HALVES)}")
    return by_name[method.lower()]


class _TrainCall(OptimizerHook):
    """One train call under :func:`client_half`: finds the model the call trains at the
    first optimiser step on it, builds the method's :class:`ClientHalf` for it, runs the
    half before every step of that optimiser, then adds the half's records and metrics
    to the call's reply (:meth:`finish`).

    The model is the ``nn.Module`` called during the train function (seen through
    torch's global forward pre-hook until the first step) whose parameters include the
    stepping optimiser's and whose parameter names and shapes are arrays of the message
    (the root module, or a wrapped one inside it, e.g. ``torch.compile``'s). Without one
    (a loop calling ``model.forward`` or a functional model), each of the optimiser's
    parameters must equal exactly one of the message's arrays (they hold the received
    weights until the first step). An optimiser that steps none of the received
    arrays is left alone; any other is refused in one line.
    """

    def __init__(self, cls: type[ClientHalf], msg: Message, context: Context, steps: Optional[Steps]) -> None:
        self.cls, self.msg = cls, msg
        self.options, self.payload, self.state = cls.read_message(msg, context)
        self.kwargs: dict[str, Any] = {}
        if issubclass(cls, BHerdClient):
            if steps is None and self.options.bherd.max_stored > 0:
                raise ValueError(
                    f"client_half(BHerd): the server bounds the stored gradients (bherd.max_stored="
                    f"{self.options.bherd.max_stored}): declare the loop's local steps, "
                    "@client_half(steps=lambda msg, context: epochs * batches_per_epoch)"
                )
            if steps is not None:
                self.kwargs["steps"] = int(steps(msg, context) if callable(steps) else steps)
        self.half: Optional[ClientHalf] = None
        self.optimizer: Optional[torch.optim.Optimizer] = None
        self.others: list[torch.optim.Optimizer] = []  # optimisers of other models, seen stepping
        self.seen: list[nn.Module] = []
        self._seen_ids: set[int] = set()
        self._forward: Any = None

    @property
    def name(self) -> str:
        """Return how errors name this call: ``client_half(<method>)``."""
        return f"client_half({self.cls.method})"

    # ------------------------------------------------------------------ hooks
    def _saw(self, module: nn.Module, args: Any) -> None:
        if id(module) not in self._seen_ids:
            self._seen_ids.add(id(module))
            self.seen.append(module)

    def __enter__(self) -> "_TrainCall":
        super().__enter__()
        # not traced by torch.compile (a graph break at each call, until the first step)
        self._forward = register_module_forward_pre_hook(torch.compiler.disable(self._saw))
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop_watching()
        super().__exit__(*exc)

    def _stop_watching(self) -> None:
        if self._forward is not None:
            self._forward.remove()
            self._forward = None
        self.seen, self._seen_ids, self.others = [], set(), []

    def accepts(self, optimizer: torch.optim.Optimizer) -> bool:
        """Return True for the optimiser that steps the received model (found at its first step)."""
        if any(optimizer is other for other in self.others):
            return False
        if self.half is None:
            return self._begin(optimizer)
        if optimizer is self.optimizer:
            return True
        if self.half.accepts(optimizer):
            raise ValueError(
                f"{self.name}: a second optimizer ({type(optimizer).__name__}) stepped the model: the client "
                "half follows one optimizer per train call (build it once, before the loop)"
            )
        return False

    def on_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Run the method's work on this step (:meth:`ClientHalf.on_step`)."""
        cast(ClientHalf, self.half).on_step(optimizer)

    # ------------------------------------------------------------------ finding the model
    def _begin(self, optimizer: torch.optim.Optimizer) -> bool:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        record = cast(ArrayRecord, self.msg.content[keys.ARRAYS])
        shapes = {k: tuple(a.shape) for k, a in record.items()}
        module = self._module({id(p) for p in params}, shapes)
        named = None if module is not None else self._named_by_value(params, record)
        if module is None and named is None:
            self.others.append(optimizer)
            return False
        self._stop_watching()
        self.half = self.cls(module, self.options, self.payload, self.state, named=named, **self.kwargs)
        self.optimizer = optimizer
        return True

    def _module(self, ids: set[int], shapes: Mapping[str, tuple[int, ...]]) -> Optional[nn.Module]:
        """Return the largest module called so far whose parameters are arrays of the
        message (same names and shapes) and include some of the optimiser's.
        """
        best, size, covered = None, 0, set()
        for root in self.seen:  # a root comes before the submodules it calls
            for module in root.modules():
                if id(module) in covered:
                    continue
                covered.add(id(module))
                named = list(module.named_parameters())
                if len(named) <= size or not any(id(p) in ids for _, p in named):
                    continue
                if all(shapes.get(k) == tuple(p.shape) for k, p in named):
                    best, size = module, len(named)
        return best

    def _named_by_value(
        self, params: list[torch.Tensor], record: ArrayRecord
    ) -> Optional["OrderedDict[str, torch.Tensor]"]:
        """Return the optimiser's parameters under the names of the message's arrays they
        equal (None when none equals any); refuse when one matches none or several.
        """
        received = record.to_torch_state_dict()
        found: dict[str, torch.Tensor] = {}
        unclear = 0
        for p in params:
            value = p.detach().cpu()
            hits = [
                k
                for k, v in received.items()
                if v.shape == value.shape and v.dtype == value.dtype and torch.equal(v, value)
            ]
            if len(hits) == 1 and hits[0] not in found:
                found[hits[0]] = p
            else:
                unclear += 1
        if not found:
            return None
        if unclear:
            raise ValueError(
                f"{self.name}: cannot tell the names of {unclear} of the optimizer's {len(params)} parameters (no "
                "nn.Module named like the message's arrays was called, and they equal no received array or "
                "several): call the model as model(x) in train()"
            )
        return OrderedDict((k, found[k]) for k in received if k in found)

    # ------------------------------------------------------------------ the reply
    def finish(self, reply: Message) -> Message:
        """Return ``reply`` with the method's records, ``num-steps`` and its metrics added
        (an error reply unchanged).

        Raises
        ------
        ValueError
            When the train function took no step on the received model.
        """
        if reply.has_error():
            return reply
        if self.half is None:
            raise ValueError(
                f"{self.name}: the train function took no optimizer step on the received model, so there is "
                f"nothing for {self.cls.method}'s reply (no training data?)"
            )
        content = reply.content
        if keys.METRICS not in content.metric_records:
            content[keys.METRICS] = MetricRecord()
        metrics = content.metric_records[keys.METRICS]
        out = self.half.output(int(cast(int, metrics.get(keys.NUM_EXAMPLES, 0))))
        records = {keys.ARRAYS: out.arrays} if out.arrays is not None else {}
        for name, tensors in {**records, **out.extras}.items():
            content[name] = numpy_to_record({k: v.detach().cpu().numpy() for k, v in tensors.items()})
        metrics[keys.NUM_STEPS] = self.half.num_steps
        for key, value in out.metrics.items():
            metrics[key] = value
        return reply


def _train_with_half(
    msg: Message, context: Context, call_next: TrainFn, method: Optional[str] = None, steps: Optional[Steps] = None
) -> Message:
    if msg.metadata.message_type.split(".")[0] != MessageType.TRAIN:
        return call_next(msg, context)
    cls = half_for(msg, method)
    if cls is None:
        return call_next(msg, context)
    with _TrainCall(cls, msg, context, steps) as call:
        reply = call_next(msg, context)
    return call.finish(reply)


@overload
def client_half(func: TrainFn, /) -> TrainFn: ...


@overload
def client_half(method: Optional[str] = None, /, *, steps: Optional[Steps] = None) -> Callable[[TrainFn], TrainFn]: ...


def client_half(
    func_or_method: Union[TrainFn, str, None] = None, /, *, steps: Optional[Steps] = None
) -> Union[TrainFn, Callable[[TrainFn], TrainFn]]:
    """Give a ClientApp's train function the client half its server's method needs.

    Placed under ``@app.train()``, over a train function written as Flower's quickstart
    writes it (load the message's ``arrays`` into a model, train it with a torch
    optimiser, reply with ``arrays`` and ``metrics``)::

        @app.train()
        @client_half
        def train(msg, context): ...

    The method is the one the train message is for (``local-rule.name``; Flower's
    ``proximal-mu``: FedProx); a message that needs none (Flower's FedAvg, ...) runs the
    function unchanged. While the function runs, every step of the optimiser that
    trains the received model goes through the method (:class:`ClientHalf`:
    SCAFFOLD's, FedProx's, FedDyn's and FedCM's gradient terms, BHerd's recorded
    gradients, FedNova's step count), and the reply gets the method's records,
    ``num-steps`` and its metrics; the reply's ``arrays`` and the function's own
    metrics are kept. How the model is found: :class:`_TrainCall`.

    Parameters
    ----------
    func_or_method
        The train function (``@client_half``), or the name of the method the function
        serves (``@client_half("BHerd")``, a key of :data:`HALVES`): a message for
        another method is then refused.
    steps
        BHerd only, needed when the server bounds the stored gradients
        (``bherd.max_stored`` > 0): the loop's local steps, or a function of the train
        message and context that returns them.

    Raises
    ------
    ValueError
        In one line, at the call: a message for a local rule without a client half, a
        missing record, a second optimiser stepping the model, a non-SGD optimiser for
        BHerd / FedNova / FedCM, no step on the received model, parameters whose names
        cannot be told.
    """
    if callable(func_or_method):
        return _with_half(func_or_method, None, None)
    method = func_or_method
    if method is not None:
        _half_named(method)  # a bad name fails here, not at the first message
    return lambda func: _with_half(func, method, steps)


def _with_half(func: TrainFn, method: Optional[str], steps: Optional[Steps]) -> TrainFn:
    @functools.wraps(func)
    def train(msg: Message, context: Context) -> Message:
        return _train_with_half(msg, context, func, method, steps)

    return train


def client_half_mod(msg: Message, context: Context, call_next: TrainFn) -> Message:
    """:func:`client_half` as a Flower mod, for a train function left as it is:
    ``@app.train(mods=[client_half_mod])`` or ``ClientApp(mods=[client_half_mod])``
    (messages other than TRAIN pass through). Flower applies mods at the ClientApp,
    so the mod takes no ``steps=`` (BHerd with ``bherd.max_stored``: use the decorator).
    """
    return _train_with_half(msg, context, call_next)
