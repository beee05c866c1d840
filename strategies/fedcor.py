"""FedCor: client selection by a Gaussian-process model of correlated client loss changes.

Method: Minxue Tang, Xuefei Ning, Yitu Wang, Jingwei Sun, Yu Wang, Hai Li and Yiran Chen,
"FedCor: Correlation-Based Active Client Selection Strategy for Heterogeneous Federated
Learning", CVPR 2022, https://arxiv.org/abs/2103.13822.

FedCor models the change of every client's loss over one round,
``dl_i(t) = l_i(x_{t+1}) - l_i(x_t)``, as jointly Gaussian across clients,
``dl ~ N(mu, Sigma)``: training one client moves the losses of the clients whose data
resemble its data, and the covariance says by how much. The server

1. **warm-up** (``warmup`` rounds): samples uniformly at random and, each round, asks
   every online client for its loss on the global model (a QUERY round trip,
   ``RoundContext.query``, the one pow-d uses); two consecutive loss vectors give one
   loss-change vector;
2. **fits the GP** to the stored loss-change vectors (the last ``history``) by maximum
   marginal likelihood;
3. **selects greedily**: with the current posterior covariance Sigma, the next client is

       k* = argmin_k  sum_i p_i E[dl_i | dl_k = mu_k - c_k sqrt(Sigma_kk)] - mu_i
          = argmax_k  c_k sum_i p_i Sigma_ik / sqrt(Sigma_kk)

   (a chosen client's own loss is assumed to drop by ``c_k`` posterior standard
   deviations, and the GP carries that drop to every correlated client, weighted by the
   data shares ``p_i`` of the online clients: the expected reduction of the global
   loss); then the GP is conditioned on k (``Sigma <- Sigma - Sigma_:k Sigma_k: /
   Sigma_kk``) and the next client is chosen, K times;
4. **refreshes** the fit every ``refresh`` rounds: all online clients are queried in
   two consecutive rounds (one new loss-change vector) and the GP is refitted.

Readings and choices (the paper's text leaves them open or we could not check them):

- **Kernel.** Sigma = W W^T + s^2 I: a linear kernel on learned ``rank``-dimensional
  client embeddings W plus isotropic noise. Its maximum-marginal-likelihood fit to the
  loss-change vectors has a closed form, probabilistic PCA (Tipping & Bishop, 1999):
  W = U_r (L_r - s^2)^{1/2}, s^2 = the mean of the other eigenvalues of the sample
  covariance (:func:`fit_ppca`). The paper trains a parameterised kernel on client
  embeddings by gradient steps on the same likelihood; the closed form gives the same
  kind of model without an optimiser, deterministically, in O(T^2 N).
- **Assumed drop** c_k = ``discount`` ^ (times k was chosen since the last fit): with a
  fixed GP, the greedy rule would choose the same K clients every round until the next
  refresh; the discount makes a client that was just trained less attractive
  (``discount`` = 1 turns it off). The authors' public code keeps a per-client discount
  of this kind; we did not check its exact form.
- **Churn.** Loss changes of clients that did not answer both queries are filled with
  that client's mean observed change (0 when it has none) before the fit; the sums and
  the candidates run over the online clients; online clients without any observed loss
  change are explored first (random order).

Memory: the history (``history`` x N floats) and W (N x ``rank``); the greedy selection
keeps Sigma implicitly (W, s^2 and the K rank-one downdates), O(N (rank + K)) per pick,
never an N x N matrix. Client cost: every online client evaluates the global model in
the ``warmup + 1`` first rounds and in 2 of every ``refresh`` rounds afterwards.
"""

from __future__ import annotations

from logging import DEBUG, INFO, WARNING
from typing import Any, Optional

import numpy as np
from flwr.common import log

from fedflex.options import FedCorOptions, resolve_options
from fedflex.strategies.baseline import explore_first, query_losses
from fedflex.strategies.clustering import data_shares
from fedflex.strategies.parts import Arrays, ClientUpdate, Sampler


# ---------------------------------------------------------------------------- kernels
def fit_ppca(y: np.ndarray, rank: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Maximum-likelihood fit of ``y_t ~ N(mu, W W^T + s2 I)`` (probabilistic PCA).

    Parameters
    ----------
    y
        [T, N] observations (T loss-change vectors of N clients), T >= 2.
    rank
        Columns of W; reduced to at most ``min(T - 1, N - 1)`` (the sample covariance
        has rank <= T - 1).

    Returns
    -------
    mu : ndarray
        [N] sample mean.
    w : ndarray
        [N, r] with W W^T = U_r (L_r - s2) U_r^T (L: eigenvalues of the sample
        covariance S = Yc^T Yc / T, descending; only those above s2 are kept).
    s2 : float
        The mean of the N - r discarded eigenvalues (zeros included), floored at a tiny
        positive value so that Sigma stays invertible.
    """
    y = np.asarray(y, dtype=np.float64)
    t, n = y.shape
    mu = y.mean(axis=0)
    yc = y - mu
    r = max(0, min(int(rank), t - 1, n - 1))
    # eigenpairs of S from the SVD of the centred data: S = V diag(sv^2 / T) V^T
    _, sv, vt = np.linalg.svd(yc, full_matrices=False)
    lam = sv**2 / t
    total = float(np.sum(lam))  # = trace(S); the eigenvalues beyond the SVD's are 0
    s2 = (total - float(np.sum(lam[:r]))) / (n - r) if n > r else 0.0
    s2 = max(s2, 1e-12 * max(total / n, 1e-300))
    keep = lam[:r] > s2
    w = vt[:r][keep].T * np.sqrt(lam[:r][keep] - s2)
    return mu, w, s2


def greedy_loss_reduction(
    w: np.ndarray, s2: float, weights: np.ndarray, k: int, drop: Optional[np.ndarray] = None
) -> tuple[np.ndarray, np.ndarray]:
    """FedCor's greedy selection under Sigma = W W^T + s2 I (see the module docstring).

    Parameters
    ----------
    w, s2
        The GP's covariance factors over the n candidates.
    weights
        [n] weights p_i of the clients in the global loss.
    k
        How many to choose.
    drop
        [n] assumed drop c_k in posterior standard deviations (default 1).

    Returns
    -------
    chosen : ndarray
        Indices in the order chosen (ties: lowest index).
    gain : ndarray
        The expected reduction of the weighted loss each pick brought,
        ``c_k sum_i p_i Sigma_ik / sqrt(Sigma_kk)`` under the posterior at that step.

    Sigma is never formed: the posterior after conditioning on picks j is
    ``W W^T + s2 I - sum_j g_j g_j^T / d_j`` (g_j the column of the pick at its step,
    d_j its variance), so column k, ``Sigma p`` and the diagonal update in O(n (r + k)).
    """
    w = np.asarray(w, dtype=np.float64)
    p = np.asarray(weights, dtype=np.float64)
    n = w.shape[0]
    k = min(int(k), n)
    c = np.ones(n) if drop is None else np.asarray(drop, dtype=np.float64)
    diag = np.einsum("ij,ij->i", w, w) + s2
    sp = w @ (w.T @ p) + s2 * p  # Sigma p
    cols: list[np.ndarray] = []
    pivots: list[float] = []
    taken = np.zeros(n, dtype=bool)
    chosen, gains = [], []
    for _ in range(k):
        score = np.full(n, -np.inf)
        ok = (~taken) & (diag > 0)
        score[ok] = c[ok] * sp[ok] / np.sqrt(diag[ok])
        if not ok.any():  # every remaining client is fully explained: any will do
            score[~taken] = 0.0
        j = int(np.argmax(score))
        chosen.append(j)
        gains.append(float(score[j]) if np.isfinite(score[j]) else 0.0)
        taken[j] = True
        if diag[j] <= 0:
            continue
        col = w @ w[j] + s2 * (np.arange(n) == j)  # prior column j
        for g, d in zip(cols, pivots):
            col -= g * (g[j] / d)
        d_j = float(diag[j])
        sp -= col * (col @ p) / d_j
        diag = np.maximum(diag - col * col / d_j, 0.0)
        cols.append(col)
        pivots.append(d_j)
    return np.array(chosen, dtype=np.int64), np.array(gains, dtype=np.float64)


# ---------------------------------------------------------------------------- the part
class FedCorSampler(Sampler):
    """FedCor (see the module docstring).

    Parameters
    ----------
    seed : int
        Seed of the sampler's generator (warm-up draws, exploration order).
    warmup : int
        Rounds of uniform sampling with a loss query of every online client.
    refresh : int
        After the warm-up, query twice and refit every ``refresh`` rounds (0: never).
    rank : int
        Dimension of the client embeddings.
    history : int
        Loss-change vectors kept for the fit (the newest).
    discount : float
        Factor on a client's assumed drop per selection since the last fit.
    """

    name = "fedcor"
    OPTIONS = FedCorOptions
    SEED_OFFSET = 16
    DP_NOTE = "FedCor samples by the clients' local losses (EVALUATE replies: not clipped, not noised)"

    def __init__(
        self,
        *,
        seed: int,
        options: Optional[FedCorOptions] = None,
        **fields: Any,
    ) -> None:
        o = self.options = resolve_options(FedCorOptions, options, fields, "strategy.sampler.fedcor")
        warmup, refresh, rank, history, discount = o.warmup, o.refresh, o.rank, o.history, o.discount
        if discount == 1 and refresh == 0:
            log(WARNING, "fedcor with discount=1 and refresh=0 chooses the same clients in every round after warm-up")
        self.rng = np.random.default_rng(seed)
        self.warmup, self.refresh, self.rank, self.history, self.discount = warmup, refresh, rank, history, discount
        self.sizes: dict[int, int] = {}
        self.last_loss: dict[int, float] = {}  # client -> loss at the last query
        self.last_query: Optional[int] = None  # round of the last query
        self.changes: list[dict[int, float]] = []  # loss-change vectors, oldest first
        self.picked: dict[int, int] = {}  # selections since the last fit
        self.fit: Optional[tuple[list[int], np.ndarray, np.ndarray, float]] = None  # clients, mu, W, s2
        self._last: dict[str, Any] = {}

    # -------------------------------------------------------------- schedule
    def queries(self, server_round: int) -> bool:
        """Whether this round's global model is evaluated by every online client: the
        warm-up rounds and the round after them, then rounds ``warmup + m R`` and
        ``warmup + m R + 1`` (R = ``refresh``).
        """
        after = server_round - self.warmup - 1
        if after <= 0:
            return True
        return self.refresh > 0 and after % self.refresh in (self.refresh - 1, 0)

    # -------------------------------------------------------------- hooks
    def sample(self, server_round: int, online: np.ndarray, num: int) -> np.ndarray:
        """Choose at most ``num`` of the ``online`` clients to train in ``server_round``."""
        online = np.asarray(online, dtype=np.int64)
        num = min(int(num), len(online))
        self._last = {}
        if num == 0:
            return np.zeros(0, dtype=np.int64)
        if self.queries(server_round):
            self._query(server_round, online)
        if server_round <= self.warmup or self.fit is None:
            return np.sort(self.rng.choice(online, size=num, replace=False)).astype(np.int64)
        known = {c for change in self.changes for c in change}
        return explore_first(self.rng, online, num, known, lambda cands, rest: self._select(server_round, cands, rest))

    def observe(self, server_round: int, updates: list[ClientUpdate], global_arrays: Arrays) -> None:
        """Learn from the round's replies (data sizes, update statistics)."""
        for u in updates:
            self.sizes[u.client] = u.num_examples

    # -------------------------------------------------------------- internals
    def _query(self, server_round: int, online: np.ndarray) -> None:
        if self.ctx is None:
            raise RuntimeError("fedcor needs the strategy's context (bind the sampler first)")
        if self.last_query is None:
            log(
                INFO,
                "fedcor: round %d: %d online client(s) report their loss on the global model (a QUERY to "
                "fedflex's ClientApp, an EVALUATE message to any other), the Gaussian process's data",
                server_round,
                len(online),
            )
        losses = query_losses(self.ctx, server_round, online, self.sizes)
        if len(losses) < len(online):
            log(
                WARNING,
                "fedcor round %d: %d of %d online clients reported a loss",
                server_round,
                len(losses),
                len(online),
            )
        if self.last_query == server_round - 1:
            change = {c: v - self.last_loss[c] for c, v in losses.items() if c in self.last_loss}
            if change:
                self.changes = (self.changes + [change])[-self.history :]
                self._fit()
        self.last_loss, self.last_query = losses, server_round
        self._last["fedcor_queried"] = len(losses)

    def _fit(self) -> None:
        if len(self.changes) < 2:
            return
        clients = sorted({c for change in self.changes for c in change})
        y = np.full((len(self.changes), len(clients)), np.nan)
        col = {c: j for j, c in enumerate(clients)}
        for t, change in enumerate(self.changes):
            for c, v in change.items():
                y[t, col[c]] = v
        # a client that missed a query: its mean observed change (every column has one)
        y = np.where(np.isnan(y), np.nanmean(y, axis=0), y)
        mu, w, s2 = fit_ppca(y, self.rank)
        if self.fit is None:
            log(INFO, "fedcor: the Gaussian process is fit on %d client(s) and chooses from now on", len(clients))
        self.fit = (clients, mu, w, s2)
        self.picked = {}

    def _select(self, server_round: int, candidates: np.ndarray, num: int) -> np.ndarray:
        if candidates.size <= num:
            return candidates
        clients, _, w, s2 = self.fit  # type: ignore[misc]
        row = {c: j for j, c in enumerate(clients)}
        rows = np.array([row[int(c)] for c in candidates])
        shares = data_shares(candidates, self.sizes)
        drop = np.array([self.discount ** self.picked.get(int(c), 0) for c in candidates])
        picks, gains = greedy_loss_reduction(w[rows], s2, shares, num, drop)
        chosen = candidates[picks]
        for c in chosen:
            self.picked[int(c)] = self.picked.get(int(c), 0) + 1
        self._last["fedcor_gain"] = float(np.sum(gains))
        log(DEBUG, "fedcor round %d: chose %s", server_round, chosen.tolist())
        return chosen

    def round_metrics(self) -> dict[str, Any]:
        """``fedcor_queried``: clients that reported a loss this round (query rounds only);
        ``fedcor_gain``: the summed expected reduction of the weighted global loss of the
        greedy picks, in the GP's units (selection rounds only).
        """
        return dict(self._last)

    def summary(self) -> str:
        """Describe the part and its settings in one line (the run log and summary.json)."""
        return (
            f"fedcor(warmup={self.warmup}, refresh={self.refresh}, rank={self.rank}, history={self.history}, "
            f"discount={self.discount})"
        )

    def state_dict(self) -> dict[str, Any]:
        """Return the state a checkpoint keeps (JSON/npz-friendly values)."""
        return {
            "rng": self.rng.bit_generator.state,
            "sizes": {str(c): n for c, n in self.sizes.items()},
            "last_loss": {str(c): v for c, v in self.last_loss.items()},
            "last_query": self.last_query,
            "changes": [{str(c): v for c, v in ch.items()} for ch in self.changes],
            "picked": {str(c): n for c, n in self.picked.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state that :meth:`state_dict` returned."""
        self.rng.bit_generator.state = state["rng"]
        self.sizes = {int(c): int(n) for c, n in state["sizes"].items()}
        self.last_loss = {int(c): float(v) for c, v in state["last_loss"].items()}
        self.last_query = state["last_query"]
        self.changes = [{int(c): float(v) for c, v in ch.items()} for ch in state["changes"]]
        self._fit()
        self.picked = {int(c): int(n) for c, n in state["picked"].items()}
