"""fedflex's methods as Flower strategies that drop into any Flower ServerApp.

Each class here is a :class:`~strategies.fedflex.FedFlex` (so a Flower
:class:`~flwr.serverapp.strategy.FedAvg`, with its ``fraction_train``,
``fraction_evaluate``, ``min_*_nodes``, ``weighted_by_key`` and record-key options)
whose parts are one published method; the rest of the round is FedAvg. In a Flower app
the strategy line is the only change::

    strategy = HiCSFL(fraction_train=0.5)  # was: FedAvg(fraction_train=0.5)
    result = strategy.start(grid=grid, initial_arrays=arrays, num_rounds=3,
                            train_config=ConfigRecord({"lr": 0.01}))

The method's keywords are the scenario options of its part, declared once in
:mod:`fedflex.config` (``strategy.sampler.hics_lambda`` is ``HiCSFL(hics_lambda=...)``),
with the defaults and checks declared there; ``help(HiCSFL)`` lists them with their
defaults. The parts are built when the run starts, for the nodes connected then
(``num_clients`` unset) and the run's ``num_rounds``. Nodes are identified by their
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
from typing import Any, ClassVar, Optional, Union

import numpy as np

from fedflex.config import (
    AggregatorConfig,
    ClientConfig,
    InitializerConfig,
    LocalRuleConfig,
    SamplerConfig,
    ScenarioConfig,
    load_scenario,
)
from fedflex.strategies.build import ModelInfo, build_parts
from fedflex.strategies.fedaware import AWARE_BASES
from fedflex.strategies.fedflex import FedFlex

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
    "aware",
    "bherd_fixed_order",  # a client-side data-order option of every rule
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
    """Option name -> default of the options part ``part`` named ``name`` reads (the
    fields of its class in :mod:`fedflex.config`, defaults from there).
    """
    cls = PART_OPTIONS[part]
    default = cls(name=name, **({"aware": True} if aware else {}))
    return {
        f.name: getattr(default, f.name)
        for f in dataclasses.fields(cls)
        if f.name not in _OWNED_BY_FEDFLEX and default._reads(f.name)
    }


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
        :class:`~strategies.fedflex.FedFlex`.
    **kwargs
        The method's options (below), then any :class:`~strategies.fedflex.FedFlex`
        keyword (Flower's ``fraction_train``, ..., ``clients_per_round``,
        ``availability``, ...).
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
        num_clients: Optional[int] = None,
        rounds: Optional[int] = None,
        seed: int = 0,
        lr: Optional[float] = None,
        bias_key: Optional[str] = None,
        identify: str = "auto",
        **kwargs: Any,
    ) -> None:
        options = {k: kwargs.pop(k) for k in list(kwargs) if k in self.OPTIONS}
        self.choice = dict(self.PARTS)
        self.options = options
        self.bias_key = bias_key
        self._seed, self._rounds, self._lr = seed, rounds, lr
        # a bad option fails here, with the scenario key's one-line message (ConfigError)
        self._check(num_clients, kwargs.get("clients_per_round"))
        try:
            super().__init__(num_clients=num_clients, identify=identify, parts_factory=self._build_parts, **kwargs)
        except TypeError as exc:
            allowed = ", ".join(self.OPTIONS) or "none"
            raise TypeError(f"{type(self).__name__}: {exc} (the method's options: {allowed})") from None

    def _scenario(self, num_clients: int, rounds: int, clients_per_round: int) -> ScenarioConfig:
        """Return the scenario options of this method (checked by :func:`load_scenario`)."""
        strategy: dict[str, dict[str, Any]] = {part: {} for part in PART_OPTIONS}
        for part, name in self.choice.items():
            strategy[part]["name"] = name
        base = getattr(self, "base", None)
        if self._aware() or (isinstance(base, FlowerStrategy) and base._aware()):
            strategy["aggregator"]["aware"] = True
        for option, value in self.options.items():
            strategy[self.OPTIONS.get(option) or self._option_part(option)][option] = value
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

    def _option_part(self, option: str) -> str:
        raise KeyError(option)

    def _check(self, num_clients: Optional[int], clients_per_round: Optional[int]) -> None:
        k = clients_per_round or 1
        self._scenario(max(num_clients or 0, k), self._rounds or 1, k)

    def _build_parts(self, num_clients: int, num_rounds: int, arrays: "OrderedDict[str, np.ndarray]"):
        rounds = num_rounds or self._rounds or 1
        k = min(self._per_round(num_clients), num_clients)
        cfg = self._scenario(num_clients, rounds, k)
        info = ModelInfo(output_bias_key=self.bias_key or _default_bias_key(arrays))
        self.local_rule = cfg.strategy.local_rule.name
        return build_parts(cfg, info)


def _document(cls: Any, defaults: dict[str, Any]) -> None:
    """Append the method's options with their defaults (from :mod:`fedflex.config`) to
    the class docstring, and give the class a signature that lists them.
    """
    if defaults:
        lines = [
            "",
            "    Method options (defaults from fedflex.config; see :class:`FlowerStrategy` for the rest)",
            "    " + "-" * 30,
        ]
        for option, value in defaults.items():
            part = cls.OPTIONS[option]
            lines.append(f"    {option} : default {value!r}")
            where = f"fedflex.config.{PART_OPTIONS[part].__name__}"
            lines.append(f"        ``strategy.{part}.{option}`` of a scenario (:class:`{where}`).")
        cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n" + "\n".join(lines) + "\n"
    base = inspect.signature(FlowerStrategy.__init__)
    params = [p for p in base.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    params += [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=v) for k, v in defaults.items()]
    flex = inspect.signature(FedFlex.__init__).parameters
    skip = {"self", "sampler", "aggregator", "initializer", "server_rule", "parts_factory", "num_clients", "identify"}
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
        ``fedams``); its options (``server_momentum``, ``beta1``, ``beta2``, ``tau``,
        ``server_lr``) are keywords here too. Clients: any.
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
