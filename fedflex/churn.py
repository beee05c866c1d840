"""Client availability ("churn") schedules and the session counter.

One interface, :class:`Availability`, answers "which clients (ids ``0..N-1``) are online
in round t" (rounds are 1-based, as Flower's server rounds). The schedules:

- :class:`AlwaysOnline`: everyone, always.
- :class:`ExplicitSessions`: lists of client ids, ``rounds_per_session`` rounds each.
- :class:`LabelSessions`: label-driven sessions of the session-aware initialisation
  paper: session s admits the clients whose label set lies in the session's label set.
- :class:`MarkovChurn`: a per-client two-state on/off Markov chain, as FLGo's
  availability modes do (Wang et al., "FLGo: A Fully Customizable Federated Learning
  Platform", 2023, https://arxiv.org/abs/2306.12079).
- :class:`TraceAvailability`: a CSV of ``client,online_from,online_until`` intervals, in
  the spirit of FedScale's client availability traces (Lai et al., "FedScale:
  Benchmarking Model and System Performance of Federated Learning at Scale", ICML 2022,
  https://arxiv.org/abs/2105.11367).

:func:`make_availability` builds one from a :class:`~fedflex.config.ChurnConfig`.

:class:`SessionTracker` turns the online set of each round into a session counter. It
never looks at the schedule: in simulation it is fed the schedule's online set, in a
deployment the online node set, through the same :meth:`SessionTracker.update`.

It is over 600 lines because each of the five schedules checks its own inputs and
documents its model, and all of them share one interface with the session counter.
"""

from __future__ import annotations

import logging
import numbers
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from fedflex.config import CHURN_KINDS, ChurnConfig
from fedflex.trace import read_trace

__all__ = [
    "Availability",
    "AlwaysOnline",
    "ExplicitSessions",
    "LabelSessions",
    "MarkovChurn",
    "TraceAvailability",
    "make_availability",
    "SessionTracker",
]

log = logging.getLogger(__name__)

# Mixed into MarkovChurn's seed so its draws are not those of another part seeded with
# the same scenario seed ("churn" in ASCII).
_MARKOV_STREAM = 0x636875726E


# ---------------------------------------------------------------------------- helpers
def _check_round(server_round: Any) -> int:
    if isinstance(server_round, bool) or not isinstance(server_round, numbers.Integral):
        raise ValueError(f"server_round = {server_round!r}: must be an integer >= 1")
    if server_round < 1:
        raise ValueError(f"server_round = {server_round!r}: must be >= 1 (rounds are 1-based)")
    return int(server_round)


def _check_count(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} = {value!r}: must be an integer >= {minimum}")
    return int(value)


def _check_prob(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name} = {value!r}: must be a probability in [0, 1]")
    return float(value)


def _id_array(ids: Iterable[int]) -> np.ndarray:
    return np.unique(np.asarray(list(ids), dtype=np.int64))


# ---------------------------------------------------------------------------- interface
class Availability(ABC):
    """Which clients are online in each round.

    Subclasses implement :meth:`online`; its answer for a round is fixed (asking again,
    or asking rounds in any order, gives the same ids).

    Attributes
    ----------
    num_clients : int
        Client ids are ``0 .. num_clients - 1``.
    """

    num_clients: int

    def __init__(self, num_clients: int) -> None:
        self.num_clients = _check_count("num_clients", num_clients, 1)

    @abstractmethod
    def online(self, server_round: int) -> np.ndarray:
        """Sorted ``int64`` array of the ids online in ``server_round`` (1-based)."""

    def starts_session(self, server_round: int) -> bool:
        """Whether the schedule itself starts a session in ``server_round`` (scripted
        session lists do, even when an entry repeats the previous online set); False:
        the :class:`SessionTracker`'s rules decide (Markov, trace, live nodes).
        """
        return False

    def timeline(self, num_rounds: int) -> np.ndarray:
        """Online mask of rounds ``1 .. num_rounds``.

        Returns
        -------
        numpy.ndarray
            ``bool`` array of shape ``[num_rounds, num_clients]``; row ``t - 1`` is round t.
        """
        num_rounds = _check_count("num_rounds", num_rounds, 0)
        mask = np.zeros((num_rounds, self.num_clients), dtype=bool)
        for t in range(1, num_rounds + 1):
            mask[t - 1, self.online(t)] = True
        return mask

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_clients={self.num_clients})"


class AlwaysOnline(Availability):
    """Every client is online in every round."""

    def __init__(self, num_clients: int) -> None:
        super().__init__(num_clients)
        self._all = np.arange(self.num_clients, dtype=np.int64)

    def online(self, server_round: int) -> np.ndarray:
        """Return the ids of the clients online in ``server_round``."""
        _check_round(server_round)
        return self._all.copy()

    def timeline(self, num_rounds: int) -> np.ndarray:
        """Return who is online in each of the first ``num_rounds`` rounds (rounds x clients, bool)."""
        num_rounds = _check_count("num_rounds", num_rounds, 0)
        return np.ones((num_rounds, self.num_clients), dtype=bool)


class _RoundRobinSessions(Availability):
    """Fixed online sets, one per session of ``rounds_per_session`` rounds."""

    def __init__(self, num_clients: int, online_sets: list[np.ndarray], rounds_per_session: int, cycle: bool) -> None:
        super().__init__(num_clients)
        if not online_sets:
            raise ValueError(f"{type(self).__name__} needs at least one session")
        self.rounds_per_session = _check_count("rounds_per_session", rounds_per_session, 1)
        self.cycle = bool(cycle)
        self._sets = online_sets
        for s, ids in enumerate(online_sets):
            if ids.size == 0:
                log.warning("%s: session %d has no online client", type(self).__name__, s)

    @property
    def num_sessions(self) -> int:
        """How many sessions the schedule lists (before cycling)."""
        return len(self._sets)

    def session_index(self, server_round: int) -> int:
        """Index of the listed session that covers ``server_round``.

        Session s covers rounds ``s * R + 1 .. (s + 1) * R``; after the last one the
        schedule starts over (``cycle``) or stays in the last session.
        """
        s = (_check_round(server_round) - 1) // self.rounds_per_session
        return s % len(self._sets) if self.cycle else min(s, len(self._sets) - 1)

    def online(self, server_round: int) -> np.ndarray:
        return self._sets[self.session_index(server_round)].copy()

    def starts_session(self, server_round: int) -> bool:
        """Every entry of the schedule starts a session (also after cycling), even when
        its online set equals the previous entry's.
        """
        s, offset = divmod(_check_round(server_round) - 1, self.rounds_per_session)
        return offset == 0 and (self.cycle or s < len(self._sets))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_clients={self.num_clients}, sessions={len(self._sets)}, "
            f"rounds_per_session={self.rounds_per_session}, cycle={self.cycle})"
        )


class ExplicitSessions(_RoundRobinSessions):
    """Sessions given as lists of client ids.

    Parameters
    ----------
    num_clients : int
        Client ids are ``0 .. num_clients - 1``.
    sessions : list of list of int
        The online ids of each session (duplicates are dropped, order does not matter).
    rounds_per_session : int
        Session s covers rounds ``s * R + 1 .. (s + 1) * R``.
    cycle : bool
        After the last session start over from the first; else stay in the last.

    Raises
    ------
    ValueError
        For no sessions, or an id outside ``0 .. num_clients - 1``.
    """

    def __init__(
        self,
        num_clients: int,
        sessions: Sequence[Sequence[int]],
        rounds_per_session: int,
        cycle: bool = True,
    ) -> None:
        num_clients = _check_count("num_clients", num_clients, 1)
        sets = []
        for s, ids in enumerate(sessions):
            arr = _id_array(ids)
            bad = arr[(arr < 0) | (arr >= num_clients)]
            if bad.size:
                raise ValueError(
                    f"sessions[{s}] = {list(ids)!r}: client ids must lie in 0..{num_clients - 1} (got {bad.tolist()})"
                )
            sets.append(arr)
        super().__init__(num_clients, sets, rounds_per_session, cycle)


class LabelSessions(_RoundRobinSessions):
    """Label-driven sessions: a session admits the clients whose labels it covers.

    In session s the online clients are those whose label set is a non-empty subset of
    ``session_labels[s]``; a client without labels is never online.

    Parameters
    ----------
    num_clients : int
        Client ids are ``0 .. num_clients - 1``.
    session_labels : list of list of int
        The labels available in each session.
    client_labels : list of frozenset of int
        The labels each client holds, indexed by client id (length ``num_clients``).
    rounds_per_session : int
        Session s covers rounds ``s * R + 1 .. (s + 1) * R``.
    cycle : bool
        After the last session start over from the first; else stay in the last.

    Raises
    ------
    ValueError
        For no sessions or a ``client_labels`` list of the wrong length.
    """

    def __init__(
        self,
        num_clients: int,
        session_labels: Sequence[Sequence[int]],
        client_labels: Sequence[frozenset[int]],
        rounds_per_session: int,
        cycle: bool = True,
    ) -> None:
        num_clients = _check_count("num_clients", num_clients, 1)
        if len(client_labels) != num_clients:
            raise ValueError(
                f"client_labels has {len(client_labels)} entries: needs one label set per client ({num_clients})"
            )
        self.session_labels = [frozenset(int(y) for y in labels) for labels in session_labels]
        self.client_labels = [frozenset(int(y) for y in labels) for labels in client_labels]
        sets = [
            np.asarray(
                [c for c, mine in enumerate(self.client_labels) if mine and mine <= allowed],
                dtype=np.int64,
            )
            for allowed in self.session_labels
        ]
        super().__init__(num_clients, sets, rounds_per_session, cycle)


class MarkovChurn(Availability):
    """Per-client two-state on/off Markov chain (FLGo-style availability).

    Every round each online client goes offline with probability ``p_leave`` and each
    offline client comes online with probability ``p_join``, independently. In round 1
    each client is online with probability ``initial_online``, by default the stationary
    share ``p_join / (p_leave + p_join)``, so the expected online share is the same in
    every round. An on-stretch lasts ``1 / p_leave`` rounds on average.

    States are drawn round by round from the chain's own generator (one uniform per
    client per round) up to the latest round asked for and cached, so any order of
    asking gives the same answers; the work is vectorised over clients.

    Parameters
    ----------
    num_clients : int
        Client ids are ``0 .. num_clients - 1``.
    p_leave, p_join : float
        Transition probabilities on -> off and off -> on, in [0, 1].
    seed : int
        Seeds the chain's :class:`numpy.random.Generator` (mixed with a fixed stream tag).
    initial_online : float, optional
        Probability of being online in round 1; required when ``p_leave + p_join == 0``.

    Raises
    ------
    ValueError
        For a probability outside [0, 1], or ``p_leave = p_join = 0`` without
        ``initial_online``.
    """

    def __init__(
        self,
        num_clients: int,
        p_leave: float,
        p_join: float,
        seed: int,
        initial_online: Optional[float] = None,
    ) -> None:
        super().__init__(num_clients)
        self.p_leave = _check_prob("p_leave", p_leave)
        self.p_join = _check_prob("p_join", p_join)
        if initial_online is None:
            if self.p_leave + self.p_join == 0:
                raise ValueError("p_leave = p_join = 0: the chain has no stationary share; set initial_online")
            initial_online = self.p_join / (self.p_leave + self.p_join)
        self.initial_online = _check_prob("initial_online", initial_online)
        self.seed = _check_count("seed", seed, 0)
        if self.p_leave + self.p_join == 0:
            log.warning("MarkovChurn with p_leave = p_join = 0: the round-1 online set never changes")
        self._rng = np.random.default_rng([_MARKOV_STREAM, self.seed])
        self._states = np.zeros((0, self.num_clients), dtype=bool)
        self._computed = 0  # rows of _states filled (= rounds drawn)

    def _extend(self, num_rounds: int) -> None:
        """Draw the states of rounds ``computed + 1 .. num_rounds``."""
        if num_rounds <= self._computed:
            return
        if num_rounds > self._states.shape[0]:
            capacity = max(num_rounds, 2 * self._states.shape[0], 16)
            grown = np.zeros((capacity, self.num_clients), dtype=bool)
            grown[: self._computed] = self._states[: self._computed]
            self._states = grown
        for t in range(self._computed, num_rounds):  # t: 0-based row
            u = self._rng.random(self.num_clients)
            if t == 0:
                self._states[0] = u < self.initial_online
            else:
                prev = self._states[t - 1]
                self._states[t] = np.where(prev, u >= self.p_leave, u < self.p_join)
        self._computed = num_rounds

    def online(self, server_round: int) -> np.ndarray:
        """Return the ids of the clients online in ``server_round``."""
        t = _check_round(server_round)
        self._extend(t)
        return np.flatnonzero(self._states[t - 1]).astype(np.int64)

    def timeline(self, num_rounds: int) -> np.ndarray:
        """Return who is online in each of the first ``num_rounds`` rounds (rounds x clients, bool)."""
        num_rounds = _check_count("num_rounds", num_rounds, 0)
        self._extend(num_rounds)
        return self._states[:num_rounds].copy()

    def __repr__(self) -> str:
        return (
            f"MarkovChurn(num_clients={self.num_clients}, p_leave={self.p_leave}, "
            f"p_join={self.p_join}, seed={self.seed}, initial_online={self.initial_online})"
        )


class TraceAvailability(Availability):
    """Online intervals read from a CSV trace (FedScale-style).

    The file has the header ``client,online_from,online_until`` (extra columns are
    ignored) and one row per interval: client ``client`` is online in rounds
    ``online_from <= t < online_until``; an empty ``online_until`` means forever. A client
    may have several rows; a client without rows is never online. Blank lines are skipped.

    Parameters
    ----------
    path : str or Path
        The CSV file.
    num_clients : int
        Client ids are ``0 .. num_clients - 1``.

    Raises
    ------
    ValueError
        For a missing or unreadable file, or a bad row; the message names the file, the
        line number and the problem (unknown client id, ``online_from >= online_until``,
        a non-integer, a missing column or value).
    """

    def __init__(self, path: str | Path, num_clients: int) -> None:
        super().__init__(num_clients)
        self.path = Path(path)
        clients, starts, ends = read_trace(self.path, num_clients)
        self._client = np.asarray(clients, dtype=np.int64)
        self._from = np.asarray(starts, dtype=np.int64)
        self._until = np.asarray(ends, dtype=np.int64)
        never = self.num_clients - np.unique(self._client).size
        log.info(
            "trace %s: %d intervals, %d of %d clients never online",
            self.path,
            self._client.size,
            never,
            self.num_clients,
        )

    def online(self, server_round: int) -> np.ndarray:
        """Return the ids of the clients online in ``server_round``."""
        t = _check_round(server_round)
        live = (self._from <= t) & (t < self._until)
        return np.unique(self._client[live])

    def __repr__(self) -> str:
        return f"TraceAvailability(path={str(self.path)!r}, num_clients={self.num_clients})"


# ---------------------------------------------------------------------------- factory
def make_availability(
    cfg: ChurnConfig,
    num_clients: int,
    seed: int,
    client_labels: Optional[list[frozenset[int]]] = None,
) -> Availability:
    """Build the schedule that ``cfg.kind`` names.

    Parameters
    ----------
    cfg : ChurnConfig
        The scenario's ``churn`` section.
    num_clients : int
        Client ids are ``0 .. num_clients - 1``.
    seed : int
        The scenario seed (used by ``markov``).
    client_labels : list of frozenset of int, optional
        Each client's label set; required by ``label-sessions``.

    Raises
    ------
    ValueError
        For an unknown kind, a kind without its settings, or bad settings.
    """
    kind = cfg.kind
    if kind == "none":
        return AlwaysOnline(num_clients)
    if kind == "sessions":
        if not cfg.sessions:
            raise ValueError("churn.kind = 'sessions' needs churn.sessions (lists of client ids)")
        return ExplicitSessions(num_clients, cfg.sessions, cfg.rounds_per_session, cfg.cycle)
    if kind == "label-sessions":
        if not cfg.session_labels:
            raise ValueError("churn.kind = 'label-sessions' needs churn.session_labels (lists of labels)")
        if client_labels is None:
            raise ValueError("churn.kind = 'label-sessions' needs the clients' label sets (client_labels)")
        return LabelSessions(num_clients, cfg.session_labels, client_labels, cfg.rounds_per_session, cfg.cycle)
    if kind == "markov":
        return MarkovChurn(num_clients, cfg.p_leave, cfg.p_join, seed, cfg.initial_online)
    if kind == "trace":
        if not cfg.trace:
            raise ValueError("churn.kind = 'trace' needs churn.trace (a CSV path)")
        return TraceAvailability(cfg.trace, num_clients)
    raise ValueError(f"churn.kind = {kind!r}: must be one of {', '.join(CHURN_KINDS)}")


# ---------------------------------------------------------------------------- sessions
def _jaccard_distance(a: frozenset[int], b: frozenset[int]) -> float:
    """``1 - |a & b| / |a | b|``, computed as ``|a ^ b| / |a | b|`` (one rounding, so
    3 of 10 gives exactly ``0.3``); 0 for two empty sets.
    """
    union = len(a | b)
    return 0.0 if union == 0 else len(a ^ b) / union


class SessionTracker:
    """Turns the online set of each round into a session counter (0-based).

    The first :meth:`update` starts session 0. A later round starts a new session when
    the online set differs from the current session's *starting* set, the current session
    has lasted at least ``min_session_rounds`` rounds (``server_round - start``), and the
    Jaccard distance ``1 - |A & B| / |A | B|`` between the two sets exceeds
    ``change_threshold``. The tracker never looks at a schedule, so simulation and
    deployment drive it alike.

    Parameters
    ----------
    min_session_rounds : int
        Shortest session; holds a flapping node back.
    change_threshold : float
        In [0, 1): smallest Jaccard distance (exclusive) that counts as a change.

    Attributes
    ----------
    session : int
        Current session, ``-1`` before the first update.
    session_start_round : int
        Round the current session started in (``0`` before the first update).
    members : frozenset of int
        Online set at the start of the current session.
    history : list of (int, frozenset of int)
        ``(start round, online set at start)`` of every session so far.
    """

    def __init__(self, min_session_rounds: int = 1, change_threshold: float = 0.0) -> None:
        self.min_session_rounds = _check_count("min_session_rounds", min_session_rounds, 1)
        if (
            isinstance(change_threshold, bool)
            or not isinstance(change_threshold, numbers.Real)
            or not 0.0 <= float(change_threshold) < 1.0
        ):
            raise ValueError(f"change_threshold = {change_threshold!r}: must be in [0, 1)")
        self.change_threshold: float = float(change_threshold)
        self.session: int = -1
        self.session_start_round: int = 0
        self.members: frozenset[int] = frozenset()
        self.history: list[tuple[int, frozenset[int]]] = []
        self._last_round: int = 0
        self._last_started: bool = False

    def update(self, server_round: int, online: Iterable[int], force: bool = False) -> tuple[int, bool]:
        """Feed the online set of ``server_round``; return ``(session, started_now)``.
        ``force``: start a session in this round whatever the rules say (a scripted
        schedule's entry, :meth:`Availability.starts_session`).

        Rounds must not go backwards. Asking again for the round last fed returns the
        same answer as the first time (the round's decision is made once).

        Raises
        ------
        ValueError
            For a round earlier than the last one fed.
        """
        t = _check_round(server_round)
        if t < self._last_round:
            raise ValueError(f"server_round = {t}: earlier than the last round fed ({self._last_round})")
        if t == self._last_round:
            return self.session, self._last_started
        current = frozenset(int(c) for c in online)
        started = False
        if self.session < 0:
            started = True
            distance = 1.0
        elif force:
            started = True
            distance = _jaccard_distance(self.members, current) if current != self.members else 0.0
        elif current != self.members:
            distance = _jaccard_distance(self.members, current)
            lasted = t - self.session_start_round
            if lasted < self.min_session_rounds:
                log.debug(
                    "round %d: online set changed, session %d only %d round(s) old; kept", t, self.session, lasted
                )
            elif distance <= self.change_threshold:
                log.debug(
                    "round %d: Jaccard distance %.3f <= threshold %.3f; session %d kept",
                    t,
                    distance,
                    self.change_threshold,
                    self.session,
                )
            else:
                started = True
        if started:
            self.session += 1
            self.session_start_round = t
            self.members = current
            self.history.append((t, current))
            log.info(
                "round %d: session %d starts with %d online client(s) (Jaccard distance %.3f)",
                t,
                self.session,
                len(current),
                distance,
            )
        self._last_round, self._last_started = t, started
        return self.session, started

    def state_dict(self) -> dict[str, Any]:
        """JSON-friendly state for checkpoints (sets become sorted lists)."""
        return {
            "min_session_rounds": self.min_session_rounds,
            "change_threshold": self.change_threshold,
            "session": self.session,
            "session_start_round": self.session_start_round,
            "members": sorted(self.members),
            "history": [[start, sorted(ids)] for start, ids in self.history],
            "last_round": self._last_round,
            "last_started": self._last_started,
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`. The thresholds stay the constructor's.

        Raises
        ------
        ValueError
            For a missing key.
        """
        keys = ("session", "session_start_round", "members", "history", "last_round", "last_started")
        missing = [k for k in keys if k not in d]
        if missing:
            raise ValueError(f"SessionTracker state is missing {', '.join(missing)}")
        for key in ("min_session_rounds", "change_threshold"):
            if key in d and d[key] != getattr(self, key):
                log.warning("SessionTracker state has %s = %r; keeping %r", key, d[key], getattr(self, key))
        self.session = int(d["session"])
        self.session_start_round = int(d["session_start_round"])
        self.members = frozenset(int(c) for c in d["members"])
        self.history = [(int(start), frozenset(int(c) for c in ids)) for start, ids in d["history"]]
        self._last_round = int(d["last_round"])
        self._last_started = bool(d["last_started"])

    def __repr__(self) -> str:
        return (
            f"SessionTracker(min_session_rounds={self.min_session_rounds}, "
            f"change_threshold={self.change_threshold}, session={self.session})"
        )
