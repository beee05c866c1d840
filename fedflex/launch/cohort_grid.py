"""Cohort messages on Flower's simulation runtime (Ray backend).

Flower's simulation gives every client its own virtual SuperNode and every train
message its own trip through the Ray worker pool. :class:`CohortGrid` wraps the
simulation's Grid so that one round's train messages (one per sampled client, the same
content) travel as one message per Ray worker instead: the message goes to the node of
the cohort's first client and names every client of the cohort (``cohort-clients``);
that worker trains them together (:class:`clients.cohort_app.CohortTrainer`, batched
where it pays) and answers once with every client's records; the grid unpacks that
answer into one reply per client, from the client's own node, so the strategy sees the
replies it would have seen without cohorts.

The trade-off with Flower's one-node-per-client identity: a cohort runs in the worker
serving the first client's node, so per-client node state (SCAFFOLD's c_i) cannot live
in each node's Flower context. The grid keeps it instead, one RecordDict per client id,
and ships it with the cohort message (``state|<client>|<record>`` records) and back; it
is the same state Flower's simulation would hold for that node, in the same process.
A failed cohort message fails each of its clients (error replies). Deployments never
use this: a real SuperNode is one client.

:func:`cohort_grid` wraps a simulation's grid (in-process, Ray and ``flwr run``'s
simulation runtime alike); :func:`decide_cohorts` decides once whether each worker trains
its clients batched; :func:`usable_cpus` bounds the number of workers.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from typing import TYPE_CHECKING, Callable, Iterable, Optional, cast

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedflex import keys
from fedflex.launch.grid_wrapper import GridWrapper
from fedflex.messages import client_record, error_reply, state_record

if TYPE_CHECKING:
    from fedflex.config import ScenarioConfig

logger = logging.getLogger(__name__)


def split_chunks(items: list, parts: int) -> list[list]:
    """``items`` cut into at most ``parts`` consecutive chunks of near-equal size.

    Examples
    --------
    >>> split_chunks([1, 2, 3, 4, 5], 2)
    [[1, 2, 3], [4, 5]]
    """
    parts = max(1, min(parts, len(items)))
    size, extra = divmod(len(items), parts)
    out, lo = [], 0
    for i in range(parts):
        hi = lo + size + (1 if i < extra else 0)
        out.append(items[lo:hi])
        lo = hi
    return out


class CohortGrid(GridWrapper):
    """A Grid that packs each round's train messages into ``workers`` cohort messages.

    Parameters
    ----------
    grid
        Flower's simulation grid; everything but train batches passes through.
    client_of
        Node id -> client id (the strategy's node directory).
    workers
        Cohort messages per round (the Ray worker pool's size: more would queue).
    vectorize, cohort_size
        ``simulation.vectorize`` / ``simulation.cohort_size``, passed to the workers.
    """

    def __init__(
        self,
        grid: Grid,
        client_of: Callable[[int], Optional[int]],
        workers: int,
        vectorize: str = "auto",
        cohort_size: int = 0,
    ) -> None:
        super().__init__(grid)
        self.client_of = client_of
        self.workers = max(1, int(workers))
        self.vectorize = vectorize
        self.cohort_size = cohort_size
        self.states: dict[int, RecordDict] = {}  # client id -> its node state

    # ------------------------------------------------------------------ cohorts
    def send_and_receive(self, messages: Iterable[Message], *, timeout: Optional[float] = None) -> Iterable[Message]:
        """Send ``messages``, packing same-content train messages into cohorts where that pays; return the replies."""
        messages = list(messages)
        packable = (
            len(messages) > 1
            and all(m.metadata.message_type == MessageType.TRAIN for m in messages)
            and all(m.content is messages[0].content for m in messages)
            and all(self.client_of(m.metadata.dst_node_id) is not None for m in messages)
        )
        if not packable:
            return self.grid.send_and_receive(messages, timeout=timeout)
        for m in messages:  # ids for the strategy's reply bookkeeping (error replies)
            m.metadata.__dict__["_message_id"] = uuid.uuid4().hex
        by_client = {int(cast(int, self.client_of(m.metadata.dst_node_id))): m for m in messages}
        chunks = split_chunks(sorted(by_client), self.workers)
        packed = [self._pack(messages[0], chunk, by_client[chunk[0]].metadata.dst_node_id) for chunk in chunks]
        replies = list(self.grid.send_and_receive(packed, timeout=timeout))
        answered = {r.metadata.reply_to_message_id: r for r in replies}
        out: list[Message] = []
        for pack, chunk in zip(packed, chunks):
            reply = answered.get(pack.metadata.message_id)
            if reply is None:  # timed out: Flower returns nothing for it either
                continue
            out.extend(self._unpack(reply, chunk, by_client))
        return out

    def _pack(self, template: Message, clients: list[int], node: int) -> Message:
        content = RecordDict()
        for name, record in template.content.items():
            content[name] = record
        config = ConfigRecord(dict(cast(ConfigRecord, template.content[keys.CONFIG])))
        config[keys.COHORT_CLIENTS] = json.dumps(clients)
        config[keys.COHORT_VECTORIZE] = self.vectorize
        config[keys.COHORT_SIZE] = self.cohort_size
        content[keys.CONFIG] = config
        for c in clients:
            for name, record in self.states.get(c, RecordDict()).items():
                content[state_record(c, name)] = record
        return Message(content=content, dst_node_id=node, message_type=MessageType.TRAIN, ttl=template.metadata.ttl)

    def _unpack(self, reply: Message, clients: list[int], by_client: dict[int, Message]) -> list[Message]:
        if reply.has_error():
            return [error_reply(by_client[c], cast(str, reply.error.reason), code=reply.error.code) for c in clients]
        out = []
        for c in clients:
            errors = reply.content.config_records.get(client_record(c, keys.COHORT_ERROR))
            if errors is not None:
                out.append(error_reply(by_client[c], str(errors["reason"])))
                continue
            content, state = RecordDict(), RecordDict()
            for name, record in reply.content.items():
                if name.startswith(state_record(c, "")):
                    state[name[len(state_record(c, "")) :]] = record
                elif name.startswith(client_record(c, "")):
                    content[name[len(client_record(c, "")) :]] = record
            self.states[c] = state
            out.append(Message(content=content, reply_to=by_client[c]))
        return out


def usable_cpus() -> int:
    """Return the CPUs this process may run on (its affinity: ``taskset``, or a ``fedflex sweep``
    member's share), which bound the Ray pool it starts.
    """
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


REAL_RULE_MODEL_BYTES = 64 * 2**20


def decide_cohorts(cfg: ScenarioConfig, data) -> str:
    """``simulation.vectorize=rule``: decide once, before round 1, whether this run trains
    in cohorts (:func:`clients.cohort.vectorize_rule`: the model, the device, the clients
    per round, the batch; no timing) and record it in ``cfg`` as
    ``simulation.vectorize_choice``, which config.yaml then holds: a resumed run (and a
    re-run of the saved config) finds it there and does not decide again. Returns how
    the run trains: ``on``, ``off`` or ``auto``.
    """
    sim = cfg.simulation
    if sim.vectorize != "rule":
        return sim.cohorts()
    # DEBUG: config.yaml records the choice; a run's stderr stays its one line on failure
    say = logging.getLogger("fedflex.clients.cohort_app")  # the logger that says how clients train
    if sim.vectorize_choice is not None:
        say.debug("cohorts (simulation.vectorize=rule): %s, as recorded in the config", sim.vectorize_choice)
        return sim.cohorts()
    import torch

    from fedflex.clients.cohort import vectorize_rule
    from fedflex.clients.runtime import resolve_device
    from fedflex.models import build_model

    example = data.train.inputs(torch.zeros(1, dtype=torch.long))
    with torch.random.fork_rng(devices=[]):  # the run's own random stream is not touched
        try:  # shapes first: built on the meta device, no memory, no arithmetic
            with torch.device("meta"):
                model = build_model(cfg.model, data.train.input_shape, data.train.num_classes)
            if sum(p.numel() * p.element_size() for p in model.parameters()) <= REAL_RULE_MODEL_BYTES:
                # a small model is built for real and its one-example forward runs on the CPU:
                # a first forward on the meta device imports torch's meta kernels, 1.7 s of a
                # 10,000-client run whose rounds take 0.3 s (issue 32)
                model = build_model(cfg.model, data.train.input_shape, data.train.num_classes)
            else:
                example = example.to("meta")
        except Exception:  # a model that cannot be built on the meta device
            model = build_model(cfg.model, data.train.input_shape, data.train.num_classes)
    try:
        device = resolve_device(cfg.client.device)
    except RuntimeError:  # client.device=cuda without a GPU here: the workers say so
        device = torch.device(cfg.client.device)
    choice, why = vectorize_rule(
        model,
        example,
        device,
        cast(int, cfg.strategy.sampler.clients_per_round),  # filled by validate
        cfg.client.batch_size,
        len(data.train) / cfg.num_clients,
        sim.cohort_size,
    )
    sim.vectorize_choice = choice
    say.debug(
        "cohorts (simulation.vectorize=rule): %s: %s (recorded as simulation.vectorize_choice)",
        "in cohorts" if choice == "on" else "one client at a time",
        why,
    )
    return choice


def cohort_grid(cfg: ScenarioConfig, workers: int):
    """``wrap_grid`` for the ServerApp on a simulation: one cohort message per worker and
    round (:mod:`fedflex.launch.cohort_grid`), whatever ``simulation.vectorize`` decides
    (it says how each worker trains its clients: batched, or one after another). A message
    per client costs Flower's simulation engine a ClientApp call each (issue 46: 100
    messages a round made a round of K = 100 small clients 4x the in-process backend's).
    """
    mode = cfg.simulation.cohorts()

    def wrap(grid, client_of):
        return CohortGrid(grid, client_of, workers, mode, cfg.simulation.cohort_size)

    return wrap
