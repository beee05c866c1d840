"""The ``strategy`` section of a scenario: one options class per part type (sampler,
aggregator, initializer, local rule), each with its method sections, and what a reply
may carry.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

from fedflex.checks import ConfigError
from fedflex.checks import choice as _choice
from fedflex.checks import join as _join
from fedflex.checks import number as _num
from fedflex.options import (
    AdaptiveOptions,
    AwareOptions,
    BHerdOptions,
    ClusteredOptions,
    DivFLOptions,
    FedAMSOptions,
    FedAvgMOptions,
    FedCMOptions,
    FedCorOptions,
    FedDynOptions,
    FedProxOptions,
    HiCSOptions,
    KrumOptions,
    MethodOptions,
    PowDOptions,
    SessionAwareOptions,
    TrimmedMeanOptions,
    UniformOptions,
)

# The part names (``strategy.<part>.name``) are not listed here: each side's registry is
# the one place that names its parts (strategies/build.py SAMPLERS, AGGREGATORS,
# INITIALIZERS, SERVER_RULES; clients/rules.py LOCAL_RULES), and the composition root
# refuses a name no registry has right after loading (strategies.build.check_parts, with
# the names available). The core reads a part's name only to find its option sections.


class _PartOptions:
    """Options of one part type: a few read by every part of the type (plain fields) and
    one section per method (a :class:`~fedflex.options.MethodOptions` field, e.g.
    ``hics``), read by the parts its class names in ``PARTS``. :meth:`unused` lists the
    options set away from their default that the chosen part ignores (:func:`load_scenario`
    warns about each); :meth:`sent` the fields it reads.
    """

    name: str
    #: plain fields some parts of the type do not read -> those parts (every other part reads them)
    NOT_READ_BY: ClassVar[dict[str, tuple[str, ...]]] = {}

    def sections(self) -> dict[str, MethodOptions]:
        """Section name -> the method options it holds."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)  # type: ignore[arg-type]
            if isinstance(getattr(self, f.name), MethodOptions)
        }

    def section_read(self, section: str) -> bool:
        """Whether the chosen part reads ``section``."""
        return self.name in type(self.sections()[section]).PARTS

    def _reads(self, section: str, option: str) -> bool:
        options = self.sections()[section]
        return self.section_read(section) and self.name in options.readers(option) + self._extra_readers(section)

    def _extra_readers(self, section: str) -> tuple[str, ...]:
        return ()

    def unused(self) -> list[tuple[str, Any, tuple[str, ...]]]:
        """``(option, value, the parts that read it)`` for every option set away from its
        default that the chosen part ignores; section options are dotted (``hics.temperature``).
        """
        default = type(self)()
        out: list[tuple[str, Any, tuple[str, ...]]] = [
            (option, getattr(self, option), ("all but " + ", ".join(ignored),))
            for option, ignored in self.NOT_READ_BY.items()
            if getattr(self, option) != getattr(default, option) and self.name in ignored
        ]
        for section, options in self.sections().items():
            for option, value in options.changed().items():
                if not self._reads(section, option):
                    out.append((f"{section}.{option}", value, self._readers(section, option)))
        return out

    def _readers(self, section: str, option: str) -> tuple[str, ...]:
        return self.sections()[section].readers(option)

    def sent(self) -> list[str]:
        """Return the fields the chosen part reads (what a train message needs to carry), section
        fields dotted.
        """
        out = [
            f.name
            for f in dataclasses.fields(self)  # type: ignore[arg-type]
            if f.name not in self.sections() and self.name not in self.NOT_READ_BY.get(f.name, ())
        ]
        for section, options in self.sections().items():
            out += [f"{section}.{f.name}" for f in dataclasses.fields(options) if self._reads(section, f.name)]
        return out

    def validate_sections(self, path: str) -> None:
        for section, options in self.sections().items():
            options.validate(_join(path, section))


@dataclass
class SamplerConfig(_PartOptions):
    """Who trains each round: ``clients_per_round`` (K) drawn from the online clients.

    ``name``: ``uniform`` (without replacement; ``uniform.weighted``: proportional to data
    size), ``hics`` (HiCS-FL, :class:`~fedflex.options.HiCSOptions`), ``pow-d``
    (Power-of-Choice, ``powd.d``), ``clustered`` (Clustered Sampling on update similarity),
    ``divfl`` (DivFL), ``fedcor`` (FedCor); each method's options are its section
    (:mod:`fedflex.options`).

    ``clients_per_round``: unset, 5 (or ``num_clients`` when there are fewer); a value
    above ``num_clients`` is refused. ``explore_first``: online clients that never trained
    are drawn first (shuffled, without replacement), then the named sampler draws
    (FedAWARE's exploration phase: every client has a momentum after about N/K rounds
    instead of ~(N/K) ln N).
    """

    name: str = "uniform"
    clients_per_round: Optional[int] = None  # unset: 5, or num_clients when fewer
    min_clients: int = 1
    explore_first: bool = False
    uniform: UniformOptions = field(default_factory=UniformOptions)
    hics: HiCSOptions = field(default_factory=HiCSOptions)
    powd: PowDOptions = field(default_factory=PowDOptions)
    clustered: ClusteredOptions = field(default_factory=ClusteredOptions)
    divfl: DivFLOptions = field(default_factory=DivFLOptions)
    fedcor: FedCorOptions = field(default_factory=FedCorOptions)

    def validate(self, path: str) -> None:
        """Check this section's values; raise :class:`ConfigError` naming the key under ``path``."""
        _num(path, "clients_per_round", self.clients_per_round, ge=1)
        _num(path, "min_clients", self.min_clients, ge=1)
        if self.clients_per_round is not None and self.min_clients > self.clients_per_round:
            raise ConfigError(
                _join(path, "min_clients"),
                self.min_clients,
                f"must be <= clients_per_round ({self.clients_per_round})",
            )
        self.validate_sections(path)


@dataclass
class AggregatorConfig(_PartOptions):
    """How replies become the next model.

    - ``fedavg``: x <- x + ``server_lr`` (avg_i x_i - x), avg weighted by examples
      (``weighted``) or plain.
    - ``fedavgm`` / ``fedadam`` / ``fedyogi`` / ``fedadagrad``: server optimisers on the
      pseudo-gradient x - avg_i x_i (Hsu et al., 2019; Reddi et al., 2021): ``server_lr``,
      ``fedavgm.momentum``, ``adaptive.beta1`` / ``beta2`` / ``tau``.
    - ``fedams``: FedAMS (Wang et al., 2022): Adam's moments with v_hat = max(v_hat, v)
      (AMSGrad); ``adaptive.*`` and ``fedams.epsilon_at``.
    - ``fedaware``: FedAWARE (Zeng et al.): per-client momenta, min-norm weights by
      Frank-Wolfe; options in ``aware`` (:class:`~fedflex.options.AwareOptions`).
    - ``bherd``: BHerd's server step w - (eta / alpha) sum_i p_i g_i.
    - Byzantine-robust (Flower's own functions, ``strategies/robust.py``): ``median``
      (coordinate-wise median), ``trimmed-mean`` (cut ``trimmed_mean.beta`` of each tail
      per coordinate), ``krum`` / ``multikrum`` (Blanchard et al., 2017: the reply, or the
      ``krum.num_selected`` replies (null: n - f), closest to their n - f - 2 nearest
      neighbours; multikrum averages them by examples when ``weighted``), ``bulyan``
      (El Mhamdi et al., 2018: multikrum selection, then a coordinate-wise trimmed mean
      around the median); ``krum.num_malicious`` is f, the Byzantine clients to tolerate.
      Each steps x <- x + ``server_lr`` (agg - x).
    ``clip_norm`` (any aggregator but bherd): each client's update (reply - global model,
    float arrays) is scaled down to at most this L2 norm before the parts see it.
    ``aware.enabled: true`` adds the AWARE projection to a server optimiser (plug-in).
    ``on_model_switch``: what server-optimiser state does when an initializer replaces
    the model (``keep`` or ``reset``).
    """

    name: str = "fedavg"
    weighted: bool = True
    server_lr: float = 1.0
    on_model_switch: str = "keep"
    clip_norm: Optional[float] = None  # max L2 norm of a client's update (null: no clipping)
    fedavgm: FedAvgMOptions = field(default_factory=FedAvgMOptions)
    adaptive: AdaptiveOptions = field(default_factory=AdaptiveOptions)
    fedams: FedAMSOptions = field(default_factory=FedAMSOptions)
    aware: AwareOptions = field(default_factory=AwareOptions)
    trimmed_mean: TrimmedMeanOptions = field(default_factory=TrimmedMeanOptions)
    krum: KrumOptions = field(default_factory=KrumOptions)

    NOT_READ_BY: ClassVar[dict[str, tuple[str, ...]]] = {
        # median, trimmed-mean, krum and bulyan weigh every reply alike
        "weighted": ("median", "trimmed-mean", "krum", "bulyan"),
    }

    def section_read(self, section: str) -> bool:
        """Whether the chosen aggregator reads ``section`` (the AWARE plug-in reads ``aware`` around any base)."""
        return super().section_read(section) or (section == "aware" and self.aware.enabled)

    def _extra_readers(self, section: str) -> tuple[str, ...]:
        return (self.name,) if section == "aware" and self.aware.enabled else ()

    def _readers(self, section: str, option: str) -> tuple[str, ...]:
        readers = super()._readers(section, option)
        return readers + ("aware.enabled=true",) if section == "aware" else readers

    def validate(self, path: str) -> None:
        """Check this section's values; raise :class:`ConfigError` naming the key under ``path``."""
        _num(path, "server_lr", self.server_lr, gt=0)
        _choice(path, "on_model_switch", self.on_model_switch, ("keep", "reset"))
        _num(path, "clip_norm", self.clip_norm, gt=0, optional=True)
        self.validate_sections(path)


@dataclass
class InitializerConfig(_PartOptions):
    """Where a session starts after churn (the churn paper's plug-in and baselines).

    - ``previous``: continue from the latest global model;
    - ``average``: the plain mean of the stored last models of earlier sessions;
    - ``session-aware``: softmin(-R d) weights over the stored last models, d the distance
      between session gradients; options in ``session_aware``
      (:class:`~fedflex.options.SessionAwareOptions`, docs/session-init.md).
    """

    name: str = "previous"
    session_aware: SessionAwareOptions = field(default_factory=SessionAwareOptions)

    def validate(self, path: str) -> None:
        """Check this section's values; raise :class:`ConfigError` naming the key under ``path``."""
        self.validate_sections(path)


@dataclass
class LocalRuleConfig(_PartOptions):
    """What a client sends.

    - ``sgd``: plain local training; ``fedprox``: + ``fedprox.mu``/2 ||w - w_g||^2;
    - ``scaffold``: control variates (Karimireddy et al., 2020), client variates kept in
      the node's state; ``fednova``: normalised averaging (Wang et al., 2020; with
      aggregator ``fedavg``, or a server optimiser for FedNova with server momentum);
    - ``bherd``: herding selection of the local gradients (Luo et al., 2024; options in
      ``bherd``, :class:`~fedflex.options.BHerdOptions`); the server steps with
      ``eta / bherd.alpha`` times their weighted sum (aggregator ``bherd``).
    - ``grab``: GraB-FedAvg, online balancing of the local gradients (aggregator ``bherd``).
    - ``feddyn``: FedDyn (Acar et al., 2021), ``feddyn.alpha``; the server keeps h and
      shifts the average by -h / alpha (``strategies/feddyn.py``).
    - ``fedcm``: FedCM (Xu et al., 2021), ``fedcm.alpha``; Delta the server's global momentum.

    ``fixed_order``: the same batch order every round (any local rule; BHerd's
    experiments). The rule's server half sends the options its rule reads (:meth:`sent`)
    with every train message (:func:`fedflex.records.to_record` under ``local-rule``); the
    client reads this class back (:func:`fedflex.records.from_record`).
    """

    name: str = "sgd"
    fixed_order: bool = False
    fedprox: FedProxOptions = field(default_factory=FedProxOptions)
    bherd: BHerdOptions = field(default_factory=BHerdOptions)
    feddyn: FedDynOptions = field(default_factory=FedDynOptions)
    fedcm: FedCMOptions = field(default_factory=FedCMOptions)

    def validate(self, path: str) -> None:
        """Check this section's values; raise :class:`ConfigError` naming the key under ``path``."""
        self.validate_sections(path)


@dataclass
class ReplyConfig:
    """Limits every training reply is checked against before aggregation
    (``strategies/replies.py``); a reply that breaks one is dropped from its round.

    ``max_num_examples``: null bounds a client's ``num-examples`` by the examples it holds
    (its partition, which the server computes from the same task as the clients); a number
    bounds every client by it instead (for federations whose nodes hold data the server
    does not know). ``max_reply_mb``: the most MB (2^20 bytes) of arrays and values one
    reply may carry; null: 4 x the model's size + 1 MB (a normal reply is the model plus
    at most two model-shaped records).
    """

    max_num_examples: Optional[int] = None
    max_reply_mb: Optional[float] = None

    def validate(self, path: str) -> None:
        """Check this section's values; raise :class:`ConfigError` naming the key under ``path``."""
        _num(path, "max_num_examples", self.max_num_examples, ge=1, optional=True)
        _num(path, "max_reply_mb", self.max_reply_mb, gt=0, optional=True)


@dataclass
class StrategyConfig:
    """The ``strategy`` section: one sub-section per part (sampler, aggregator, initializer, local rule)."""

    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    aggregator: AggregatorConfig = field(default_factory=AggregatorConfig)
    initializer: InitializerConfig = field(default_factory=InitializerConfig)
    local_rule: LocalRuleConfig = field(default_factory=LocalRuleConfig)
    replies: ReplyConfig = field(default_factory=ReplyConfig)

    def validate(self, path: str) -> None:
        """Check this section's values; raise :class:`ConfigError` naming the key under ``path``."""
        for f in dataclasses.fields(self):
            getattr(self, f.name).validate(_join(path, f.name))
