"""The minimum-norm point of a set of vectors, from their Gram matrix: the kernels of
FedAWARE and the AWARE plug-in (:mod:`strategies.fedaware`).

lambda = argmin_{lambda in simplex} || sum_i lambda_i m_i ||^2, solved by Frank-Wolfe with
the spec's two-point line search (:func:`min_norm_weights`, the authors' solver) or with
away steps (:func:`min_norm_away_steps`, which converges; docs/fedaware.md); plus
:func:`projection_coefficient` and :func:`lambda_entropy`. Pure numpy, no state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np


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
