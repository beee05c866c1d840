"""An in-process Flower Grid: a ServerApp's messages handled by a ClientApp in the same
process, one node per client id, no Ray, no network.

For tests and debugging: it exercises the real ServerApp / ClientApp message handlers
(records, metadata, error replies) in milliseconds. Nodes can leave and come back
(:meth:`LocalGrid.remove_node`, :meth:`LocalGrid.add_node`) like SuperNodes do.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any, Callable, Iterable, Optional

import numpy as np
from flwr.app import Context, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from fedflex.messages import error_reply

logger = logging.getLogger(__name__)

#: ``(pairs of (message, node context), deliver) -> replies``: answers a batch at once.
TrainBatch = Callable[[list[tuple[Message, Context]], Callable[[Message, Context], Message]], list[Message]]


class LocalGrid(Grid):
    """``num_nodes`` nodes with node config ``partition-id=i num-partitions=N``.

    Node ids are random 63-bit integers (as Flower's), not the partition ids.
    ``client_app`` is any callable ``(Message, Context) -> Message`` (a ClientApp).
    ``train_batch(pairs, deliver)``, when given, answers all the messages of one
    ``send_and_receive`` call at once (e.g. :class:`clients.cohort_app.CohortTrainer`,
    which trains the sampled clients as one batched cohort); ``deliver(msg, context)``
    is the one-message path with this grid's error handling.
    """

    def __init__(
        self,
        client_app: Callable[[Message, Context], Message],
        num_nodes: int,
        seed: int = 0,
        node_config: Optional[dict[str, Any]] = None,
        train_batch: Optional[TrainBatch] = None,
    ) -> None:
        self.client_app = client_app
        self.train_batch = train_batch
        self.num_nodes = num_nodes
        self._run = Run.create_empty(run_id=1)
        # Messages take their run / sender ids from the task identity (as run_simulation sets it)
        TaskIdentity.task_id = 1
        TaskIdentity.run_id = self._run.run_id
        TaskIdentity.node_id = SUPERLINK_NODE_ID
        self._rng = np.random.default_rng(seed)
        self._extra = dict(node_config or {})
        self.contexts: dict[int, Context] = {}
        self.sent: list[Message] = []
        for pid in range(num_nodes):
            self.add_node(pid)

    # -------------------------------------------------------------- membership
    def add_node(self, partition_id: int) -> int:
        """Start a node serving ``partition_id``; returns its (new) node id."""
        node_id = int(self._rng.integers(1, 2**63 - 1))
        config = {"partition-id": partition_id, "num-partitions": self.num_nodes, **self._extra}
        self.contexts[node_id] = Context(
            run_id=self._run.run_id, node_id=node_id, node_config=config, state=RecordDict(), run_config={}
        )
        return node_id

    def remove_node(self, partition_id: int) -> None:
        """Stop the node(s) serving ``partition_id``."""
        for node_id in [n for n, c in self.contexts.items() if c.node_config["partition-id"] == partition_id]:
            del self.contexts[node_id]

    def registration_order(self) -> list[int]:
        """Node ids by partition id (``[node of 0, node of 1, ...]``) when each of the
        ``num_nodes`` partition ids has exactly one node; else [] (the node directory then
        asks every node).
        """
        order: dict[int, int] = {}
        for node_id, context in self.contexts.items():
            pid = context.node_config.get("partition-id")
            if not isinstance(pid, int) or pid in order:
                return []
            order[pid] = node_id
        if sorted(order) != list(range(self.num_nodes)):
            return []
        return [order[pid] for pid in range(self.num_nodes)]

    # -------------------------------------------------------------- Grid API
    def set_run(self, run: Run) -> None:
        """Set the run this grid's messages belong to (Flower's Grid interface)."""
        self._run = run

    @property
    def run(self) -> Run:
        """Return the run set by :meth:`set_run` (Flower's Grid interface)."""
        return self._run

    def create_message(
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: Optional[float] = None
    ) -> Message:
        """Create a message to ``dst_node_id`` (Flower's Grid interface)."""
        return Message(content=content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        """Return the ids of the connected nodes (Flower's Grid interface)."""
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Not supported: use :meth:`send_and_receive`."""
        raise NotImplementedError("LocalGrid only supports send_and_receive")

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Not supported: use :meth:`send_and_receive`."""
        raise NotImplementedError("LocalGrid only supports send_and_receive")

    def send_and_receive(self, messages: Iterable[Message], *, timeout: Optional[float] = None) -> Iterable[Message]:
        """Answer ``messages`` in this process, through the ClientApp, in order."""
        pairs = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            self.sent.append(msg)
            context = self.contexts.get(msg.metadata.dst_node_id)
            if context is None:  # the node is gone: Flower returns nothing before the timeout
                continue
            pairs.append((msg, context))
        if self.train_batch is not None and len(pairs) > 1:
            return list(self.train_batch(pairs, self._deliver))
        return [self._deliver(msg, context) for msg, context in pairs]

    def _deliver(self, msg: Message, context: Context) -> Message:
        """One message through the ClientApp; an exception becomes an error reply."""
        try:
            return self.client_app(msg, context)
        except Exception as exc:  # what Flower turns into an error reply
            logger.debug("client app raised", exc_info=True)
            return error_reply(msg, exc)
