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

- pure kernels, in :mod:`strategies.min_norm`: the min-norm solvers on the Gram matrix
  (Frank-Wolfe and away steps), :func:`projection_coefficient`, :func:`lambda_entropy`
  (the paper's e-LUD, reported for every aggregator, is :func:`strategies.diagnostics.e_lud`);
- :class:`MomentumStore`: the momenta in one preallocated ``[N, d]`` array
  (float32, float16 or bfloat16, the latter two with a per-row scale);
- :class:`AwareCore`: momenta, their Gram matrix (kept up to date row by row), warm-up,
  churn handling and the AWARE direction; shared by
- :class:`FedAwareAggregator` (FedAWARE) and :class:`AwarePlugin` (x AWARE).

The authors' exploration (every online client once, shuffled, before the base sampler
takes over) is :class:`strategies.baseline.ExploreFirstSampler`, for any sampler.

Decisions the paper leaves open and their defaults are documented in ``docs/fedaware.md``.

It is over 600 lines because FedAWARE's momentum store and its core are shared by the
method's aggregator and by the AWARE plug-in for other optimisers; the paper's decisions
are documented beside the code that makes them.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from logging import DEBUG, INFO, WARNING
from typing import Any, Optional, Union

import numpy as np
from flwr.common import log

from fedflex.arrays import flatten, is_float
from fedflex.config import AggregatorConfig
from fedflex.options import (
    AWARE_DEPARTED,
    AWARE_SOLVER_ITERS,
    AWARE_SOLVERS,
    FLOAT_DTYPES,
    AwareOptions,
    resolve_options,
)
from fedflex.strategies.baseline import FedAvgAggregator
from fedflex.strategies.min_norm import (  # noqa: F401 - the kernels, also importable from here
    MinNormResult,
    best_pair,
    lambda_entropy,
    min_norm_away_steps,
    min_norm_weights,
    projection_coefficient,
    two_point,
)
from fedflex.strategies.parts import Aggregator, Arrays, ClientUpdate, Federation, PartWrapper, RoundContext

#: storage types of the momenta
MOMENTUM_DTYPES = FLOAT_DTYPES
#: what happens to the momentum of a client that is offline
DEPARTED = AWARE_DEPARTED
#: min-norm solvers (:func:`min_norm_weights`, :func:`min_norm_away_steps`)
SOLVERS = AWARE_SOLVERS
#: each solver's iteration cap when ``aware.iters`` is unset: the authors' 250 for
#: Frank-Wolfe; for away steps a guard only (the duality gap stops them first: 2,481
#: iterations, 0.16 s, on a real 100-client Gram matrix, docs/fedaware.md)
SOLVER_ITERS = AWARE_SOLVER_ITERS
#: weights above this count as "nonzero" in the round metrics
NONZERO_WEIGHT = 1e-6

Rows = Union[np.ndarray, slice]


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
    options
        :class:`fedflex.options.AwareOptions` (or its fields as keywords): ``momentum`` a
        in m_i <- (1 - a) m_i + a g_i (momenta start at zero, as in the paper);
        ``normalize`` (solve and step with m_i / ||m_i||, the authors' code); ``warmup``
        (FedAvg until every client online in the round has a momentum; False: AWARE from
        the first round over the clients that have one); ``solver`` ``frank-wolfe``
        (:func:`min_norm_weights`) or ``away-steps`` (:func:`min_norm_away_steps`, stops at
        the relative duality gap ``gap_tol``), ``iters`` (cap) and ``tol``; ``memory``
        ``full`` or ``last-layers`` (momenta and solve of the last ``layers`` float tensors;
        the step then weights this round's uploads by lambda restricted to the clients
        that trained, see :meth:`direction`); ``dtype`` of the stored momenta;
        ``departed``: a client offline this round is kept in the solve (``keep``), left
        out while offline (``exclude``) or forgotten (``drop``); ``max_age``: None (the
        paper): every stored momentum enters the solve; an integer A: only the momenta
        refreshed in the last A + 1 aggregations (age <= A; this round's are age 0) do;
        older ones stay stored and come back when their client trains again. For samplers
        that pick some clients far more often than others (HiCS-FL), whose rarely picked
        clients' momenta are many rounds stale (docs/composition.md).
    reset_on_switch
        Forget all momenta (and warm up again) when an initializer replaces the model.
    """

    def __init__(
        self,
        num_clients: int,
        options: Optional[AwareOptions] = None,
        *,
        reset_on_switch: bool = False,
        **fields: Any,
    ) -> None:
        o = self.options = resolve_options(AwareOptions, options, fields, "strategy.aggregator.aware")
        self.num_clients = num_clients
        self.momentum, self.normalize, self.warmup = o.momentum, o.normalize, o.warmup
        self.warmup_rounds = o.warmup_rounds
        self.iters, self.tol, self.solver, self.gap_tol = o.solver_iters(), o.tol, o.solver, o.gap_tol
        self.memory, self.layers, self.dtype = o.memory, o.layers, o.dtype
        self.departed, self.reset_on_switch, self.max_age = o.departed, reset_on_switch, o.max_age
        self.step = 0  # aggregations so far (direction() calls)
        self.refreshed = np.zeros(num_clients, dtype=np.int64)  # step at which each momentum was last set
        self.store: Optional[MomentumStore] = None
        self.gram = np.zeros((0, 0))
        self.has = np.zeros(num_clients, dtype=bool)
        self.warm = False  # warm-up over (latched)
        self._stuck_warned = False  # "the warm-up cannot end in this run" said
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
        self._stuck_warned = False

    # ------------------------------------------------------------------ round
    def direction(
        self,
        global_arrays: Arrays,
        updates: list[ClientUpdate],
        online: Optional[np.ndarray] = None,
        rounds_left: Optional[int] = None,
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
        rounds_left
            Rounds of the run after this one (None: unknown); the warm-up that cannot
            end in them is warned about once.

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
            capped = self.warmup_rounds is not None and self.step > self.warmup_rounds
            if self.warmup and not self.has[needed].all() and not capped:
                self.metrics["aware_phase"] = "warmup"
                self.metrics["aware_solve_s"] = time.perf_counter() - t0
                self._warn_stuck(int((needed & ~self.has).sum()), ids.size, rounds_left)
                return None
            self.warm = True
            log(
                INFO,
                "fedaware: warm-up over after %d aggregation(s): %d client(s) have a momentum; "
                "min-norm weights from now on",
                self.step,
                int(self.has.sum()),
            )
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
            aware_weights={
                str(int(c)): round(float(w), 5) for c, w in zip(active_ids, res.weights) if w > NONZERO_WEIGHT
            },
            aware_entropy=lambda_entropy(res.weights),
            aware_fw_iters=res.iterations,
            aware_gap=res.relative_gap,
            aware_min_norm=math.sqrt(res.value),
            aware_age=float(res.weights @ age[active_ids]),
            aware_d_norm=float(np.linalg.norm(d)),
            aware_solve_s=time.perf_counter() - t0,
        )
        return d

    def _warn_stuck(self, missing: int, per_round: int, rounds_left: Optional[int]) -> None:
        """Warn once when the warm-up cannot end in the rounds left (more online clients lack
        a momentum than the run can still sample at this round's reply count), or has lasted
        three times the ``ceil(N / replies)`` aggregations it needs when every sampled client
        replies (clients that are sampled but never reply: stragglers, failing nodes).
        """
        if self._stuck_warned:
            return
        cannot_end = rounds_left is not None and missing > per_round * rounds_left
        overdue = self.step > 3 * math.ceil(self.num_clients / max(per_round, 1))
        if not (cannot_end or overdue):
            return
        self._stuck_warned = True
        log(
            WARNING,
            "fedaware: the warm-up %s: %d online client(s) have no momentum (never sampled, or sampled and "
            "never replied) after %d aggregation(s); until it ends the aggregation is FedAvg "
            "(AwareOptions(warmup=False) steers from the first round, warmup_rounds=W after W)",
            "cannot end in this run" if cannot_end else "is not ending",
            missing,
            self.step,
        )

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


def _online(ctx: Optional[RoundContext], server_round: int) -> Optional[np.ndarray]:
    """Return the clients online this round, when the strategy tells (its round facts)."""
    facts = ctx.facts if ctx is not None else None
    if facts is None or facts.round != server_round or len(facts.online) == 0:
        return None
    return np.asarray(facts.online, dtype=np.int64)


def _rounds_left(ctx: Optional[RoundContext], server_round: int) -> Optional[int]:
    """Return the rounds of the run after ``server_round``, when the strategy tells."""
    facts = ctx.facts if ctx is not None else None
    if facts is None or facts.num_rounds is None:
        return None
    return max(facts.num_rounds - server_round, 0)


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
    DP_NOTE = (
        "FedAWARE keeps a momentum of each client's clipped, un-noised update and weighs "
        "clients by them (the aggregate is no uniform average: its sensitivity exceeds clipping_norm / K)"
    )

    @classmethod
    def build(cls, options: AggregatorConfig, federation: Federation) -> "FedAwareAggregator":
        """Return FedAWARE with the ``aware`` section, for the federation's clients."""
        reset = options.on_model_switch == "reset"
        return cls(
            federation.num_clients,
            options.aware,
            server_lr=options.server_lr,
            weighted=options.weighted,
            reset_on_switch=reset,
        )

    def __init__(
        self,
        num_clients: int,
        options: Optional[AwareOptions] = None,
        *,
        server_lr: float = 1.0,
        weighted: bool = True,
        reset_on_switch: bool = False,
        **fields: Any,
    ) -> None:
        self.core = AwareCore(num_clients, options, reset_on_switch=reset_on_switch, **fields)
        self.server_lr, self.weighted, self.rescale = server_lr, weighted, self.core.options.rescale
        self.fedavg = FedAvgAggregator(weighted=weighted, server_lr=server_lr)
        self._metrics: dict[str, Any] = {}
        self._zero_logged = False

    def aggregate(self, server_round: int, global_arrays: Arrays, updates: list[ClientUpdate]) -> Arrays:
        """Return the next global model from the global model and the round's replies."""
        d = self.core.direction(
            global_arrays, updates, _online(self.ctx, server_round), _rounds_left(self.ctx, server_round)
        )
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
    DP_NOTE = "AWARE keeps per-client momenta of clipped, un-noised updates and weighs clients by them"
    base: Aggregator

    def __init__(
        self,
        base: Aggregator,
        num_clients: int,
        options: Optional[AwareOptions] = None,
        *,
        reset_on_switch: bool = False,
        **fields: Any,
    ) -> None:
        super().__init__(base)
        self.core = AwareCore(num_clients, options, reset_on_switch=reset_on_switch, **fields)
        if self.core.options.rescale:
            log(WARNING, "aware.rescale has no effect on the AWARE plug-in: the base method sets the step length")
        self._metrics: dict[str, Any] = {}

    def aggregate(self, server_round: int, global_arrays: Arrays, updates: list[ClientUpdate]) -> Arrays:
        """Return the next global model from the global model and the round's replies."""
        d = self.core.direction(
            global_arrays, updates, _online(self.ctx, server_round), _rounds_left(self.ctx, server_round)
        )
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
