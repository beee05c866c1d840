"""A system model on a simulated clock: client speeds and bandwidths, round deadlines,
stragglers and mid-round dropouts (``system:`` in a scenario, simulation only).

Availability (churn) says who is online; the system model says how long a sampled
client's round takes and whether its reply arrives in time (FedScale's and Oort's
deadline rounds, FLGo's responsiveness and connectivity). :class:`SystemGrid` wraps the
simulation's grid: it sends a round's train messages as usual (every sampled client
trains: the simulation computes what the clients would), then reads each reply's
arrival time on the simulated clock,

    t_c = steps_c x step_seconds_c + (bytes down_c + bytes up_c) / bandwidth_c,

with ``steps_c = client.epochs x ceil(n_c / client.batch_size)`` for the ``n_c``
examples client c holds, ``step_seconds_c = step_s / speed_c`` (``kind: lognormal``) or
FedScale's ``3 x batch_size x ms per sample / 1000`` with bandwidth ``kbps x 1024 / 8``
bytes/s (``kind: fedscale``, a device-capacity file: :mod:`fedflex.fedscale`), and
returns only the replies the server would have used: those of clients that did not drop
out (``dropout``), by ``deadline_s`` when set, the first ``keep_first`` when set. A
missing reply is what a strategy sees of a node that did not answer: it is not
aggregated and not rejected. The round's simulated time is the last
kept reply's arrival (the deadline, when clients missed it). Other messages (queries,
probes, evaluations) pass through and take no simulated time. :class:`SystemClock`, a
round observer, puts the round's figures into its row.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Iterable, Optional, cast

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, RecordDict

from fedflex import keys
from fedflex.clients.train import TrainSettings, drawn_settings, num_steps
from fedflex.config import ScenarioConfig
from fedflex.fedscale import read_device_profile
from fedflex.launch.grid_wrapper import GridWrapper
from fedflex.launch.metered_grid import message_bytes

#: FedScale's augmentation factor: a training step costs about 3 forward passes
FEDSCALE_AUGMENTATION = 3.0


def client_profiles(cfg: ScenarioConfig) -> tuple[np.ndarray, np.ndarray]:
    """Return every client's seconds per local step and bandwidth (bytes/s): drawn once from
    the run's seed (``system.kind: lognormal``), or from a FedScale device-capacity file,
    client ``c`` taking its ``c mod len``-th profile (``kind: fedscale``).
    """
    system = cfg.system
    if system.kind == "fedscale":
        devices = read_device_profile(system.profile)
        ms, kbps = np.array([devices[c % len(devices)] for c in range(cfg.num_clients)]).T
        return FEDSCALE_AUGMENTATION * cfg.client.batch_size * ms / 1000.0, kbps * 1024.0 / 8.0
    rng = np.random.default_rng([cfg.seed, 0x5157])
    speed = rng.lognormal(0.0, system.speed_sigma, cfg.num_clients)
    bandwidth = system.bandwidth * rng.lognormal(0.0, system.bandwidth_sigma, cfg.num_clients)
    return system.step_s / speed, bandwidth


def round_outcome(
    times: dict[int, float], dropped: set[int], deadline_s: float, keep_first: int
) -> tuple[list[int], list[int], float]:
    """Return (the clients whose replies are kept, the stragglers, the round's simulated
    seconds) for each sampled client's arrival time ``times``; the ``dropped`` never arrive.

    The server closes the round at the ``keep_first``-th reply when that many come in time;
    else at ``deadline_s`` when a reply is missing by then; else with the last reply that
    comes (without a deadline it learns of a dropout when the others are in).
    """
    arrived = sorted((t, c) for c, t in times.items() if c not in dropped)
    on_time = [(t, c) for t, c in arrived if not deadline_s or t <= deadline_s]
    kept = on_time[:keep_first] if keep_first else on_time
    kept_ids = {c for _, c in kept}
    stragglers = sorted(c for _, c in arrived if c not in kept_ids)
    if keep_first and len(kept) == keep_first:
        seconds = kept[-1][0]
    elif deadline_s and len(kept) < len(times):
        seconds = deadline_s
    else:
        seconds = arrived[-1][0] if arrived else 0.0
    return sorted(kept_ids), stragglers, float(seconds)


#: system.partial budgets a reply at the train message's size plus this share and these bytes
REPLY_MARGIN = 0.01
REPLY_SLACK_BYTES = 4096


def reported_steps(reply: Message) -> Optional[int]:
    """Return the local steps a reply says its client took (``num-steps``), or None."""
    for record in reply.content.metric_records.values():
        if keys.NUM_STEPS in record:
            return int(cast(int, record[keys.NUM_STEPS]))
    return None


def _tell_caps(messages: list[Message], caps: dict[int, int]) -> None:
    """Add the step caps to the messages' config (``step-caps``), keeping messages that
    shared one content sharing its copy (the cohort grid packs only those).
    """
    text = json.dumps({str(c): k for c, k in sorted(caps.items())})
    copies: dict[int, RecordDict] = {}
    for m in messages:
        if keys.CONFIG not in m.content.config_records:
            continue
        if id(m.content) not in copies:
            content = RecordDict()
            for name, record in m.content.items():
                content[name] = record
            config = ConfigRecord(dict(m.content.config_records[keys.CONFIG]))
            config[keys.STEP_CAPS] = text
            content[keys.CONFIG] = config
            copies[id(m.content)] = content
        m.content = copies[id(m.content)]


def _round_of(message: Message) -> int:
    """Return the server round a train message belongs to (its config's ``server-round``; 0 if none)."""
    for record in message.content.config_records.values():
        if keys.SERVER_ROUND in record:
            return int(cast(int, record[keys.SERVER_ROUND]))
    return 0


class SystemGrid(GridWrapper):
    """The simulation's grid under a system model (see the module).

    Parameters
    ----------
    grid
        The grid the messages travel on.
    cfg
        The scenario (``system``, ``client.epochs`` / ``batch_size``, the seed).
    client_of
        Node id -> client id.
    sizes
        Client id -> the examples it holds.
    """

    def __init__(
        self, grid, cfg: ScenarioConfig, client_of: Callable[[int], Optional[int]], sizes: dict[int, int]
    ) -> None:
        super().__init__(grid)
        self.cfg, self.client_of, self.sizes = cfg, client_of, sizes
        self.step_seconds, self.bandwidth = client_profiles(cfg)
        self.batch = (0, 0)  # (server round, train batches sent in it): the dropout stream's key
        self.seconds = 0.0  # simulated seconds since the last take()
        self.stragglers: list[int] = []
        self.dropouts: list[int] = []
        self.partial: list[int] = []  # system.partial: clients whose cut work was kept
        self.settings = TrainSettings.from_client(cfg.client)

    def planned_steps(self, client: int, server_round: int) -> int:
        """Return the local steps ``client`` plans in ``server_round``: its epochs over its
        batches, or ``client.steps``, with the epochs and batch size it draws under
        ``client.epochs_range`` / ``batch_size_range`` (the client's own draw).
        """
        n = self.sizes.get(client, 0)
        drawn = drawn_settings(
            self.settings, seed=self.cfg.seed, server_round=server_round, client=client, num_examples=n
        )
        return num_steps(n, drawn)

    def client_seconds(self, client: int, down: int, up: int, steps: int) -> float:
        """Return a client's round time for ``steps`` local steps and ``down`` + ``up`` bytes (the module's formula)."""
        return steps * self.step_seconds[client] + (down + up) / self.bandwidth[client]

    def step_caps(self, messages: list[Message], server_round: int, sizes: dict[int, int]) -> dict[int, int]:
        """``system.partial``: client -> the local steps that fit the deadline, for each
        sampled client whose planned steps do not (and that fits at least one). Its reply is
        budgeted at the train message's size plus :data:`REPLY_MARGIN` and
        :data:`REPLY_SLACK_BYTES` (a reply carries the model back, and its metrics).
        ``sizes``: the round's measured array records (:func:`message_bytes`).
        """
        caps = {}
        for m in messages:
            client = self.client_of(m.metadata.dst_node_id)
            if client is None:
                continue
            down = message_bytes(m, sizes)
            reply = down * (1 + REPLY_MARGIN) + REPLY_SLACK_BYTES
            budget = self.cfg.system.deadline_s - (down + reply) / self.bandwidth[client]
            fit = math.floor(budget / self.step_seconds[client]) if budget > 0 else 0
            if 1 <= fit < self.planned_steps(client, server_round):
                caps[client] = fit
        return caps

    def send_and_receive(self, messages: Iterable[Message], *, timeout: Optional[float] = None) -> Iterable[Message]:
        """Send ``messages``; of a train round's replies, return those the server would use in time."""
        messages = list(messages)
        train = bool(messages) and all(m.metadata.message_type == MessageType.TRAIN for m in messages)
        server_round = _round_of(messages[0]) if train else 0
        sizes: dict[int, int] = {}  # the round's messages share the model's record: measured once
        caps = self.step_caps(messages, server_round, sizes) if train and self.cfg.system.partial else {}
        if caps:
            _tell_caps(messages, caps)
        replies = list(self.grid.send_and_receive(messages, timeout=timeout))
        if not train:
            return replies
        self.batch = (server_round, self.batch[1] + 1 if self.batch[0] == server_round else 0)
        system = self.cfg.system
        down = {m.metadata.message_id: (m.metadata.dst_node_id, message_bytes(m, sizes)) for m in messages}
        times: dict[int, float] = {}
        reply_of: dict[int, Message] = {}
        passed: list[Message] = []  # error replies and replies of unknown nodes: as they are
        for reply in replies:
            node, sent = down.get(reply.metadata.reply_to_message_id, (reply.metadata.src_node_id, 0))
            client = self.client_of(node)
            if client is None or reply.has_error():
                passed.append(reply)
                continue
            steps = reported_steps(reply)
            steps = self.planned_steps(client, server_round) if steps is None else steps
            times[client] = self.client_seconds(client, sent, message_bytes(reply), steps)
            reply_of[client] = reply
        rng = np.random.default_rng([self.cfg.seed, 0xD809, *self.batch])  # a resumed run draws the same
        dropped = {c for c in sorted(times) if rng.random() < system.dropout}
        kept, stragglers, seconds = round_outcome(times, dropped, system.deadline_s, system.keep_first)
        self.seconds += seconds
        self.stragglers += stragglers
        self.dropouts += sorted(dropped)
        self.partial += [c for c in kept if c in caps]
        return [*passed, *(reply_of[c] for c in kept)]

    def take(self) -> dict[str, Any]:
        """Return the figures since the last call (a row's), and start again."""
        out = {"sim_round_s": round(self.seconds, 6), "stragglers": self.stragglers, "dropouts": self.dropouts}
        if self.cfg.system.partial:
            out["partial"] = self.partial
        self.seconds, self.stragglers, self.dropouts, self.partial = 0.0, [], [], []
        return out


class SystemClock:
    """Round observer: a row gets ``sim_round_s`` (the simulated seconds of its train
    messages), ``sim_clock_s`` (the run's simulated clock after it, resumes included),
    ``stragglers`` and ``dropouts``.
    """

    def __init__(self, grid: SystemGrid, clock_s: float = 0.0) -> None:
        self.grid, self.clock_s = grid, float(clock_s)

    def after_round(self, record: Any, arrays: Any) -> bool:
        """Put the round's figures into ``record``; never stops the run."""
        figures = self.grid.take()
        self.clock_s += figures["sim_round_s"]
        record.extra.update(figures, sim_clock_s=round(self.clock_s, 6))
        return False
