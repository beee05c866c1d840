"""fedflex's methods as Flower strategies that drop into any Flower ServerApp.

Each class here is a :class:`~strategies.strategy.FedFlex` (so a Flower
:class:`~flwr.serverapp.strategy.FedAvg`, with its ``fraction_train``,
``fraction_evaluate``, ``min_*_nodes``, ``weighted_by_key`` and record-key options)
whose parts are one published method; the rest of the round is FedAvg. In a Flower app
the strategy line is the only change::

    strategy = HiCSFL(fraction_train=0.5)  # was: FedAvg(fraction_train=0.5)
    result = strategy.start(grid=grid, initial_arrays=arrays, num_rounds=3,
                            train_config=ConfigRecord({"lr": 0.01}))

A method's options are its options class of :mod:`fedflex.options`, the one its part
takes and a scenario nests (``strategy.sampler.hics`` is ``HiCSFL(options=HiCSOptions(...))``),
with the defaults and checks declared there; ``help(HiCSFL)`` lists them with their
defaults. The old flat keywords (``HiCSFL(hics_lambda=5)``) are read for one more release
through :data:`fedflex.options.ALIASES`, with a warning. The parts are built when the run
starts, for the nodes connected then (``num_clients`` unset) and the run's ``num_rounds``. Nodes are identified by their
partition id when they say it (fedflex's ClientApp) and by node id otherwise
(``identify``, :mod:`strategies.nodes`), so any ClientApp that follows Flower's
conventions works; the methods that need more than ``arrays`` and ``num-examples``
(SCAFFOLD, FedNova, BHerd) reject a reply without it in one line that says which client
sends it; :mod:`fedflex.clients.helpers` gives a user's own training loop those client halves.
See ``docs/flower-strategies.md``.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections import OrderedDict
from typing import Any, ClassVar, Mapping, Optional, Sequence, Union

import numpy as np

from fedflex.config import (
    AggregatorConfig,
    ClientConfig,
    InitializerConfig,
    LocalRuleConfig,
    SamplerConfig,
    ScenarioConfig,
)
from fedflex.loader import load_scenario
from fedflex.options import ALIASES, AWARE_BASES, MethodOptions
from fedflex.strategies.build import build_parts
from fedflex.strategies.parts import ModelInfo
from fedflex.strategies.strategy import FedFlex

#: the option classes of the four parts (scenario section ``strategy.<part>``)
PART_OPTIONS: dict[str, type] = {
    "sampler": SamplerConfig,
    "aggregator": AggregatorConfig,
    "initializer": InitializerConfig,
    "local_rule": LocalRuleConfig,
}
#: options every part type has that FedFlex itself owns (not a method's keyword)
_OWNED_BY_FEDFLEX = (
    "name",
    "clients_per_round",
    "min_clients",
    "clip_norm",
    "on_model_switch",
    "fixed_order",  # a client-side data-order option of every rule
)
#: Flower's server optimisers (their names in :mod:`flwr.serverapp.strategy`) -> fedflex's aggregator
FLOWER_OPTIMIZERS = {
    "FedAvg": "fedavg",
    "FedAvgM": "fedavgm",
    "FedAdam": "fedadam",
    "FedYogi": "fedyogi",
    "FedAdagrad": "fedadagrad",
}


def method_options(part: str, name: str, aware: bool = False) -> dict[str, Any]:
    """Return keyword -> default of what part ``part`` named ``name`` reads besides FedFlex's
    own options: its plain fields (``server_lr``, ``weighted``, ...) and its sections
    (``hics``: a :class:`~fedflex.options.MethodOptions` object), defaults from
    :mod:`fedflex.config` and :mod:`fedflex.options`.
    """
    cls = PART_OPTIONS[part]
    default = cls(name=name)
    if aware:
        default.aware.enabled = True
    sections = default.sections()
    read = {f.split(".")[0] for f in default.sent()}
    return {
        f.name: getattr(default, f.name)
        for f in dataclasses.fields(cls)
        if f.name not in _OWNED_BY_FEDFLEX
        and f.name in read
        and (f.name not in sections or default.section_read(f.name))
    }


def _section_of(options: MethodOptions, parts: Mapping[str, str]) -> tuple[str, str]:
    """``(part, section)`` where a strategy with ``parts`` keeps ``options``."""
    for part in parts:
        for f in dataclasses.fields(PART_OPTIONS[part]):
            if f.type == type(options).__name__ or f.type is type(options):
                return part, f.name
    raise TypeError(f"{type(options).__name__} is not an option of this strategy's parts ({', '.join(parts)})")


def _default_bias_key(arrays: "OrderedDict[str, np.ndarray]") -> Optional[str]:
    """Return the last one-dimensional float array of the model: the output layer's bias in
    the usual ``state_dict`` order.
    """
    keys = [k for k, a in arrays.items() if a.ndim == 1 and np.issubdtype(a.dtype, np.floating)]
    return keys[-1] if keys else None


class FlowerStrategy(FedFlex):
    """A fedflex method as a Flower strategy (the base of the named strategies).

    Parameters
    ----------
    num_clients
        N, the clients the per-client state is sized for. None: the nodes connected
        when the run starts (at least ``min_available_nodes``).
    rounds
        The round count for schedules that need it (HiCS-FL's temperature decay) under
        Flower's own ``Strategy.start`` loop; ``start`` passes its ``num_rounds``.
    options
        The method's options: an object of its class in :mod:`fedflex.options` (e.g.
        :class:`~fedflex.options.HiCSOptions`), or a list of them (``AWARE``: its
        :class:`~fedflex.options.AwareOptions` and the base's, e.g.
        :class:`~fedflex.options.FedAvgMOptions`).
    seed
        Seeds the parts' random generators.
    lr
        The learning rate the clients train with (BHerd's and FedCM's server steps and
        HiCS-FL's per-step estimate use it); None: fedflex's ``client.lr`` default.
    bias_key
        HiCS-FL: the output layer's bias in the model; None: the model's last 1-D float
        array.
    identify
        ``"auto"`` (default), ``"node-id"`` or ``"partition-id"``, see
        :class:`~strategies.strategy.FedFlex`.
    **kwargs
        The part's plain options (below: ``server_lr``, ``weighted``, ...), the old flat
        option names (``hics_lambda``, ``aware_momentum``, ...: a warning names the new
        spelling), then any :class:`~strategies.strategy.FedFlex` keyword (Flower's
        ``fraction_train``, ..., ``clients_per_round``, ``availability``, ...).
    """

    #: part -> the method's name for it (the others stay FedAvg's: uniform, fedavg, previous, sgd)
    PARTS: ClassVar[dict[str, str]] = {}
    #: the method's option name -> its part (filled by ``__init_subclass__``)
    OPTIONS: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.OPTIONS = {}
        defaults: dict[str, Any] = {}
        for part, name in cls.PARTS.items():
            for option, value in method_options(part, name, aware=cls._aware()).items():
                cls.OPTIONS[option] = part
                defaults[option] = value
        _document(cls, defaults)

    @classmethod
    def _aware(cls) -> bool:
        return False

    def __init__(
        self,
        *,
        options: Union[MethodOptions, Sequence[MethodOptions], None] = None,
        num_clients: Optional[int] = None,
        rounds: Optional[int] = None,
        seed: int = 0,
        lr: Optional[float] = None,
        bias_key: Optional[str] = None,
        identify: str = "auto",
        **kwargs: Any,
    ) -> None:
        given = [options] if isinstance(options, MethodOptions) else list(options or [])
        flat = {k: kwargs.pop(k) for k in list(kwargs) if k in self.OPTIONS or self._old_name(k)}
        self.choice = dict(self.PARTS)
        self.options = flat
        self.sections = given
        self.bias_key = bias_key
        self._seed, self._rounds, self._lr = seed, rounds, lr
        # a bad option fails here, with the scenario key's one-line message (ConfigError)
        self._check(num_clients, kwargs.get("clients_per_round"))
        try:
            super().__init__(
                num_clients=num_clients,
                identify=identify,
                parts_factory=self._build_parts,
                lr=lr if lr is not None else ClientConfig.lr,
                **kwargs,
            )
        except TypeError as exc:
            allowed = ", ".join(self.OPTIONS) or "none"
            raise TypeError(f"{type(self).__name__}: {exc} (the method's options: {allowed})") from None

    def _scenario(self, num_clients: int, rounds: int, clients_per_round: int) -> ScenarioConfig:
        """Return the scenario options of this method (checked by :func:`load_scenario`)."""
        strategy: dict[str, dict[str, Any]] = {part: {} for part in PART_OPTIONS}
        for part, name in self.choice.items():
            strategy[part]["name"] = name
        for option, value in self.options.items():
            strategy[self.OPTIONS.get(option) or self._option_part(option)][option] = value
        for obj in self._all_sections():
            part, section = _section_of(obj, self.choice)
            strategy[part][section] = dataclasses.asdict(obj)
        base = getattr(self, "base", None)
        if self._aware() or (isinstance(base, FlowerStrategy) and base._aware()):
            strategy["aggregator"].setdefault("aware", {})["enabled"] = True
        strategy["sampler"]["clients_per_round"] = clients_per_round
        client = {"lr": self._lr if self._lr is not None else ClientConfig.lr}
        spec = {
            "num_clients": num_clients,
            "rounds": max(rounds, 1),
            "seed": self._seed,
            "client": client,
            "strategy": strategy,
        }
        return load_scenario(spec)

    def _all_sections(self) -> list[MethodOptions]:
        return list(self.sections)

    def _old_name(self, option: str) -> bool:
        """Whether ``option`` is an old flat option name of one of this strategy's parts."""
        return any(f"strategy.{part}.{option}" in ALIASES for part in self._parts())

    def _parts(self) -> tuple[str, ...]:
        return tuple(self.PARTS)

    def _option_part(self, option: str) -> str:
        for part in self._parts():
            if f"strategy.{part}.{option}" in ALIASES:
                return part
        raise KeyError(option)

    def _check(self, num_clients: Optional[int], clients_per_round: Optional[int]) -> None:
        k = clients_per_round or 1
        self._scenario(max(num_clients or 0, k), self._rounds or 1, k)

    def _build_parts(self, num_clients: int, num_rounds: int, arrays: "OrderedDict[str, np.ndarray]"):
        rounds = num_rounds or self._rounds or 1
        k = min(self._per_round(num_clients), num_clients)
        cfg = self._scenario(num_clients, rounds, k)
        info = self.model = ModelInfo(output_bias_key=self.bias_key or _default_bias_key(arrays))
        self.local_rule = cfg.strategy.local_rule.name
        return build_parts(cfg, info)


def _document(cls: Any, defaults: dict[str, Any]) -> None:
    """Append the method's options with their defaults (from :mod:`fedflex.config`) to
    the class docstring, and give the class a signature that lists them.
    """
    if defaults:
        lines = [
            "",
            "    Method options (defaults from fedflex.options and fedflex.config; see :class:`FlowerStrategy`)",
            "    " + "-" * 30,
        ]
        for option, value in defaults.items():
            part = cls.OPTIONS[option]
            if isinstance(value, MethodOptions):
                where = f"fedflex.options.{type(value).__name__}"
                lines.append(f"    options : {type(value).__name__}, default {value!r}")
                lines.append(f"        ``strategy.{part}.{option}`` of a scenario (:class:`{where}`).")
                continue
            lines.append(f"    {option} : default {value!r}")
            where = f"fedflex.config.{PART_OPTIONS[part].__name__}"
            lines.append(f"        ``strategy.{part}.{option}`` of a scenario (:class:`{where}`).")
        cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n" + "\n".join(lines) + "\n"
    base = inspect.signature(FlowerStrategy.__init__)
    params = [p for p in base.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    params += [
        inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=v)
        for k, v in defaults.items()
        if not isinstance(v, MethodOptions)
    ]
    flex = inspect.signature(FedFlex.__init__).parameters
    skip = {"self", "sampler", "aggregator", "initializer", "server_rule", "parts_factory", "num_clients", "identify"}
    skip |= {"lr", "model"}
    params += [p for name, p in flex.items() if name not in skip and name not in defaults]
    cls.__signature__ = inspect.Signature(params[1:])


# ---------------------------------------------------------------------------- samplers
class HiCSFL(FlowerStrategy):
    """HiCS-FL: heterogeneity-guided client sampling (Chen & Vikalo, 2024,
    https://arxiv.org/abs/2310.00198).

    Estimates each client's label entropy from its output-layer bias update, clusters
    clients and samples clusters of high entropy more often. Clients: any (the update of
    the model's last bias is all it reads; ``bias_key`` names it).
    """

    PARTS = {"sampler": "hics"}


class PowerOfChoice(FlowerStrategy):
    """Power-of-Choice (Cho et al., 2020, https://arxiv.org/abs/2010.01243).

    Asks ``d`` candidates for their loss on the global model and trains the K highest.
    Clients: fedflex's ClientApp answers a loss QUERY; any other ClientApp is sent an
    EVALUATE message and its ``eval-loss`` (or Flower's ``eval_loss``) metric is read.
    """

    PARTS = {"sampler": "pow-d"}


class ClusteredSampling(FlowerStrategy):
    """Clustered Sampling (Fraboni et al., 2021, https://arxiv.org/abs/2105.05883), on
    update similarity. Clients: any.
    """

    PARTS = {"sampler": "clustered"}


class DivFL(FlowerStrategy):
    """DivFL (Balakrishnan et al., 2022, https://openreview.net/forum?id=nwKXyFvaUm):
    greedy facility location over update proxies. Clients: any (``divfl_proxies="ideal"``
    sends extra TRAIN messages every round).
    """

    PARTS = {"sampler": "divfl"}


class FedCor(FlowerStrategy):
    """FedCor (Tang et al., 2022, https://arxiv.org/abs/2103.13822): a Gaussian process
    over the clients' loss changes. Clients: loss queries as :class:`PowerOfChoice`.
    """

    PARTS = {"sampler": "fedcor"}


# ---------------------------------------------------------------------------- aggregators
class FedAWARE(FlowerStrategy):
    """FedAWARE (Zeng et al., 2024, https://arxiv.org/abs/2305.04979): per-client update
    momenta, aggregated with the min-norm weights that balance them. Clients: any.
    """

    PARTS = {"aggregator": "fedaware"}


class FedAMS(FlowerStrategy):
    """FedAMS (Wang et al., 2022, https://arxiv.org/abs/2205.02719): AMSGrad on the
    server. Clients: any.
    """

    PARTS = {"aggregator": "fedams"}


class AWARE(FlowerStrategy):
    """The AWARE plug-in (Zeng et al., 2024) around a server optimiser.

    Parameters
    ----------
    base
        The server optimiser: Flower's strategy class (or its name) ``FedAvg``,
        ``FedAvgM``, ``FedAdam``, ``FedYogi``, ``FedAdagrad``, or fedflex's aggregator
        name (``fedavg``, ``fedavgm``, ``fedadam``, ``fedyogi``, ``fedadagrad``,
        ``fedams``); its options go in ``options`` beside the
        :class:`~fedflex.options.AwareOptions` (e.g. ``[AwareOptions(momentum=0.9),
        FedAvgMOptions(momentum=0.5)]``), ``server_lr`` is a keyword. Clients: any.
    """

    PARTS = {"aggregator": "fedavg"}

    @classmethod
    def _aware(cls) -> bool:
        return True

    def __init__(self, *, base: Union[str, type] = "fedavgm", **kwargs: Any) -> None:
        name = base if isinstance(base, str) else getattr(base, "__name__", str(base))
        name = FLOWER_OPTIMIZERS.get(name, name)
        if name not in AWARE_BASES:
            allowed = ", ".join(list(FLOWER_OPTIMIZERS) + list(AWARE_BASES))
            raise ValueError(f"AWARE: base is {base!r}; allowed: {allowed}")
        self.base_name = name
        super().__init__(**kwargs)

    def _scenario(self, num_clients: int, rounds: int, clients_per_round: int) -> ScenarioConfig:
        self.choice["aggregator"] = getattr(self, "base_name", "fedavgm")
        return super()._scenario(num_clients, rounds, clients_per_round)


for _name in AWARE_BASES:  # AWARE takes every base's options
    for _option, _part in ((o, "aggregator") for o in method_options("aggregator", _name, aware=True)):
        AWARE.OPTIONS.setdefault(_option, _part)


# ---------------------------------------------------------------------------- local rules
class BHerd(FlowerStrategy):
    """BHerd (Luo et al., 2024, https://arxiv.org/abs/2402.10071), the server half: the
    global step ``w - lr / bherd_alpha x sum_i p_i g_i`` with each client's herded
    gradient sum. Clients: must send ``herd-g`` and the herding metrics (fedflex's
    ClientApp with local rule bherd, or :class:`fedflex.clients.helpers.BHerdClient` around a
    user's ``train()``); ``lr`` is the clients' learning rate.
    """

    PARTS = {"aggregator": "bherd", "local_rule": "bherd"}


class SCAFFOLD(FlowerStrategy):
    """SCAFFOLD (Karimireddy et al., 2020, https://arxiv.org/abs/1910.06378), the server
    half: the server control variate, sent with every train message. Clients: must send
    ``scaffold-dc`` (fedflex's ClientApp with local rule scaffold, or
    :class:`fedflex.clients.helpers.SCAFFOLDClient`).
    """

    PARTS = {"local_rule": "scaffold"}


class FedNova(FlowerStrategy):
    """FedNova (Wang et al., 2020, https://arxiv.org/abs/2007.07481), the server half:
    normalised averaging. Clients: must send ``fednova-d`` and ``fednova-a-norm``
    (fedflex's ClientApp with local rule fednova, :class:`fedflex.clients.helpers.FedNovaClient`
    or :func:`fedflex.clients.helpers.fednova_mod`).
    """

    PARTS = {"local_rule": "fednova"}


class FedDyn(FlowerStrategy):
    """FedDyn (Acar et al., 2021, https://arxiv.org/abs/2111.04263), the server half: the
    state h and the shifted average ``mean - h / feddyn_alpha``. Clients: the dynamic
    regulariser (fedflex's ClientApp with local rule feddyn, or
    :class:`fedflex.clients.helpers.FedDynClient`); a plain client's replies
    are taken, and the server half alone is FedAvg with h's correction.
    """

    PARTS = {"local_rule": "feddyn"}


class FedCM(FlowerStrategy):
    """FedCM (Xu et al., 2021, https://arxiv.org/abs/2106.10874), the server half: the
    global momentum Delta, sent as the ``fedcm-delta`` record with every train message.
    Clients: local steps along ``fedcm_alpha g + (1 - fedcm_alpha) Delta`` (fedflex's
    ClientApp with local rule fedcm, or :class:`fedflex.clients.helpers.FedCMClient`); ``lr`` is
    the clients' learning rate.
    """

    PARTS = {"local_rule": "fedcm"}


# ---------------------------------------------------------------------------- initializer
class SessionAware(FlowerStrategy):
    """Session-aware initialisation under churn (the churn paper's method): when the
    online set changes, the next session starts from a model built for its clients.

    Parameters
    ----------
    base
        Another named strategy (e.g. ``HiCSFL(hics_lambda=5)``) whose method runs
        inside the sessions; None: FedAvg. Its options are taken, its other keywords
        are not (give them here). Clients: any. Sessions follow the online set: the live
        nodes in a deployment, or an ``availability`` schedule (:mod:`fedflex.churn`)
        in simulation, where Flower keeps every node connected.
    """

    PARTS = {"initializer": "session-aware"}

    def __init__(self, *, base: Optional[FlowerStrategy] = None, **kwargs: Any) -> None:
        self.base = base
        super().__init__(**kwargs)

    def _scenario(self, num_clients: int, rounds: int, clients_per_round: int) -> ScenarioConfig:
        if self.base is not None:
            self.choice.update({p: n for p, n in self.base.choice.items() if p != "initializer"})
            self.options = {**self.base.options, **self.options}
        return super()._scenario(num_clients, rounds, clients_per_round)

    def _option_part(self, option: str) -> str:
        if self.base is not None and option in self.base.OPTIONS:
            return self.base.OPTIONS[option]
        return super()._option_part(option)

    def _parts(self) -> tuple[str, ...]:
        return tuple(self.PARTS) + (tuple(self.base.PARTS) if self.base is not None else ())

    def _all_sections(self) -> list[MethodOptions]:
        return (list(self.base.sections) if self.base is not None else []) + list(self.sections)


#: every named strategy, by class name
NAMED = {
    cls.__name__: cls
    for cls in (
        HiCSFL,
        PowerOfChoice,
        ClusteredSampling,
        DivFL,
        FedCor,
        FedAWARE,
        FedAMS,
        AWARE,
        BHerd,
        SCAFFOLD,
        FedNova,
        FedDyn,
        FedCM,
        SessionAware,
    )
}
