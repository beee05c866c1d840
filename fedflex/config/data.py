"""The data sections of a scenario: ``dataset`` (which data, how it is read) and
``partition`` (how it is split among the clients).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional

from fedflex.checks import ConfigError
from fedflex.checks import choice as _choice
from fedflex.checks import join as _join
from fedflex.checks import number as _num

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
