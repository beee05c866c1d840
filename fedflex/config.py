"""Scenario configuration: the dataclass schema of a scenario.

A scenario is one YAML file (see ``scenarios/``) merged over the defaults below, then
over command-line overrides in OmegaConf dotlist form (``client.lr=0.05``), by
:func:`fedflex.loader.load_scenario`. Each method's own options are declared in
:mod:`fedflex.options` and nested here under their part (``strategy.sampler.hics``).
Unknown keys, wrong types and out-of-range values raise :class:`ConfigError`, whose
message names the dotted key, the value and what is allowed. Nothing here knows a
strategy or a client: the parts are named by strings that the runner resolves.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

from omegaconf import ListConfig

from fedflex.checks import ConfigError
from fedflex.checks import choice as _choice
from fedflex.checks import int_range as _int_range
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

__all__ = ["ConfigError"]  # re-exported: the error every config check raises


# ---------------------------------------------------------------------------- schema
DATASETS = ("synthetic", "fmnist", "mnist", "cifar10", "svhn", "hf")
LABEL_MAPS = ("none", "even-odd")
TOKENIZERS = ("vocab", "hashing")
TOKEN_UNITS = ("words", "chars")
SIDES = ("right", "left")


@dataclass
class DatasetConfig:
    """Which data, and where it lives.

    ``root`` defaults to ``$FEDFLEX_DATA``, then ``~/.cache/fedflex/data``; for
    ``fmnist`` the Debian package files in ``/usr/share/datasets/fashion-mnist`` are
    also looked at. ``synthetic`` is Synthetic(alpha, beta) of the FedProx paper
    (Li et al., 2020): one generating distribution per client, no download.

    ``label_map``: ``none``, or ``even-odd`` (label y -> y mod 2: even -> 0, odd -> 1;
    the BHerd paper's "is the digit even or odd" SVM task). Applied when the data are
    loaded, so partitions, training and evaluation all see the two classes.

    ``hf``: a Hugging Face dataset (:mod:`fedflex.hf`, ``docs/datasets.md``), from a local
    ``save_to_disk`` directory (``path``), or data files (``train_files`` /
    ``test_files``: CSV, JSON lines or Parquet, by suffix), or else the hub (``hub``,
    through ``datasets.load_dataset`` when the network is reachable and ``download`` is
    on). Relative paths resolve against the data root. ``input_column`` holds a text
    (tokenised) or an image; ``label_column`` an integer, a class label or a string
    (strings are numbered in sorted order). ``client_column`` names each example's
    natural client (writer, speaker, user id) for ``partition.scheme=natural``. Without
    a test split, ``test_fraction`` of the training split (a fixed seeded draw) is held
    out. Text: ``tokenizer`` ``vocab`` (the ``vocab_size`` most frequent tokens of the
    training split; ids 0 = padding, 1 = unknown) or ``hashing`` (token -> one of
    ``vocab_size`` buckets by a stable hash), tokens are ``words`` (lower-cased when
    ``lowercase``, split on non-word characters) or ``chars``; every text becomes
    ``max_len`` ids, cut on the ``truncation`` side and padded on the ``padding`` side.
    """

    name: str = "synthetic"
    root: Optional[str] = None
    download: bool = True
    # Synthetic(alpha, beta)
    alpha: float = 1.0
    beta: float = 1.0
    dim: int = 60
    num_classes: int = 10
    samples_per_client: int = 200
    test_fraction: float = 0.2
    label_map: str = "none"
    # hf: Hugging Face datasets
    hub: Optional[str] = None
    hub_config: Optional[str] = None
    path: Optional[str] = None
    train_files: list[str] = field(default_factory=list)
    test_files: list[str] = field(default_factory=list)
    train_split: str = "train"
    test_split: str = "test"
    input_column: str = "text"
    label_column: str = "label"
    client_column: Optional[str] = None
    # hf text
    tokenizer: str = "vocab"
    token_unit: str = "words"
    lowercase: bool = True
    vocab_size: int = 20000
    max_len: int = 64
    truncation: str = "right"
    padding: str = "right"

    #: ids below this are reserved (0 = padding, 1 = unknown); a model's embedding table
    #: has ``vocab_size + NUM_SPECIAL_TOKENS`` rows.
    NUM_SPECIAL_TOKENS: ClassVar[int] = 2

    def validate(self, path: str) -> None:
        """Check this section's values; raise :class:`ConfigError` naming the key under ``path``."""
        _choice(path, "name", self.name, DATASETS)
        _choice(path, "label_map", self.label_map, LABEL_MAPS)
        _num(path, "alpha", self.alpha, ge=0)
        _num(path, "beta", self.beta, ge=0)
        _num(path, "dim", self.dim, ge=1)
        _num(path, "num_classes", self.num_classes, ge=2)
        _num(path, "samples_per_client", self.samples_per_client, ge=2)
        _num(path, "test_fraction", self.test_fraction, gt=0, lt=1)
        _choice(path, "tokenizer", self.tokenizer, TOKENIZERS)
        _choice(path, "token_unit", self.token_unit, TOKEN_UNITS)
        _choice(path, "truncation", self.truncation, SIDES)
        _choice(path, "padding", self.padding, SIDES)
        _num(path, "vocab_size", self.vocab_size, ge=1)
        _num(path, "max_len", self.max_len, ge=1)
        for key in ("train_files", "test_files"):
            value = getattr(self, key)
            if isinstance(value, str):  # one file given as a string
                value = [value]
            setattr(self, key, [str(v) for v in value])
        if self.name != "hf":
            return
        if self.path and self.train_files:
            raise ConfigError(
                _join(path, "path"), self.path, "set either path (a save_to_disk directory) or train_files, not both"
            )
        if self.test_files and not self.train_files:
            raise ConfigError(_join(path, "test_files"), self.test_files, "needs train_files too")
        if not (self.hub or self.path or self.train_files):
            raise ConfigError(
                _join(path, "hub"),
                self.hub,
                "dataset hf needs a source: hub (a Hugging Face hub name), path (a save_to_disk "
                "directory) or train_files (CSV, JSON lines, Parquet)",
            )
        for key in ("input_column", "label_column"):
            if not getattr(self, key):
                raise ConfigError(_join(path, key), getattr(self, key), "must name a column")


PARTITIONS = ("natural", "iid", "dirichlet", "shards", "mixed-dirichlet", "label-sets", "label-groups")
LABEL_SET_PATTERNS = ("half", "partial-overlap", "distinct", "two-shard", "sessions", "half-iid")


@dataclass
class PartitionConfig:
    """How the training set is split over ``num_clients`` clients.

    - ``natural``: the dataset's own split (synthetic: one generator per client; ``hf``:
      one client per value of ``dataset.client_column``, flwr-datasets'
      ``NaturalIdPartitioner``; ``num_clients`` must equal the number of values).
    - ``iid``: uniform random equal split.
    - ``dirichlet``: label shares per client ~ Dirichlet(``alpha``) (Hsu et al., 2019).
    - ``shards``: ``labels_per_client`` labels per client (pathological, McMahan et al.).
    - ``mixed-dirichlet``: HiCS-FL's groups: the set is cut in ``len(alphas)`` equal
      parts, each split over an equal group of clients by Dirichlet(alpha_g).
    - ``label-sets``: the churn paper's label-set patterns (``pattern``), and ``half-iid``
      (BHerd's Case 3: the first half of the labels IID over the first half of the
      clients, the other labels one block per remaining client).
    - ``label-groups``: explicit label sets: client i holds the labels of
      ``label_groups[i mod len(label_groups)]``, each label's examples cut evenly over
      the clients that hold it (BHerd's Case 2 with 5 clients:
      ``[[0,5],[1,6],[2,7],[3,8],[4,9]]``).

    ``labels``: split on the labels the model learns (``mapped``: after
    ``dataset.label_map``) or on the dataset's own labels (``source``; e.g. BHerd's
    Case 2 for the even/odd SVM, where ``label_groups`` name digits). Label counts,
    entropies and online-label accuracy always use the mapped labels.
    """

    scheme: str = "natural"
    alpha: float = 0.5
    alphas: list[float] = field(default_factory=list)
    labels_per_client: int = 2
    min_size: int = 1
    pattern: str = "half"
    overlap: float = 0.0
    num_label_sets: int = 6
    label_groups: list[list[int]] = field(default_factory=list)
    labels: str = "mapped"

    def validate(self, path: str) -> None:
        """Check this section's values; raise :class:`ConfigError` naming the key under ``path``."""
        _choice(path, "scheme", self.scheme, PARTITIONS)
        _choice(path, "labels", self.labels, ("mapped", "source"))
        if self.scheme == "label-groups" and not any(self.label_groups):
            raise ConfigError(
                _join(path, "label_groups"), self.label_groups, "label-groups needs a list of label lists"
            )
        for g, group in enumerate(self.label_groups):
            for label in group:
                _num(path, f"label_groups[{g}]", label, ge=0)
        _num(path, "alpha", self.alpha, gt=0)
        for i, a in enumerate(self.alphas):
            _num(path, f"alphas[{i}]", a, gt=0)
        if self.scheme == "mixed-dirichlet" and not self.alphas:
            raise ConfigError(_join(path, "alphas"), [], "mixed-dirichlet needs a list of alphas")
        _num(path, "labels_per_client", self.labels_per_client, ge=1)
        _num(path, "min_size", self.min_size, ge=0)
        _choice(path, "pattern", self.pattern, LABEL_SET_PATTERNS)
        _num(path, "overlap", self.overlap, ge=0, lt=1)
        _num(path, "num_label_sets", self.num_label_sets, ge=1)


MODELS = (
    "logreg",
    "linear",
    "mlp",
    "cnn-fmnist",
    "cnn-fmnist-authors",
    "cnn-bherd",
    "cnn-cifar",
    "cnn-svhn",
    "resnet18",
    "svm",
    "embedding-bag",
    "text-cnn",
    "text-lstm",
)
#: Models that read token ids (``dataset.name=hf`` with a text ``input_column``).
TEXT_MODELS = ("embedding-bag", "text-cnn", "text-lstm")
LOSSES = ("cross-entropy", "squared-hinge")


@dataclass
class ModelConfig:
    """Model by registry name (see :mod:`fedflex.models`) and its training loss
    (``loss``, see :mod:`fedflex.losses`: ``cross-entropy`` or ``squared-hinge``; the
    one-output ``svm`` needs ``squared-hinge``).

    Text models (:data:`TEXT_MODELS`) embed token ids in ``embed_dim`` dimensions;
    ``text_hidden`` is the LSTM width per direction (``text-lstm``, ``rnn_layers``
    layers, ``bidirectional``) or the filters per kernel size (``text-cnn``).
    ``vocab_size``: rows of the embedding table; left unset it is
    ``dataset.vocab_size + 2`` (padding and unknown ids), the only value that fits.
    """

    name: str = "logreg"
    norm: str = "batch"  # resnet18 only: batch | group
    hidden: Any = 200  # mlp only: one width, or a list of widths ([200, 200]: FedAWARE's MLP)
    loss: str = "cross-entropy"
    # text models
    embed_dim: int = 64
    text_hidden: int = 128
    rnn_layers: int = 1
    bidirectional: bool = True
    vocab_size: Optional[int] = None

    def validate(self, path: str) -> None:
        """Check this section's values; raise :class:`ConfigError` naming the key under ``path``."""
        _choice(path, "name", self.name, MODELS)
        _choice(path, "loss", self.loss, LOSSES)
        if self.name == "svm" and self.loss != "squared-hinge":
            raise ConfigError(
                _join(path, "loss"),
                self.loss,
                "model svm has one output (a binary scorer): use squared-hinge",
            )
        _choice(path, "norm", self.norm, ("batch", "group"))
        _num(path, "embed_dim", self.embed_dim, ge=1)
        _num(path, "text_hidden", self.text_hidden, ge=1)
        _num(path, "rnn_layers", self.rnn_layers, ge=1)
        _num(path, "vocab_size", self.vocab_size, ge=3, optional=True)
        widths = list(self.hidden) if isinstance(self.hidden, (list, tuple, ListConfig)) else [self.hidden]
        if not widths or not all(isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in widths):
            raise ConfigError(
                _join(path, "hidden"), self.hidden, "one integer >= 1 or a non-empty list of them (mlp layer widths)"
            )
        if isinstance(self.hidden, ListConfig):
            self.hidden = list(self.hidden)


@dataclass
class ClientConfig:
    """Local training hyper-parameters, shared by every local rule.

    ``steps`` (mini-batch steps per round) overrides ``epochs`` when set.
    ``keep_optimizer_state``: the optimiser's state (SGD's momentum buffers, Adam's
    moments) stays on the node from one round to the next, as in HiCS-FL's public code,
    instead of starting from zero every round (Flower's node state; sequential training
    only: batched cohorts train such rounds one client at a time).
    ``device``: ``auto`` takes CUDA when present, else the CPU. ``num_threads``: torch
    threads per worker; 0 keeps torch's default, which Ray sets to the worker's
    ``simulation.num_cpus`` and the in-process backend leaves at all cores.

    Learning-rate schedule (computed by the server, which sends each round's value as
    ``client.lr``; every client path trains with it unchanged):

    - ``lr_schedule``: ``constant`` (default: ``lr`` every round, the train message as
      without a schedule), ``round`` (the clock t counts rounds from the run's start:
      t = round - 1) or ``session`` (t counts rounds from the start of the current
      session: t = round - start round, so the decay restarts at every session start the
      server's session tracker sees; the session-aware initializer's gradient rounds run
      at t = 0).
    - ``lr_shape``: ``exp``: lr_t = max(``lr_min``, ``lr`` * ``lr_decay`` ** t);
      ``poly``: lr_t = (``lr`` - ``lr_min``) (1 - min(t, H) / H) ** ``lr_power`` +
      ``lr_min`` with H = ``lr_horizon`` rounds (the churn paper authors' schedule:
      power 0.9, H the rounds of a session, ``lr_min`` a fraction of ``lr``).

    The lr is a function of the round and of the current session's start round, which
    the checkpoint keeps, so a resumed run sends the same values.

    The training fields travel to the clients in every train message
    (:func:`fedflex.records.to_record` under ``client``); ``device`` and ``num_threads``
    (``WORKER``) set up the worker process and travel in the task instead; the schedule
    fields (``SCHEDULE``) stay on the server.

    Per-client, per-round draws (null: off, every client trains ``epochs`` with
    ``batch_size``): ``epochs_range: [lo, hi]`` draws the local epochs uniformly from
    lo..hi; ``batch_size_range: [lo, hi]`` draws the batch size uniformly from
    lo..min(hi, n - 1), n the client's examples (a client with n <= lo trains with batch n,
    one batch per epoch). FedAWARE's authors' regime is ``epochs_range: [2, 5]`` and
    ``batch_size_range: [10, hi]`` with hi at or above the largest partition. Each client
    draws from (``seed``, round, client id) alone (:func:`clients.train.drawn_settings`), so
    every backend and a resumed run train with the same values; the replies report them
    (``local_draws`` in metrics.jsonl).
    """

    WORKER: ClassVar[tuple[str, ...]] = ("device", "num_threads")
    SCHEDULE: ClassVar[tuple[str, ...]] = ("lr_schedule", "lr_shape", "lr_decay", "lr_power", "lr_horizon", "lr_min")
    # schedule options and what reads them: (option, attribute, the values that read it)
    SCHEDULE_USED_BY: ClassVar[tuple[tuple[str, str, tuple[str, ...]], ...]] = (
        ("lr_shape", "lr_schedule", ("round", "session")),
        ("lr_min", "lr_schedule", ("round", "session")),
        ("lr_decay", "lr_shape", ("exp",)),
        ("lr_power", "lr_shape", ("poly",)),
        ("lr_horizon", "lr_shape", ("poly",)),
    )

    epochs: int = 1
    steps: Optional[int] = None
    batch_size: int = 32
    optimizer: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0
    keep_optimizer_state: bool = False
    device: str = "auto"
    num_threads: int = 0
    lr_schedule: str = "constant"
    lr_shape: str = "exp"
    lr_decay: float = 1.0
    lr_power: float = 0.9
    lr_horizon: int = 0
    lr_min: float = 0.0

    # Per-client, per-round draws of epochs and batch size (None: off)
    epochs_range: Optional[list[int]] = None
    batch_size_range: Optional[list[int]] = None

    def validate(self, path: str) -> None:
        """Check this section's values; raise :class:`ConfigError` naming the key under ``path``."""
        _num(path, "epochs", self.epochs, ge=1)
        _num(path, "steps", self.steps, ge=1, optional=True)
        _num(path, "batch_size", self.batch_size, ge=1)
        _choice(path, "optimizer", self.optimizer, ("sgd", "adam"))
        _num(path, "lr", self.lr, gt=0)
        _num(path, "momentum", self.momentum, ge=0, lt=1)
        _num(path, "weight_decay", self.weight_decay, ge=0)
        _choice(path, "device", self.device, ("auto", "cpu", "cuda"))
        _num(path, "num_threads", self.num_threads, ge=0)
        for name in ("epochs_range", "batch_size_range"):
            setattr(self, name, _int_range(path, name, getattr(self, name)))
        if self.epochs_range is not None and self.steps is not None:
            raise ConfigError(
                _join(path, "epochs_range"),
                self.epochs_range,
                f"has no effect with client.steps = {self.steps} (steps override epochs): unset one",
            )
        _choice(path, "lr_schedule", self.lr_schedule, LR_SCHEDULES)
        _choice(path, "lr_shape", self.lr_shape, LR_SHAPES)
        _num(path, "lr_decay", self.lr_decay, gt=0, le=1)
        _num(path, "lr_power", self.lr_power, gt=0)
        _num(path, "lr_horizon", self.lr_horizon, ge=0)
        _num(path, "lr_min", self.lr_min, ge=0)
        if self.lr_schedule == "constant":
            return
        if self.lr_min > self.lr:
            raise ConfigError(_join(path, "lr_min"), self.lr_min, f"must be <= client.lr ({self.lr})")
        if self.lr_shape == "poly" and self.lr_horizon < 1:
            raise ConfigError(
                _join(path, "lr_horizon"), self.lr_horizon, "lr_shape=poly needs lr_horizon >= 1 (rounds to decay over)"
            )

    def training_fields(self) -> list[str]:
        """Return the fields a train message carries (all but ``WORKER`` and ``SCHEDULE``)."""
        return [f.name for f in dataclasses.fields(self) if f.name not in self.WORKER + self.SCHEDULE]

    def unused(self) -> list[tuple[str, Any, str, tuple[str, ...]]]:
        """``(option, value, the option that decides, the values of it that read the
        option)`` for every schedule option set away from its default that the chosen
        schedule ignores (e.g. ``lr_decay`` with ``lr_schedule`` constant).
        """
        default = type(self)()
        deciders = {option: (decider, readers) for option, decider, readers in self.SCHEDULE_USED_BY}
        out = []
        for option, decider, readers in self.SCHEDULE_USED_BY:
            if getattr(self, option) == getattr(default, option):
                continue
            # an option is read when every option deciding it (and what decides those, as
            # lr_schedule decides lr_shape) is at a reading value
            chain = [(decider, readers)]
            while chain[-1][0] in deciders:
                chain.append(deciders[chain[-1][0]])
            for name, values in chain:
                if getattr(self, name) not in values:
                    out.append((option, getattr(self, option), name, values))
                    break
        return out

    def lr_at(self, server_round: int, session_start: int) -> float:
        """Return the client learning rate of ``server_round`` (1-based) when the current
        session started in round ``session_start`` (see the class docstring).
        """
        if self.lr_schedule == "constant":
            return float(self.lr)
        t = server_round - 1 if self.lr_schedule == "round" else server_round - session_start
        t = max(t, 0)
        if self.lr_shape == "exp":
            return float(max(self.lr_min, self.lr * self.lr_decay**t))
        fraction = 1.0 - min(t, self.lr_horizon) / self.lr_horizon
        return float((self.lr - self.lr_min) * fraction**self.lr_power + self.lr_min)


LR_SCHEDULES = ("constant", "round", "session")
LR_SHAPES = ("exp", "poly")


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
        # the AWARE plug-in reads the aware section around any base
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


CHURN_KINDS = ("none", "sessions", "label-sessions", "markov", "trace")


@dataclass
class ChurnConfig:
    """Which clients are online in round t (see :mod:`fedflex.churn`).

    - ``none``: everyone, always.
    - ``sessions``: explicit client-id lists, ``rounds_per_session`` rounds each
      (``cycle``: start over after the last one, else keep the last).
    - ``label-sessions``: session s admits the clients whose label set lies in
      ``session_labels[s]`` (the churn paper's label-driven sessions).
    - ``markov``: each client flips on -> off with ``p_leave`` and off -> on with
      ``p_join`` every round; starts from the stationary share unless
      ``initial_online`` is set.
    - ``trace``: a CSV of ``client,online_from,online_until`` rows (rounds, until exclusive).

    ``min_session_rounds``: the session counter moves only when the online set has
    changed and the current session is at least this long (a flapping node does not
    start a session every round), and only when the Jaccard distance between the
    session's starting set and the online set exceeds ``change_threshold``. Unset
    (``null``), they default by kind: ``markov`` 5 rounds and 0.3 (with the default
    p_leave 0.1 / p_join 0.3 about 3 of 20 clients flip every round, so the exact rule
    would start a session nearly every round; these give sessions of 5-10 rounds); every
    other kind 1 and 0.0 (any change of the online set). Scripted schedules
    (``sessions``, ``label-sessions``) start a session at every entry, also when an
    entry repeats the previous online set. ``on_too_few``: what a round with fewer online
    clients than ``strategy.sampler.min_clients`` does: ``skip`` it (logged, the model
    is kept) or ``fail`` the run.
    """

    kind: str = "none"
    sessions: list[list[int]] = field(default_factory=list)
    session_labels: list[list[int]] = field(default_factory=list)
    rounds_per_session: int = 10
    cycle: bool = True
    p_leave: float = 0.1
    p_join: float = 0.3
    initial_online: Optional[float] = None
    trace: Optional[str] = None
    min_session_rounds: Optional[int] = None
    change_threshold: Optional[float] = None
    on_too_few: str = "skip"

    def validate(self, path: str) -> None:
        """Check this section's values; raise :class:`ConfigError` naming the key under ``path``."""
        _choice(path, "kind", self.kind, CHURN_KINDS)
        if self.kind == "sessions" and not self.sessions:
            raise ConfigError(_join(path, "sessions"), [], "kind=sessions needs a list of client-id lists")
        if self.kind == "label-sessions" and not self.session_labels:
            raise ConfigError(_join(path, "session_labels"), [], "kind=label-sessions needs a list of label lists")
        if self.kind == "trace" and not self.trace:
            raise ConfigError(_join(path, "trace"), self.trace, "kind=trace needs a CSV path")
        _num(path, "rounds_per_session", self.rounds_per_session, ge=1)
        _num(path, "p_leave", self.p_leave, ge=0, le=1)
        _num(path, "p_join", self.p_join, ge=0, le=1)
        if self.kind == "markov" and self.p_leave + self.p_join == 0:
            raise ConfigError(_join(path, "p_join"), self.p_join, "p_leave + p_join must be > 0")
        _num(path, "initial_online", self.initial_online, ge=0, le=1, optional=True)
        markov = self.kind == "markov"
        if self.min_session_rounds is None:
            self.min_session_rounds = 5 if markov else 1
        if self.change_threshold is None:
            self.change_threshold = 0.3 if markov else 0.0
        _num(path, "min_session_rounds", self.min_session_rounds, ge=1)
        _num(path, "change_threshold", self.change_threshold, ge=0, lt=1)
        _choice(path, "on_too_few", self.on_too_few, ("skip", "fail"))


@dataclass
class EvaluationConfig:
    """Server-side evaluation of the global model on the test set every ``every`` rounds
    (and always after the last round).

    ``online_labels``: also report ``online_accuracy``, the accuracy on the test examples
    whose label some online client holds (the churn paper's metric). summary.json lists,
    per session transition, the mean accuracy over the ``transition_window`` rounds from
    the transition on.

    ``stop_at_accuracy``: end the run after the first evaluated round whose test accuracy
    reaches this value (0 = never; for rounds-to-target studies). summary.json then has
    ``stopped_early: true`` and ``rounds`` counts the rounds run. ``stop_smoothing``
    (odd window, 0 = off): run on until the Savitzky-Golay-smoothed accuracy curve
    (that window, polynomial order ``stop_smoothing_order``; HiCS-FL's plots use 13 and 3)
    has also reached the target at a point its window fully covers, so that both the raw
    and the smoothed rounds-to-target are known exactly (about window / 2 rounds more;
    after a resume the smoothing sees only the rounds since the resume, so the run may
    stop later, never earlier).

    ``stop_on_divergence``: end the run (``"status": "diverged"``, exit code 3) after a
    round whose replies were all rejected for NaN / Inf values, or whose global model or
    test loss is not finite; the rows, plots and model up to that round are kept. False:
    run on (a round without usable replies keeps the model).

    ``per_class`` (default on): each evaluated row gets ``class_accuracy`` (the test
    accuracy of each class) and ``worst_class_accuracy``; summary.json the final round's
    confusion matrix; the run directory ``confusion.png``. ``per_client``: ``off``
    (default: a row would hold a value per client), ``online`` or ``all``: each such
    client's accuracy on its own test split, ``client_test_size`` test examples drawn
    once (seeded) in its training labels' proportions (the test set has no per-client
    split of its own), from the same forward pass: rows get ``client_accuracy`` ([client,
    accuracy] pairs) and its mean, std, and the mean of the worst and of the best 10%
    of those clients (:mod:`fedflex.evaluation`).
    """

    every: int = 1
    batch_size: int = 1000
    online_labels: bool = False
    transition_window: int = 10
    stop_at_accuracy: float = 0.0
    stop_smoothing: int = 0
    stop_smoothing_order: int = 3
    stop_on_divergence: bool = True
    per_class: bool = True
    per_client: str = "off"
    client_test_size: int = 200

    def validate(self, path: str) -> None:
        """Check this section's values; raise :class:`ConfigError` naming the key under ``path``."""
        _num(path, "every", self.every, ge=1)
        _choice(path, "per_client", self.per_client, ("off", "online", "all"))
        _num(path, "client_test_size", self.client_test_size, ge=1)
        _num(path, "stop_at_accuracy", self.stop_at_accuracy, ge=0, le=1)
        _num(path, "stop_smoothing", self.stop_smoothing, ge=0)
        if self.stop_smoothing and self.stop_smoothing % 2 == 0:
            raise ConfigError(_join(path, "stop_smoothing"), self.stop_smoothing, "must be 0 (off) or an odd window")
        _num(path, "stop_smoothing_order", self.stop_smoothing_order, ge=0)
        if self.stop_smoothing and self.stop_smoothing_order >= self.stop_smoothing:
            raise ConfigError(
                _join(path, "stop_smoothing_order"),
                self.stop_smoothing_order,
                f"must be < stop_smoothing ({self.stop_smoothing})",
            )
        _num(path, "batch_size", self.batch_size, ge=1)
        _num(path, "transition_window", self.transition_window, ge=1)


@dataclass
class SimulationConfig:
    """How ``fedflex run`` simulates the federation.

    ``backend``: ``auto`` (default: ``ray`` when ``ray_address`` names a cluster, else
    ``local``; the resolved value is what config.yaml records), ``ray`` (Flower's
    simulation runtime: a Ray worker pool runs the ClientApp; ``num_cpus`` / ``num_gpus``
    per virtual client, fractions pack several per core or GPU) or ``local`` (the same
    ServerApp and ClientApp handlers in one process, a round's clients in cohorts or one
    after another, no Ray). On one machine ``local`` is the faster (issue 46, docs/scale.md:
    no Ray start-up, no message per client; torch uses every core for each step), so it is
    the default there; ``ray`` spreads clients over the processes of a cluster.

    ``vectorize``: train the clients of a round as batched cohorts
    (:mod:`clients.cohort`): ``rule`` (default) decides once per run, before round 1, by
    a fixed rule of the model, the device, the clients per round and the batch
    (:func:`clients.cohort.vectorize_rule`, no timing) and records its decision as
    ``vectorize_choice`` in the resolved config (config.yaml, which a resumed run reads):
    a resumed run and a re-run of the saved config train the same way, bit for bit.
    ``on`` always where the rule and model allow it, ``off`` one client at a time,
    ``auto`` times a step both ways once and predicts every round the faster way
    (logged; cohorts agree with one-by-one training to float rounding, not bit for bit,
    so ``auto``'s timing-based choice makes a run repeat only to float rounding). ``on``,
    ``off`` and ``rule`` repeat bit for bit (with ``cohort_size`` set when memory is
    tight: the chunking follows free memory). BHerd / GraB rounds and BatchNorm models
    always train one client at a time. ``vectorize_choice``: ``on`` / ``off``, what
    ``rule`` decided (set by the run; null: decide; ignored and cleared with another
    ``vectorize``). ``cohort_size``: most clients per batched computation (0: as many as
    fit half the device's free memory).
    On the ``ray`` backend a round's clients travel as one cohort message per Ray worker
    (:mod:`fedflex.launch.cohort_grid`); a real SuperNode is one client.

    ``ray_address``: attach the Ray backend to a running Ray cluster (``auto``, or the
    head's ``host:port`` from ``ray start --head``) instead of starting one in this
    process; every machine of the cluster needs fedflex installed and the data.
    """

    backend: str = "auto"
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    timeout: float = 3600.0
    vectorize: str = "rule"
    vectorize_choice: Optional[str] = None
    cohort_size: int = 0
    ray_address: Optional[str] = None

    def validate(self, path: str) -> None:
        """Check this section's values; raise :class:`ConfigError` naming the key under ``path``."""
        _choice(path, "backend", self.backend, ("auto", "ray", "local"))
        if self.backend == "auto":  # resolved here: config.yaml (and a resume) says which ran
            self.backend = "ray" if self.ray_address else "local"
        # YAML 1.1 reads a bare on / off as a boolean, which OmegaConf then writes as a string
        bools = {"True": "on", "true": "on", "False": "off", "false": "off"}
        self.vectorize = bools.get(self.vectorize, self.vectorize)
        _choice(path, "vectorize", self.vectorize, ("rule", "auto", "on", "off"))
        if self.vectorize != "rule":
            self.vectorize_choice = None  # only rule records a choice
        elif self.vectorize_choice is not None:
            self.vectorize_choice = bools.get(str(self.vectorize_choice), str(self.vectorize_choice))
            _choice(path, "vectorize_choice", self.vectorize_choice, ("on", "off"))
        _num(path, "cohort_size", self.cohort_size, ge=0)
        _num(path, "num_cpus", self.num_cpus, gt=0)
        _num(path, "num_gpus", self.num_gpus, ge=0)
        _num(path, "timeout", self.timeout, gt=0)

    def cohorts(self) -> str:
        """How the run trains its clients: ``on``, ``off`` or ``auto``; ``rule`` gives its
        recorded choice (``off`` before the run made it).
        """
        if self.vectorize == "rule":
            return self.vectorize_choice or "off"
        return self.vectorize

    def cohorts_key(self) -> str:
        """Return the key that set :meth:`cohorts` (for error messages)."""
        return "simulation.vectorize_choice" if self.vectorize == "rule" else "simulation.vectorize"


@dataclass
class SystemConfig:
    """A system model on a simulated clock (simulation only; ``kind: none``, the default,
    keeps rounds as they are): each client has a compute speed and a bandwidth, drawn
    once per run; a client's round takes its local steps (``client.epochs`` x its batches)
    times ``step_s`` / its speed, plus its train message and its reply over its
    bandwidth. The server waits for every reply, or until ``deadline_s`` (replies later
    than it are stragglers: missing, not rejected), or for the first ``keep_first``;
    ``dropout`` is the chance that a sampled client drops out mid-round (its reply is
    missing too). ``partial`` (with a deadline; FLGo's completeness, FedNova's variable
    local work): a client whose planned steps would miss the deadline trains the first
    steps of them that fit, and its reply counts; without it, it is a straggler. Rows get
    ``sim_round_s`` and ``sim_clock_s``, and the ids of the ``stragglers``, ``dropouts``
    and (``partial``) ``partial`` clients (:mod:`fedflex.launch.system_grid`).

    ``kind: lognormal``: speeds and bandwidths are log-normal with median 1 and
    ``bandwidth`` bytes/s, log-sigmas ``speed_sigma`` and ``bandwidth_sigma`` (FLGo's and
    FedScale's heterogeneity, as a parametric default where no device profile is given).
    ``kind: fedscale``: each client's compute (ms per sample) and bandwidth (kbps) from
    ``profile``, a FedScale ``client_device_capacity`` file (pickle or JSON; a relative path
    resolves against the scenario file's folder), timed as FedScale does
    (:mod:`fedflex.fedscale`); ``step_s`` and the ``*_sigma`` / ``bandwidth`` keys are then
    not read.
    """

    kind: str = "none"
    profile: str = ""
    step_s: float = 0.01
    speed_sigma: float = 0.5
    bandwidth: float = 1e6
    bandwidth_sigma: float = 0.5
    deadline_s: float = 0.0
    keep_first: int = 0
    dropout: float = 0.0
    partial: bool = False

    def validate(self, path: str) -> None:
        """Check this section's values; raise :class:`ConfigError` naming the key under ``path``."""
        _choice(path, "kind", self.kind, ("none", "lognormal", "fedscale"))
        if self.kind == "fedscale" and not self.profile:
            raise ConfigError(f"{path}.profile", self.profile, "kind fedscale needs a FedScale device-capacity file")
        _num(path, "step_s", self.step_s, gt=0)
        _num(path, "speed_sigma", self.speed_sigma, ge=0)
        _num(path, "bandwidth", self.bandwidth, gt=0)
        _num(path, "bandwidth_sigma", self.bandwidth_sigma, ge=0)
        _num(path, "deadline_s", self.deadline_s, ge=0)
        _num(path, "keep_first", self.keep_first, ge=0)
        _num(path, "dropout", self.dropout, ge=0, lt=1)
        if self.partial and not self.deadline_s:
            raise ConfigError(f"{path}.partial", self.partial, "cuts local work to a deadline: set deadline_s > 0")


@dataclass
class DeploymentConfig:
    """Waiting on a real federation (``flwr run`` on a SuperLink, ``fedflex deploy
    local``). In simulation every node exists from the start and answers, so these only
    bound waits that end at once.

    ``round_timeout``: seconds a round waits for the replies of the sampled SuperNodes
    (``null``: ``simulation.timeout``). A SuperNode that crashed is noticed by the
    SuperLink only after two missed heartbeats (about 60 s with Flower's defaults); its
    pending message then returns an error reply, so a round ends at the latest after
    ``round_timeout`` or that delay. Keep it above a node's normal reply time: a
    message that timed out is still processed by its node, which then lags behind.
    ``wait_for_nodes``: before round 1, wait until this many client ids have a live
    SuperNode (0: start at once with whoever is connected), at most ``wait_timeout``
    seconds. ``query_timeout``: seconds to wait for a new SuperNode to say its
    partition id.
    """

    round_timeout: Optional[float] = None
    wait_for_nodes: int = 0
    wait_timeout: float = 300.0
    query_timeout: float = 60.0

    def validate(self, path: str) -> None:
        """Check this section's values; raise :class:`ConfigError` naming the key under ``path``."""
        _num(path, "round_timeout", self.round_timeout, gt=0, optional=True)
        _num(path, "wait_for_nodes", self.wait_for_nodes, ge=0)
        _num(path, "wait_timeout", self.wait_timeout, ge=0)
        _num(path, "query_timeout", self.query_timeout, gt=0)


# tracker name -> (the module it needs, the fedflex extra that installs it)
TRACKERS = {"tensorboard": ("tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow"), "wandb": ("wandb", "wandb")}


def _missing_module(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


@dataclass
class OutputConfig:
    """Where results go: ``dir`` (default ``runs/<name>-<timestamp>``), PNG plots, progress.

    ``checkpoint_every``: save the server state (global model, parts' state, session
    tracker, round) every k rounds to ``checkpoint.npz`` (0: never); ``fedflex run
    --resume DIR`` continues from it. The final model is always saved (``model.npz``).

    ``trackers``: experiment trackers that also receive the run (:mod:`fedflex.tracking`):
    ``tensorboard`` (event files in ``DIR/tensorboard``), ``mlflow`` (``MLFLOW_TRACKING_URI``,
    else ``DIR/mlflow.db``), ``wandb`` (``WANDB_MODE=offline`` keeps it local). Each needs
    its package: ``pip install 'fedflex[tensorboard]'`` (or ``[mlflow]``, ``[wandb]``).
    """

    dir: Optional[str] = None
    plots: bool = True
    progress: str = "auto"  # auto | bar | lines | off
    checkpoint_every: int = 10
    trackers: list[str] = field(default_factory=list)

    def validate(self, path: str) -> None:
        """Check this section's values; raise :class:`ConfigError` naming the key under ``path``."""
        if self.progress in ("False", "false"):  # YAML reads a bare `off` as false
            self.progress = "off"
        _choice(path, "progress", self.progress, ("auto", "bar", "lines", "off"))
        _num(path, "checkpoint_every", self.checkpoint_every, ge=0)
        key = _join(path, "trackers")
        if isinstance(self.trackers, str):
            raise ConfigError(key, self.trackers, "must be a list of tracker names, e.g. [tensorboard]")
        for name in self.trackers:
            _choice(path, "trackers", name, tuple(TRACKERS))
            module, extra = TRACKERS[name]
            if _missing_module(module):
                raise ConfigError(
                    key, name, f"tracker {name} needs the {module} package: pip install 'fedflex[{extra}]'"
                )
        if len(set(self.trackers)) < len(self.trackers):
            raise ConfigError(key, list(self.trackers), "names a tracker twice")


@dataclass
class ScenarioConfig:
    """One complete experiment.

    Built in code (``ScenarioConfig(rounds=5, churn=ChurnConfig(kind="markov"))``), it is
    validated and its unset defaults are filled at construction: a bad value raises
    :class:`ConfigError` naming the key.
    """

    name: str = "scenario"
    seed: int = 0
    num_clients: int = 20
    rounds: int = 20
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    client: ClientConfig = field(default_factory=ClientConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    churn: ChurnConfig = field(default_factory=ChurnConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    simulation: SimulationConfig = field(default_factory=SimulationConfig)
    system: SystemConfig = field(default_factory=SystemConfig)
    deployment: DeploymentConfig = field(default_factory=DeploymentConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    def __post_init__(self) -> None:
        # a config built in code (ScenarioConfig(rounds=5, ...)) is checked and its
        # unset defaults (e.g. churn.min_session_rounds) filled as it is made
        self.validate()

    def _check_text_model(self) -> None:
        """Check that a text model reads token ids of an ``hf`` dataset; its embedding table has one row
        per id the tokenizer can emit (filled in when unset); LSTMs cannot be batched.
        """
        if self.model.name not in TEXT_MODELS:
            return
        if self.dataset.name != "hf":
            raise ConfigError(
                "model.name",
                self.model.name,
                f"reads token ids: use it with dataset.name=hf and a text input_column, not {self.dataset.name}",
            )
        rows = self.dataset.vocab_size + DatasetConfig.NUM_SPECIAL_TOKENS
        if self.model.vocab_size is None:
            self.model.vocab_size = rows
        elif self.model.vocab_size != rows:
            raise ConfigError(
                "model.vocab_size",
                self.model.vocab_size,
                f"must be dataset.vocab_size + {DatasetConfig.NUM_SPECIAL_TOKENS} = {rows} (or unset)",
            )
        if self.model.name == "text-lstm" and self.simulation.cohorts() == "on":
            raise ConfigError(
                self.simulation.cohorts_key(),
                "on",
                "model text-lstm cannot be trained as a batched cohort (torch.func.vmap has no rule for "
                "LSTM layers); use vectorize=off (or auto, which trains it one client at a time)",
            )

    def validate(self, path: str = "") -> None:
        """Check every section and the cross-section rules; raise :class:`ConfigError` naming the key."""
        _num(path, "seed", self.seed, ge=0)
        _num(path, "num_clients", self.num_clients, ge=1)
        _num(path, "rounds", self.rounds, ge=1)
        if self.strategy.sampler.clients_per_round is None:
            self.strategy.sampler.clients_per_round = min(5, self.num_clients)
        for f in dataclasses.fields(self):
            sub = getattr(self, f.name)
            if hasattr(sub, "validate"):
                sub.validate(_join(path, f.name))
        if self.partition.scheme == "natural" and self.dataset.name == "hf" and not self.dataset.client_column:
            raise ConfigError(
                "partition.scheme",
                "natural",
                "dataset hf splits naturally by a column: set dataset.client_column (writer, speaker, user id)",
            )
        if self.partition.scheme == "natural" and self.dataset.name not in ("synthetic", "hf"):
            raise ConfigError(
                "partition.scheme",
                "natural",
                f"dataset {self.dataset.name} has no natural split; "
                "use iid, dirichlet, shards, mixed-dirichlet or label-sets",
            )
        self._check_text_model()
        if self.deployment.wait_for_nodes > self.num_clients:
            raise ConfigError(
                "deployment.wait_for_nodes",
                self.deployment.wait_for_nodes,
                f"must be <= num_clients ({self.num_clients})",
            )
        if self.client.keep_optimizer_state and self.strategy.local_rule.name in ("bherd", "grab"):
            raise ConfigError(
                "client.keep_optimizer_state",
                True,
                f"local rule {self.strategy.local_rule.name} runs its own per-step loop with plain SGD and "
                "keeps no optimiser state; use it with sgd, fedprox, scaffold, fednova, feddyn or fedcm",
            )
        batch_norm = self.model.name == "cnn-fmnist-authors" or (
            self.model.name == "resnet18" and self.model.norm == "batch"
        )
        if self.simulation.cohorts() == "on" and batch_norm:
            fix = "use model.norm=group, or " if self.model.name == "resnet18" else "use "
            raise ConfigError(
                self.simulation.cohorts_key(),
                "on",
                f"model {self.model.name} keeps BatchNorm running statistics, which a "
                f"batched cohort cannot keep per client; {fix}vectorize=auto / off",
            )
        if self.strategy.sampler.clients_per_round > self.num_clients:
            raise ConfigError(
                "strategy.sampler.clients_per_round",
                self.strategy.sampler.clients_per_round,
                f"must be <= num_clients ({self.num_clients})",
            )
        if self.strategy.sampler.min_clients > self.num_clients:
            raise ConfigError(
                "strategy.sampler.min_clients",
                self.strategy.sampler.min_clients,
                f"must be <= num_clients ({self.num_clients})",
            )
        for s, ids in enumerate(self.churn.sessions):
            for cid in ids:
                if not 0 <= cid < self.num_clients:
                    raise ConfigError(
                        f"churn.sessions[{s}]", list(ids), f"client ids must lie in 0..{self.num_clients - 1}"
                    )
        if self.partition.scheme == "mixed-dirichlet" and self.num_clients % len(self.partition.alphas):
            raise ConfigError(
                "num_clients",
                self.num_clients,
                f"mixed-dirichlet needs a multiple of len(partition.alphas) = {len(self.partition.alphas)}",
            )
