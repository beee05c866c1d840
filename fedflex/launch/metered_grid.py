"""Cost accounting: the bytes a run's messages carry, server to clients (down) and back (up).

:class:`MeteredGrid` wraps the grid the strategy sends on, outside any cohort packing, so
it counts what each client is sent and returns, as a deployment's SuperNodes would:
every message of the run (partition-id queries, probes, train and evaluate messages and
their replies). A message's size is that of its content as Flower serializes it: each
array's bytes (:attr:`flwr.app.Array.data`, the NumPy serialization with its header) plus
the serialized config and metric records; message metadata and transport framing (gRPC,
TLS) are not counted. An error reply carries no content: 0 bytes.
:class:`CostMeter`, a round observer, moves the counts into each round's row
(``bytes_down``, ``bytes_up``); ``summary.json`` sums them over the rows.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

from flwr.app import ArrayRecord, Message

from fedflex.launch.grid_wrapper import GridWrapper


def record_bytes(record: ArrayRecord) -> int:
    """Return the serialized size of an ArrayRecord's arrays."""
    return sum(len(array.data) for array in record.values())


def message_bytes(message: Message, sizes: Optional[dict[int, int]] = None) -> int:
    """Return the serialized size of a message's content (0 for an error reply).

    ``sizes``: ``id(ArrayRecord) -> bytes`` of records already measured (a round's train
    messages share the global model's record), filled as records are measured.
    """
    if message.has_error():
        return 0
    sizes = {} if sizes is None else sizes
    content = message.content
    total = 0
    for record in content.array_records.values():
        if id(record) not in sizes:
            sizes[id(record)] = record_bytes(record)
        total += sizes[id(record)]
    return total + sum(len(r.deflate()) for r in [*content.config_records.values(), *content.metric_records.values()])


class MeteredGrid(GridWrapper):
    """A grid that counts the bytes of the messages sent (``down``) and received (``up``).

    A round's train messages usually share one ArrayRecord (the global model): its size is
    computed once per round and object.
    """

    def __init__(self, grid) -> None:
        super().__init__(grid)
        self.down = 0
        self.up = 0

    def _count(self, messages: list[Message]) -> int:
        sizes: dict[int, int] = {}  # within one batch: its messages' records are all alive
        return sum(message_bytes(m, sizes) for m in messages)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Send messages, counting their bytes; return their ids."""
        messages = list(messages)
        self.down += self._count(messages)
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Return the replies that arrived, counting their bytes."""
        replies = list(self.grid.pull_messages(message_ids))
        self.up += self._count(replies)
        return replies

    def send_and_receive(self, messages: Iterable[Message], *, timeout: Optional[float] = None) -> Iterable[Message]:
        """Send ``messages`` and return their replies, counting the bytes of both."""
        messages = list(messages)
        self.down += self._count(messages)
        replies = list(self.grid.send_and_receive(messages, timeout=timeout))
        self.up += self._count(replies)
        return replies

    def take(self) -> tuple[int, int]:
        """Return the bytes (down, up) counted since the last call, and start again from 0."""
        counts = (self.down, self.up)
        self.down = self.up = 0
        return counts


class CostMeter:
    """Round observer: a round's row gets ``bytes_down`` / ``bytes_up``, the bytes counted by
    ``grid`` since the previous row (the run's first row includes the partition-id queries).
    """

    def __init__(self, grid: MeteredGrid) -> None:
        self.grid = grid

    def after_round(self, record: Any, arrays: Any) -> bool:
        """Put the counts into ``record``; never stops the run."""
        record.extra["bytes_down"], record.extra["bytes_up"] = self.grid.take()
        return False
