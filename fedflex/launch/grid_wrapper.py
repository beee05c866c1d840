"""A Grid that wraps another and passes every call through: the base of fedflex's grids
that change one thing about how messages travel (:class:`~fedflex.launch.cohort_grid.CohortGrid`
packs a round's train messages, :class:`~fedflex.launch.metered_grid.MeteredGrid` counts
their bytes).
"""

from __future__ import annotations

from typing import Iterable, Optional

from flwr.app import Message
from flwr.proto.node_pb2 import NodeInfo
from flwr.serverapp import Grid


class GridWrapper(Grid):
    """Flower's Grid interface, every call passed to ``grid``.

    Parameters
    ----------
    grid
        The grid the messages travel on (Flower's, or another wrapper).
    """

    def __init__(self, grid: Grid) -> None:
        self.grid = grid

    def __getattr__(self, name):  # e.g. pull_interval of Flower's InMemoryGrid
        return getattr(self.grid, name)

    def set_run(self, run) -> None:
        """Set the run this grid's messages belong to (Flower's Grid interface)."""
        self.grid.set_run(run)

    @property
    def run(self):
        """Return the run set by :meth:`set_run` (Flower's Grid interface)."""
        return self.grid.run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        """Create a message to ``dst_node_id`` (Flower's Grid interface)."""
        return self.grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        """Return the ids of the connected nodes (Flower's Grid interface)."""
        return self.grid.get_node_ids()

    def get_nodes(self) -> Iterable[NodeInfo]:
        """Return the connected nodes with their public keys (Flower's Grid interface; the
        base class's default would drop the keys a node-key binding checks).
        """
        return self.grid.get_nodes()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Send messages; return their ids (Flower's Grid interface)."""
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Return the replies that arrived to ``message_ids`` (Flower's Grid interface)."""
        return self.grid.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: Optional[float] = None) -> Iterable[Message]:
        """Send ``messages`` and return their replies (Flower's Grid interface)."""
        return self.grid.send_and_receive(messages, timeout=timeout)
