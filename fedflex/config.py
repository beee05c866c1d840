"""Scenario configuration: a dataclass schema loaded with OmegaConf.

A scenario is one YAML file (see ``scenarios/``) merged over the defaults below, then
over command-line overrides in OmegaConf dotlist form (``client.lr=0.05``). Unknown keys,
wrong types and out-of-range values raise :class:`ConfigError`, whose message names the
dotted key, the value and what is allowed. Nothing here knows a strategy or a client:
the parts are named by strings that the runner resolves.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Iterable, Mapping, Optional, Sequence, cast

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from fedflex.trace import read_trace

logger = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A scenario key has a value that is not allowed.

    The message is one line: ``key = value: what is allowed``.
    """

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{key} = {value!r}: {allowed}")


# ---------------------------------------------------------------------------- checks
def _choice(path: str, name: str, value: Any, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ConfigError(_join(path, name), value, "must be one of " + ", ".join(allowed))


def _num(
    path: str,
    name: str,
    value: Optional[float],
    *,
    gt: Optional[float] = None,
    ge: Optional[float] = None,
    lt: Optional[float] = None,
    le: Optional[float] = None,
    optional: bool = False,
) -> None:
    key = _join(path, name)
    if value is None:
        if optional:
            return
        raise ConfigError(key, value, "must be set")
    if isinstance(value, bool) or not isinstance(value, (int, float)):  # a config built in code
        raise ConfigError(key, value, "must be a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(key, value, "must be a finite number")
    bounds = []
    if gt is not None:
        bounds.append((value > gt, f"> {gt}"))
    if ge is not None:
        bounds.append((value >= ge, f">= {ge}"))
    if lt is not None:
        bounds.append((value < lt, f"< {lt}"))
    if le is not None:
        bounds.append((value <= le, f"<= {le}"))
    if not all(ok for ok, _ in bounds):
        raise ConfigError(key, value, "must be " + " and ".join(text for _, text in bounds))


def _int_range(path: str, name: str, value: Any) -> Optional[list[int]]:
    """``value`` as ``[lo, hi]`` with integers 1 <= lo <= hi, or None."""
    if value is None:
        return None
    items = list(value) if isinstance(value, (list, tuple, ListConfig)) else None
    ok = (
        items is not None
        and len(items) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in items)
        and 1 <= items[0] <= items[1]
    )
    if not ok:
        raise ConfigError(_join(path, name), value, "must be null (off) or [lo, hi] with integers 1 <= lo <= hi")
    assert items is not None
    return [int(v) for v in items]


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


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


class _PartOptions:
    """Options of one part type, some read only by some of its parts: ``USED_BY`` maps
    an option to the part names that read it (options not listed are read by all).
    :meth:`unused` lists the options set away from their default that the chosen part
    ignores; :func:`load_scenario` warns about each.
    """

    USED_BY: ClassVar[dict[str, tuple[str, ...]]] = {}
    if TYPE_CHECKING:
        name: str  # a field of every subclass

    def _reads(self, option: str) -> bool:
        owners = self.USED_BY.get(option)
        return owners is None or self.name in owners

    def unused(self) -> list[tuple[str, Any, tuple[str, ...]]]:
        """``(option, value, the parts that read it)`` for every option set away from its
        default that the chosen part ignores.
        """
        default = type(self)()
        return [
            (option, getattr(self, option), owners)
            for option, owners in self.USED_BY.items()
            if getattr(self, option) != getattr(default, option) and not self._reads(option)
        ]

    def sent(self) -> list[str]:
        """Return the fields the chosen part reads (what a train message needs to carry)."""
        return [f.name for f in dataclasses.fields(cast(Any, self)) if self._reads(f.name)]


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


SAMPLERS = ("uniform", "hics", "pow-d", "clustered", "divfl", "fedcor")
#: Byzantine-robust aggregators (Flower's FedMedian, FedTrimmedAvg, Krum, MultiKrum, Bulyan)
ROBUST_AGGREGATORS = ("median", "trimmed-mean", "krum", "multikrum", "bulyan")
PLAIN_AGGREGATORS = ("fedavg", "fedavgm", "fedadam", "fedyogi", "fedadagrad", "fedams", "fedaware", "bherd")
AGGREGATORS = PLAIN_AGGREGATORS + ROBUST_AGGREGATORS
INITIALIZERS = ("previous", "average", "session-aware")
#: session-aware distance between session gradients (strategies/session_init.session_distance)
SESSION_DISTANCES = ("l2", "normalized")
LOCAL_RULES = ("sgd", "fedprox", "scaffold", "fednova", "bherd", "grab", "feddyn", "fedcm")
BHERD_BASES = ("fedavg", "fednova", "scaffold")
HICS_ESTIMATES = ("bias", "unit", "per-step")  # what HiCS-FL's entropy is taken of
HICS_REFRESH = ("every-round", "frozen")


@dataclass
class SamplerConfig(_PartOptions):
    """Who trains each round: ``clients_per_round`` (K) drawn from the online clients.

    - ``uniform``: without replacement (``weighted``: proportional to data size).
    - ``hics``: HiCS-FL (Chen & Vikalo, 2024): entropy estimate from the output-layer
      bias update at temperature ``temperature``, distance angle + ``hics_lambda`` x
      entropy gap, Ward clustering into ``num_clusters`` (0: K) groups, cluster softmax
      with gamma_t = ``gamma0`` (1 - t/T). ``departed``: what happens to the estimates of
      clients that go offline (``keep`` or ``drop``). ``variant``: ``paper`` (default) or
      the authors' code (``authors``). ``ward``: ``exact`` or ``scalable`` (large N).
      ``hics_estimate``: what the entropy is taken of: ``bias`` (the paper's bias update
      ``db``), ``unit`` (``db / ||db||``, scale-free) or ``per-step`` (``db`` / (lr x
      local steps)); unset: ``unit`` (``bias`` with ``variant: authors``), because on
      FMNIST setting (2) it ranks clients in every round and reaches 75% in fewer rounds
      (docs/hics-fl.md). ``temperature`` unset takes the estimate's default (0.0025 for
      ``bias``, the paper's; 0.2 for ``unit``, 0.1 for ``per-step``).
      ``hics_refresh``: ``every-round`` (the paper: a client's estimate is renewed
      whenever it trains) or ``frozen`` (kept from the warm-up, the authors' code);
      unset follows ``variant``.
    - ``pow-d``: Power-of-Choice (Cho et al., 2020): ``d`` candidates (0: all online)
      are asked for their loss on the global model; the K highest train.
    - ``clustered``: Clustered Sampling (Fraboni et al., 2021) on update similarity.
    - ``divfl``: DivFL (Balakrishnan et al., 2022): greedy facility location over update
      proxies; ``divfl_proxies``: ``stale`` (each client's latest update, default) or
      ``ideal`` (every online client trains on the current model each round before the
      selection; ``divfl_probe_steps`` > 0 shortens that probe to so many local steps).
    - ``fedcor``: FedCor (Tang et al., 2022): a Gaussian process over the clients' loss
      changes (every online client reports its loss in the ``fedcor_warmup`` random
      rounds and in 2 of every ``fedcor_refresh`` rounds), client embeddings of
      ``fedcor_rank`` dimensions fitted to the last ``fedcor_history`` loss-change
      vectors, greedy selection by expected global loss reduction; ``fedcor_discount``
      lowers the assumed drop of a client per selection since the last fit.

    ``clients_per_round``: unset, 5 (or ``num_clients`` when there are fewer); a value
    above ``num_clients`` is refused. ``explore_first``: online clients that never trained are drawn first (shuffled,
    without replacement), then the named sampler draws (FedAWARE's exploration phase:
    every client has a momentum after about N/K rounds instead of ~(N/K) ln N).
    """

    name: str = "uniform"
    clients_per_round: Optional[int] = None  # unset: 5, or num_clients when fewer
    min_clients: int = 1
    weighted: bool = False
    temperature: Optional[float] = None  # unset: per hics_estimate (bias: 0.0025, the paper's)
    hics_estimate: Optional[str] = None  # unset: unit (variant paper), bias (variant authors)
    hics_refresh: Optional[str] = None  # unset: every-round (variant paper), frozen (authors)
    hics_lambda: float = 10.0
    gamma0: float = 4.0
    num_clusters: int = 0
    departed: str = "keep"
    variant: str = "paper"
    ward: str = "exact"
    d: int = 0
    divfl_proxies: str = "stale"
    divfl_probe_steps: int = 0  # ideal proxies: 0 = the round's local training
    fedcor_warmup: int = 15
    fedcor_refresh: int = 10  # 0: never refit after the warm-up
    fedcor_rank: int = 10
    fedcor_history: int = 50
    fedcor_discount: float = 0.9
    explore_first: bool = False

    USED_BY: ClassVar[dict[str, tuple[str, ...]]] = {
        "weighted": ("uniform",),
        **{
            k: ("hics",)
            for k in (
                "temperature",
                "hics_estimate",
                "hics_refresh",
                "hics_lambda",
                "gamma0",
                "num_clusters",
                "departed",
                "variant",
            )
        },
        "ward": ("hics", "clustered"),
        "d": ("pow-d",),
        **{k: ("divfl",) for k in ("divfl_proxies", "divfl_probe_steps")},
        **{
            k: ("fedcor",)
            for k in ("fedcor_warmup", "fedcor_refresh", "fedcor_rank", "fedcor_history", "fedcor_discount")
        },
    }

    def validate(self, path: str) -> None:
        """Check this section's values; raise :class:`ConfigError` naming the key under ``path``."""
        _choice(path, "name", self.name, SAMPLERS)
        _num(path, "clients_per_round", self.clients_per_round, ge=1)
        _num(path, "min_clients", self.min_clients, ge=1)
        if self.clients_per_round is not None and self.min_clients > self.clients_per_round:
            raise ConfigError(
                _join(path, "min_clients"),
                self.min_clients,
                f"must be <= clients_per_round ({self.clients_per_round})",
            )
        _num(path, "temperature", self.temperature, gt=0, optional=True)
        if self.hics_estimate is not None:
            _choice(path, "hics_estimate", self.hics_estimate, HICS_ESTIMATES)
        if self.hics_refresh is not None:
            _choice(path, "hics_refresh", self.hics_refresh, HICS_REFRESH)
        _num(path, "hics_lambda", self.hics_lambda, ge=0)
        _num(path, "gamma0", self.gamma0, ge=0)
        _num(path, "num_clusters", self.num_clusters, ge=0)
        _choice(path, "departed", self.departed, ("keep", "drop"))
        _choice(path, "variant", self.variant, ("paper", "authors"))
        _choice(path, "ward", self.ward, ("exact", "scalable"))
        _num(path, "d", self.d, ge=0)
        _choice(path, "divfl_proxies", self.divfl_proxies, ("stale", "ideal"))
        _num(path, "divfl_probe_steps", self.divfl_probe_steps, ge=0)
        _num(path, "fedcor_warmup", self.fedcor_warmup, ge=1)
        if self.fedcor_refresh == 1:
            raise ConfigError(_join(path, "fedcor_refresh"), 1, "must be 0 (never) or >= 2 (two queries per refresh)")
        _num(path, "fedcor_refresh", self.fedcor_refresh, ge=0)
        _num(path, "fedcor_rank", self.fedcor_rank, ge=1)
        _num(path, "fedcor_history", self.fedcor_history, ge=2)
        _num(path, "fedcor_discount", self.fedcor_discount, gt=0, le=1)


@dataclass
class AggregatorConfig(_PartOptions):
    """How replies become the next model.

    - ``fedavg``: x <- x + ``server_lr`` (avg_i x_i - x), avg weighted by examples
      (``weighted``) or plain.
    - ``fedavgm`` / ``fedadam`` / ``fedyogi`` / ``fedadagrad``: server optimisers on the
      pseudo-gradient x - avg_i x_i (Hsu et al., 2019; Reddi et al., 2021): ``server_lr``,
      ``server_momentum`` (FedAvgM), ``beta1``, ``beta2``, ``tau``.
    - ``fedams``: FedAMS (Wang et al., 2022): Adam's moments with v_hat = max(v_hat, v)
      (AMSGrad); ``beta1``, ``beta2``, ``tau`` (epsilon), ``ams_epsilon_at``: ``max``
      (default, the paper's v_hat = max(v_hat, v, eps), step m / sqrt(v_hat)) or
      ``denominator`` (step m / (sqrt(v_hat) + eps), FedAMSGrad).
    - ``fedaware``: FedAWARE (Zeng et al.): per-client momenta (``aware_momentum``),
      min-norm weights by Frank-Wolfe; see ``aware_*`` keys.
    - ``bherd``: BHerd's server step w - (eta / alpha) sum_i p_i g_i.
    - Byzantine-robust (Flower's own functions, ``strategies/robust.py``): ``median``
      (coordinate-wise median), ``trimmed-mean`` (cut ``trim_beta`` of each tail per
      coordinate), ``krum`` / ``multikrum`` (Blanchard et al., 2017: the reply, or the
      ``num_krum_selected`` replies (null: n - f), closest to their n - f - 2 nearest
      neighbours; multikrum averages them by examples when ``weighted``), ``bulyan``
      (El Mhamdi et al., 2018: multikrum selection, then a coordinate-wise trimmed mean
      around the median); ``num_malicious`` is f, the Byzantine clients to tolerate. Each
      steps x <- x + ``server_lr`` (agg - x).
    ``clip_norm`` (any aggregator but bherd): each client's update (reply - global model,
    float arrays) is scaled down to at most this L2 norm before the parts see it.
    ``aware: true`` adds the AWARE projection to a server optimiser (plug-in).
    ``on_model_switch``: what server-optimiser state does when an initializer replaces
    the model (``keep`` or ``reset``).
    """

    name: str = "fedavg"
    weighted: bool = True
    server_lr: float = 1.0
    server_momentum: float = 0.9
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3
    ams_epsilon_at: str = "max"  # fedams: eps inside the max (paper) or added to sqrt(v_hat)
    aware: bool = False
    aware_momentum: float = 0.5
    aware_normalize: bool = False
    aware_rescale: bool = False
    aware_warmup: bool = True
    aware_iters: Optional[int] = None  # solver cap; unset: 250 (frank-wolfe, the authors'), 10,000 (away-steps)
    aware_tol: float = 1e-5
    aware_solver: str = "frank-wolfe"  # frank-wolfe (the authors') | away-steps (converges: docs/fedaware.md)
    aware_gap_tol: float = 1e-6  # away-steps: stop at this relative duality gap
    aware_memory: str = "full"
    aware_layers: int = 2  # last-layers memory: the last K float tensors (2: the output layer)
    aware_dtype: str = "float32"
    aware_departed: str = "keep"  # offline clients: keep | exclude (from the solve) | drop
    aware_max_age: Optional[int] = None  # solve over momenta refreshed in the last A+1 rounds (null: all)
    on_model_switch: str = "keep"
    trim_beta: float = 0.2  # trimmed-mean: fraction cut off each tail, in [0, 0.5)
    num_malicious: int = 1  # krum / multikrum / bulyan: f, Byzantine clients tolerated
    num_krum_selected: Optional[int] = None  # multikrum: replies averaged (null: n - f)
    clip_norm: Optional[float] = None  # max L2 norm of a client's update (null: no clipping)

    USED_BY: ClassVar[dict[str, tuple[str, ...]]] = {
        # median, trimmed-mean, krum and bulyan weigh every reply alike
        "weighted": tuple(a for a in AGGREGATORS if a not in ("median", "trimmed-mean", "krum", "bulyan")),
        "trim_beta": ("trimmed-mean",),
        "num_malicious": ("krum", "multikrum", "bulyan"),
        "num_krum_selected": ("multikrum",),
        "server_momentum": ("fedavgm",),
        **{k: ("fedadam", "fedyogi", "fedadagrad", "fedams") for k in ("beta1", "beta2", "tau")},
        "ams_epsilon_at": ("fedams",),
        **{
            k: ("fedaware", "aware=true")  # or any base with aware: true (see _reads)
            for k in (
                "aware_momentum",
                "aware_normalize",
                "aware_rescale",
                "aware_warmup",
                "aware_iters",
                "aware_tol",
                "aware_solver",
                "aware_gap_tol",
                "aware_memory",
                "aware_layers",
                "aware_dtype",
                "aware_departed",
                "aware_max_age",
            )
        },
    }

    def _reads(self, option: str) -> bool:
        return super()._reads(option) or (option.startswith("aware_") and self.aware)

    def validate(self, path: str) -> None:
        """Check this section's values; raise :class:`ConfigError` naming the key under ``path``."""
        _choice(path, "name", self.name, AGGREGATORS)
        _num(path, "server_lr", self.server_lr, gt=0)
        _num(path, "server_momentum", self.server_momentum, ge=0, lt=1)
        _num(path, "beta1", self.beta1, ge=0, lt=1)
        _num(path, "beta2", self.beta2, ge=0, lt=1)
        _num(path, "tau", self.tau, gt=0)
        _choice(path, "ams_epsilon_at", self.ams_epsilon_at, ("max", "denominator"))
        _num(path, "aware_momentum", self.aware_momentum, gt=0, le=1)
        _num(path, "aware_iters", self.aware_iters, ge=1, optional=True)
        _num(path, "aware_tol", self.aware_tol, gt=0)
        _choice(path, "aware_solver", self.aware_solver, ("frank-wolfe", "away-steps"))
        _num(path, "aware_gap_tol", self.aware_gap_tol, ge=0)
        _choice(path, "aware_memory", self.aware_memory, ("full", "last-layers"))
        _choice(path, "aware_dtype", self.aware_dtype, ("float32", "float16", "bfloat16"))
        _num(path, "aware_layers", self.aware_layers, ge=1)
        _choice(path, "aware_departed", self.aware_departed, ("keep", "exclude", "drop"))
        _num(path, "aware_max_age", self.aware_max_age, ge=0, optional=True)
        _choice(path, "on_model_switch", self.on_model_switch, ("keep", "reset"))
        _num(path, "trim_beta", self.trim_beta, ge=0, lt=0.5)
        _num(path, "num_malicious", self.num_malicious, ge=0)
        _num(path, "num_krum_selected", self.num_krum_selected, ge=1, optional=True)
        _num(path, "clip_norm", self.clip_norm, gt=0, optional=True)


@dataclass
class InitializerConfig(_PartOptions):
    """Where a session starts after churn (the churn paper's plug-in and baselines).

    - ``previous``: continue from the latest global model;
    - ``average``: the plain mean of the stored last models of earlier sessions;
    - ``session-aware``: softmin(-R d) weights over the stored last models, d the L2
      distance between session gradients; ``pilot_sessions`` (P), ``gradient_rounds``
      (V), ``similarity_scale`` (R). See ``specs/session-init.md``. ``distance``: ``l2``
      (the spec, ``||G_s - G_z||``) or ``normalized`` (the authors' code: the mean over
      weight tensors of the distance between unit-length gradients, in [0, 2] whatever
      the lr; docs/session-init.md).
    """

    name: str = "previous"
    pilot_sessions: int = 1
    gradient_rounds: int = 1
    similarity_scale: float = 10.0
    distance: str = "l2"

    USED_BY: ClassVar[dict[str, tuple[str, ...]]] = {
        k: ("session-aware",) for k in ("pilot_sessions", "gradient_rounds", "similarity_scale", "distance")
    }

    def validate(self, path: str) -> None:
        """Check this section's values; raise :class:`ConfigError` naming the key under ``path``."""
        _choice(path, "name", self.name, INITIALIZERS)
        _num(path, "pilot_sessions", self.pilot_sessions, ge=1)
        _num(path, "gradient_rounds", self.gradient_rounds, ge=1)
        _num(path, "similarity_scale", self.similarity_scale, ge=0)
        _choice(path, "distance", self.distance, SESSION_DISTANCES)


@dataclass
class LocalRuleConfig(_PartOptions):
    """What a client sends.

    - ``sgd``: plain local training; ``fedprox``: + ``mu``/2 ||w - w_g||^2;
    - ``scaffold``: control variates (Karimireddy et al., 2020), client variates kept in
      the node's state; ``fednova``: normalised averaging (Wang et al., 2020; with
      aggregator ``fedavg``, or a server optimiser for FedNova with server momentum);
    - ``bherd``: herding selection of ``k = max(1, floor(bherd_alpha * tau + 1/2))``
      of the tau local gradients (Luo et al., 2024); the server steps with
      ``eta / bherd_alpha`` times their weighted sum (aggregator ``bherd``).
      ``bherd_fixed_order``: the same batch order every round (any local rule);
      ``bherd_dtype``: precision of the stored gradients; ``bherd_max_stored`` (0: no
      bound): store at most this many gradient rows, consecutive steps summed into
      blocks (herding then picks blocks); ``bherd_base``: ``fedavg``, ``fednova`` or
      ``scaffold``, the method BHerd is combined with (see ``docs/bherd.md``).
    - ``grab``: GraB-FedAvg, online balancing of the local gradients (aggregator ``bherd``).
    - ``feddyn``: FedDyn (Acar et al., 2021): the client minimises its loss
      - <g_k, w> + ``feddyn_alpha``/2 ||w - w_g||^2 with its own g_k kept on the node;
      the server keeps h and shifts the average by -h / alpha (``strategies/feddyn.py``).
    - ``fedcm``: FedCM (Xu et al., 2021): local steps along ``fedcm_alpha`` g +
      (1 - ``fedcm_alpha``) Delta, Delta the server's global momentum.

    The rule's server half sends the options its rule reads (:meth:`sent`) with every
    train message (:func:`fedflex.records.to_record` under ``local-rule``); the client
    reads this class back (:func:`fedflex.records.from_record`).
    """

    name: str = "sgd"
    mu: float = 0.01
    bherd_alpha: float = 0.5
    bherd_fixed_order: bool = False
    bherd_dtype: str = "float32"
    bherd_max_stored: int = 0
    bherd_base: str = "fedavg"
    feddyn_alpha: float = 0.01
    fedcm_alpha: float = 0.1

    USED_BY: ClassVar[dict[str, tuple[str, ...]]] = {
        "mu": ("fedprox",),
        **{k: ("bherd",) for k in ("bherd_alpha", "bherd_dtype", "bherd_max_stored")},
        "bherd_base": ("bherd", "grab"),  # grab refuses any but fedavg (strategies.build)
        "feddyn_alpha": ("feddyn",),
        "fedcm_alpha": ("fedcm",),
    }

    def validate(self, path: str) -> None:
        """Check this section's values; raise :class:`ConfigError` naming the key under ``path``."""
        _choice(path, "name", self.name, LOCAL_RULES)
        _num(path, "mu", self.mu, ge=0)
        _num(path, "bherd_alpha", self.bherd_alpha, gt=0, le=1)
        _choice(path, "bherd_dtype", self.bherd_dtype, ("float32", "float16", "bfloat16"))
        _num(path, "bherd_max_stored", self.bherd_max_stored, ge=0)
        _choice(path, "bherd_base", self.bherd_base, BHERD_BASES)
        _num(path, "feddyn_alpha", self.feddyn_alpha, gt=0)
        _num(path, "fedcm_alpha", self.fedcm_alpha, gt=0, le=1)


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
    """

    every: int = 1
    batch_size: int = 1000
    online_labels: bool = False
    transition_window: int = 10
    stop_at_accuracy: float = 0.0
    stop_smoothing: int = 0
    stop_smoothing_order: int = 3
    stop_on_divergence: bool = True

    def validate(self, path: str) -> None:
        """Check this section's values; raise :class:`ConfigError` naming the key under ``path``."""
        _num(path, "every", self.every, ge=1)
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

    ``backend``: ``ray`` (Flower's simulation runtime: a Ray worker pool runs the
    ClientApp; ``num_cpus`` / ``num_gpus`` per virtual client, fractions pack several per
    core or GPU) or ``local`` (the same ServerApp and ClientApp handlers in one process,
    clients one after another, no Ray: for debugging and small models, where Ray's
    start-up and messaging dominate).

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

    backend: str = "ray"
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    timeout: float = 3600.0
    vectorize: str = "rule"
    vectorize_choice: Optional[str] = None
    cohort_size: int = 0
    ray_address: Optional[str] = None

    def validate(self, path: str) -> None:
        """Check this section's values; raise :class:`ConfigError` naming the key under ``path``."""
        _choice(path, "backend", self.backend, ("ray", "local"))
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
        if self.client.lr_schedule != "constant" and (
            self.strategy.aggregator.name == "bherd" or self.strategy.local_rule.name == "fedcm"
        ):
            part = "aggregator bherd" if self.strategy.aggregator.name == "bherd" else "local rule fedcm"
            raise ConfigError(
                "client.lr_schedule",
                self.client.lr_schedule,
                f"{part} steps on the server with the fixed client.lr; use lr_schedule=constant",
            )
        if self.partition.scheme == "mixed-dirichlet" and self.num_clients % len(self.partition.alphas):
            raise ConfigError(
                "num_clients",
                self.num_clients,
                f"mixed-dirichlet needs a multiple of len(partition.alphas) = {len(self.partition.alphas)}",
            )


# ---------------------------------------------------------------------------- loading
def load_scenario(
    path: Optional[str | Path | Mapping[str, Any]] = None, overrides: Iterable[str] = ()
) -> ScenarioConfig:
    """Load a scenario: defaults <- YAML file <- dotlist overrides; validate; return it.

    ``path`` may also be a mapping of scenario keys (a scenario built in code, e.g.
    ``dataclasses.asdict(cfg)``): it is checked as a file's content would be, and a
    relative ``churn.trace`` resolves against the working directory.

    Raises
    ------
    ConfigError
        For an unknown key, a wrong type, a bad value or an unreadable file.
    """
    schema = OmegaConf.structured(ScenarioConfig)
    layers: list[DictConfig | ListConfig] = []
    file_trace = None
    if isinstance(path, Mapping):
        try:
            layers.append(OmegaConf.create(dict(path)))
        except OmegaConfBaseException as exc:
            raise _from_omegaconf(exc) from None
        path = None
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError("scenario", str(path), "no such file")
        layers.append(OmegaConf.create(_read_yaml(p)))
        file_trace = OmegaConf.select(layers[0], "churn.trace", default=None)
    overrides = list(overrides)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(item, None, "overrides are dotted.key=value")
    if overrides:
        try:
            layers.append(OmegaConf.from_dotlist(overrides))
        except OmegaConfBaseException as exc:
            raise ConfigError(overrides[0].split("=")[0], overrides[0], _first_line(exc)) from None
    try:
        merged = OmegaConf.merge(schema, *layers)
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        error = _from_omegaconf(exc)
        if error.key == "scenario" and overrides:  # Omegaconf did not say which key: find it
            error = _culprit(schema, layers[:-1], overrides) or error
        raise error from None
    if not isinstance(cfg, ScenarioConfig):
        raise ConfigError("scenario", str(path), "did not load as a scenario")
    cfg.validate()
    warn_unused(cfg)
    if cfg.churn.trace:
        from_file = (
            path is not None and file_trace is not None and not any(o.startswith("churn.trace=") for o in overrides)
        )
        base = Path(path).resolve().parent if from_file and path is not None else Path.cwd()
        cfg.churn.trace = str((base / Path(cfg.churn.trace).expanduser()).resolve())
    if cfg.churn.kind == "trace":
        try:
            read_trace(cast(str, cfg.churn.trace), cfg.num_clients)  # set: checked by validate
        except ValueError as exc:
            raise ConfigError("churn.trace", cfg.churn.trace, str(exc)) from None
    return cfg


def warn_unused(cfg: ScenarioConfig) -> list[str]:
    """Warn (and return the warnings) for every part option set away from its default
    that the chosen part does not read, e.g. ``strategy.local_rule.mu`` with rule sgd.
    """
    said = []
    for part in ("sampler", "aggregator", "initializer", "local_rule"):
        options = getattr(cfg.strategy, part)
        for option, value, owners in options.unused():
            said.append(
                f"strategy.{part}.{option}={value} does nothing for {part.replace('_', ' ')} {options.name} "
                f"(read by: {', '.join(owners)})"
            )
    for option, value, decider, readers in cfg.client.unused():
        said.append(
            f"client.{option}={value} does nothing for client.{decider} {getattr(cfg.client, decider)} "
            f"(read by {decider}: {', '.join(readers)})"
        )
    for message in said:
        logger.warning(message)
    return said


class _DuplicateKey(Exception):
    pass


def _unique_key_loader():
    """Return a yaml SafeLoader class that refuses a key given twice in one mapping (built on
    first use: yaml is imported only when a scenario file is read).
    """
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def construct_mapping(loader, node, deep=False):
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            if key in seen:
                mark = key_node.start_mark
                raise _DuplicateKey(
                    f"key {key!r} given twice (line {seen[key] + 1}, and line {mark.line + 1} column {mark.column + 1})"
                )
            seen[key] = key_node.start_mark.line
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return Loader


def _read_yaml(p: Path) -> dict:
    """Return a scenario file's mapping; syntax errors name the line and column, a key given
    twice names both lines, a top level that is not a mapping is refused.
    """
    import yaml

    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("scenario", str(p), f"cannot be read ({exc})") from None
    try:
        data = yaml.load(text, Loader=_unique_key_loader())
    except _DuplicateKey as exc:
        raise ConfigError("scenario", str(p), str(exc)) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise ConfigError("scenario", str(p), f"not valid YAML ({where}{exc.problem or exc.context})") from None
    except yaml.YAMLError as exc:
        raise ConfigError("scenario", str(p), f"not valid YAML ({_first_line(exc)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            "scenario",
            str(p),
            f"the top level must be a mapping of keys (name: ..., rounds: ...), not a {type(data).__name__}",
        )
    return data


def _culprit(schema, file_layers: list, overrides: list[str]) -> Optional[ConfigError]:
    """Return the first override that fails on its own, as a ConfigError naming its key."""
    for item in overrides:
        key, _, value = item.partition("=")
        try:
            OmegaConf.to_object(OmegaConf.merge(schema, *file_layers, OmegaConf.from_dotlist([item])))
        except OmegaConfBaseException as exc:
            return ConfigError(key, value, _first_line(exc))
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _from_omegaconf(exc: OmegaConfBaseException) -> ConfigError:
    key = getattr(exc, "full_key", None) or "scenario"
    msg = _first_line(exc)
    if "not in struct" in msg or "Key '" in msg and "not in" in msg:
        allowed = "unknown key"
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        known = _known_keys(parent)
        if known:
            allowed += "; known keys here: " + ", ".join(known)
        return ConfigError(key, getattr(exc, "key", key), allowed)
    value = getattr(exc, "value", None) if hasattr(exc, "value") else None
    return ConfigError(key, value, msg)


def _known_keys(parent: str) -> list[str]:
    node: Any = ScenarioConfig
    for part in [p for p in parent.split(".") if p]:
        fields = {f.name: f for f in dataclasses.fields(node)} if dataclasses.is_dataclass(node) else {}
        if part not in fields:
            return []
        default = fields[part].default_factory if fields[part].default_factory is not dataclasses.MISSING else None
        node = default() if callable(default) else None
        if node is None or not dataclasses.is_dataclass(node):
            return []
        node = type(node)
    return [f.name for f in dataclasses.fields(node)] if dataclasses.is_dataclass(node) else []


def to_yaml(cfg: ScenarioConfig) -> str:
    """Return the fully resolved scenario as YAML (what ``config.yaml`` holds)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg: Any) -> dict:
    """Return a plain dict of a (sub-)config, for JSON and for messages."""
    return dataclasses.asdict(cfg)
