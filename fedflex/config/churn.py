"""The ``churn`` section of a scenario: which clients are online in each round."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from fedflex.checks import ConfigError
from fedflex.checks import choice as _choice
from fedflex.checks import join as _join
from fedflex.checks import number as _num

CHURN_KINDS = ("none", "sessions", "label-sessions", "markov", "trace")


@dataclass
class ChurnConfig:
    """Which clients are online in round t (see :mod:`fedflex.churn`).

    - ``none``: everyone, always.
    - ``sessions``: explicit client-id lists, ``rounds_per_session`` rounds each
      (``cycle``: start over after the last one, else keep the last).
    - ``label-sessions``: session s admits the clients whose label set lies in
      ``session_labels[s]`` (the churn paper's label-driven sessions).
    - ``markov``: each client flips on -> off with ``p_leave`` and off -> on with
      ``p_join`` every round; starts from the stationary share unless
      ``initial_online`` is set.
    - ``trace``: a CSV of ``client,online_from,online_until`` rows (rounds, until exclusive).

    ``min_session_rounds``: the session counter moves only when the online set has
    changed and the current session is at least this long (a flapping node does not
    start a session every round), and only when the Jaccard distance between the
    session's starting set and the online set exceeds ``change_threshold``. Unset
    (``null``), they default by kind: ``markov`` 5 rounds and 0.3 (with the default
    p_leave 0.1 / p_join 0.3 about 3 of 20 clients flip every round, so the exact rule
    would start a session nearly every round; these give sessions of 5-10 rounds); every
    other kind 1 and 0.0 (any change of the online set). Scripted schedules
    (``sessions``, ``label-sessions``) start a session at every entry, also when an
    entry repeats the previous online set. ``on_too_few``: what a round with fewer online
    clients than ``strategy.sampler.min_clients`` does: ``skip`` it (logged, the model
    is kept) or ``fail`` the run.
    """

    kind: str = "none"
    sessions: list[list[int]] = field(default_factory=list)
    session_labels: list[list[int]] = field(default_factory=list)
    rounds_per_session: int = 10
    cycle: bool = True
    p_leave: float = 0.1
    p_join: float = 0.3
    initial_online: Optional[float] = None
    trace: Optional[str] = None
    min_session_rounds: Optional[int] = None
    change_threshold: Optional[float] = None
    on_too_few: str = "skip"

    def validate(self, path: str) -> None:
        """Check this section's values; raise :class:`ConfigError` naming the key under ``path``."""
        _choice(path, "kind", self.kind, CHURN_KINDS)
        if self.kind == "sessions" and not self.sessions:
            raise ConfigError(_join(path, "sessions"), [], "kind=sessions needs a list of client-id lists")
        if self.kind == "label-sessions" and not self.session_labels:
            raise ConfigError(_join(path, "session_labels"), [], "kind=label-sessions needs a list of label lists")
        if self.kind == "trace" and not self.trace:
            raise ConfigError(_join(path, "trace"), self.trace, "kind=trace needs a CSV path")
        _num(path, "rounds_per_session", self.rounds_per_session, ge=1)
        _num(path, "p_leave", self.p_leave, ge=0, le=1)
        _num(path, "p_join", self.p_join, ge=0, le=1)
        if self.kind == "markov" and self.p_leave + self.p_join == 0:
            raise ConfigError(_join(path, "p_join"), self.p_join, "p_leave + p_join must be > 0")
        _num(path, "initial_online", self.initial_online, ge=0, le=1, optional=True)
        markov = self.kind == "markov"
        if self.min_session_rounds is None:
            self.min_session_rounds = 5 if markov else 1
        if self.change_threshold is None:
            self.change_threshold = 0.3 if markov else 0.0
        _num(path, "min_session_rounds", self.min_session_rounds, ge=1)
        _num(path, "change_threshold", self.change_threshold, ge=0, lt=1)
        _choice(path, "on_too_few", self.on_too_few, ("skip", "fail"))
