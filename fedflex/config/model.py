"""The ``model`` section of a scenario: the network and its loss."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from omegaconf import ListConfig

from fedflex.checks import ConfigError
from fedflex.checks import choice as _choice
from fedflex.checks import join as _join
from fedflex.checks import number as _num

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
