"""FedAWARE: adaptive weighted aggregation by the minimum-norm point of client momenta,
and AWARE as a plug-in for other server optimisers.

Zeng, Xu, Liu, Pan, Wang & Tang, "On the Power of Adaptive Weighted Aggregation in
Heterogeneous Federated Learning and Beyond" (first titled "Tackling Hybrid Heterogeneity
on Federated Optimization via Gradient Diversity Maximization"), 2023,
https://arxiv.org/abs/2310.02702; authors' code: https://github.com/dunzeng/FedAWARE.

The server keeps a moving average of every client's pseudo-gradient
(g_i = x_t - x_i, the positive direction: the server subtracts it)::

    m_i <- (1 - a) m_i + a g_i        for the clients that trained this round
    lambda = argmin_{lambda in simplex} || sum_i lambda_i m_i ||^2   (Frank-Wolfe)
    d = sum_i lambda_i m_i;   x_{t+1} = x_t - eta_g d

AWARE plug-in (the paper's Proposition 3.1): a base method with update
x_{t+1} = x_t - eta_g d~ steps along the projection (<d~, d> / <d, d>) d instead; with
u = x_new - x the base's own update, x_{t+1} = x_t + (<u, d> / <d, d>) d.

Pieces, from the bottom up:

- pure kernels: :func:`two_point` (the spec's two-point rule), :func:`best_pair`,
  :func:`min_norm_weights` (Frank-Wolfe on the Gram matrix),
  :func:`projection_coefficient`, :func:`lambda_entropy` (the paper's e-LUD, reported
  for every aggregator, is :func:`strategies.diagnostics.e_lud`);
- :class:`MomentumStore`: the momenta in one preallocated ``[N, d]`` array
  (float32, float16 or bfloat16, the latter two with a per-row scale);
- :class:`AwareCore`: momenta, their Gram matrix (kept up to date row by row), warm-up,
  churn handling and the AWARE direction; shared by
- :class:`FedAwareAggregator` (FedAWARE) and :class:`AwarePlugin` (x AWARE).

The authors' exploration (every online client once, shuffled, before the base sampler
takes over) is :class:`strategies.basic.ExploreFirstSampler`, for any sampler.

Decisions the paper leaves open and their defaults are documented in ``docs/fedaware.md``.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from dataclasses import dataclass
from logging import DEBUG, WARNING
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

import numpy as np
from flwr.common import log

from fedflex.arrays import flatten, is_float
from fedflex.strategies.basic import FedAvgAggregator
from fedflex.strategies.parts import Aggregator, Arrays, ClientUpdate, PartWrapper

if TYPE_CHECKING:  # pragma: no cover
    from fedflex.config import ScenarioConfig

#: aggregators the AWARE plug-in can wrap (``strategy.aggregator.aware: true``)
AWARE_BASES = ("fedavg", "fedavgm", "fedadam", "fedyogi", "fedadagrad", "fedams")
#: storage types of the momenta
MOMENTUM_DTYPES = ("float32", "float16", "bfloat16")
#: what happens to the momentum of a client that is offline
DEPARTED = ("keep", "exclude", "drop")
#: min-norm solvers (:func:`min_norm_weights`, :func:`min_norm_away_steps`)
SOLVERS = ("frank-wolfe", "away-steps")
#: each solver's iteration cap when ``aware_iters`` is unset: the authors' 250 for
#: Frank-Wolfe; for away steps a guard only (the duality gap stops them first: 2,481
#: iterations, 0.16 s, on a real 100-client Gram matrix, docs/fedaware.md)
SOLVER_ITERS = {"frank-wolfe": 250, "away-steps": 10_000}
#: weights above this count as "nonzero" in the round metrics
NONZERO_WEIGHT = 1e-6

Rows = Union[np.ndarray, slice]


# ============================================================================ kernels
def two_point(v1v1: float, v1v2: float, v2v2: float) -> float:
    """Return the weight c of v1 in min_c ||c v1 + (1 - c) v2||^2, by the spec's two-point rule.

    Parameters
    ----------
    v1v1, v1v2, v2v2
        <v1, v1>, <v1, v2>, <v2, v2>.

    Returns
    -------
    float
        0.999 if v1.v2 >= v1.v1 (v1 is the better end), 0.001 if v1.v2 >= v2.v2 (v2 is),
        else the exact minimiser (v2.v2 - v1.v2) / (v1.v1 + v2.v2 - 2 v1.v2). The clipped
        ends are the authors' (MGDA's) choice; the Frank-Wolfe iterations that follow move
        the remaining 0.001 away when an end is optimal.
    """
    if v1v2 >= v1v1:
        return 0.999
    if v1v2 >= v2v2:
        return 0.001
    return (v2v2 - v1v2) / (v1v1 + v2v2 - 2.0 * v1v2)


def _scaled_gram(gram: np.ndarray, scale: Optional[np.ndarray]) -> Callable[[int], np.ndarray]:
    """Column t of S G S (S = diag(scale)), without forming S G S (read as row t: G is
    symmetric, and a row is contiguous).
    """
    if scale is None:
        return lambda t: gram[t]
    return lambda t: scale * gram[t] * scale[t]


def best_pair(
    gram: np.ndarray, scale: Optional[np.ndarray] = None, block_elems: int = 4_000_000
) -> tuple[int, int, float, float]:
    """Return the pair (i < j) whose best two-point combination has the smallest norm.

    Parameters
    ----------
    gram
        [n, n] Gram matrix of the vectors (n >= 2).
    scale
        Optional per-vector factors s (the vectors are s_i v_i: normalisation).
    block_elems
        Rows are processed in blocks of about this many pair entries (flat memory).

    Returns
    -------
    i, j, c, cost
        Weight c on vector i, 1 - c on vector j, and the pair's squared norm (as the
        authors compute it: the optimal end's norm when an end is optimal). Ties go to the
        first pair in (i, j) order.
    """
    n = gram.shape[0]
    diag = np.diag(gram).astype(np.float64)
    if scale is not None:
        diag = diag * scale * scale
    rows = max(1, block_elems // max(n, 1))
    best = (math.inf, 0, 1, 0.5)
    for b0 in range(0, n - 1, rows):
        b1 = min(n - 1, b0 + rows)
        # rows i in [b0, b1), columns j in (b0, n): the upper triangle and a little more
        v1v2 = np.array(gram[b0:b1, b0 + 1 :], dtype=np.float64)
        if scale is not None:
            v1v2 *= scale[b0:b1, None] * scale[None, b0 + 1 :]
        v1v1 = diag[b0:b1, None]
        v2v2 = diag[None, b0 + 1 :]
        end1 = v1v2 >= v1v1
        end2 = ~end1 & (v1v2 >= v2v2)
        with np.errstate(divide="ignore", invalid="ignore"):
            # the inner case's cost v2.v2 + c (v1.v2 - v2.v2) = v2.v2 - (v2.v2 - v1.v2)^2 / denominator
            cost = v2v2 - (v2v2 - v1v2) ** 2 / (v1v1 + v2v2 - 2.0 * v1v2)
        np.copyto(cost, np.broadcast_to(v2v2, cost.shape), where=end2)
        np.copyto(cost, np.broadcast_to(v1v1, cost.shape), where=end1)
        cost[np.tri(b1 - b0, n - b0 - 1, -1, dtype=bool)] = np.inf  # keep j > i only
        k = int(np.argmin(cost))
        r, jj = divmod(k, cost.shape[1])
        if cost[r, jj] < best[0]:
            i, j = b0 + r, b0 + 1 + jj
            best = (float(cost[r, jj]), i, j, two_point(float(diag[i]), float(v1v2[r, jj]), float(diag[j])))
    best_cost, i, j, c = best
    return i, j, c, best_cost


@dataclass
class MinNormResult:
    """A min-norm solve's answer: the weights, ||sum_i w_i v_i||^2, the iterations run,
    and the Frank-Wolfe duality gap lambda.M.lambda - min_i (M lambda)_i at the answer
    (>= 0; ``value`` exceeds the optimum by at most twice the gap).
    """

    weights: np.ndarray
    value: float
    iterations: int
    gap: float = 0.0

    @property
    def relative_gap(self) -> float:
        """Return gap / value (0 when the value is 0): what ``aware_gap`` reports."""
        return self.gap / self.value if self.value > 0 else 0.0


def _start(gram: np.ndarray, scale: Optional[np.ndarray]):
    """Both solvers' start: the checked Gram matrix's column accessor, its (scaled)
    diagonal, lambda at the best pair (:func:`best_pair`) and M lambda; or the answer
    itself for one vector.
    """
    gram = np.asarray(gram)
    if gram.ndim != 2 or gram.shape[0] != gram.shape[1] or gram.shape[0] == 0:
        raise ValueError(f"gram must be a non-empty square matrix, got shape {gram.shape}")
    n = gram.shape[0]
    if n == 1:
        value = float(gram[0, 0]) * (float(scale[0]) ** 2 if scale is not None else 1.0)
        return MinNormResult(np.ones(1), value, 0)
    column = _scaled_gram(gram, scale)
    diag = np.diag(gram) * (scale * scale if scale is not None else 1.0)
    i, j, c, _ = best_pair(gram, scale)
    lam = np.zeros(n)
    lam[i], lam[j] = c, 1.0 - c
    ml = c * column(i) + (1.0 - c) * column(j)  # M lambda, kept up to date
    return column, diag, lam, ml


def _gap(lam: np.ndarray, ml: np.ndarray) -> float:
    return max(float(lam @ ml) - float(ml.min()), 0.0)


def min_norm_weights(
    gram: np.ndarray, iters: int = 250, tol: float = 1e-5, scale: Optional[np.ndarray] = None
) -> MinNormResult:
    """argmin_{lambda in simplex} ||sum_i lambda_i v_i||^2 by Frank-Wolfe on the Gram matrix.

    The spec's solver (the authors' ``find_min_norm_element_FW``): start from the best
    pair (:func:`best_pair`), then up to ``iters`` times take the vertex
    t* = argmin_i (M lambda)_i, line-search c between lambda and e_t* with
    :func:`two_point`, and stop when ||delta lambda||_1 < ``tol``. Two differences, both
    making it more exact and neither changing a converged answer: a zero (or negative,
    by rounding) Frank-Wolfe gap, lambda.M.lambda - min_i (M lambda)_i <= 0, certifies
    the optimum and ends the loop (the spec's rule would step 0.001 away from it); and the
    iterations also run for n = 2 (they remove the 0.001 the two-point rule leaves on a
    worse end).

    Parameters
    ----------
    gram
        [n, n] symmetric positive semi-definite M = V V^T.
    iters, tol
        Iteration cap and stopping threshold on ||delta lambda||_1.
    scale
        Optional factors s: solve for the vectors s_i v_i (S M S) without forming it.

    Returns
    -------
    MinNormResult
    """
    start = _start(gram, scale)
    if isinstance(start, MinNormResult):
        return start
    column, diag, lam, ml = start
    k = 0
    for k in range(1, iters + 1):
        t = int(np.argmin(ml))
        v1v1, v1v2, v2v2 = float(lam @ ml), float(ml[t]), float(diag[t])
        if v1v2 >= v1v1:  # Frank-Wolfe gap <= 0: lambda is optimal
            k -= 1
            break
        c = two_point(v1v1, v1v2, v2v2)
        new = c * lam
        new[t] += 1.0 - c
        change = float(np.abs(new - lam).sum())
        lam, ml = new, c * ml + (1.0 - c) * column(t)
        if change < tol:
            break
    return MinNormResult(lam, max(float(lam @ ml), 0.0), k, _gap(lam, ml))


def min_norm_away_steps(
    gram: np.ndarray, iters: int = 250, gap_tol: float = 1e-6, scale: Optional[np.ndarray] = None
) -> MinNormResult:
    """argmin_{lambda in simplex} lambda.M.lambda by Frank-Wolfe with away steps.

    Plain Frank-Wolfe (:func:`min_norm_weights`) converges like 1/k and, capped at a few
    hundred iterations, can stop far from the optimum; with away steps (Guelat & Marcotte,
    1986; Lacoste-Julien & Jaggi, "On the Global Linear Convergence of Frank-Wolfe
    Optimization Variants", NeurIPS 2015) it converges linearly on the simplex. Each
    iteration, from the same start (:func:`best_pair`): the Frank-Wolfe vertex
    t = argmin_i (M lambda)_i and the away vertex a = argmax over the support; the
    direction with the larger gap (e_t - lambda, or lambda - e_a, whose step is capped at
    lambda_a / (1 - lambda_a) so that lambda stays in the simplex), with the exact line
    search of the quadratic. Stops when the duality gap lambda.M.lambda - min_i (M lambda)_i
    is at most ``gap_tol`` x lambda.M.lambda (a certificate: the value is then within
    2 x ``gap_tol`` of the optimum, relatively), or after ``iters`` iterations. One
    iteration costs one column of M, as Frank-Wolfe's does.
    """
    start = _start(gram, scale)
    if isinstance(start, MinNormResult):
        return start
    column, diag, lam, ml = start
    k = 0
    for k in range(1, iters + 1):
        value = float(lam @ ml)
        t = int(np.argmin(ml))
        fw_gap = value - float(ml[t])
        if fw_gap <= gap_tol * max(value, 0.0):
            k -= 1
            break
        support = np.flatnonzero(lam > 0)
        a = int(support[np.argmax(ml[support])])
        away_gap = float(ml[a]) - value
        if fw_gap >= away_gap:  # toward e_t: d = e_t - lambda, M d = M e_t - M lambda
            md = column(t) - ml
            slope, curve, cap = -fw_gap, float(diag[t]) - 2.0 * float(ml[t]) + value, 1.0
            vertex, toward = t, True
        else:  # away from e_a: d = lambda - e_a, M d = M lambda - M e_a
            md = ml - column(a)
            slope, curve = -away_gap, value - 2.0 * float(ml[a]) + float(diag[a])
            cap = lam[a] / (1.0 - lam[a]) if lam[a] < 1.0 else math.inf
            vertex, toward = a, False
        step = cap if curve <= 0 else min(cap, -slope / curve)
        if toward:
            lam *= 1.0 - step
            lam[vertex] += step
        else:
            lam *= 1.0 + step
            lam[vertex] -= step
            if step == cap:
                lam[vertex] = 0.0  # a drop step: e_a leaves the support exactly
        np.clip(lam, 0.0, None, out=lam)
        ml = ml + step * md
    return MinNormResult(lam, max(float(lam @ ml), 0.0), k, _gap(lam, ml))


def lambda_entropy(weights: np.ndarray) -> float:
    """Shannon entropy (nats) of a weight vector on the simplex (0 log 0 = 0)."""
    w = np.asarray(weights, dtype=np.float64)
    w = w[w > 0]
    return float(-(w * np.log(w)).sum())


def projection_coefficient(update: np.ndarray, direction: np.ndarray) -> Optional[float]:
    """<u, d> / <d, d>: the length of u along d in units of d (None when d = 0).

    With u = -eta_g d~ (a base method's update) the AWARE plug-in steps
    x + coefficient * d = x - eta_g (<d~, d> / <d, d>) d.
    """
    dd = float(np.vdot(direction, direction))
    if dd <= 0.0:
        return None
    return float(np.vdot(update, direction)) / dd


# ============================================================================ storage
class MomentumStore:
    """N momentum vectors of length d in one preallocated [N, d] array.

    ``float32`` rows are stored as they are. ``float16`` and ``bfloat16`` rows are stored
    as m_i / s_i with s_i = max_j |m_ij| (one float64 per row), so small updates do not
    fall into float16's subnormal range; ``bfloat16`` uses torch (numpy has no bfloat16).
    Rows of clients without a momentum are zero. Reads return float64.
    """

    def __init__(self, num_rows: int, dim: int, dtype: str = "float32") -> None:
        if dtype not in MOMENTUM_DTYPES:
            raise ValueError(f"dtype {dtype!r}: must be one of {', '.join(MOMENTUM_DTYPES)}")
        self.num_rows, self.dim, self.dtype = num_rows, dim, dtype
        self.scale: Optional[np.ndarray] = None
        if dtype == "bfloat16":
            import torch

            self.data: Any = torch.zeros((num_rows, dim), dtype=torch.bfloat16)
        else:
            self.data = np.zeros((num_rows, dim), dtype=np.float32 if dtype == "float32" else np.float16)
        if dtype != "float32":
            self.scale = np.ones(num_rows, dtype=np.float64)

    @property
    def nbytes(self) -> int:
        """Bytes held by the momenta (the array plus the row scales)."""
        if self.dtype == "bfloat16":
            data = self.data.element_size() * self.data.nelement()
        else:
            data = self.data.nbytes
        return int(data + (self.scale.nbytes if self.scale is not None else 0))

    def get(self, rows: Rows, dtype: Any = np.float64) -> np.ndarray:
        """Rows as ``dtype`` (float64 or float32), [len(rows), d]. A float32 slice of a
        float32 store is a read-only view (no copy).
        """
        if self.dtype == "bfloat16":
            import torch

            index = rows if isinstance(rows, slice) else torch.from_numpy(np.asarray(rows, dtype=np.int64))
            out = self.data[index].to(torch.float32).numpy()  # bf16 -> f32 is exact
            out = out if dtype == np.float32 else out.astype(dtype)
        elif self.data.dtype == dtype and isinstance(rows, slice):
            out = self.data[rows].view()
            out.flags.writeable = False
        else:
            out = self.data[rows].astype(dtype)
        if self.scale is not None:
            out *= self.scale[rows][:, None].astype(dtype)
        return out

    def set(self, rows: np.ndarray, values: np.ndarray) -> None:
        """Store float64 ``values`` ([len(rows), d]) in ``rows``."""
        values = np.asarray(values, dtype=np.float64)
        if self.scale is not None:
            s = np.abs(values).max(axis=1) if values.size else np.ones(len(rows))
            s = np.where(s > 0, s, 1.0)
            self.scale[rows] = s
            values = values / s[:, None]
        if self.dtype == "bfloat16":
            import torch

            self.data[torch.from_numpy(np.asarray(rows, dtype=np.int64))] = torch.from_numpy(values).to(torch.bfloat16)
        else:
            self.data[rows] = values.astype(self.data.dtype)

    def clear(self, rows: np.ndarray) -> None:
        """Zero ``rows`` (no momentum)."""
        self.set(rows, np.zeros((len(rows), self.dim)))


# ============================================================================ core
class AwareCore:
    """FedAWARE's server state and direction, shared by the aggregator and the plug-in.

    Parameters
    ----------
    num_clients
        N (client ids 0..N-1).
    momentum
        a in m_i <- (1 - a) m_i + a g_i (momenta start at zero, as in the paper).
    normalize
        Solve and step with m_i / ||m_i|| (the authors' code) instead of m_i (the paper).
    warmup
        FedAvg until every client online in the round has a momentum (without churn:
        until every client has trained once), then AWARE; False: AWARE from the first
        round over the clients that have a momentum.
    iters, tol
        Iteration cap (both solvers) and Frank-Wolfe's threshold on ||delta lambda||_1.
    solver, gap_tol
        ``frank-wolfe`` (the spec's and the authors' solver, :func:`min_norm_weights`) or
        ``away-steps`` (:func:`min_norm_away_steps`, which stops at a relative duality gap
        of ``gap_tol``). Both report the gap they reach (``aware_gap``).
    memory
        ``full``: momenta of the whole model. ``last-layers``: momenta (and the solve) of
        the last ``layers`` float tensors only; the step then weights this round's uploads
        by lambda restricted to the clients that trained (see :meth:`direction`).
    layers
        K for ``last-layers`` (2: the classification layer's weight and bias in every
        fedflex model).
    dtype
        Storage of the momenta (``float32``, ``float16``, ``bfloat16``).
    departed
        A client offline this round: ``keep`` (stays in the solve with its last momentum),
        ``exclude`` (kept, left out of the solve while offline) or ``drop`` (forgotten;
        it gets a fresh momentum when it trains again).
    reset_on_switch
        Forget all momenta (and warm up again) when an initializer replaces the model.
    max_age
        None (the paper): every stored momentum enters the solve. An integer A: only the
        momenta refreshed in the last A + 1 aggregations (age <= A; this round's are age
        0) do; older ones stay stored and come back when their client trains again. For
        samplers that pick some clients far more often than others (HiCS-FL), whose
        rarely picked clients' momenta are many rounds stale (docs/composition.md).
    """

    def __init__(
        self,
        num_clients: int,
        *,
        momentum: float = 0.5,
        normalize: bool = False,
        warmup: bool = True,
        iters: int = 250,
        tol: float = 1e-5,
        solver: str = "frank-wolfe",
        gap_tol: float = 1e-6,
        memory: str = "full",
        layers: int = 2,
        dtype: str = "float32",
        departed: str = "keep",
        reset_on_switch: bool = False,
        max_age: Optional[int] = None,
    ) -> None:
        if solver not in SOLVERS:
            raise ValueError(f"solver {solver!r}: must be one of {', '.join(SOLVERS)}")
        if memory not in ("full", "last-layers"):
            raise ValueError(f"memory {memory!r}: must be full or last-layers")
        if departed not in DEPARTED:
            raise ValueError(f"departed {departed!r}: must be one of {', '.join(DEPARTED)}")
        if not 0.0 < momentum <= 1.0:
            raise ValueError(f"momentum {momentum}: must be in (0, 1]")
        if max_age is not None and max_age < 0:
            raise ValueError(f"max_age {max_age}: must be >= 0 or None")
        if dtype not in MOMENTUM_DTYPES:
            raise ValueError(f"dtype {dtype!r}: must be one of {', '.join(MOMENTUM_DTYPES)}")
        self.num_clients = num_clients
        self.momentum, self.normalize, self.warmup = momentum, normalize, warmup
        self.iters, self.tol, self.solver, self.gap_tol = iters, tol, solver, gap_tol
        self.memory, self.layers, self.dtype = memory, layers, dtype
        self.departed, self.reset_on_switch, self.max_age = departed, reset_on_switch, max_age
        self.step = 0  # aggregations so far (direction() calls)
        self.refreshed = np.zeros(num_clients, dtype=np.int64)  # step at which each momentum was last set
        self.store: Optional[MomentumStore] = None
        self.gram = np.zeros((0, 0))
        self.has = np.zeros(num_clients, dtype=bool)
        self.warm = False  # warm-up over (latched)
        self.keys: list[str] = []
        self.total_dim = 0
        self.offset = 0  # first flat index of the stored part
        self.metrics: dict[str, Any] = {}
        self.last_weights = np.zeros(num_clients)

    # ------------------------------------------------------------------ setup
    def _setup(self, global_arrays: Arrays) -> None:
        keys = [k for k, v in global_arrays.items() if is_float(v)]
        if self.store is not None:
            if keys != self.keys:
                raise ValueError("the model's float entries changed between rounds")
            return
        sizes = [int(np.asarray(global_arrays[k]).size) for k in keys]
        self.keys, self.total_dim = keys, int(sum(sizes))
        stored = len(keys)
        if self.memory == "last-layers":
            if self.layers >= len(keys):
                log(
                    WARNING,
                    "fedaware: aware_memory=last-layers with aware_layers=%d >= the model's %d float "
                    "tensors amounts to aware_memory=full",
                    self.layers,
                    len(keys),
                )
                self.memory = "full"
            else:
                stored = self.layers
        self.offset = int(sum(sizes[: len(keys) - stored]))
        dim = self.total_dim - self.offset
        self.store = MomentumStore(self.num_clients, dim, self.dtype)
        self.gram = np.zeros((self.num_clients, self.num_clients))
        log(
            DEBUG,
            "fedaware: momenta of %s (%d of %d values per client, %s): %d bytes",
            ", ".join(keys[len(keys) - stored :]),
            dim,
            self.total_dim,
            self.dtype,
            self.store.nbytes,
        )

    @property
    def stored_keys(self) -> list[str]:
        """The float entries whose momenta are kept."""
        return self.keys[len(self.keys) - self._stored_count() :]

    def _stored_count(self) -> int:
        return len(self.keys) if self.memory == "full" else min(self.layers, len(self.keys))

    @property
    def nbytes(self) -> int:
        """Bytes of the momenta plus the N x N Gram matrix."""
        return (self.store.nbytes if self.store is not None else 0) + int(self.gram.nbytes)

    # ------------------------------------------------------------------ state
    def _update_momenta(self, ids: np.ndarray, grads: np.ndarray) -> None:
        """m_i <- (1 - a) m_i + a g_i for ``ids`` (rows of ``grads`` in the same order)."""
        assert self.store is not None
        a = self.momentum
        old = self.store.get(ids)  # zero rows for clients without a momentum
        self.store.set(ids, (1.0 - a) * old + a * grads[:, self.offset :])
        self.has[ids] = True
        self.refreshed[ids] = self.step
        self._update_gram(ids)

    def _update_gram(self, ids: np.ndarray) -> None:
        """Rows and columns ``ids`` of M = m m^T from the stored (dequantised) momenta.

        The products run in float32 over blocks of the store (a float32 store is read in
        place): K x N x d multiply-adds per round, memory bounded by the block.
        """
        assert self.store is not None
        n, dim = self.num_clients, self.store.dim
        rows = self.store.get(ids, np.float32)
        block = max(1, (32 << 20) // (4 * max(dim, 1)))  # ~32 MB of float32 per block
        out = np.zeros((len(ids), n))
        for c0 in range(0, n, block):
            c1 = min(n, c0 + block)
            if self.has[c0:c1].any():
                out[:, c0:c1] = rows @ self.store.get(slice(c0, c1), np.float32).T
        self.gram[ids, :] = out
        self.gram[:, ids] = out.T

    def forget(self, ids: np.ndarray) -> None:
        """Drop the momenta of ``ids``."""
        if self.store is None or len(ids) == 0:
            return
        self.store.clear(ids)
        self.has[ids] = False
        self.gram[ids, :] = 0.0
        self.gram[:, ids] = 0.0

    def reset(self) -> None:
        """Forget every momentum and warm up again."""
        self.forget(np.flatnonzero(self.has))
        self.warm = False

    # ------------------------------------------------------------------ round
    def direction(
        self, global_arrays: Arrays, updates: list[ClientUpdate], online: Optional[np.ndarray] = None
    ) -> Optional[np.ndarray]:
        """Update the momenta with this round's uploads; the AWARE direction, or None.

        Parameters
        ----------
        global_arrays
            x_t.
        updates
            The round's replies; each row goes to ``u.client`` (never reordered).
        online
            Client ids online this round (None: unknown, everyone counts as online).

        Returns
        -------
        numpy.ndarray or None
            d over the model's float entries (flat, float64, the order of
            :func:`fedflex.arrays.flatten`), or None while warming up.
            ``full``: d = sum_i lambda_i m_i (m_i / ||m_i|| when normalising).
            ``last-layers``: lambda is solved on the stored layers; d = sum_{i in S}
            lambda_i g_i / sum_{i in S} lambda_i over this round's trained clients S
            (g_i / ||g_i|| when normalising); when S carries no weight, the FedAvg
            direction of S (data-size weights).
        """
        t0 = time.perf_counter()
        self._setup(global_arrays)
        ids = np.array([u.client for u in updates], dtype=np.int64)
        if ids.size == 0:
            raise ValueError("direction needs at least one update")
        if len(np.unique(ids)) != ids.size or ids.min() < 0 or ids.max() >= self.num_clients:
            raise ValueError(f"client ids must be distinct and in 0..{self.num_clients - 1}: {ids.tolist()}")
        x = flatten(global_arrays)
        grads = np.stack([x - flatten(u.arrays) for u in updates])  # g_i = x - x_i, rows as ids
        self.step += 1
        online_mask = None
        if online is not None:
            online_mask = np.zeros(self.num_clients, dtype=bool)
            online_mask[np.asarray(online, dtype=np.int64)] = True
            online_mask[ids] = True  # a client that replied was online
            if self.departed == "drop":
                self.forget(np.flatnonzero(self.has & ~online_mask))
        self._update_momenta(ids, grads)
        self.metrics = {"aware_phase": "aware", "aware_with_momentum": int(self.has.sum())}
        if not self.warm:
            needed = online_mask if online_mask is not None else np.ones(self.num_clients, dtype=bool)
            if self.warmup and not self.has[needed].all():
                self.metrics["aware_phase"] = "warmup"
                self.metrics["aware_solve_s"] = time.perf_counter() - t0
                return None
            self.warm = True
        active = self.has if (self.departed != "exclude" or online_mask is None) else self.has & online_mask
        age = self.step - self.refreshed
        if self.max_age is not None:
            active = active & (age <= self.max_age)
        active_ids = np.flatnonzero(active)
        gram = self.gram if active_ids.size == self.num_clients else self.gram[np.ix_(active_ids, active_ids)]
        scale = None
        if self.normalize:
            norms = np.sqrt(np.maximum(np.diag(gram), 0.0))
            scale = np.where(norms > 0, 1.0 / np.where(norms > 0, norms, 1.0), 1.0)
        if self.solver == "away-steps":
            res = min_norm_away_steps(gram, self.iters, self.gap_tol, scale)
        else:
            res = min_norm_weights(gram, self.iters, self.tol, scale)
        lam = np.zeros(self.num_clients)
        lam[active_ids] = res.weights
        self.last_weights = lam
        if self.memory == "full":
            assert self.store is not None  # allocated with the memory
            coef = res.weights * (scale if scale is not None else 1.0)
            nz = np.flatnonzero(coef)
            d = coef[nz] @ self.store.get(active_ids[nz]) if nz.size else np.zeros(self.store.dim)
        else:
            d = self._sampled_direction(lam[ids], grads, updates)
        self.metrics.update(
            aware_active=int(active_ids.size),
            aware_nonzero=int((res.weights > NONZERO_WEIGHT).sum()),
            aware_entropy=lambda_entropy(res.weights),
            aware_fw_iters=res.iterations,
            aware_gap=res.relative_gap,
            aware_min_norm=math.sqrt(res.value),
            aware_age=float(res.weights @ age[active_ids]),
            aware_d_norm=float(np.linalg.norm(d)),
            aware_solve_s=time.perf_counter() - t0,
        )
        return d

    def _sampled_direction(self, weights: np.ndarray, grads: np.ndarray, updates: list[ClientUpdate]) -> np.ndarray:
        """last-layers: lambda restricted to this round's clients, over their full uploads."""
        mass = float(weights.sum())
        self.metrics["aware_mass_sampled"] = mass
        if mass > 0.0:
            vecs = grads
            if self.normalize:
                norms = np.linalg.norm(grads, axis=1)
                vecs = grads / np.where(norms > 0, norms, 1.0)[:, None]
            self.metrics["aware_fallback"] = False
            return (weights / mass) @ vecs
        self.metrics["aware_fallback"] = True
        sizes = np.array([u.num_examples for u in updates], dtype=np.float64)
        return (sizes / sizes.sum()) @ grads

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        """Return the state a checkpoint keeps (JSON/npz-friendly values)."""
        state: dict[str, Any] = {
            "has": self.has.copy(),
            "warm": self.warm,
            "gram": self.gram.copy(),
            "keys": list(self.keys),
            "memory": self.memory,
            "offset": self.offset,
            "total_dim": self.total_dim,
            "step": self.step,
            "refreshed": self.refreshed.copy(),
        }
        if self.store is not None:
            state["momenta"] = self.store.get(slice(0, self.num_clients)).astype(np.float32)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state that :meth:`state_dict` returned."""
        self.has = np.asarray(state["has"], dtype=bool).copy()
        self.warm = bool(state["warm"])
        # checkpoints of fedflex before max_age: ages start from the resume
        self.step = int(state.get("step", 0))
        self.refreshed = np.asarray(state.get("refreshed", np.zeros(self.num_clients)), dtype=np.int64).copy()
        if "momenta" in state:
            momenta = np.asarray(state["momenta"], dtype=np.float64)
            self.keys = list(state["keys"])
            self.memory, self.offset, self.total_dim = state["memory"], int(state["offset"]), int(state["total_dim"])
            self.store = MomentumStore(self.num_clients, momenta.shape[1], self.dtype)
            self.store.set(np.arange(self.num_clients), momenta)
            self.gram = np.asarray(state["gram"], dtype=np.float64).copy()

    def summary(self) -> str:
        """Describe the part and its settings in one line (the run log and summary.json)."""
        return (
            f"momentum={self.momentum}, normalize={self.normalize}, warmup={self.warmup}, "
            f"memory={self.memory}{f'({self.layers})' if self.memory == 'last-layers' else ''}, "
            f"dtype={self.dtype}, departed={self.departed}, max_age={self.max_age}, "
            f"solver={self.solver}, iters={self.iters}, tol={self.tol}"
        )


def _online(ctx: Any, server_round: int) -> Optional[np.ndarray]:
    """Return the clients online this round, when the strategy tells (FedFlex's round record)."""
    record = getattr(ctx, "record", None)
    online = getattr(record, "online", None)
    if record is None or getattr(record, "round", None) != server_round or not online:
        return None
    return np.asarray(online, dtype=np.int64)


def _step(global_arrays: Arrays, direction: np.ndarray, factor: float, updates: list[ClientUpdate]) -> Arrays:
    """Return x + factor * direction over the float entries (dtype kept); others from the first reply."""
    out: Arrays = OrderedDict()
    offset = 0
    for key, x in global_arrays.items():
        if is_float(x):
            size = x.size
            step = direction[offset : offset + size].reshape(x.shape)
            out[key] = (x.astype(np.float64) + factor * step).astype(x.dtype)
            offset += size
        else:
            out[key] = updates[0].arrays[key].copy()
    return out


def _norm(a: Arrays, b: Arrays) -> float:
    return math.sqrt(sum(float(np.sum((a[k].astype(np.float64) - b[k]) ** 2)) for k in a if is_float(a[k])))


# ============================================================================ parts
class FedAwareAggregator(Aggregator):
    """FedAWARE: x_{t+1} = x_t - eta_g d, d the min-norm point of the client momenta.

    During warm-up (see :class:`AwareCore`) it is FedAvg (``weighted``: by examples) with
    the same ``server_lr``. ``rescale``: scale d to the mean norm of this round's uploads
    (the normalised d is far shorter than a FedAvg step). Other parameters: see
    :class:`AwareCore`.
    """

    name = "fedaware"

    def __init__(
        self, num_clients: int, server_lr: float = 1.0, weighted: bool = True, rescale: bool = False, **core: Any
    ) -> None:
        self.core = AwareCore(num_clients, **core)
        self.server_lr, self.weighted, self.rescale = server_lr, weighted, rescale
        self.fedavg = FedAvgAggregator(weighted=weighted, server_lr=server_lr)
        self._metrics: dict[str, Any] = {}
        self._zero_logged = False

    def aggregate(self, server_round: int, global_arrays: Arrays, updates: list[ClientUpdate]) -> Arrays:
        """Return the next global model from the global model and the round's replies."""
        d = self.core.direction(global_arrays, updates, _online(self.ctx, server_round))
        self._metrics = dict(self.core.metrics)
        if d is None:
            new = self.fedavg.aggregate(server_round, global_arrays, updates)
        else:
            d_norm = float(np.linalg.norm(d))
            if d_norm == 0.0 and not self._zero_logged:
                log(
                    WARNING,
                    "round %d: fedaware direction is zero (the momenta's hull contains 0): the model does not move",
                    server_round,
                )
                self._zero_logged = True
            if self.rescale and d_norm > 0.0:
                x = flatten(global_arrays)
                target = float(np.mean([np.linalg.norm(x - flatten(u.arrays)) for u in updates]))
                d = d * (target / d_norm)
            new = _step(global_arrays, d, -self.server_lr, updates)
        self._metrics["aware_step_norm"] = _norm(new, global_arrays)
        return new

    def round_metrics(self) -> dict[str, Any]:
        """Return this round's figures for the round's row of metrics.jsonl."""
        return dict(self._metrics)

    def on_model_switch(self, server_round: int) -> None:
        """React to the initializer replacing the global model (state is reset when configured)."""
        if self.core.reset_on_switch:
            self.core.reset()

    def state_dict(self) -> dict[str, Any]:
        """Return the state a checkpoint keeps (JSON/npz-friendly values)."""
        return {"core": self.core.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state that :meth:`state_dict` returned."""
        self.core.load_state_dict(state["core"])

    def summary(self) -> str:
        """Describe the part and its settings in one line (the run log and summary.json)."""
        return (
            f"fedaware({self.core.summary()}, rescale={self.rescale}, server_lr={self.server_lr}, "
            f"weighted={self.weighted})"
        )


class AwarePlugin(PartWrapper, Aggregator):
    """AWARE on top of another aggregator (Proposition 3.1 of the paper).

    The base (FedAvg, FedAvgM, FedAdam, FedYogi, FedAdagrad; FedProx is FedAvg with the
    FedProx local rule) computes its own next model x_b and updates its own state; after
    warm-up the plug-in keeps only the part of u = x_b - x along the AWARE direction d:
    x_{t+1} = x + (<u, d> / <d, d>) d. Before the warm-up ends, and when d = 0, x_b is used.
    """

    name = "aware"
    base: Aggregator

    def __init__(self, base: Aggregator, num_clients: int, **core: Any) -> None:
        super().__init__(base)
        self.core = AwareCore(num_clients, **core)
        self._metrics: dict[str, Any] = {}

    def aggregate(self, server_round: int, global_arrays: Arrays, updates: list[ClientUpdate]) -> Arrays:
        """Return the next global model from the global model and the round's replies."""
        d = self.core.direction(global_arrays, updates, _online(self.ctx, server_round))
        base_new = self.base.aggregate(server_round, global_arrays, updates)
        self._metrics = dict(self.base.round_metrics())
        self._metrics.update(self.core.metrics)
        new = base_new
        if d is not None:
            u = flatten(base_new) - flatten(global_arrays)
            coef = projection_coefficient(u, d)
            if coef is None:
                log(WARNING, "round %d: AWARE direction is zero; the base method's update is used", server_round)
            else:
                new = _step(global_arrays, d, coef, [ClientUpdate(-1, 1, base_new)])
                u_norm = float(np.linalg.norm(u))
                self._metrics["aware_coef"] = coef
                self._metrics["aware_cos"] = coef * float(np.linalg.norm(d)) / u_norm if u_norm > 0 else 0.0
        self._metrics["aware_step_norm"] = _norm(new, global_arrays)
        return new

    def round_metrics(self) -> dict[str, Any]:
        """Return this round's figures for the round's row of metrics.jsonl."""
        return dict(self._metrics)  # the base's figures (taken in aggregate) and AWARE's

    def on_model_switch(self, server_round: int) -> None:
        """React to the initializer replacing the global model (state is reset when configured)."""
        super().on_model_switch(server_round)
        if self.core.reset_on_switch:
            self.core.reset()

    def state_dict(self) -> dict[str, Any]:
        """Return the state a checkpoint keeps (JSON/npz-friendly values)."""
        return {"base": self.base.state_dict(), "core": self.core.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state that :meth:`state_dict` returned."""
        self.base.load_state_dict(state["base"])
        self.core.load_state_dict(state["core"])

    def summary(self) -> str:
        """Describe the part and its settings in one line (the run log and summary.json)."""
        return f"{self.base.summary()} x aware({self.core.summary()})"


# ============================================================================ build
def _core_kwargs(cfg: "ScenarioConfig") -> dict[str, Any]:
    a = cfg.strategy.aggregator
    return {
        "momentum": a.aware_momentum,
        "normalize": a.aware_normalize,
        "warmup": a.aware_warmup,
        "iters": a.aware_iters if a.aware_iters is not None else SOLVER_ITERS[a.aware_solver],
        "tol": a.aware_tol,
        "solver": a.aware_solver,
        "gap_tol": a.aware_gap_tol,
        "memory": a.aware_memory,
        "layers": a.aware_layers,
        "dtype": a.aware_dtype,
        "departed": a.aware_departed,
        "reset_on_switch": a.on_model_switch == "reset",
        "max_age": a.aware_max_age,
    }


def make_fedaware(cfg: "ScenarioConfig") -> FedAwareAggregator:
    """``strategy.aggregator.name: fedaware`` from a scenario."""
    a = cfg.strategy.aggregator
    return FedAwareAggregator(
        cfg.num_clients, server_lr=a.server_lr, weighted=a.weighted, rescale=a.aware_rescale, **_core_kwargs(cfg)
    )


def wrap_aware(base: Aggregator, cfg: "ScenarioConfig") -> AwarePlugin:
    """``strategy.aggregator.aware: true``: the AWARE plug-in around ``base``."""
    if cfg.strategy.aggregator.aware_rescale:
        log(WARNING, "aware_rescale has no effect on the AWARE plug-in: the base method sets the step length")
    return AwarePlugin(base, cfg.num_clients, **_core_kwargs(cfg))


def with_aware(factory: Callable[["ScenarioConfig"], Aggregator]) -> Callable[["ScenarioConfig"], Aggregator]:
    """Return a registry factory that wraps its aggregator in :class:`AwarePlugin` when the
    scenario says ``strategy.aggregator.aware: true``.
    """

    def make(cfg: "ScenarioConfig") -> Aggregator:
        base = factory(cfg)
        return wrap_aware(base, cfg) if cfg.strategy.aggregator.aware else base

    return make
