"""Session-aware initial model construction under client churn, and its baselines.

Method: "Initial model construction for federated learning with dynamic clients"
(the churn paper, v2), as read in ``docs/session-init.md``. A session is a stretch of rounds with one online
set. At a session start the server builds the start model as a softmin(-R d)-weighted
average of the last models of earlier sessions, d the L2 distance between the sessions'
"gradients" G = (model after V real rounds from a fixed pilot model) - pilot.

Initializers (plug-ins: any aggregator and local rule):

- ``previous``: continue from the latest global model (``strategies.baseline``);
- ``average``: unweighted mean of the stored last models (:class:`AverageInitializer`);
- ``session-aware``: the method (:class:`SessionAwareInitializer`).

Choices fixed by the spec: the pilot is built once (mean of the last models of the first
P sessions); G uses the model after V aggregations; a session's last model is the global
model after its last round; non-float entries (e.g. BatchNorm counters) are carried from
the current model, not averaged. Choice made here: the V gradient rounds train
min(K, |online|) online clients drawn uniformly by the initializer's own generator
(all of them when K >= |online|, the paper's full participation); they are real rounds
(messages to clients) logged with ``phase: session-init`` and not counted in the
scenario's rounds; they go through the base aggregator (and its state, e.g. server
momentum or SCAFFOLD's control variate), unless ``gradient_state: isolated``.
"""

from __future__ import annotations

from collections import OrderedDict
from logging import INFO, WARNING
from typing import Any, Optional

import numpy as np
from flwr.common import log

from fedflex.arrays import flatten, is_float
from fedflex.config import InitializerConfig
from fedflex.options import SESSION_DISTANCES, SessionAwareOptions, resolve_options
from fedflex.strategies.baseline import weighted_average
from fedflex.strategies.clustering import unit_rows
from fedflex.strategies.parts import Arrays, Federation, Initializer


def softmin_weights(distances: np.ndarray, scale: float) -> np.ndarray:
    """a_z = exp(-R d_z) / sum_y exp(-R d_y), computed stably (shifted by min d).

    R = 0 gives the plain mean; a large R puts all weight on the nearest (split evenly
    among exact ties).
    """
    d = np.asarray(distances, dtype=np.float64)
    if d.ndim != 1 or d.size == 0:
        raise ValueError("softmin_weights needs a non-empty 1-D array of distances")
    z = np.exp(-scale * (d - d.min()))
    return z / z.sum()


def weight_slices(like: Arrays) -> list[slice]:
    """Where each weight tensor (a float entry with 2 or more dimensions: convolution and
    linear kernels, not biases or BatchNorm vectors) lies in :func:`flatten`'s vector;
    every float entry when the model has no such tensor.
    """
    slices, kernels, offset = [], [], 0
    for value in like.values():
        if is_float(value):
            part = slice(offset, offset + value.size)
            slices.append(part)
            if np.ndim(value) >= 2:
                kernels.append(part)
            offset += value.size
    return kernels or slices


def session_distance(g_s: np.ndarray, g_z: np.ndarray, kind: str, slices: Optional[list[slice]] = None) -> float:
    """Distance between two session gradients.

    ``l2``: ``||G_s - G_z||`` over every float entry (the spec). ``normalized``: the
    authors' code, the mean over weight tensors t of ``||G_s[t]/|G_s[t]| - G_z[t]/|G_z[t]|||``
    (each term in [0, 2], so R does not have to follow the lr's scale; a zero tensor
    stays zero).
    """
    if kind == "l2":
        return float(np.linalg.norm(g_s - g_z))
    if kind != "normalized":
        raise ValueError(f"unknown session distance {kind!r} ({' or '.join(SESSION_DISTANCES)})")
    parts = slices if slices else [slice(0, g_s.size)]
    return float(np.mean([np.linalg.norm(unit_rows(g_s[t]) - unit_rows(g_z[t])) for t in parts]))


def mean_models(models: list[Arrays], weights: Optional[np.ndarray] = None, like: Optional[Arrays] = None) -> Arrays:
    """sum_z w_z model_z over float entries (w: plain mean when None); non-float entries
    from ``like`` (the current model), else from the last model.
    """
    w = np.ones(len(models)) if weights is None else np.asarray(weights, dtype=np.float64)
    return weighted_average(models, w, carry=like if like is not None else models[-1])


class _SessionMemory(Initializer):
    """Remembers the global model at the end of each round, and hands the previous
    session's last model to :meth:`close_session` when a new session starts.
    """

    def __init__(self) -> None:
        self._last: Optional[tuple[int, Arrays]] = None

    def _roll(self, session: int) -> None:
        """Close the remembered session when a later one has begun."""
        if self._last is not None and self._last[0] != session:
            self.close_session(*self._last)
            self._last = None

    def on_round_end(self, server_round: int, session: int, global_arrays: Arrays) -> None:
        self._roll(session)  # a session whose start round was skipped is closed here
        self._last = (session, global_arrays)

    def on_session_start(self, server_round, session, online, global_arrays):
        self._roll(session)
        return self.start_session(server_round, session, online, global_arrays)

    def close_session(self, session: int, last_model: Arrays) -> None:
        raise NotImplementedError

    def start_session(
        self, server_round: int, session: int, online: np.ndarray, global_arrays: Arrays
    ) -> Optional[Arrays]:
        raise NotImplementedError


class AverageInitializer(_SessionMemory):
    """Baseline ``average``: a new session starts from the unweighted mean of the last
    models of all earlier sessions.
    """

    name = "average"
    DP_NOTE = "the average initializer mixes the stored session models"

    def __init__(self) -> None:
        super().__init__()
        self.models: list[Arrays] = []

    def close_session(self, session: int, last_model: Arrays) -> None:
        """Keep what this initializer needs of a session that ended with ``last_model``."""
        self.models.append(last_model)

    def start_session(self, server_round, session, online, global_arrays):
        """Return the model a new session starts from, or None to keep the current one."""
        if not self.models:
            return None
        return mean_models(self.models, like=global_arrays)

    def state_dict(self) -> dict[str, Any]:
        """Return the state a checkpoint keeps (JSON/npz-friendly values)."""
        return {"models": [dict(m) for m in self.models], "last": self._last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state that :meth:`state_dict` returned."""
        self.models = [OrderedDict(m) for m in state["models"]]
        self._last = state["last"]


def session_recurs(distances: np.ndarray, margin: float) -> bool:
    """Whether an older stored session is closer to the new one than the latest stored
    session is, by the fraction ``margin``: some ``d_z <= (1 - margin) d_latest``, z before
    the latest (``distances`` in session order). False with one stored session.

    The gate of ``switch_margin`` (beyond the paper): when sessions do not recur, as under
    Markov churn, the latest session's model is also the most trained one, and the
    paper's softmin would mix older ones into the start.
    """
    d = np.asarray(distances, dtype=np.float64)
    return d.size > 1 and bool(d[:-1].min() <= (1.0 - margin) * d[-1])


class SessionAwareInitializer(_SessionMemory):
    """The churn paper's session-aware initial model (see the module docstring).

    Parameters
    ----------
    pilot_sessions
        P: the pilot is the mean of the last models of sessions 0..P-1, built once.
    gradient_rounds
        V: real rounds from the pilot at each later session start.
    similarity_scale
        R in softmin(-R d(G_s, G_z)).
    distance
        d: ``l2`` (the spec, ``||G_s - G_z||``) or ``normalized`` (the authors' code:
        the mean over weight tensors of the distance between unit-length gradients);
        see :func:`session_distance`.
    gradient_state
        ``shared`` (the spec) or ``isolated``: see :class:`~fedflex.options.SessionAwareOptions`.
    switch_margin
        m (beyond the paper; None is the paper): keep the current model unless
        :func:`session_recurs` says an older stored session is closer than the latest by m.
    clients_per_round
        How many online clients train in a gradient round (all when fewer are online).
    seed
        Seed of the generator that draws them.
    """

    name = "session-aware"
    DP_NOTE = (
        "SessionAware weighs the stored session models by gradient rounds whose per-client "
        "replies bypass the wrapper (not noised; not clipped under server-side clipping)"
    )

    @classmethod
    def build(cls, options: InitializerConfig, federation: Federation) -> "SessionAwareInitializer":
        """Return the initializer with the ``session_aware`` section, for the federation's K and seed."""
        return cls(
            options.session_aware, clients_per_round=federation.clients_per_round, seed=federation.seed_of(cls.name)
        )

    def __init__(
        self,
        options: Optional[SessionAwareOptions] = None,
        *,
        clients_per_round: int = 10,
        seed: int = 0,
        **fields: Any,
    ) -> None:
        super().__init__()
        o = self.options = resolve_options(SessionAwareOptions, options, fields, "strategy.initializer.session_aware")
        self.P, self.V, self.R = o.pilot_sessions, o.gradient_rounds, o.similarity_scale
        self.distance = o.distance
        self.switch_margin = o.switch_margin
        self.isolated = o.gradient_state == "isolated"
        self.clients_per_round = clients_per_round
        self.rng = np.random.default_rng(seed)
        self.pilot_buffer: list[Arrays] = []
        self.pilot: Optional[Arrays] = None
        self.history: list[tuple[Arrays, np.ndarray]] = []  # (last model w_z, gradient G_z), z >= P
        self.gradients: dict[int, np.ndarray] = {}  # G_s of sessions not closed yet
        self.last_weights: Optional[np.ndarray] = None
        self._round_metrics: dict[str, Any] = {}

    def round_metrics(self) -> dict[str, Any]:
        """``init_weights``: the softmin weights of the stored sessions' models, in the
        round whose session started from their mix.
        """
        out, self._round_metrics = self._round_metrics, {}
        return out

    def summary(self) -> str:
        """Describe the part and its settings in one line (the run log and summary.json)."""
        extra = "" if self.switch_margin is None else f", switch_margin={self.switch_margin}"
        extra += ", gradient_state=isolated" if self.isolated else ""
        return f"session-aware(P={self.P}, V={self.V}, R={self.R}, distance={self.distance}{extra})"

    def close_session(self, session: int, last_model: Arrays) -> None:
        """Keep what this initializer needs of a session that ended with ``last_model``."""
        if session < self.P:
            self.pilot_buffer.append(last_model)
            if session == self.P - 1:
                self.pilot = mean_models(self.pilot_buffer)
                self.pilot_buffer = []
                log(INFO, "session-aware: pilot model built from the first %d session(s)", self.P)
            return
        gradient = self.gradients.pop(session, None)
        if gradient is not None:
            self.history.append((last_model, gradient))

    def start_session(self, server_round, session, online, global_arrays):
        """Return the model a new session starts from, or None to keep the current one."""
        if self.pilot is None or self.ctx is None or len(online) == 0:
            return None
        clients = online
        if len(online) > self.clients_per_round:
            clients = np.sort(self.rng.choice(online, size=self.clients_per_round, replace=False))
        pilot: Arrays = self.pilot
        u = pilot
        for _ in range(self.V):
            trained = self.ctx.train_round(server_round, u, clients, phase="session-init", isolated=self.isolated)
            if trained is None:
                log(WARNING, "session-aware: gradient round at round %d got no reply; model kept", server_round)
                return None
            u = trained
        gradient = flatten(u) - flatten(pilot)
        replacement = None
        if self.history:
            slices = weight_slices(self.pilot) if self.distance == "normalized" else None
            distances = np.array([session_distance(gradient, g, self.distance, slices) for _, g in self.history])
            self._round_metrics = {"init_distances": [round(float(d), 6) for d in distances]}
            switch = self.switch_margin is None or session_recurs(distances, self.switch_margin)
            if self.switch_margin is not None:
                self._round_metrics["init_switched"] = int(switch)
            if switch:
                self.last_weights = softmin_weights(distances, self.R)
                replacement = mean_models([w for w, _ in self.history], self.last_weights, like=global_arrays)
                log(
                    INFO,
                    "session-aware: session %d starts from weights %s",
                    session,
                    np.round(self.last_weights, 3).tolist(),
                )
                self._round_metrics["init_weights"] = [round(float(w), 6) for w in self.last_weights]
            else:
                log(
                    INFO,
                    "session-aware: session %d keeps the current model (no older session closer than the latest by %g)",
                    session,
                    self.switch_margin,
                )
        self.gradients[session] = gradient  # only after the weights were computed
        return replacement

    def state_dict(self) -> dict[str, Any]:
        """Return the state a checkpoint keeps (JSON/npz-friendly values)."""
        return {
            "rng": self.rng.bit_generator.state,
            "pilot_buffer": [dict(m) for m in self.pilot_buffer],
            "pilot": None if self.pilot is None else dict(self.pilot),
            "history": [(dict(w), g) for w, g in self.history],
            "gradients": dict(self.gradients),
            "last": self._last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state that :meth:`state_dict` returned."""
        self.rng.bit_generator.state = state["rng"]
        self.pilot_buffer = [OrderedDict(m) for m in state["pilot_buffer"]]
        self.pilot = None if state["pilot"] is None else OrderedDict(state["pilot"])
        self.history = [(OrderedDict(w), np.asarray(g)) for w, g in state["history"]]
        self.gradients = {int(k): np.asarray(v) for k, v in state["gradients"].items()}
        self._last = state["last"]
