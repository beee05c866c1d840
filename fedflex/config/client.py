"""The ``client`` section of a scenario: local training (epochs or steps, batch size,
optimiser, learning rate and its schedule, device, per-client draws). The schedule's
values are computed by :func:`fedflex.lr_schedule.client_lr`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from fedflex.checks import ConfigError
from fedflex.checks import choice as _choice
from fedflex.checks import int_range as _int_range
from fedflex.checks import join as _join
from fedflex.checks import number as _num


@dataclass
class ClientConfig:
    """Local training hyper-parameters, shared by every local rule.

    ``steps`` (mini-batch steps per round) overrides ``epochs`` when set.
    ``keep_optimizer_state``: the optimiser's state (SGD's momentum buffers, Adam's
    moments) stays on the node from one round to the next, as in HiCS-FL's public code,
    instead of starting from zero every round (Flower's node state; sequential training
    only: batched cohorts train such rounds one client at a time).
    ``device``: ``auto`` takes CUDA when present, else the CPU. ``num_threads``: torch
    threads per worker; 0 keeps torch's default, which Ray sets to the worker's
    ``simulation.num_cpus`` and the in-process backend leaves at all cores.

    Learning-rate schedule (computed by the server, which sends each round's value as
    ``client.lr``; every client path trains with it unchanged):

    - ``lr_schedule``: ``constant`` (default: ``lr`` every round, the train message as
      without a schedule), ``round`` (the clock t counts rounds from the run's start:
      t = round - 1) or ``session`` (t counts rounds from the start of the current
      session: t = round - start round, so the decay restarts at every session start the
      server's session tracker sees; the session-aware initializer's gradient rounds run
      at t = 0).
    - ``lr_shape``: ``exp``: lr_t = max(``lr_min``, ``lr`` * ``lr_decay`` ** t);
      ``poly``: lr_t = (``lr`` - ``lr_min``) (1 - min(t, H) / H) ** ``lr_power`` +
      ``lr_min`` with H = ``lr_horizon`` rounds (the churn paper authors' schedule:
      power 0.9, H the rounds of a session, ``lr_min`` a fraction of ``lr``).

    The lr is a function of the round and of the current session's start round, which
    the checkpoint keeps, so a resumed run sends the same values.

    The training fields travel to the clients in every train message
    (:func:`fedflex.records.to_record` under ``client``); ``device`` and ``num_threads``
    (``WORKER``) set up the worker process and travel in the task instead; the schedule
    fields (``SCHEDULE``) stay on the server.

    Per-client, per-round draws (null: off, every client trains ``epochs`` with
    ``batch_size``): ``epochs_range: [lo, hi]`` draws the local epochs uniformly from
    lo..hi; ``batch_size_range: [lo, hi]`` draws the batch size uniformly from
    lo..min(hi, n - 1), n the client's examples (a client with n <= lo trains with batch n,
    one batch per epoch). FedAWARE's authors' regime is ``epochs_range: [2, 5]`` and
    ``batch_size_range: [10, hi]`` with hi at or above the largest partition. Each client
    draws from (``seed``, round, client id) alone (:func:`clients.train.drawn_settings`), so
    every backend and a resumed run train with the same values; the replies report them
    (``local_draws`` in metrics.jsonl).
    """

    WORKER: ClassVar[tuple[str, ...]] = ("device", "num_threads")
    SCHEDULE: ClassVar[tuple[str, ...]] = ("lr_schedule", "lr_shape", "lr_decay", "lr_power", "lr_horizon", "lr_min")
    # schedule options and what reads them: (option, attribute, the values that read it)
    SCHEDULE_USED_BY: ClassVar[tuple[tuple[str, str, tuple[str, ...]], ...]] = (
        ("lr_shape", "lr_schedule", ("round", "session")),
        ("lr_min", "lr_schedule", ("round", "session")),
        ("lr_decay", "lr_shape", ("exp",)),
        ("lr_power", "lr_shape", ("poly",)),
        ("lr_horizon", "lr_shape", ("poly",)),
    )

    epochs: int = 1
    steps: Optional[int] = None
    batch_size: int = 32
    optimizer: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0
    keep_optimizer_state: bool = False
    device: str = "auto"
    num_threads: int = 0
    lr_schedule: str = "constant"
    lr_shape: str = "exp"
    lr_decay: float = 1.0
    lr_power: float = 0.9
    lr_horizon: int = 0
    lr_min: float = 0.0

    # Per-client, per-round draws of epochs and batch size (None: off)
    epochs_range: Optional[list[int]] = None
    batch_size_range: Optional[list[int]] = None

    def validate(self, path: str) -> None:
        """Check this section's values; raise :class:`ConfigError` naming the key under ``path``."""
        _num(path, "epochs", self.epochs, ge=1)
        _num(path, "steps", self.steps, ge=1, optional=True)
        _num(path, "batch_size", self.batch_size, ge=1)
        _choice(path, "optimizer", self.optimizer, ("sgd", "adam"))
        _num(path, "lr", self.lr, gt=0)
        _num(path, "momentum", self.momentum, ge=0, lt=1)
        _num(path, "weight_decay", self.weight_decay, ge=0)
        _choice(path, "device", self.device, ("auto", "cpu", "cuda"))
        _num(path, "num_threads", self.num_threads, ge=0)
        for name in ("epochs_range", "batch_size_range"):
            setattr(self, name, _int_range(path, name, getattr(self, name)))
        if self.epochs_range is not None and self.steps is not None:
            raise ConfigError(
                _join(path, "epochs_range"),
                self.epochs_range,
                f"has no effect with client.steps = {self.steps} (steps override epochs): unset one",
            )
        _choice(path, "lr_schedule", self.lr_schedule, LR_SCHEDULES)
        _choice(path, "lr_shape", self.lr_shape, LR_SHAPES)
        _num(path, "lr_decay", self.lr_decay, gt=0, le=1)
        _num(path, "lr_power", self.lr_power, gt=0)
        _num(path, "lr_horizon", self.lr_horizon, ge=0)
        _num(path, "lr_min", self.lr_min, ge=0)
        if self.lr_schedule == "constant":
            return
        if self.lr_min > self.lr:
            raise ConfigError(_join(path, "lr_min"), self.lr_min, f"must be <= client.lr ({self.lr})")
        if self.lr_shape == "poly" and self.lr_horizon < 1:
            raise ConfigError(
                _join(path, "lr_horizon"), self.lr_horizon, "lr_shape=poly needs lr_horizon >= 1 (rounds to decay over)"
            )

    def training_fields(self) -> list[str]:
        """Return the fields a train message carries (all but ``WORKER`` and ``SCHEDULE``)."""
        return [f.name for f in dataclasses.fields(self) if f.name not in self.WORKER + self.SCHEDULE]

    def unused(self) -> list[tuple[str, Any, str, tuple[str, ...]]]:
        """``(option, value, the option that decides, the values of it that read the
        option)`` for every schedule option set away from its default that the chosen
        schedule ignores (e.g. ``lr_decay`` with ``lr_schedule`` constant).
        """
        default = type(self)()
        deciders = {option: (decider, readers) for option, decider, readers in self.SCHEDULE_USED_BY}
        out = []
        for option, decider, readers in self.SCHEDULE_USED_BY:
            if getattr(self, option) == getattr(default, option):
                continue
            # an option is read when every option deciding it (and what decides those, as
            # lr_schedule decides lr_shape) is at a reading value
            chain = [(decider, readers)]
            while chain[-1][0] in deciders:
                chain.append(deciders[chain[-1][0]])
            for name, values in chain:
                if getattr(self, name) not in values:
                    out.append((option, getattr(self, option), name, values))
                    break
        return out


LR_SCHEDULES = ("constant", "round", "session")
LR_SHAPES = ("exp", "poly")
