"""Each method's options, declared once: one dataclass per method with its fields,
defaults, allowed values and checks.

A scenario nests them under the part that reads them (``strategy.sampler.hics.temperature``,
``strategy.aggregator.aware.momentum``, ``strategy.local_rule.feddyn.alpha``); the part's
constructor (``strategies/``) and the named Flower strategy of the method take the same
object. ``PARTS`` names the parts (``strategy.<part>.name`` values) that read a class's
options: a section set away from its defaults while another part is chosen is warned
about at load (:func:`fedflex.loader.warn_unused`), and ``FIELD_PARTS`` narrows a field
to fewer parts. Adding a hyper-parameter to a method is one field here (with its check in
``validate``) plus its use in the part.

Old flat keys (``strategy.sampler.hics_estimate``, ``strategy.aggregator.aware_momentum``,
``strategy.local_rule.feddyn_alpha``, ...) are read for one more release through
:data:`ALIASES`, with a warning naming the new spelling.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Optional, TypeVar

from fedflex.checks import ConfigError, choice, number

T = TypeVar("T", bound="MethodOptions")

FLOAT_DTYPES = ("float32", "float16", "bfloat16")


@dataclass
class MethodOptions:
    """Base of the method options classes (no fields of its own)."""

    #: the part names (``strategy.<part>.name``) that read these options
    PARTS: ClassVar[tuple[str, ...]] = ()
    #: fields read by fewer parts than ``PARTS``
    FIELD_PARTS: ClassVar[dict[str, tuple[str, ...]]] = {}

    def validate(self, path: str) -> None:
        """Raise :class:`~fedflex.checks.ConfigError` for a value that is not allowed."""

    @classmethod
    def readers(cls, field_name: str) -> tuple[str, ...]:
        """Return the part names that read ``field_name``."""
        return cls.FIELD_PARTS.get(field_name, cls.PARTS)

    def changed(self) -> dict[str, Any]:
        """Field -> value for every field set away from its default."""
        default = type(self)()
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        }


def resolve_options(cls: type[T], options: Optional[T], fields: Mapping[str, Any], path: str) -> T:
    """Return the options a part constructor works with: ``options``, or an object of ``cls``
    made of the keyword ``fields`` (the defaults of ``cls`` for the others); checked,
    errors naming ``path`` (the scenario section, e.g. ``strategy.sampler.hics``).
    """
    if options is not None and fields:
        raise TypeError(f"give either options= or {cls.__name__}'s fields ({', '.join(fields)}), not both")
    if options is None:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - names)
        if unknown:
            raise TypeError(f"{cls.__name__} has no option {', '.join(unknown)} (options: {', '.join(sorted(names))})")
        options = cls(**fields)
    options.validate(path)
    return options


# ---------------------------------------------------------------------------- samplers
HICS_ESTIMATES = ("bias", "unit", "per-step")  # what HiCS-FL's entropy is taken of
HICS_REFRESH = ("every-round", "frozen")
#: HiCS-FL's temperature per estimate when unset (``bias``: the paper's 0.0025)
DEFAULT_TEMPERATURE = {"bias": 0.0025, "unit": 0.2, "per-step": 0.1}
WARD_MODES = ("exact", "scalable")


@dataclass
class UniformOptions(MethodOptions):
    """Uniform sampling: ``weighted`` draws proportionally to data size."""

    PARTS: ClassVar[tuple[str, ...]] = ("uniform",)

    weighted: bool = False


@dataclass
class HiCSOptions(MethodOptions):
    """HiCS-FL (Chen & Vikalo, 2024): the entropy estimate from the output-layer bias
    update at ``temperature``, distance angle + ``entropy_weight`` (the paper's lambda) x
    entropy gap, Ward clustering into ``num_clusters`` (0: K) groups, cluster softmax with
    gamma_t = ``gamma0`` (1 - t/T).

    ``departed``: the estimates of clients that go offline are kept (``keep``) or dropped.
    ``variant``: ``paper`` or the authors' code (``authors``). ``ward``: ``exact`` or
    ``scalable`` (large N). ``estimate``: what the entropy is taken of: ``bias`` (the
    paper's bias update ``db``), ``unit`` (``db / ||db||``) or ``per-step`` (``db`` / (lr x
    local steps), lr the one the clients train with this round); unset: ``unit``
    (``bias`` with ``variant: authors``; docs/hics-fl.md). ``temperature`` unset: the
    estimate's default (:data:`DEFAULT_TEMPERATURE`). ``refresh``: ``every-round`` (the
    paper) or ``frozen`` (the warm-up estimate kept, the authors' code); unset follows
    ``variant``. ``explore_tries``: a client without an estimate (it never replied) is
    explored first at most that many times, then no longer drawn (null: until it
    replies; a client that never does, a straggler past every deadline or a node that
    always fails, would take an exploration slot every round).
    """

    PARTS: ClassVar[tuple[str, ...]] = ("hics",)

    temperature: Optional[float] = None  # unset: per estimate (bias: 0.0025, the paper's)
    estimate: Optional[str] = None  # unset: unit (variant paper), bias (variant authors)
    refresh: Optional[str] = None  # unset: every-round (variant paper), frozen (authors)
    entropy_weight: float = 10.0  # the paper's lambda
    gamma0: float = 4.0
    num_clusters: int = 0
    departed: str = "keep"
    variant: str = "paper"
    ward: str = "exact"
    explore_tries: Optional[int] = None  # null: a client without an estimate is explored until it replies

    def validate(self, path: str) -> None:
        """Check the values (a :class:`~fedflex.checks.ConfigError` names ``path``.field)."""
        number(path, "temperature", self.temperature, gt=0, optional=True)
        if self.estimate is not None:
            choice(path, "estimate", self.estimate, HICS_ESTIMATES)
        if self.refresh is not None:
            choice(path, "refresh", self.refresh, HICS_REFRESH)
        number(path, "entropy_weight", self.entropy_weight, ge=0)
        number(path, "gamma0", self.gamma0, ge=0)
        number(path, "num_clusters", self.num_clusters, ge=0)
        choice(path, "departed", self.departed, ("keep", "drop"))
        choice(path, "variant", self.variant, ("paper", "authors"))
        choice(path, "ward", self.ward, WARD_MODES)
        number(path, "explore_tries", self.explore_tries, ge=1, optional=True)

    def resolved_estimate(self) -> str:
        """Return the estimate, unset following ``variant``."""
        return self.estimate or ("bias" if self.variant == "authors" else "unit")

    def resolved_temperature(self) -> float:
        """Return the temperature, unset following the estimate."""
        return self.temperature if self.temperature is not None else DEFAULT_TEMPERATURE[self.resolved_estimate()]

    def resolved_refresh(self) -> str:
        """Return the refresh rule, unset following ``variant`` (the paper re-estimates a client
        whenever it trains; the authors' code keeps each client's warm-up estimate).
        """
        return self.refresh or ("frozen" if self.variant == "authors" else "every-round")


@dataclass
class PowDOptions(MethodOptions):
    """Power-of-Choice (Cho et al., 2020): ``d`` candidates (0: all online) report their
    loss on the global model; the K highest train.
    """

    PARTS: ClassVar[tuple[str, ...]] = ("pow-d",)

    d: int = 0

    def validate(self, path: str) -> None:
        """Check the values (a :class:`~fedflex.checks.ConfigError` names ``path``.field)."""
        number(path, "d", self.d, ge=0)


@dataclass
class ClusteredOptions(MethodOptions):
    """Clustered Sampling (Fraboni et al., 2021): ``ward`` ``exact`` or ``scalable``."""

    PARTS: ClassVar[tuple[str, ...]] = ("clustered",)

    ward: str = "exact"

    def validate(self, path: str) -> None:
        """Check the values (a :class:`~fedflex.checks.ConfigError` names ``path``.field)."""
        choice(path, "ward", self.ward, WARD_MODES)


@dataclass
class DivFLOptions(MethodOptions):
    """DivFL (Balakrishnan et al., 2022): greedy facility location over update proxies:
    ``stale`` (each client's latest update) or ``ideal`` (every online client trains on the
    current model before the selection; ``probe_steps`` > 0 shortens that probe to so many
    local steps, 0: the round's local training).
    """

    PARTS: ClassVar[tuple[str, ...]] = ("divfl",)

    proxies: str = "stale"
    probe_steps: int = 0

    def validate(self, path: str) -> None:
        """Check the values (a :class:`~fedflex.checks.ConfigError` names ``path``.field)."""
        choice(path, "proxies", self.proxies, ("stale", "ideal"))
        number(path, "probe_steps", self.probe_steps, ge=0)


@dataclass
class FedCorOptions(MethodOptions):
    """FedCor (Tang et al., 2022): a Gaussian process over the clients' loss changes
    (every online client reports its loss in the ``warmup`` random rounds and in 2 of every
    ``refresh`` rounds; 0: never refit), client embeddings of ``rank`` dimensions fitted to
    the last ``history`` loss-change vectors; ``discount`` lowers the assumed drop of a
    client per selection since the last fit.
    """

    PARTS: ClassVar[tuple[str, ...]] = ("fedcor",)

    warmup: int = 15
    refresh: int = 10
    rank: int = 10
    history: int = 50
    discount: float = 0.9

    def validate(self, path: str) -> None:
        """Check the values (a :class:`~fedflex.checks.ConfigError` names ``path``.field)."""
        number(path, "warmup", self.warmup, ge=1)
        if self.refresh == 1:
            raise ConfigError(f"{path}.refresh", 1, "must be 0 (never) or >= 2 (two queries per refresh)")
        number(path, "refresh", self.refresh, ge=0)
        number(path, "rank", self.rank, ge=1)
        number(path, "history", self.history, ge=2)
        number(path, "discount", self.discount, gt=0, le=1)


# ---------------------------------------------------------------------------- aggregators
#: aggregators the AWARE plug-in wraps (``strategy.aggregator.aware.enabled``)
AWARE_BASES = ("fedavg", "fedavgm", "fedadam", "fedyogi", "fedadagrad", "fedams")
AWARE_SOLVERS = ("frank-wolfe", "away-steps")
#: the solver's iteration cap when ``aware.iters`` is unset
AWARE_SOLVER_ITERS = {"frank-wolfe": 250, "away-steps": 10_000}
AWARE_DEPARTED = ("keep", "exclude", "drop")
AWARE_MEMORY = ("full", "last-layers")


@dataclass
class AwareOptions(MethodOptions):
    """FedAWARE (Zeng et al., 2024) and the AWARE plug-in: per-client momenta
    m_i <- (1 - ``momentum``) m_i + ``momentum`` g_i, min-norm weights over them.

    ``enabled``: the plug-in around a server optimiser (:data:`AWARE_BASES`; aggregator
    ``fedaware`` is AWARE already). ``normalize``: solve and step with m_i / ||m_i|| (the
    authors' code). ``rescale`` (fedaware): scale the direction to the mean norm of this
    round's uploads. ``warmup``: FedAvg until every online client has a momentum;
    ``warmup_rounds``: for at most that many aggregations (null: however many that takes,
    the paper; a client that is online but never replies, a straggler past a deadline,
    would otherwise hold the warm-up, and so FedAvg, for the whole run).
    ``solver``: ``frank-wolfe`` (the authors') or ``away-steps`` (stops at the relative
    duality gap ``gap_tol``); ``iters`` caps it (unset: :data:`AWARE_SOLVER_ITERS`),
    ``tol`` is Frank-Wolfe's threshold on ||delta lambda||_1. ``memory``: momenta of the
    ``full`` model or of the ``last-layers`` (the last ``layers`` float tensors), stored as
    ``dtype``. ``departed``: an offline client's momentum is kept in the solve (``keep``),
    kept but left out while offline (``exclude``) or forgotten (``drop``). ``max_age``:
    null (the paper) solves over every stored momentum; an integer A only over the momenta
    refreshed in the last A + 1 aggregations (older ones stay stored and come back when
    their client trains again; for samplers that pick some clients far more often than
    others, docs/composition.md).
    """

    PARTS: ClassVar[tuple[str, ...]] = ("fedaware",)  # and any AWARE_BASES with enabled

    enabled: bool = False
    momentum: float = 0.5
    normalize: bool = False
    rescale: bool = False
    warmup: bool = True
    warmup_rounds: Optional[int] = None  # at most this many warm-up aggregations (null: until all have one)
    iters: Optional[int] = None  # unset: 250 (frank-wolfe, the authors'), 10,000 (away-steps)
    tol: float = 1e-5
    solver: str = "frank-wolfe"
    gap_tol: float = 1e-6
    memory: str = "full"
    layers: int = 2  # last-layers memory: the last K float tensors (2: the output layer)
    dtype: str = "float32"
    departed: str = "keep"
    max_age: Optional[int] = None  # solve over momenta refreshed in the last A+1 rounds (null: all)

    def validate(self, path: str) -> None:
        """Check the values (a :class:`~fedflex.checks.ConfigError` names ``path``.field)."""
        number(path, "momentum", self.momentum, gt=0, le=1)
        number(path, "iters", self.iters, ge=1, optional=True)
        number(path, "tol", self.tol, gt=0)
        choice(path, "solver", self.solver, AWARE_SOLVERS)
        number(path, "gap_tol", self.gap_tol, ge=0)
        choice(path, "memory", self.memory, AWARE_MEMORY)
        choice(path, "dtype", self.dtype, FLOAT_DTYPES)
        number(path, "layers", self.layers, ge=1)
        choice(path, "departed", self.departed, AWARE_DEPARTED)
        number(path, "max_age", self.max_age, ge=0, optional=True)
        number(path, "warmup_rounds", self.warmup_rounds, ge=0, optional=True)

    def solver_iters(self) -> int:
        """Return the iteration cap, unset following the solver."""
        return self.iters if self.iters is not None else AWARE_SOLVER_ITERS[self.solver]


@dataclass
class FedAvgMOptions(MethodOptions):
    """FedAvgM (Hsu et al., 2019): server momentum."""

    PARTS: ClassVar[tuple[str, ...]] = ("fedavgm",)

    momentum: float = 0.9

    def validate(self, path: str) -> None:
        """Check the values (a :class:`~fedflex.checks.ConfigError` names ``path``.field)."""
        number(path, "momentum", self.momentum, ge=0, lt=1)


@dataclass
class AdaptiveOptions(MethodOptions):
    """The adaptive server optimisers (Reddi et al., 2021; FedAMS): ``beta1``, ``beta2``
    and ``tau`` (the adaptivity epsilon).
    """

    PARTS: ClassVar[tuple[str, ...]] = ("fedadam", "fedyogi", "fedadagrad", "fedams")

    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3

    def validate(self, path: str) -> None:
        """Check the values (a :class:`~fedflex.checks.ConfigError` names ``path``.field)."""
        number(path, "beta1", self.beta1, ge=0, lt=1)
        number(path, "beta2", self.beta2, ge=0, lt=1)
        number(path, "tau", self.tau, gt=0)


@dataclass
class FedAMSOptions(MethodOptions):
    """FedAMS (Wang et al., 2022): ``epsilon_at`` ``max`` (the paper's v_hat = max(v_hat,
    v, eps), step m / sqrt(v_hat)) or ``denominator`` (step m / (sqrt(v_hat) + eps),
    FedAMSGrad).
    """

    PARTS: ClassVar[tuple[str, ...]] = ("fedams",)

    epsilon_at: str = "max"

    def validate(self, path: str) -> None:
        """Check the values (a :class:`~fedflex.checks.ConfigError` names ``path``.field)."""
        choice(path, "epsilon_at", self.epsilon_at, ("max", "denominator"))


@dataclass
class TrimmedMeanOptions(MethodOptions):
    """Trimmed mean (Flower's FedTrimmedAvg): ``beta`` cut off each tail per coordinate."""

    PARTS: ClassVar[tuple[str, ...]] = ("trimmed-mean",)

    beta: float = 0.2

    def validate(self, path: str) -> None:
        """Check the values (a :class:`~fedflex.checks.ConfigError` names ``path``.field)."""
        number(path, "beta", self.beta, ge=0, lt=0.5)


@dataclass
class KrumOptions(MethodOptions):
    """Krum, MultiKrum and Bulyan (Flower's): ``num_malicious`` is f, the Byzantine
    clients tolerated; ``num_selected`` the replies MultiKrum averages (null: n - f).
    """

    PARTS: ClassVar[tuple[str, ...]] = ("krum", "multikrum", "bulyan")
    FIELD_PARTS: ClassVar[dict[str, tuple[str, ...]]] = {"num_selected": ("multikrum",)}

    num_malicious: int = 1
    num_selected: Optional[int] = None

    def validate(self, path: str) -> None:
        """Check the values (a :class:`~fedflex.checks.ConfigError` names ``path``.field)."""
        number(path, "num_malicious", self.num_malicious, ge=0)
        number(path, "num_selected", self.num_selected, ge=1, optional=True)


# ---------------------------------------------------------------------------- initializers
#: session-aware distance between session gradients (strategies/session_init.session_distance)
SESSION_DISTANCES = ("l2", "normalized")
#: what the session-aware gradient rounds do to the other parts' server state
SESSION_GRADIENT_STATES = ("shared", "isolated")


@dataclass
class SessionAwareOptions(MethodOptions):
    """Session-aware initialisation (the churn paper): softmin(-R d) weights over the
    stored last models of ``pilot_sessions`` (P) sessions, d between session gradients of
    ``gradient_rounds`` (V) rounds, R = ``similarity_scale``; ``distance`` ``l2`` (the
    spec) or ``normalized`` (the authors' code: the mean over weight tensors of the
    distance between unit-length gradients; docs/session-init.md). ``switch_margin`` m
    (beyond the paper; null, the default, is the paper): keep the current model at a
    session start unless an older stored session's gradient is closer than the latest
    session's by the fraction m (some d_z <= (1 - m) d_latest), i.e. switch only when a
    session seems to recur (docs/composition.md: under Markov churn, where sessions do not
    recur, the paper's softmin mixes in less trained models). ``gradient_state``: the V
    gradient rounds go through the base method's server state and change it (``shared``,
    the default: server momentum, HiCS-FL's estimates), or run from that state as it was
    before round 1 and leave it as it was (``isolated``, beyond the paper: G then does not
    carry the run's server momentum, and the momentum does not carry the pilot's step).
    Clients' own state (SCAFFOLD's c_i) is not isolated.
    """

    PARTS: ClassVar[tuple[str, ...]] = ("session-aware",)

    pilot_sessions: int = 1
    gradient_rounds: int = 1
    similarity_scale: float = 10.0
    distance: str = "l2"
    switch_margin: Optional[float] = None
    gradient_state: str = "shared"

    def validate(self, path: str) -> None:
        """Check the values (a :class:`~fedflex.checks.ConfigError` names ``path``.field)."""
        number(path, "pilot_sessions", self.pilot_sessions, ge=1)
        number(path, "gradient_rounds", self.gradient_rounds, ge=1)
        number(path, "similarity_scale", self.similarity_scale, ge=0)
        choice(path, "distance", self.distance, SESSION_DISTANCES)
        number(path, "switch_margin", self.switch_margin, ge=0, lt=1, optional=True)
        choice(path, "gradient_state", self.gradient_state, SESSION_GRADIENT_STATES)


# ---------------------------------------------------------------------------- local rules
BHERD_BASES = ("fedavg", "fednova", "scaffold")


@dataclass
class FedProxOptions(MethodOptions):
    """FedProx (Li et al., 2020): the proximal term ``mu``/2 ||w - w_g||^2."""

    PARTS: ClassVar[tuple[str, ...]] = ("fedprox",)

    mu: float = 0.01

    def validate(self, path: str) -> None:
        """Check the values (a :class:`~fedflex.checks.ConfigError` names ``path``.field)."""
        number(path, "mu", self.mu, ge=0)


@dataclass
class BHerdOptions(MethodOptions):
    """BHerd (Luo et al., 2024): herding selection of ``k = max(1, floor(alpha * tau +
    1/2))`` of the tau local gradients; the server steps with eta / ``alpha`` times their
    weighted sum. ``dtype``: precision of the stored gradients; ``max_stored`` (0: no
    bound): store at most this many gradient rows, consecutive steps summed into blocks;
    ``base``: ``fedavg``, ``fednova`` or ``scaffold``, the method BHerd is combined with
    (GraB takes ``fedavg`` only; see ``docs/bherd.md``).
    """

    PARTS: ClassVar[tuple[str, ...]] = ("bherd", "grab")
    FIELD_PARTS: ClassVar[dict[str, tuple[str, ...]]] = {
        "alpha": ("bherd",),
        "dtype": ("bherd",),
        "max_stored": ("bherd",),
    }

    alpha: float = 0.5
    dtype: str = "float32"
    max_stored: int = 0
    base: str = "fedavg"

    def validate(self, path: str) -> None:
        """Check the values (a :class:`~fedflex.checks.ConfigError` names ``path``.field)."""
        number(path, "alpha", self.alpha, gt=0, le=1)
        choice(path, "dtype", self.dtype, FLOAT_DTYPES)
        number(path, "max_stored", self.max_stored, ge=0)
        choice(path, "base", self.base, BHERD_BASES)


@dataclass
class FedDynOptions(MethodOptions):
    """FedDyn (Acar et al., 2021): the client minimises its loss - <g_k, w> + ``alpha``/2
    ||w - w_g||^2; the server shifts the average by -h / ``alpha``.
    """

    PARTS: ClassVar[tuple[str, ...]] = ("feddyn",)

    alpha: float = 0.01

    def validate(self, path: str) -> None:
        """Check the values (a :class:`~fedflex.checks.ConfigError` names ``path``.field)."""
        number(path, "alpha", self.alpha, gt=0)


@dataclass
class FedCMOptions(MethodOptions):
    """FedCM (Xu et al., 2021): local steps along ``alpha`` g + (1 - ``alpha``) Delta,
    Delta the server's global momentum.
    """

    PARTS: ClassVar[tuple[str, ...]] = ("fedcm",)

    alpha: float = 0.1

    def validate(self, path: str) -> None:
        """Check the values (a :class:`~fedflex.checks.ConfigError` names ``path``.field)."""
        number(path, "alpha", self.alpha, gt=0, le=1)


# ---------------------------------------------------------------------------- old spellings
def _moved(part: str, section: str, **names: str) -> dict[str, tuple[str, ...]]:
    return {f"strategy.{part}.{old}": (f"strategy.{part}.{section}.{new}",) for old, new in names.items()}


#: The one table of old (flat) option keys -> their new keys, read for one more release
#: with a warning by :func:`fedflex.loader.load_scenario` (the named strategies no longer
#: take the flat keywords; their error message names the new spelling from this table).
#: ``strategy.aggregator.aware`` is old only as a boolean.
ALIASES: dict[str, tuple[str, ...]] = {
    **_moved("sampler", "uniform", weighted="weighted"),
    **_moved(
        "sampler",
        "hics",
        temperature="temperature",
        hics_estimate="estimate",
        hics_refresh="refresh",
        hics_lambda="entropy_weight",
        gamma0="gamma0",
        num_clusters="num_clusters",
        departed="departed",
        variant="variant",
    ),
    "strategy.sampler.ward": ("strategy.sampler.hics.ward", "strategy.sampler.clustered.ward"),
    **_moved("sampler", "powd", d="d"),
    **_moved("sampler", "divfl", divfl_proxies="proxies", divfl_probe_steps="probe_steps"),
    **_moved(
        "sampler",
        "fedcor",
        fedcor_warmup="warmup",
        fedcor_refresh="refresh",
        fedcor_rank="rank",
        fedcor_history="history",
        fedcor_discount="discount",
    ),
    **_moved("aggregator", "fedavgm", server_momentum="momentum"),
    **_moved("aggregator", "adaptive", beta1="beta1", beta2="beta2", tau="tau"),
    **_moved("aggregator", "fedams", ams_epsilon_at="epsilon_at"),
    "strategy.aggregator.aware": ("strategy.aggregator.aware.enabled",),
    **_moved(
        "aggregator",
        "aware",
        **{
            f"aware_{k}": k
            for k in (
                "momentum",
                "normalize",
                "rescale",
                "warmup",
                "iters",
                "tol",
                "solver",
                "gap_tol",
                "memory",
                "layers",
                "dtype",
                "departed",
                "max_age",
            )
        },
    ),
    **_moved("aggregator", "trimmed_mean", trim_beta="beta"),
    **_moved("aggregator", "krum", num_malicious="num_malicious", num_krum_selected="num_selected"),
    **_moved(
        "initializer",
        "session_aware",
        pilot_sessions="pilot_sessions",
        gradient_rounds="gradient_rounds",
        similarity_scale="similarity_scale",
        distance="distance",
    ),
    **_moved("local_rule", "fedprox", mu="mu"),
    **_moved(
        "local_rule",
        "bherd",
        bherd_alpha="alpha",
        bherd_dtype="dtype",
        bherd_max_stored="max_stored",
        bherd_base="base",
    ),
    "strategy.local_rule.bherd_fixed_order": ("strategy.local_rule.fixed_order",),
    **_moved("local_rule", "feddyn", feddyn_alpha="alpha"),
    **_moved("local_rule", "fedcm", fedcm_alpha="alpha"),
}
