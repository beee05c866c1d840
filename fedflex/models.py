"""Model registry: the networks of the papers fedflex reproduces, built by name.

Every model maps a batch ``[B, *input_shape]`` to scores ``[B, num_classes]`` that
:func:`torch.nn.functional.cross_entropy` takes as logits (except the binary ``svm``:
one score ``[B, 1]`` for :mod:`fedflex.losses`' squared hinge), and ends in one
classification :class:`~torch.nn.Linear` that :func:`output_layer` returns (HiCS-FL
estimates a client's label skew from the update of that layer's bias, whose
``state_dict`` key :func:`output_bias_key` gives).

Models and where they come from:

- ``logreg``: multinomial logistic regression, ``flatten -> Linear(d, C)``; the model of
  FedProx (Li et al., "Federated Optimization in Heterogeneous Networks",
  arXiv 1812.06127) on Synthetic(alpha, beta) (d = 60, C = 10).
- ``linear``: the churn paper's model, ``flatten -> Linear(784, 10) -> log_softmax``
  (any input size: d = prod(input_shape)).
- ``mlp``: ``flatten -> Linear(d, h) -> ReLU [-> Linear(h, h2) -> ReLU ...] -> Linear(., C)``
  (``ModelConfig.hidden``: one width or a list; ``[200, 200]`` is FedAWARE's MLP
  784-200-200-10), a generic baseline.
- ``cnn-fmnist``: HiCS-FL's FMNIST CNN (Chen et al., "Heterogeneity-Guided Client
  Sampling", arXiv 2310.00198, Appendix): two 5x5 conv layers, two 2x2 max-pools, one
  fully-connected layer. The paper gives no channel counts; we use 16 then 32.
- ``cnn-fmnist-authors``: the FMNIST CNN of HiCS-FL's public code
  (github.com/CityChan/HiCS-FL, ``cnn.py``): three 3x3 convolutions (32, 32, 64
  channels, padding 1) each followed by PReLU and BatchNorm, 2x2 max-pools after the
  second and third, then FC 64 x H/4 x W/4 -> 64 -> ReLU -> C (229,709 parameters for
  28x28). Its BatchNorm running statistics travel and are averaged like the weights.
- ``cnn-bherd``: the BHerd paper's MNIST CNN: two 5x5 conv layers with 32 channels and
  padding 2, each followed by ReLU and 2x2 max-pooling, then FC 1568 -> 256 -> C.
- ``cnn-cifar``: FedAWARE's 5-layer CIFAR-10 CNN, which is the classic TensorFlow CIFAR
  tutorial net ``conv32 -> pool -> conv64 -> pool -> conv64 -> fc64 -> fc C`` (3x3
  kernels, no padding). HiCS-FL's CIFAR-10 CNN ("three 3x3 conv, two 2x2 max-pool,
  two FC, hidden 64") is the same network.
- ``cnn-svhn``: a standard small SVHN CNN (no paper prescribes one):
  ``conv(5x5, 32, pad 2) -> pool -> conv(5x5, 64, pad 2) -> pool -> fc512 -> fc C``.
- ``resnet18``: torchvision's ResNet-18 with BatchNorm or GroupNorm(2 groups) (the
  common FL choice of Hsieh et al., "The Non-IID Data Quagmire", ICML 2020); for small
  inputs (both sides <= 32) the usual CIFAR stem: 3x3 stride-1 ``conv1``, no max-pool.
- ``svm``: the BHerd paper's linear SVM (Luo et al., arXiv 2403.16557, Sec. 1.2),
  ``flatten -> Linear(d, 1)``: ONE score f(x) per example for a binary task
  (``num_classes`` must be 2), trained with the squared hinge loss
  (``model.loss=squared-hinge``, :mod:`fedflex.losses`); the predicted class is
  ``f(x) > 0``. It is the one model whose output is ``[B, 1]``, not ``[B, C]``: a
  two-column scorer ``f = s_1 - s_0`` would have twice the parameters and take steps
  twice as long, so it would not be the paper's SVM.

Text models (token ids ``int64 [B, L]`` from :mod:`fedflex.hf`, 0 = padding; an
embedding table of ``ModelConfig.vocab_size`` rows, ``embed_dim`` wide):

- ``embedding-bag``: the mean of the non-padding tokens' embeddings, then
  ``Linear(embed_dim, C)``: fastText (Joulin et al., "Bag of Tricks for Efficient Text
  Classification", EACL 2017), the model of PyTorch's AG News tutorial (embedding 64).
  It computes ``nn.EmbeddingBag(mode="mean", padding_idx=0)`` with an ``nn.Embedding`` and
  a masked mean, because ``torch.func.vmap`` (cohorts) has no batching rule for
  ``embedding_bag`` and would fall back to a slow per-client loop.
- ``text-cnn``: Kim's CNN ("Convolutional Neural Networks for Sentence Classification",
  EMNLP 2014) without dropout: 1-D convolutions of widths 3, 4, 5 with ``text_hidden``
  filters each, ReLU, max over time, ``Linear(3 * text_hidden, C)``. Needs L >= 5.
- ``text-lstm``: TextRNN (Liu, Qiu & Huang, "Recurrent Neural Network for Text
  Classification with Multi-Task Learning", IJCAI 2016), HiCS-FL's THUCNews model:
  ``rnn_layers`` (bi)LSTM layers of ``text_hidden`` units, the output at the last
  position, ``Linear``. Not batchable as a cohort (no vmap rule for LSTM).

All convolutional models take ``input_shape = (C, H, W)`` and compute their flattened
feature size from it, except ``cnn-bherd``, whose FC 1568 fixes H = W = 28. A shape a
model cannot take raises :class:`ValueError` naming the model, the shape and what the
model needs.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from fedflex.config import ModelConfig

__all__ = [
    "Classifier",
    "MODELS",
    "build_model",
    "num_parameters",
    "output_bias_key",
    "output_layer",
]

#: Attribute names under which a model keeps its classification layer, looked up in order.
OUTPUT_LAYER_ATTRS = ("fc_out", "fc")

Builder = Callable[[ModelConfig, tuple[int, ...], int], nn.Module]


# ---------------------------------------------------------------------------- module
class Classifier(nn.Module):
    """A feature ``body`` followed by the classification layer ``fc_out``.

    Parameters
    ----------
    body : nn.Module
        Maps ``[B, *input_shape]`` to ``[B, fc_out.in_features]``.
    fc_out : nn.Linear
        The classification layer; its output is the model's output.
    log_softmax : bool
        Return ``log_softmax(fc_out(...))`` instead of the raw scores (the churn
        paper's ``linear`` model).

    Notes
    -----
    ``state_dict`` keys are ``body.<i>.weight`` ... and ``fc_out.weight``,
    ``fc_out.bias``.
    """

    def __init__(self, body: nn.Module, fc_out: nn.Linear, log_softmax: bool = False) -> None:
        super().__init__()
        self.body = body
        self.fc_out = fc_out
        self.log_softmax = log_softmax

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the class scores (log-probabilities with ``log_softmax``) of the batch ``x``."""
        scores = self.fc_out(self.body(x))
        return F.log_softmax(scores, dim=1) if self.log_softmax else scores

    def extra_repr(self) -> str:
        """Return the extra text of the module's repr."""
        return "log_softmax=True" if self.log_softmax else ""


# ---------------------------------------------------------------------------- shape helpers
def _conv_side(side: int, kernel: int, padding: int = 0) -> int:
    """Output side of a stride-1 convolution."""
    return side + 2 * padding - kernel + 1


def _pool_side(side: int) -> int:
    """Output side of ``MaxPool2d(2)`` (stride 2, floor)."""
    return side // 2 if side > 0 else 0


def _smallest_side(feature_side: Callable[[int], int]) -> int:
    """Return the smallest input side whose feature map side is at least 1."""
    return next(s for s in range(1, 1025) if feature_side(s) >= 1)


def _shape_error(name: str, input_shape: tuple[int, ...], needs: str) -> ValueError:
    return ValueError(f"model {name!r} cannot take input shape {input_shape}: it needs {needs}")


def _image_shape(name: str, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """Check that ``input_shape`` is ``(C, H, W)`` and return it."""
    if len(input_shape) != 3:
        raise _shape_error(name, input_shape, "an image shape (C, H, W)")
    c, h, w = input_shape
    return c, h, w


def _feature_hw(name: str, input_shape: tuple[int, ...], feature_side: Callable[[int], int]) -> tuple[int, int, int]:
    """``(C_in, H_out, W_out)`` of a conv stack, or a ValueError when the input is too small."""
    c, h, w = _image_shape(name, input_shape)
    h_out, w_out = feature_side(h), feature_side(w)
    if h_out < 1 or w_out < 1:
        smallest = _smallest_side(feature_side)
        raise _shape_error(name, input_shape, f"(C, H, W) with H, W >= {smallest}")
    return c, h_out, w_out


# ---------------------------------------------------------------------------- builders
def _logreg(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Multinomial logistic regression (FedProx, arXiv 1812.06127): ``Linear(d, C)`` on
    the flattened input; returns logits.
    """
    return Classifier(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))


def _linear(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Return the churn paper's linear model: ``flatten -> Linear(d, C) -> log_softmax``
    (d = 784, C = 10 on MNIST; any input size works).

    It returns log-probabilities, not raw logits. That is harmless for
    :func:`torch.nn.functional.cross_entropy`, which applies ``log_softmax`` itself:
    ``log_softmax`` is idempotent (``log_softmax(log_softmax(z)) == log_softmax(z)``),
    so the loss, the gradients and the argmax are those of the raw logits.
    """
    return Classifier(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes), log_softmax=True)


def _mlp(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """``flatten -> (Linear -> ReLU) per hidden width -> Linear(last, C)``; returns logits.
    ``hidden``: one width (``200``) or a list (``[200, 200]``: FedAWARE's 784-200-200-10).
    """
    widths = list(cfg.hidden) if isinstance(cfg.hidden, (list, tuple)) else [cfg.hidden]
    if not widths or any(int(w) < 1 for w in widths):
        raise ValueError(f"model 'mlp': hidden = {cfg.hidden!r}: widths must be >= 1")
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for w in widths:
        layers += [nn.Linear(width, int(w)), nn.ReLU()]
        width = int(w)
    return Classifier(nn.Sequential(*layers), nn.Linear(width, num_classes))


def _cnn_fmnist_side(side: int) -> int:
    # conv5 (no padding) -> pool2 -> conv5 -> pool2; 28 -> 24 -> 12 -> 8 -> 4
    return _pool_side(_conv_side(_pool_side(_conv_side(side, 5)), 5))


def _cnn_fmnist(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """HiCS-FL's FMNIST CNN (arXiv 2310.00198, Appendix).

    ``conv(C_in, 16, 5) -> ReLU -> pool2 -> conv(16, 32, 5) -> ReLU -> pool2 -> flatten
    -> Linear(32 * H' * W', C)``; no padding, so H' = W' = 4 for 28x28 (FC 512 -> C)
    and 5 for 32x32. The paper names the layers but not their widths: 16 and 32
    channels are our choice (the common small MNIST CNN). Returns logits.
    """
    c, h, w = _feature_hw("cnn-fmnist", input_shape, _cnn_fmnist_side)
    body = nn.Sequential(
        nn.Conv2d(c, 16, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
    )
    return Classifier(body, nn.Linear(32 * h * w, num_classes))


def _cnn_fmnist_authors(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """HiCS-FL's FMNIST CNN as its authors' code builds it (module docstring).

    ``[conv3(C_in, 32, no bias) -> PReLU -> BN] -> [conv3(32, 32) -> PReLU -> BN -> pool2]
    -> [conv3(32, 64) -> PReLU -> BN -> pool2] -> flatten -> Linear(64 H/4 W/4, 64) ->
    ReLU -> Linear(64, C)``, padding 1 throughout. Returns logits.
    """
    c, h, w = _feature_hw("cnn-fmnist-authors", input_shape, lambda side: _pool_side(_pool_side(side)))
    body = nn.Sequential(
        nn.Conv2d(c, 32, 3, padding=1, bias=False),
        nn.PReLU(),
        nn.BatchNorm2d(32),
        nn.Conv2d(32, 32, 3, padding=1),
        nn.PReLU(),
        nn.BatchNorm2d(32),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.PReLU(),
        nn.BatchNorm2d(64),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * h * w, 64),
        nn.ReLU(),
    )
    return Classifier(body, nn.Linear(64, num_classes))


def _cnn_bherd(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Return the BHerd paper's CNN.

    ``conv(C_in, 32, 5, pad 2) -> ReLU -> pool2 -> conv(32, 32, 5, pad 2) -> ReLU ->
    pool2 -> flatten -> Linear(1568, 256) -> ReLU -> Linear(256, C)``. The paper fixes
    the FC input at 1568 = 32 * 7 * 7, so the input must be ``(C, 28, 28)``. Returns
    logits.
    """
    c, h, w = _image_shape("cnn-bherd", input_shape)
    if (h, w) != (28, 28):
        raise _shape_error("cnn-bherd", input_shape, "(C, 28, 28): its FC layer takes 1568 = 32 * 7 * 7 features")
    body = nn.Sequential(
        nn.Conv2d(c, 32, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 32, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 7 * 7, 256),
        nn.ReLU(),
    )
    return Classifier(body, nn.Linear(256, num_classes))


def _cnn_cifar_side(side: int) -> int:
    # conv3 -> pool2 -> conv3 -> pool2 -> conv3, no padding; 32 -> 30 -> 15 -> 13 -> 6 -> 4
    return _conv_side(_pool_side(_conv_side(_pool_side(_conv_side(side, 3)), 3)), 3)


def _cnn_cifar(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """FedAWARE's 5-layer CIFAR CNN (= the TensorFlow CIFAR tutorial net = HiCS-FL's
    CIFAR-10 CNN: three 3x3 conv, two 2x2 max-pool, two FC, hidden 64).

    ``conv(C_in, 32, 3) -> ReLU -> pool2 -> conv(32, 64, 3) -> ReLU -> pool2 ->
    conv(64, 64, 3) -> ReLU -> flatten -> Linear(64 * H' * W', 64) -> ReLU ->
    Linear(64, C)``; no padding, so 32x32 gives H' = W' = 4 (FC 1024 -> 64). Returns
    logits.
    """
    c, h, w = _feature_hw("cnn-cifar", input_shape, _cnn_cifar_side)
    body = nn.Sequential(
        nn.Conv2d(c, 32, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(64 * h * w, 64),
        nn.ReLU(),
    )
    return Classifier(body, nn.Linear(64, num_classes))


def _cnn_svhn_side(side: int) -> int:
    # 'same' 5x5 convs keep the side; two pools halve it twice: 32 -> 16 -> 8
    return _pool_side(_pool_side(side))


def _cnn_svhn(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Return a standard small SVHN CNN (none of the reproduced papers prescribes one).

    ``conv(C_in, 32, 5, pad 2) -> ReLU -> pool2 -> conv(32, 64, 5, pad 2) -> ReLU ->
    pool2 -> flatten -> Linear(64 * H/4 * W/4, 512) -> ReLU -> Linear(512, C)``
    (FC 4096 -> 512 for 32x32). Returns logits.
    """
    c, h, w = _feature_hw("cnn-svhn", input_shape, _cnn_svhn_side)
    body = nn.Sequential(
        nn.Conv2d(c, 32, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * h * w, 512),
        nn.ReLU(),
    )
    return Classifier(body, nn.Linear(512, num_classes))


def _group_norm(num_channels: int) -> nn.GroupNorm:
    """GroupNorm with 2 groups (Hsieh et al., 2020); a named function so models pickle."""
    return nn.GroupNorm(2, num_channels)


#: Inputs whose sides are all at most this get the CIFAR stem in ``resnet18``.
SMALL_IMAGE_SIDE = 32


def _resnet18(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Return torchvision's ResNet-18, randomly initialised, classification layer ``fc``.

    ``cfg.norm``: ``batch`` (BatchNorm2d) or ``group`` (GroupNorm with 2 groups, which
    does not depend on the batch statistics that differ between non-IID clients; Hsieh
    et al., 2020). ``conv1`` takes ``input_shape[0]`` channels. For small inputs (H and
    W both <= 32: CIFAR, SVHN, MNIST) ``conv1`` is 3x3 stride 1 padding 1 and the
    max-pool is dropped, the usual CIFAR adaptation (He et al., 2016, Sec. 4.2);
    larger inputs keep the ImageNet stem (7x7 stride 2, max-pool). Returns logits.
    """
    from torchvision.models import resnet18  # import here: torchvision is slow to import

    c, h, w = _image_shape("resnet18", input_shape)
    if cfg.norm == "batch":
        norm_layer: Callable[[int], nn.Module] = nn.BatchNorm2d
    elif cfg.norm == "group":
        norm_layer = _group_norm
    else:
        raise ValueError(f"model 'resnet18': norm = {cfg.norm!r} must be one of batch, group")
    model = resnet18(weights=None, num_classes=num_classes, norm_layer=norm_layer)
    small = max(h, w) <= SMALL_IMAGE_SIDE
    if small:
        model.conv1 = nn.Conv2d(c, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    elif c != 3:
        model.conv1 = nn.Conv2d(c, 64, kernel_size=7, stride=2, padding=3, bias=False)
    if small or c != 3:
        # the initialisation torchvision gives its own convolutions
        nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    return model


# ---------------------------------------------------------------------------- text
class MeanEmbedding(nn.Module):
    """The mean embedding of each row's non-padding ids (id 0 is padding): what
    ``nn.EmbeddingBag(num, dim, mode="mean", padding_idx=0)`` computes, written so that
    ``torch.func.vmap`` batches it. An all-padding row gives zeros.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(num_embeddings, embedding_dim, padding_idx=0)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = (ids != 0).unsqueeze(-1).to(self.embedding.weight.dtype)
        total = (self.embedding(ids) * mask).sum(dim=1)
        return total / mask.sum(dim=1).clamp(min=1.0)


class ConvPool(nn.Module):
    """Kim's CNN body: embed, 1-D convolutions of several widths, ReLU, max over time, concat."""

    def __init__(self, num_embeddings: int, embedding_dim: int, channels: int, widths: Sequence[int]) -> None:
        super().__init__()
        self.embedding = nn.Embedding(num_embeddings, embedding_dim, padding_idx=0)
        self.convs = nn.ModuleList(nn.Conv1d(embedding_dim, channels, w) for w in widths)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embedding(ids).transpose(1, 2)  # [B, D, L]
        return torch.cat([F.relu(conv(x)).amax(dim=2) for conv in self.convs], dim=1)


class LastStepLSTM(nn.Module):
    """TextRNN's body: embed, (bi)LSTM, the output at the last position."""

    def __init__(self, num_embeddings: int, embedding_dim: int, hidden: int, layers: int, bidirectional: bool) -> None:
        super().__init__()
        self.embedding = nn.Embedding(num_embeddings, embedding_dim, padding_idx=0)
        self.lstm = nn.LSTM(embedding_dim, hidden, num_layers=layers, batch_first=True, bidirectional=bidirectional)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embedding(ids))
        return out[:, -1]


#: Kernel widths of ``text-cnn`` (Kim, 2014).
TEXT_CNN_WIDTHS = (3, 4, 5)


def _text_rows(name: str, cfg: ModelConfig, input_shape: tuple[int, ...], min_len: int = 1) -> int:
    """Return the embedding table's rows; checks that the input is ``(L,)`` token ids."""
    if len(input_shape) != 1 or input_shape[0] < min_len:
        raise _shape_error(name, input_shape, f"token ids (L,) with L >= {min_len} (dataset.max_len)")
    if cfg.vocab_size is None:
        raise ValueError(f"model {name!r} needs model.vocab_size (dataset.vocab_size + 2; the scenario sets it)")
    return int(cfg.vocab_size)


def _embedding_bag(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """fastText: mean of the token embeddings -> ``Linear(embed_dim, C)``; returns logits."""
    rows = _text_rows("embedding-bag", cfg, input_shape)
    return Classifier(MeanEmbedding(rows, cfg.embed_dim), nn.Linear(cfg.embed_dim, num_classes))


def _text_cnn(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Kim's CNN: widths 3, 4, 5 x ``text_hidden`` filters, max over time -> Linear; logits."""
    rows = _text_rows("text-cnn", cfg, input_shape, min_len=max(TEXT_CNN_WIDTHS))
    body = ConvPool(rows, cfg.embed_dim, cfg.text_hidden, TEXT_CNN_WIDTHS)
    return Classifier(body, nn.Linear(cfg.text_hidden * len(TEXT_CNN_WIDTHS), num_classes))


def _text_lstm(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """TextRNN: (bi)LSTM, last position -> Linear; logits."""
    rows = _text_rows("text-lstm", cfg, input_shape)
    body = LastStepLSTM(rows, cfg.embed_dim, cfg.text_hidden, cfg.rnn_layers, cfg.bidirectional)
    width = cfg.text_hidden * (2 if cfg.bidirectional else 1)
    return Classifier(body, nn.Linear(width, num_classes))


def _svm(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Linear SVM (BHerd paper): ``flatten -> Linear(d, 1)``, one score per example.

    Binary only: ``num_classes`` must be 2 (labels 0 / 1; see ``dataset.label_map``).
    """
    if num_classes != 2:
        raise ValueError(
            f"model 'svm' (input shape {input_shape}) is a binary classifier with one output: "
            f"num_classes = {num_classes}, it needs 2 (set dataset.label_map=even-odd)"
        )
    return Classifier(nn.Flatten(), nn.Linear(math.prod(input_shape), 1))


#: Registry: model name -> builder ``(cfg, input_shape, num_classes) -> nn.Module``.
MODELS: dict[str, Builder] = {
    "logreg": _logreg,
    "linear": _linear,
    "mlp": _mlp,
    "cnn-fmnist": _cnn_fmnist,
    "cnn-fmnist-authors": _cnn_fmnist_authors,
    "cnn-bherd": _cnn_bherd,
    "cnn-cifar": _cnn_cifar,
    "cnn-svhn": _cnn_svhn,
    "resnet18": _resnet18,
    "svm": _svm,
    "embedding-bag": _embedding_bag,
    "text-cnn": _text_cnn,
    "text-lstm": _text_lstm,
}


# ---------------------------------------------------------------------------- public API
def build_model(cfg: ModelConfig, input_shape: Sequence[int], num_classes: int) -> nn.Module:
    """Build the model ``cfg.name`` for inputs of one example's shape ``input_shape``.

    Parameters
    ----------
    cfg : ModelConfig
        ``name`` picks the model from :data:`MODELS`; ``norm`` (resnet18) and
        ``hidden`` (mlp) tune it.
    input_shape : sequence of int
        One example's shape without the batch dimension: ``(d,)`` for vectors,
        ``(C, H, W)`` for images (flattening models take any shape).
    num_classes : int
        Width of the output.

    Returns
    -------
    nn.Module
        Maps ``[B, *input_shape]`` to ``[B, num_classes]`` scores that
        ``cross_entropy`` takes as logits (``linear`` returns log-probabilities; see
        its builder). Parameters are drawn from torch's global RNG: seed it
        (``torch.manual_seed``) for a reproducible model.

    Raises
    ------
    ValueError
        For an unknown name, a shape the model cannot take or a bad ``num_classes``;
        the message names the model, the shape and what is needed.
    """
    shape = tuple(int(s) for s in input_shape)
    if cfg.name not in MODELS:
        raise ValueError(f"unknown model {cfg.name!r} (input shape {shape}): must be one of " + ", ".join(MODELS))
    if not shape or any(s < 1 for s in shape):
        raise _shape_error(cfg.name, shape, "a non-empty shape of positive sizes")
    if int(num_classes) < 1:
        raise ValueError(f"model {cfg.name!r} (input shape {shape}): num_classes = {num_classes!r} must be >= 1")
    return MODELS[cfg.name](cfg, shape, int(num_classes))


def output_layer(model: nn.Module) -> nn.Linear:
    """Return the model's classification layer (its output is the model's output, up to
    ``linear``'s log-softmax).

    Looks for an :class:`~torch.nn.Linear` attribute named ``fc_out`` (fedflex's own
    models) or ``fc`` (torchvision's ResNet), in that order.

    Raises
    ------
    ValueError
        When the model has neither.
    """
    for attr in OUTPUT_LAYER_ATTRS:
        layer = getattr(model, attr, None)
        if isinstance(layer, nn.Linear):
            return layer
    raise ValueError(
        f"{type(model).__name__} has no classification layer: expected an nn.Linear attribute "
        + " or ".join(OUTPUT_LAYER_ATTRS)
    )


def output_bias_key(model: nn.Module) -> str:
    """Return the ``model.state_dict()`` key of the classification layer's bias
    (``fc_out.bias`` or ``fc.bias``).

    Raises
    ------
    ValueError
        When the classification layer has no bias or is not a submodule of ``model``.
    """
    layer = output_layer(model)
    if layer.bias is None:
        raise ValueError(f"{type(model).__name__}'s classification layer has no bias")
    for name, module in model.named_modules():
        if module is layer:
            return f"{name}.bias"
    raise ValueError(f"{type(model).__name__}'s classification layer is not one of its submodules")


def num_parameters(model: nn.Module) -> int:
    """Return number of scalar parameters (trainable or not; buffers such as BatchNorm running
    statistics are not counted).
    """
    return sum(p.numel() for p in model.parameters())
