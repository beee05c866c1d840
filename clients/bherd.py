"""BHerd and GraB on the client: which local gradients a client uploads.

BHerd: Luo, Chen, Chen, Lin, Zhang & Li (2024), "BHerd: Accelerating Federated Learning
by Selecting a Beneficial Herd of Local Gradients", https://arxiv.org/abs/2403.16557.
GraB: Lu, Guo & De Sa (2022), "GraB: Finding Provably Better Data Permutations than
Random Reshuffling", NeurIPS 2022, https://arxiv.org/abs/2205.10733 (online gradient
balancing; used here as the BHerd paper's GraB-FedAvg baseline, its Algorithm 4).

BHerd client (``bherd``; the paper's Algorithms 2-3). All tau plain SGD steps run
unchanged; every mini-batch gradient z_l (the gradient the SGD step used, weight decay
included, taken at the local iterate where it was computed) is kept, flattened, on the
training device in ``bherd.dtype``. After the last step:

1. centre: c_l = z_l - mean(z);
2. greedy prefix balancing (Algorithm 2): s = 0; k times pick the unselected l that
   minimises ||s + c_l||, then s += c_l. Done exactly through the Gram matrix
   K = C C^T: ||s + c_l||^2 = ||s||^2 + 2 r_l + K_ll with r = the sum of the rows of K
   already selected (:func:`centered_gram`, :func:`herd_select`);
3. upload g = sum of the ORIGINAL (uncentred) z_l of the selected steps (record
   ``herd-g``), with tau, k, k / tau, ||g / k - mean(z)|| and ||mean(z)|| in the metrics.
   Their ratio is how far the herded step (g / alpha ~ tau g / k) is from FedAvg's
   (tau mean(z)), relative to FedAvg's.

k = ``herd_k(alpha, tau)`` = floor(alpha * tau + 1/2) (round half up, not Python's
banker's rounding), at least 1 and at most tau: alpha = 0.5, tau = 120 -> 60;
alpha = 0.1, tau = 5 -> 1 (0.5 rounds up); alpha = 0.1, tau = 4 -> 1 (at least one).
The server (:mod:`strategies.bherd`) steps w <- w - (eta / alpha) sum_i p_i g_i.

Memory: tau x d stored values per training client (``benchmarks/bherd_memory.py``).
``bherd.max_stored = M > 0`` bounds it: when tau > M the steps are cut into M
consecutive blocks of near-equal length (``array_split``), each stored as the sum of its
gradients; herding then runs on the block means and picks round(alpha M) blocks, and g
is the sum of the selected blocks (still a sum of original gradients; k counts their
steps). M >= tau is the paper's method.

Combinations (``bherd.base``; the paper names them but does not define them):

- ``fedavg``: as above.
- ``fednova``: the same client; the server normalises each client's herded direction
  by its count, ``w <- w - eta tau_eff sum_i p_i g_i / k_i`` with
  ``tau_eff = sum_i p_i tau_i`` (FedNova's normalised averaging applied to the mean of
  the selected gradients; alpha = 1 is vanilla FedNova).
- ``scaffold``: SCAFFOLD's corrected steps z_l + c - c_i are run and stored; centring
  removes the constant correction, so the selection is that of the raw gradients; g is
  the sum of the selected CORRECTED gradients, the server step is BHerd's, and c_i / c
  move by SCAFFOLD's option II from the whole trajectory (alpha = 1 is SCAFFOLD with
  weighted averaging and global step 1).

GraB client (``grab``, Algorithm 4): mu = s = g = 0; at every step
mu += grad / tau, z = grad - mu; if ||s + z|| < ||s - z|| (equivalently <s, z> < 0):
s += z, g += grad, else s -= z. Uploads g and alpha_i = selected / tau; the server
divides by alpha_t = sum_i p_i alpha_i. O(d) memory.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from fedflex import keys
from fedflex.clients.rule_io import RuleInput, RuleOutput
from fedflex.clients.scaffold import scaffold_finish, scaffold_variates
from fedflex.clients.train import StepTerms, TrainResult, batch_order, make_optimizer
from fedflex.lazy_dynamo import step as optimizer_step
from fedflex.losses import get_loss

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

#: Bytes of float32 scratch the Gram computation may use per column chunk.
GRAM_CHUNK_BYTES = 64 * 2**20


# ---------------------------------------------------------------------------- kernels
def herd_k(alpha: float, tau: int) -> int:
    """How many of ``tau`` gradients BHerd keeps: floor(alpha * tau + 1/2), clipped to
    [1, tau] (0 when tau = 0).

    Examples
    --------
    >>> herd_k(0.5, 120), herd_k(0.3, 120), herd_k(0.1, 5), herd_k(0.1, 4), herd_k(1.0, 7)
    (60, 36, 1, 1, 7)
    """
    if tau <= 0:
        return 0
    return min(tau, max(1, math.floor(alpha * tau + 0.5)))


def block_sizes(tau: int, max_rows: int) -> list[int]:
    """Return steps per stored row: all ones when ``max_rows`` is 0 or >= tau, else ``max_rows``
    consecutive blocks of near-equal length (the first ones one longer).

    Examples
    --------
    >>> block_sizes(5, 0), block_sizes(7, 3)
    ([1, 1, 1, 1, 1], [3, 2, 2])
    """
    rows = tau if max_rows <= 0 or tau <= max_rows else max_rows
    if rows == 0:
        return []
    base, extra = divmod(tau, rows)
    return [base + (1 if j < extra else 0) for j in range(rows)]


@torch.no_grad()
def centered_gram(rows: torch.Tensor, counts: Optional[Sequence[int]] = None) -> torch.Tensor:
    """K = C C^T of the centred gradients, float64 ``[m, m]`` on the rows' device.

    Parameters
    ----------
    rows : torch.Tensor
        ``[m, d]`` stored gradients (any float dtype); row j is the SUM of ``counts[j]``
        consecutive gradients (all ones: one gradient per row).
    counts : sequence of int, optional
        Gradients per row; the centred vectors are c_j = rows_j / counts_j - mean, with
        mean = sum_j rows_j / sum_j counts_j (the mean of all gradients).

    Notes
    -----
    Column chunks are converted to float32 (float64 rows stay float64) and centred
    before the product, so a large common mean does not cancel digits and
    half-precision storage needs only a chunk of float32 scratch
    (:data:`GRAM_CHUNK_BYTES`).
    """
    m, d = rows.shape
    work = torch.float64 if rows.dtype == torch.float64 else torch.float32
    n = (
        torch.ones(m, dtype=work, device=rows.device)
        if counts is None
        else torch.as_tensor(list(counts), dtype=work, device=rows.device)
    )
    total = float(n.sum())
    out = torch.zeros(m, m, dtype=torch.float64, device=rows.device)
    chunk = max(1, GRAM_CHUNK_BYTES // (4 * max(m, 1)))
    for start in range(0, d, chunk):
        block = rows[:, start : start + chunk].to(work)
        mean = block.sum(dim=0) / total
        centred = block / n[:, None] - mean
        out += (centred @ centred.T).to(torch.float64)
    return out


def herd_select(gram: np.ndarray | torch.Tensor, k: int) -> list[int]:
    """Greedy prefix balancing on a Gram matrix (BHerd's Algorithm 2).

    Picks, k times, the unselected l minimising ||s + c_l||^2 = ||s||^2 + 2 r_l + K_ll,
    with r = sum of the rows of K already selected (s = sum of the selected c's); ties
    go to the lowest index. O(k m) after the Gram matrix.

    Returns
    -------
    list of int
        The selected indices in the order they were picked.
    """
    K = np.asarray(gram.detach().cpu().numpy() if isinstance(gram, torch.Tensor) else gram, dtype=np.float64)
    m = K.shape[0]
    k = min(int(k), m)
    diag = np.diag(K).copy()
    r = np.zeros(m)
    free = np.ones(m, dtype=bool)
    order: list[int] = []
    for _ in range(k):
        score = np.where(free, 2.0 * r + diag, np.inf)
        j = int(np.argmin(score))
        order.append(j)
        free[j] = False
        r += K[j]
    return order


def herd_select_naive(vectors: np.ndarray, k: int) -> list[int]:
    """Algorithm 2 written out on the vectors (for tests): centre, then k times pick the
    unselected vector minimising ||s + c_l|| (lowest index on ties).
    """
    z = np.asarray(vectors, dtype=np.float64)
    c = z - z.mean(axis=0)
    s = np.zeros(z.shape[1])
    free = list(range(len(z)))
    order: list[int] = []
    for _ in range(min(int(k), len(z))):
        norms = [np.linalg.norm(s + c[row]) for row in free]
        j = free[int(np.argmin(norms))]
        order.append(j)
        free.remove(j)
        s = s + c[j]
    return order


class GrabBalancer:
    """GraB-FedAvg's online balancing of one round's gradients (BHerd paper, Alg. 4).

    ``add(grad)`` for each of the ``tau`` gradients in order; afterwards ``g`` is the
    sum of the selected ones and ``selected / tau`` their share.
    """

    def __init__(self, tau: int, like: torch.Tensor) -> None:
        self.tau = tau
        self.mu = torch.zeros_like(like, dtype=torch.float32)
        self.s = torch.zeros_like(self.mu)
        self.g = torch.zeros_like(self.mu)
        self.selected = 0
        self.mask: list[bool] = []

    @torch.no_grad()
    def add(self, grad: torch.Tensor) -> bool:
        """Balance one gradient; True when it is selected (||s + z|| < ||s - z||,
        i.e. <s, z> < 0 since ||s + z||^2 - ||s - z||^2 = 4 <s, z>).
        """
        grad = grad.to(torch.float32)
        self.mu += grad / self.tau
        z = grad - self.mu
        take = bool(torch.dot(self.s, z) < 0)
        if take:
            self.s += z
            self.g += grad
            self.selected += 1
        else:
            self.s -= z
        self.mask.append(take)
        return take

    @property
    def alpha(self) -> float:
        """Return the share of gradients selected so far (selected / tau; 0 before any step)."""
        return self.selected / self.tau if self.tau else 0.0


def grab_balance(grads: torch.Tensor | np.ndarray) -> tuple[list[bool], torch.Tensor]:
    """Run :class:`GrabBalancer` over the rows of ``grads``: (selected mask, g)."""
    z = torch.as_tensor(np.asarray(grads), dtype=torch.float32) if not isinstance(grads, torch.Tensor) else grads
    bal = GrabBalancer(len(z), z[0] if len(z) else torch.zeros(0))
    for row in z:
        bal.add(row)
    return bal.mask, bal.g


class GradientStore:
    """tau flattened gradients (or block sums of them) on the training device.

    Parameters
    ----------
    tau, dim
        Steps of the round (None: not known in advance, one row per step as they come,
        e.g. a user's own loop, :mod:`clients.helpers`) and parameters of the model.
    dtype, device
        Storage precision and place.
    max_rows
        0: one row per step; else at most this many rows (:func:`block_sizes`; needs
        ``tau``).
    """

    def __init__(
        self, tau: Optional[int], dim: int, dtype: torch.dtype, device: torch.device, max_rows: int = 0
    ) -> None:
        if tau is None and max_rows > 0:
            raise ValueError("bherd.max_stored > 0 needs the number of local steps in advance")
        self.growing = tau is None
        self.counts = [] if tau is None else block_sizes(tau, max_rows)
        self.rows = torch.empty(len(self.counts), dim, dtype=dtype, device=device)
        self._grown: list[torch.Tensor] = []
        self.total = torch.zeros(dim, dtype=torch.float32, device=device)
        self._row_of = np.repeat(np.arange(len(self.counts)), self.counts)
        self._last_of = set(np.cumsum(self.counts) - 1) if self.counts else set()
        self._acc = torch.zeros(dim, dtype=torch.float32, device=device) if tau and tau > len(self.counts) else None

    @property
    def nbytes(self) -> int:
        """Return the memory the stored gradient rows take, in bytes."""
        rows = [self.rows, *self._grown]
        return sum(r.numel() * r.element_size() for r in rows)

    @torch.no_grad()
    def add(self, step: int, grad: torch.Tensor) -> None:
        """Store the gradient of step ``step`` (0-based, in order)."""
        self.total += grad
        if self.growing:
            self._grown.append(grad.to(self.rows.dtype).clone())
            self.counts.append(1)
            return
        j = int(self._row_of[step])
        if self._acc is None:
            self.rows[j].copy_(grad)
            return
        self._acc += grad
        if step in self._last_of:
            self.rows[j].copy_(self._acc)
            self._acc.zero_()

    @torch.no_grad()
    def select(self, alpha: float) -> tuple[list[int], torch.Tensor, int]:
        """Herd the stored rows: (selected rows in pick order, g = their float32 sum,
        number of steps they hold).
        """
        if not self.counts:
            return [], torch.zeros_like(self.total), 0
        rows = torch.stack(self._grown) if self.growing else self.rows
        order = herd_select(centered_gram(rows, self.counts), herd_k(alpha, len(self.counts)))
        g = torch.zeros_like(self.total)
        for j in order:
            g += rows[j].to(torch.float32)
        return order, g, int(sum(self.counts[j] for j in order))


def herd_reply(
    store: GradientStore, tau: int, alpha: float, named: "OrderedDict[str, torch.Tensor]"
) -> tuple["OrderedDict[str, torch.Tensor]", dict[str, float]]:
    """Herd a round's stored gradients: g (the ``herd-g`` record, shaped like ``named``,
    on the CPU) and BHerd's reply metrics (tau, k, k / tau, the distance and mean norm of
    the module docstring). Shared by :func:`bherd_rule` and :class:`clients.helpers.BHerdClient`.
    """
    order, g, k = store.select(alpha)
    mean = store.total / tau if tau else store.total
    distance = float(torch.linalg.vector_norm(g / k - mean)) if k else math.nan
    logger.debug(
        "bherd: tau=%d, %d stored rows (%d bytes), picked %d steps: %s",
        tau,
        len(store.counts),
        store.nbytes,
        k,
        order[:10],
    )
    metrics = {
        keys.HERD_TAU: tau,
        keys.HERD_K: k,
        keys.HERD_ALPHA_I: k / tau if tau else 0.0,
        keys.HERD_DISTANCE: distance,
        keys.HERD_MEAN_NORM: float(torch.linalg.vector_norm(mean)),
    }
    return unflatten(g, named), metrics


# ---------------------------------------------------------------------------- training loop
def flat_gradient(params: Sequence[torch.Tensor], weight_decay: float) -> torch.Tensor:
    """Return the flattened gradient an SGD step uses: grad (+ weight_decay * p), float32."""
    parts = []
    for p in params:
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        if weight_decay:
            g = g + weight_decay * p.detach()
        parts.append(g.reshape(-1).to(torch.float32))
    return torch.cat(parts) if parts else torch.zeros(0)


def train_recording(
    inp: RuleInput,
    batches: list[torch.Tensor],
    on_gradient: Callable[[int, torch.Tensor], None],
    correction: Optional[dict[str, torch.Tensor]] = None,
) -> TrainResult:
    """Run the local SGD steps of :func:`clients.train.local_train`, handing each step's
    flattened gradient (after ``correction`` is added, before the step) to
    ``on_gradient(step, grad)``. The trajectory is exactly local training's.
    """
    assert inp.model is not None and inp.data is not None and inp.generator is not None  # None only in clients.helpers
    model, s = inp.model, inp.settings
    named = OrderedDict((k, p) for k, p in model.named_parameters() if p.requires_grad)
    params = list(named.values())
    model.train()
    optimizer = make_optimizer(model.parameters(), s)
    loss_fn = get_loss(s.loss).fn
    indices = inp.indices.to(inp.device)
    total, steps = 0.0, 0
    for step, pos in enumerate(batches):
        rows = indices[pos.to(inp.device)]
        x, y = inp.data.inputs(rows), inp.data.labels(rows)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        total += float(loss.detach())
        loss.backward()
        if correction is not None:
            StepTerms(correction=correction).add_to_gradients(named)
        with torch.no_grad():
            on_gradient(step, flat_gradient(params, s.weight_decay if s.optimizer == "sgd" else 0.0))
        optimizer_step(optimizer)
        steps += 1
    return TrainResult(num_examples=len(indices), num_steps=steps, train_loss=total / steps if steps else math.nan)


def unflatten(vector: torch.Tensor, named: "OrderedDict[str, torch.Tensor]") -> "OrderedDict[str, torch.Tensor]":
    """Return a flat vector cut into tensors shaped like ``named`` (on the CPU)."""
    out: "OrderedDict[str, torch.Tensor]" = OrderedDict()
    offset = 0
    for k, p in named.items():
        out[k] = vector[offset : offset + p.numel()].reshape(p.shape).detach().cpu()
        offset += p.numel()
    return out


def _check_sgd(inp: RuleInput, rule: str) -> None:
    if inp.settings.optimizer != "sgd":
        raise ValueError(
            f"{rule}: needs client.optimizer=sgd (its server step is eta times gradients), "
            f"got {inp.settings.optimizer!r}"
        )


# ---------------------------------------------------------------------------- rules
def bherd_rule(inp: RuleInput) -> RuleOutput:
    """BHerd's client (see the module docstring): all steps, herding, upload g.

    Options (``inp.options.bherd``): ``alpha``, ``dtype``, ``max_stored``,
    ``bherd.base`` (``scaffold`` runs SCAFFOLD's corrected steps and control variates).
    """
    _check_sgd(inp, "bherd")
    assert inp.model is not None and inp.data is not None and inp.generator is not None  # None only in clients.helpers
    opts = inp.options
    alpha, dtype, max_rows, base = opts.bherd.alpha, DTYPES[opts.bherd.dtype], opts.bherd.max_stored, opts.bherd.base
    named: "OrderedDict[str, torch.Tensor]" = OrderedDict(
        (k, p) for k, p in inp.model.named_parameters() if p.requires_grad
    )
    variates = scaffold_variates(inp, named) if base == "scaffold" else None
    x = {k: p.detach().clone() for k, p in named.items()} if variates is not None else None
    batches = batch_order(len(inp.indices), inp.settings, inp.generator)
    dim = sum(p.numel() for p in named.values())
    store = GradientStore(len(batches), dim, dtype, inp.device, max_rows)
    result = train_recording(inp, batches, store.add, correction=variates.correction if variates else None)
    g, metrics = herd_reply(store, result.num_steps, alpha, named)
    del store
    extras = {keys.HERD_G: g}
    if variates is not None:
        assert x is not None
        extras[keys.SCAFFOLD_DC] = scaffold_finish(inp, variates, x, named, result.num_steps)
    return RuleOutput(result, extras=extras, metrics=metrics)


def grab_rule(inp: RuleInput) -> RuleOutput:
    """GraB-FedAvg's client: plain SGD steps, online balancing, upload g and alpha_i."""
    _check_sgd(inp, "grab")
    assert inp.model is not None and inp.data is not None and inp.generator is not None  # None only in clients.helpers
    named: "OrderedDict[str, torch.Tensor]" = OrderedDict(
        (k, p) for k, p in inp.model.named_parameters() if p.requires_grad
    )
    batches = batch_order(len(inp.indices), inp.settings, inp.generator)
    dim = sum(p.numel() for p in named.values())
    balancer = GrabBalancer(len(batches), torch.zeros(dim, device=inp.device))
    total = torch.zeros(dim, dtype=torch.float32, device=inp.device)

    def on_gradient(step: int, grad: torch.Tensor) -> None:
        total.add_(grad)
        balancer.add(grad)

    result = train_recording(inp, batches, on_gradient)
    tau, k = result.num_steps, balancer.selected
    distance = float(torch.linalg.vector_norm(balancer.g / k - total / tau)) if k else math.nan
    metrics = {
        keys.HERD_TAU: tau,
        keys.HERD_K: k,
        keys.HERD_ALPHA_I: balancer.alpha,
        keys.HERD_DISTANCE: distance,
        keys.HERD_MEAN_NORM: float(torch.linalg.vector_norm(total / tau)) if tau else math.nan,
    }
    return RuleOutput(result, extras={keys.HERD_G: unflatten(balancer.g, named)}, metrics=metrics)
