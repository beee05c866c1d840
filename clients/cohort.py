"""Cohort training: the clients sampled in one round trained together, as one batched
computation over a client axis.

Small federated models do microseconds of arithmetic per SGD step and milliseconds of
Python and kernel launches; training K clients one after another pays that overhead K
times. Here the K clients' parameters and optimiser state are stacked along a leading
client axis, the model runs once per step for all of them
(:func:`torch.func.functional_call` under :func:`torch.func.vmap`: a convolution
becomes one grouped convolution, a linear layer one batched matrix product), and one
backward pass gives every client's gradient (the clients' losses are summed; their
parameters are disjoint, so each gets exactly its own gradient).

What stays per client, exactly as in the sequential loop
(:func:`clients.train.local_train`):

- its data order and random stream: batch positions come from
  :func:`clients.train.batch_order` with the client's own generator;
- its number of steps: a client that has run out of batches stands still (clients are
  ordered by step count, so each step computes only the prefix still training); a
  short last batch of an epoch is a batch of that size (per-example weights
  ``1 / len(batch)``, padding weighs 0);
- the optimiser (torch's SGD with momentum / weight decay, or Adam: the same update
  formulas, applied to the stacked tensors) and the rule's per-step terms
  (:class:`clients.train.StepTerms`: FedProx's ``mu``, SCAFFOLD's correction, FedCM's
  gradient scale);
- the reply: the rule's ``finish`` (:class:`clients.rule_io.RuleSteps`) builds it from the
  trained parameters, with the same records and metrics.

Results equal the sequential path's up to float rounding (batched kernels sum in another
order): ``tests/clients/test_cohort.py`` states the tolerance.

Not batched: models with BatchNorm running statistics (per-client buffers would need a
running-stats update under vmap; :func:`unsupported_reason` names the layer), recurrent
layers (vmap has no rule for ``aten::lstm``; embeddings and 1-D convolutions batch) and rules
with their own loop (BHerd, GraB): those rounds run one client at a time.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional, Sequence, cast

import torch
from torch import nn
from torch.func import functional_call, vmap

from fedflex.clients.train import StepTerms, TrainResult, TrainSettings, batch_order
from fedflex.data import ArrayDataset
from fedflex.losses import get_loss

logger = logging.getLogger(__name__)

__all__ = [
    "CohortClient",
    "batch_buckets",
    "train_cohort",
    "unsupported_reason",
    "cohort_chunk_size",
    "per_client_bytes",
    "vectorize_rule",
]

ADAM_BETAS = (0.9, 0.999)  # torch.optim.Adam's defaults, which make_optimizer uses
ADAM_EPS = 1e-8


@dataclass
class CohortClient:
    """One client of a cohort: its rows of the worker's data, its random stream and the
    terms its rule adds to each step.
    """

    indices: torch.Tensor
    generator: torch.Generator
    terms: StepTerms = StepTerms()


def unsupported_reason(model: nn.Module) -> Optional[str]:
    """Why ``model`` cannot be trained as a cohort (None: it can).

    BatchNorm layers in training mode update running statistics in place, one set per
    model; a cohort would need one set per client.
    """
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._NormBase) and module.track_running_stats:
            return f"{type(module).__name__} layer {name!r} keeps running statistics"
        if isinstance(module, nn.Dropout) and module.p > 0:
            return f"dropout layer {name!r} draws random masks"
        if isinstance(module, nn.RNNBase):
            return f"{type(module).__name__} layer {name!r} has no torch.func.vmap batching rule"
    return None


# ---------------------------------------------------------------------------- memory
def _activation_bytes(model: nn.Module, example: torch.Tensor) -> int:
    """Bytes of every module output for one example (a forward pass with hooks)."""
    total = 0

    def hook(_module, _inputs, output) -> None:
        nonlocal total
        if isinstance(output, torch.Tensor):
            total += output.numel() * output.element_size()

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        with torch.no_grad():
            model(example)
    finally:
        for h in handles:
            h.remove()
    return total


def per_client_bytes(model: nn.Module, example: torch.Tensor, batch_size: int, optimizer: str) -> int:
    """Return an estimate of one cohort member's memory: its parameters, gradient, optimiser
    state (momentum / Adam moments), step terms and start copy (6-7 model sizes), plus the
    activations of one batch kept for the backward pass (3x the forward outputs).
    """
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    copies = 7 if optimizer == "adam" else 6
    return copies * param_bytes + 3 * batch_size * _activation_bytes(model, example[:1])


def _free_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 << 30


def cohort_chunk_size(
    model: nn.Module, example: torch.Tensor, settings: TrainSettings, device: torch.device, fraction: float = 0.5
) -> int:
    """How many clients fit one chunk: ``fraction`` of the device's free memory (CUDA:
    ``mem_get_info``; CPU: MemAvailable) over :func:`per_client_bytes`, at least 1.
    """
    need = max(1, per_client_bytes(model, example, settings.batch_size, settings.optimizer))
    return max(1, int(_free_bytes(device) * fraction) // need)


# ---------------------------------------------------------------------------- vectorize=rule
#: ``simulation.vectorize=rule`` on a CPU: cohorts when one batched step's activations
#: (clients x batch x one example's module outputs) stay within this many bytes. Measured
#: on a 2-core CPU (docs/cohorts.md): below it the per-step launch overhead that cohorts
#: save dominates; above it the batched kernels run out of cache and are slower than the
#: same clients' steps one by one.
RULE_CPU_BYTES = 64 * 2**20


def vectorize_rule(
    model: nn.Module,
    example: torch.Tensor,
    device: torch.device,
    clients_per_round: int,
    batch_size: int,
    examples_per_client: float,
    cohort_size: int = 0,
) -> tuple[str, str]:
    """``("on" | "off", why)``: whether a run trains its rounds in cohorts, decided
    without timing from the model, the device, the clients per round and the batch.

    - a model that cannot be batched (:func:`unsupported_reason`), or one client per
      cohort: ``off``;
    - CUDA: ``on`` (a step of a small model is kernel-launch overhead there);
    - CPU: ``on`` when one batched step's activations, ``width x batch x`` one example's
      module outputs, are at most :data:`RULE_CPU_BYTES`; ``width`` is the clients per
      round (``cohort_size`` when smaller), ``batch`` the batch size or the mean client's
      examples when fewer (its local steps are then full-data steps).

    ``example``: one input example (any device, ``meta`` too: only shapes are used).

    Examples
    --------
    >>> mlp = nn.Sequential(nn.Flatten(), nn.Linear(784, 200), nn.ReLU(), nn.Linear(200, 10))
    >>> x = torch.zeros(1, 1, 28, 28)
    >>> vectorize_rule(mlp, x, torch.device("cpu"), 100, 32, 60.0)[0]
    'on'
    >>> vectorize_rule(mlp, x, torch.device("cpu"), 1, 32, 60.0)[0]
    'off'
    """
    reason = unsupported_reason(model)
    if reason is not None:
        return "off", f"the model cannot be batched ({reason})"
    width = min(clients_per_round, cohort_size) if cohort_size else clients_per_round
    if width < 2:
        return "off", f"{width} client per cohort: nothing to batch"
    if device.type == "cuda":
        return "on", f"{width} clients per cohort on {device.type}"
    batch = max(1, min(batch_size, math.ceil(examples_per_client)))
    footprint = width * batch * _activation_bytes(model, example[:1])
    mib = 2**20
    verdict = "<=" if footprint <= RULE_CPU_BYTES else ">"
    why = (
        f"{width} clients x batch {batch} x {_activation_bytes(model, example[:1]) / 1024:.1f} KiB of activations "
        f"= {footprint / mib:.1f} MiB per batched step {verdict} {RULE_CPU_BYTES / mib:.0f} MiB on {device.type}"
    )
    return ("on" if footprint <= RULE_CPU_BYTES else "off"), why


# ---------------------------------------------------------------------------- training
def _schedule(
    clients: Sequence[CohortClient], orders: Sequence[list], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Rows ``[K, S, B]`` (padding: the client's first row), per-example weights
    ``[K, S, B]`` (``1/len(batch)``, padding 0) and each client's step count, from each
    client's own :func:`batch_order` (``orders``).
    """
    k_n, s_n = len(clients), max((len(o) for o in orders), default=0)
    b_n = max((len(pos) for o in orders for pos in o), default=1)
    rows = torch.zeros(k_n, s_n, b_n, dtype=torch.long)
    weights = torch.zeros(k_n, s_n, b_n)
    for k, (client, order) in enumerate(zip(clients, orders)):
        idx = client.indices.cpu()
        for s, pos in enumerate(order):
            rows[k, s, : len(pos)] = idx[pos]
            rows[k, s, len(pos) :] = idx[0]
            weights[k, s, : len(pos)] = 1.0 / len(pos)
    return rows.to(device), weights.to(device), [len(o) for o in orders]


def batch_buckets(orders: Sequence[list], device: torch.device) -> list[list[int]]:
    """Cohort positions grouped for batched passes: on the CPU by each client's longest
    mini-batch rounded up to a power of two, so that padding at most doubles a client's
    batch; on a GPU one group (padding is nearly free there, every pass costs launches).

    A pass pads every client's batch to the longest one's: with batch 32, a client of 6
    examples in a pass with one client of 32 costs 32 examples' compute. At 10,000 clients
    (6 examples each on average, some hundreds) that made a batched round slower than
    training one client at a time.

    Examples
    --------
    >>> orders = [[[0] * 6], [[0] * 32, [0] * 8], [[0] * 5], [], [[0] * 2]]
    >>> batch_buckets(orders, torch.device("cpu"))
    [[1], [0, 2], [4], [3]]
    >>> batch_buckets(orders, torch.device("cuda"))
    [[0, 1, 2, 3, 4]]
    """
    if device.type != "cpu":
        return [list(range(len(orders)))]
    groups: dict[int, list[int]] = {}
    for k, order in enumerate(orders):
        longest = max((len(pos) for pos in order), default=0)
        groups.setdefault(1 << (longest - 1).bit_length() if longest else 0, []).append(k)
    return [groups[key] for key in sorted(groups, reverse=True)]


def _stack(
    terms: Sequence[Optional[dict[str, torch.Tensor]]], like: dict[str, torch.Tensor]
) -> Optional[dict[str, torch.Tensor]]:
    """Per-client correction tensors stacked on the client axis (zeros where a client
    has none); None when no client has one.
    """
    if all(t is None for t in terms):
        return None
    return {
        k: torch.stack([t[k].to(v.device, v.dtype) if t is not None else torch.zeros_like(v[0]) for t in terms])
        for k, v in like.items()
    }


def _expand(vec: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Return a ``[K]`` vector shaped to broadcast against a stacked ``[K, ...]`` tensor."""
    return vec.reshape(-1, *([1] * (like.dim() - 1)))


def train_cohort(
    model: nn.Module,
    data: ArrayDataset,
    clients: Sequence[CohortClient],
    settings: TrainSettings,
    device: torch.device,
) -> tuple[list["OrderedDict[str, torch.Tensor]"], list[TrainResult]]:
    """Train every client of ``clients`` from ``model``'s current parameters, at once.

    Returns each client's trained parameters (``named_parameters`` order, on
    ``device``) and its :class:`TrainResult` (examples, steps, mean mini-batch loss
    without the rule's terms), as :func:`clients.train.local_train` would give them
    one client at a time. ``model`` itself is not changed. ``data`` lives on ``device``.

    The clients train in passes of similar batch lengths (:func:`batch_buckets`); in a pass
    they are ordered by their number of steps (longest first), so the clients still
    training at step ``s`` are a prefix of the pass and each step computes only them.

    Raises
    ------
    ValueError
        When the model cannot be batched (:func:`unsupported_reason`) or the optimiser
        is unknown.
    """
    reason = unsupported_reason(model)
    if reason is not None:
        raise ValueError(f"cohort training cannot batch this model: {reason}")
    if settings.optimizer not in ("sgd", "adam"):
        raise ValueError(f"unknown optimizer {settings.optimizer!r}: use sgd or adam")
    if not clients:
        return [], []
    orders = [batch_order(len(c.indices), settings, c.generator) for c in clients]
    results: list[Any] = [None] * len(clients)
    trained: list[Any] = [None] * len(clients)
    for bucket in batch_buckets(orders, device):  # clients of similar batch lengths together
        rows, weights, counts = _schedule([clients[k] for k in bucket], [orders[k] for k in bucket], device)
        order = sorted(range(len(bucket)), key=lambda j: -counts[j])  # longest first (stable)
        pos = torch.tensor(order, device=device)
        rows, weights = rows[pos], weights[pos]
        live = [sum(1 for j in order if counts[j] > s) for s in range(rows.shape[1])]  # clients at step s
        members = [clients[bucket[j]] for j in order]
        params, losses = _train_sorted(model, data, members, rows, weights, live, settings, device)
        for i, j in enumerate(order):
            k, n = bucket[j], counts[j]
            results[k] = TrainResult(
                num_examples=len(clients[k].indices), num_steps=n, train_loss=losses[i] / n if n else math.nan
            )
            trained[k] = OrderedDict((name, p[i]) for name, p in params.items())
    return trained, results


def _train_sorted(
    model: nn.Module,
    data: ArrayDataset,
    clients: Sequence[CohortClient],
    rows: torch.Tensor,
    weights: torch.Tensor,
    live: list[int],
    settings: TrainSettings,
    device: torch.device,
) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Run the batched steps; ``live[s]`` clients (a prefix) train at step ``s``."""
    k_n = len(clients)
    model.train()
    start = {n: p.detach() for n, p in model.named_parameters()}
    names = list(start)
    buffers = {n: b.detach() for n, b in model.named_buffers()}
    params = {n: p.unsqueeze(0).repeat(k_n, *([1] * p.dim())).contiguous() for n, p in start.items()}
    correction = _stack([c.terms.correction for c in clients], params)
    mu = torch.tensor([c.terms.prox_mu for c in clients], device=device)
    use_prox = bool((mu > 0).any())
    scale = torch.tensor([c.terms.grad_scale for c in clients], device=device)
    use_scale = bool((scale != 1.0).any())
    lr, wd, momentum = settings.lr, settings.weight_decay, settings.momentum
    adam = settings.optimizer == "adam"
    state1 = {n: torch.zeros_like(p) for n, p in params.items()} if (adam or momentum) else None
    state2 = {n: torch.zeros_like(p) for n, p in params.items()} if adam else None
    loss_fn = get_loss(settings.loss).fn
    loss_sum = torch.zeros(k_n, device=device)
    shape = data.input_shape

    def forward(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return functional_call(model, (p, buffers), (x,))

    batched = vmap(forward, in_dims=(0, 0))
    for s, m in enumerate(live):
        flat = rows[:m, s].reshape(-1)
        x = data.inputs(flat).reshape(m, -1, *shape)
        y = data.labels(flat)
        leaves = {n: params[n][:m].detach().requires_grad_(True) for n in names}
        with torch.enable_grad():
            scores = batched(leaves, x)
            per_example = loss_fn(scores.reshape(flat.numel(), -1), y, reduction="none").reshape(m, -1)
            per_client = (per_example * weights[:m, s]).sum(dim=1)
            grads = torch.autograd.grad(per_client.sum(), [leaves[n] for n in names])
        loss_sum[:m] += per_client.detach()
        with torch.no_grad():
            for n, g in zip(names, grads):
                p = params[n][:m]
                if use_scale:
                    g = g * _expand(scale[:m], p)
                if correction is not None:
                    g = g + correction[n][:m]
                if use_prox:
                    g = g + _expand(mu[:m], p) * (p - start[n])
                if wd:
                    g = g + wd * p
                if adam:
                    b1, b2 = ADAM_BETAS
                    t = s + 1  # steps are a prefix: every live client is at step s + 1
                    m1, m2 = cast(dict, state1)[n][:m], cast(dict, state2)[n][:m]
                    m1.mul_(b1).add_(g, alpha=1 - b1)
                    m2.mul_(b2).addcmul_(g, g, value=1 - b2)
                    denom = (m2.sqrt() / math.sqrt(1 - b2**t)).add_(ADAM_EPS)
                    p.sub_(m1 / denom * (lr / (1 - b1**t)))
                elif momentum:
                    buf = cast(dict, state1)[n][:m]
                    buf.mul_(momentum).add_(g)
                    p.sub_(buf * lr)
                else:
                    p.sub_(g * lr)
    return {n: p.detach() for n, p in params.items()}, loss_sum.cpu().tolist()  # one host sync
