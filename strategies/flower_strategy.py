"""The base of the named Flower strategies: one fedflex method as a Flower strategy.

A :class:`FlowerStrategy` is a :class:`~strategies.strategy.FedFlex` (so a Flower
:class:`~flwr.serverapp.strategy.FedAvg`) whose four parts are FedAvg's (uniform
sampling, the weighted mean, the previous model, plain local SGD) except those its
method replaces. Each method is one module beside its part (``hics_strategy.py`` beside
``hics.py``, ...), a subclass that overrides the ``build_*`` method of each part it
changes. A method's options are its option classes of :mod:`fedflex.options`, checked at
construction by their own ``validate`` (a :class:`~fedflex.checks.ConfigError` naming the
scenario key, ``strategy.sampler.hics.temperature``); the parts are built when the run
starts, for the nodes connected then (``num_clients`` unset) and the run's ``num_rounds``,
from the same constructors and seeds as a scenario's (:mod:`strategies.build`).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections import OrderedDict
from typing import Any, ClassVar, Optional, Sequence, TypeVar, Union, cast

import numpy as np

from fedflex.checks import ConfigError, number
from fedflex.config import AggregatorConfig, ClientConfig, LocalRuleConfig
from fedflex.options import ALIASES, MethodOptions, UniformOptions
from fedflex.strategies.baseline import ExploreFirstSampler, FedAvgAggregator, PreviousInitializer, UniformSampler
from fedflex.strategies.build import SAMPLERS
from fedflex.strategies.parts import Aggregator, Federation, Initializer, ModelInfo, Sampler, ServerRule
from fedflex.strategies.strategy import FedFlex

T = TypeVar("T", bound=MethodOptions)

#: what a method's ``options`` keyword takes: one options object or a list of them
OptionsArg = Union[MethodOptions, Sequence[MethodOptions], None]

#: FedFlex keywords a named strategy sets itself (its parts, its local rule, its model, ...)
_SET_BY_THE_STRATEGY = (
    "self",
    "sampler",
    "aggregator",
    "initializer",
    "server_rule",
    "parts_factory",
    "local_rule",
    "model",
    "num_clients",
    "lr",
)


def default_bias_key(arrays: "OrderedDict[str, np.ndarray]") -> Optional[str]:
    """Return the last one-dimensional float array of the model: the output layer's bias in
    the usual ``state_dict`` order.
    """
    keys = [k for k, a in arrays.items() if a.ndim == 1 and np.issubdtype(a.dtype, np.floating)]
    return keys[-1] if keys else None


def check_integer(key: str, value: Any, ge: int, optional: bool = False) -> None:
    """``value`` must be an integer >= ``ge`` (None only when ``optional``); else a
    :class:`~fedflex.checks.ConfigError` naming ``key``.
    """
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfigError(key, value, "must be an integer")
    number("", key, int(value), ge=ge)


def check_bool(key: str, value: Any) -> None:
    """``value`` must be True or False; else a :class:`~fedflex.checks.ConfigError` naming ``key``."""
    if not isinstance(value, bool):
        raise ConfigError(key, value, "must be true or false")


def check_aggregation(server_lr: Any, weighted: Any) -> None:
    """Check the aggregator's plain options (``strategy.aggregator.server_lr`` / ``weighted``)."""
    number("strategy.aggregator", "server_lr", server_lr, gt=0)
    check_bool("strategy.aggregator.weighted", weighted)


class FlowerStrategy(FedFlex):
    """A fedflex method as a Flower strategy: the base of the named strategies.

    Subclasses name their option classes in :attr:`OPTIONS` and override the ``build_*``
    method of each part their method changes; the others are FedAvg's.

    Parameters
    ----------
    options
        The method's options: an object of one of its option classes in
        :mod:`fedflex.options` (:attr:`OPTIONS`), or a list of them, each class at most
        once; the classes not given take their defaults. Checked here by their own
        ``validate``: a bad value raises :class:`~fedflex.checks.ConfigError` naming the
        scenario key (``strategy.sampler.hics.temperature = -1.0: must be > 0``).
    num_clients
        N, the clients the per-client state is sized for. None: the nodes connected when
        the run starts (at least ``min_available_nodes``).
    rounds
        The round count for schedules that need it (HiCS-FL's annealing) under Flower's
        own ``Strategy.start`` loop (a DP wrapper's); :meth:`start` passes its ``num_rounds``.
    seed
        Seeds the parts' random generators (each part adds its offset, as in a scenario).
    lr
        The learning rate the clients train with, for the server steps that need it
        (BHerd, FedCM, HiCS-FL's ``per-step`` estimate). None: the app's
        ``train_config["lr"]`` when it sends one, else fedflex's ``client.lr`` default.
    **kwargs
        :class:`~strategies.strategy.FedFlex`'s keywords: Flower's FedAvg options
        (``fraction_train``, ``fraction_evaluate``, ``min_train_nodes``,
        ``min_evaluate_nodes``, ``min_available_nodes``, ``weighted_by_key``,
        ``arrayrecord_key``, ``configrecord_key``, ``train_metrics_aggr_fn``,
        ``evaluate_metrics_aggr_fn``) and fedflex's (``clients_per_round``,
        ``min_clients``, ``availability``, ``identify``, ``clip_norm``, ...). Any other
        keyword raises a one-line :class:`TypeError` naming it and the allowed ones.
    """

    #: the method's option classes -> the scenario section that holds each (its errors' key)
    OPTIONS: ClassVar[dict[type[MethodOptions], str]] = {}
    #: the local rule whose client half the method's server half expects (``sgd``: none)
    LOCAL_RULE: ClassVar[str] = "sgd"
    #: HiCS-FL's output-layer bias (None: the model's last 1-D float array)
    bias_key: Optional[str] = None

    def __init__(
        self,
        *,
        options: OptionsArg = None,
        num_clients: Optional[int] = None,
        rounds: Optional[int] = None,
        seed: int = 0,
        lr: Optional[float] = None,
        **kwargs: Any,
    ) -> None:
        self._check_keywords(kwargs)
        check_integer("num_clients", num_clients, ge=1, optional=True)
        check_integer("rounds", rounds, ge=1, optional=True)
        check_integer("seed", seed, ge=0)
        number("client", "lr", lr, gt=0, optional=True)
        self.method_options = self._take_options(options)
        self._seed, self.rounds = int(seed), rounds  # rounds: see strategies.privacy
        super().__init__(
            num_clients=num_clients,
            lr=lr,
            local_rule=self.LOCAL_RULE,
            parts_factory=self._build_parts,
            **kwargs,
        )

    # ------------------------------------------------------------------ options
    def option_classes(self) -> dict[type[MethodOptions], str]:
        """Return the option classes this strategy takes -> their scenario section."""
        return dict(self.OPTIONS)

    def option(self, cls: type[T]) -> T:
        """Return the (checked) options of class ``cls``: the ones given, else its defaults."""
        return cast(T, self.method_options[cls])

    def _take_options(self, options: OptionsArg) -> dict[type[MethodOptions], MethodOptions]:
        """Return option class -> a checked copy of the given object (its defaults when not given)."""
        name, classes = type(self).__name__, self.option_classes()
        takes = ", ".join(c.__name__ for c in classes) or "none"
        given = [options] if isinstance(options, MethodOptions) else list(options or [])
        taken: dict[type[MethodOptions], MethodOptions] = {}
        for obj in given:
            if type(obj) not in classes:
                raise TypeError(f"{name}: options={obj!r} is not one of its option classes ({takes})")
            if type(obj) in taken:
                raise TypeError(f"{name}: options has two {type(obj).__name__} objects; give one")
            taken[type(obj)] = obj
        out: dict[type[MethodOptions], MethodOptions] = {}
        for cls, path in classes.items():
            obj = dataclasses.replace(taken[cls]) if cls in taken else cls()
            obj.validate(path)
            out[cls] = obj
        return out

    def _check_keywords(self, kwargs: dict[str, Any]) -> None:
        """Raise a one-line TypeError for a keyword neither this strategy nor FedFlex takes."""
        passed = [p for p in inspect.signature(FedFlex.__init__).parameters if p not in _SET_BY_THE_STRATEGY]
        unknown = [k for k in kwargs if k not in passed]
        if not unknown:
            return
        mro = [c for c in type(self).__mro__ if issubclass(c, FlowerStrategy)]
        inits = [vars(c)["__init__"] for c in mro if "__init__" in vars(c)]
        own = list(
            dict.fromkeys(
                p.name
                for init in inits
                for p in inspect.signature(init).parameters.values()
                if p.kind is inspect.Parameter.KEYWORD_ONLY
            )
        )
        name = type(self).__name__
        hints = [hint for hint in (self._old_keyword(k) for k in unknown) if hint]
        raise TypeError(
            f"{name} got an unexpected keyword argument {', '.join(repr(k) for k in unknown)}"
            + (f" ({'; '.join(hints)})" if hints else "")
            + f"; {name} takes {', '.join(own)} and FedFlex's {', '.join(passed)}"
        )

    def _old_keyword(self, keyword: str) -> Optional[str]:
        """Where the first release's flat keyword ``keyword`` went, when it is one of this strategy's options."""
        for part in ("sampler", "aggregator", "initializer", "local_rule"):
            for new in ALIASES.get(f"strategy.{part}.{keyword}", ()):
                section, _, field = new.rpartition(".")
                for cls, path in self.option_classes().items():
                    if path == section:
                        return f"the first release's {keyword} is options={cls.__name__}({field}=...)"
        return None

    # ------------------------------------------------------------------ parts
    def _build_parts(
        self, num_clients: int, num_rounds: int, arrays: "OrderedDict[str, np.ndarray]"
    ) -> tuple[Sampler, Aggregator, Initializer, ServerRule]:
        """FedFlex's ``parts_factory``: the four parts for ``num_clients`` clients and ``num_rounds`` rounds."""
        self.model = ModelInfo(output_bias_key=self.bias_key or default_bias_key(arrays))
        federation = Federation(
            num_clients=num_clients,
            rounds=max(num_rounds or self.rounds or 1, 1),
            clients_per_round=min(self._per_round(num_clients), num_clients),
            seed=self._seed,
            lr=self.lr if self.lr is not None else ClientConfig.lr,
            model=self.model,
        )
        return (
            self.build_sampler(federation),
            self.build_aggregator(federation),
            self.build_initializer(federation),
            self.build_server_rule(federation),
        )

    def build_sampler(self, federation: Federation) -> Sampler:
        """Return the sampler: FedAvg's uniform draw unless the method replaces it."""
        return UniformSampler.build(UniformOptions(), federation)

    def build_aggregator(self, federation: Federation) -> Aggregator:
        """Return the aggregator: FedAvg's weighted mean unless the method replaces it."""
        return FedAvgAggregator(weighted=AggregatorConfig.weighted, server_lr=AggregatorConfig.server_lr)

    def build_initializer(self, federation: Federation) -> Initializer:
        """Return the initializer: the previous model unless the method replaces it."""
        return PreviousInitializer()

    def build_server_rule(self, federation: Federation) -> ServerRule:
        """Return the local rule's server half: plain SGD's unless the method replaces it."""
        return ServerRule(LocalRuleConfig(name="sgd"))

    @staticmethod
    def with_explore_first(sampler: Sampler, federation: Federation, explore_first: bool) -> Sampler:
        """Return ``sampler``, behind the explore-first draw (``strategy.sampler.explore_first``) when asked."""
        return ExploreFirstSampler(sampler, seed=federation.seed_of("explore-first")) if explore_first else sampler


class SamplerMethod(FlowerStrategy):
    """FedAvg with the sampler class :attr:`SAMPLER` (its options class is the
    strategy's), behind the explore-first draw when asked: the base of the named sampler
    strategies (:class:`~strategies.hics_strategy.HiCSFL`, ...) and of
    :class:`SamplerStrategy`.

    Parameters
    ----------
    options : MethodOptions, optional
        The sampler's options (``strategy.sampler.<section>``). None: the defaults.
    explore_first : bool, default False
        Online clients that never trained are drawn first (``strategy.sampler.explore_first``).
    num_clients, rounds, seed, lr, **kwargs
        As :class:`FlowerStrategy`'s.
    """

    #: the sampler class (a named strategy's; :class:`SamplerStrategy` sets it per object)
    SAMPLER: type[Sampler] = UniformSampler

    def __init__(
        self,
        *,
        options: OptionsArg = None,
        explore_first: bool = False,
        num_clients: Optional[int] = None,
        rounds: Optional[int] = None,
        seed: int = 0,
        lr: Optional[float] = None,
        **kwargs: Any,
    ) -> None:
        check_bool("strategy.sampler.explore_first", explore_first)
        self.explore_first = explore_first
        super().__init__(options=options, num_clients=num_clients, rounds=rounds, seed=seed, lr=lr, **kwargs)

    def option_classes(self) -> dict[type[MethodOptions], str]:
        """Return the sampler's options class -> its scenario section."""
        cls = self.SAMPLER
        return {cls.OPTIONS: f"strategy.sampler.{cls.section()}"} if cls.OPTIONS is not None else {}

    def build_sampler(self, federation: Federation) -> Sampler:
        """Return the sampler (:meth:`~strategies.parts.Sampler.build`), behind the explore-first draw when asked."""
        cls = self.SAMPLER
        options = self.option(cls.OPTIONS) if cls.OPTIONS is not None else None
        return self.with_explore_first(cls.build(options, federation), federation, self.explore_first)


class SamplerStrategy(SamplerMethod):
    """FedAvg with any registered sampler, by name: ``SamplerStrategy(sampler="pow-d",
    options=PowDOptions(d=4))`` (a name of :data:`strategies.build.SAMPLERS`, the options
    object of its class's :attr:`~strategies.parts.Sampler.OPTIONS`), behind the
    explore-first draw when asked. A sampler added by its module and its registry line is
    reachable here without another edit.

    Parameters
    ----------
    sampler : str, default "uniform"
        The sampler's name (``strategy.sampler.name``).
    options : MethodOptions, optional
        The sampler's options (``strategy.sampler.<section>``). None: the defaults.
    explore_first : bool, default False
        Online clients that never trained are drawn first (``strategy.sampler.explore_first``).
    num_clients : int, optional
        N; None: the nodes connected when the run starts.
    rounds : int, optional
        The run's round count under a loop that does not say it.
    seed : int, default 0
        Seeds the sampler (as a scenario's ``seed``).
    lr : float, optional
        The clients' learning rate, for samplers that read it.
    **kwargs
        Flower's FedAvg options and FedFlex's (``clients_per_round``, ``availability``,
        ...): see :class:`FlowerStrategy`.
    """

    def __init__(self, *, sampler: str = "uniform", **kwargs: Any) -> None:
        if sampler not in SAMPLERS:
            raise ConfigError("strategy.sampler.name", sampler, "must be one of " + ", ".join(SAMPLERS))
        self.SAMPLER = SAMPLERS[sampler]
        super().__init__(**kwargs)
