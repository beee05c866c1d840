"""Which Flower node serves which client id.

Flower addresses nodes by random node ids; fedflex speaks of client ids, the partition
ids 0..N-1 each node holds in its node config, in simulation and deployment alike. The
directory asks every node it has not seen yet for its partition id (one QUERY round trip
per new node) and forgets nodes that left the grid, so the online set of a deployment is
simply the set of client ids with a live node.

A node that did not answer (its ClientApp failed, the query timed out) is asked again
after ``retry_after`` seconds, so a node that was slow to start is not ignored for good.

A node that claims a client id whose node is still live is refused (logged as an error
once): two SuperNodes started with one ``partition-id`` must not silently take turns
serving one client. It is held back, not forgotten: when the first node leaves the grid
(stopped, or a crashed node noticed after two missed heartbeats), the waiting node takes
the client id over, which is how a SuperNode restarted after a crash comes back.
:meth:`NodeDirectory.wait_for` lets a deployment wait (bounded) for its first nodes
before round 1, instead of starting with whoever happened to be connected.

With a key binding (:mod:`fedflex.node_keys`, authenticated deployments) a node's claim
counts only if the public key it authenticated with (``Grid.get_nodes()``) is the one
bound to the claimed partition id; a node that fails the check is refused (logged as an
error once) and not asked again while it stays connected.

Every refusal (a key that does not match, a client id a live node serves, one outside
the scenario's, a node past the last free id) is logged once, on Flower's logger (the
one a deployment's run log, ``flwr log`` and the console carry, and ``run.log``), and
kept for the results: :meth:`NodeDirectory.refusals` (``refused_nodes`` in summary.json)
and :meth:`NodeDirectory.shortfall` (the bound ids no node ever served).

Only ``identify="partition-id"`` (fedflex's scenarios and deployments, where fedflex's
ClientApp is known to answer) sends the QUERY. The other modes send nothing a Flower
ClientApp without a query function (Flower's quickstart) would have to answer:

- ``"node-id"``: each node id gets the next free client id (0, 1, 2, ... in order of
  first appearance, kept for that node id while the run lasts);
- ``"auto"`` (the Flower strategies' default): in Flower's simulation (and fedflex's
  in-process grid) node i of the registration order is client id i, which is the
  ``partition-id`` Flower's simulation gives that node; elsewhere (a deployment) as
  ``"node-id"``.
"""

from __future__ import annotations

import logging
import time
from logging import ERROR, WARNING
from typing import Any, Callable, Iterable, Mapping, Optional, cast

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common import log
from flwr.serverapp import Grid

from fedflex import keys
from fedflex.node_keys import fingerprint

logger = logging.getLogger(__name__)

#: how nodes get their client ids (see the module docstring)
IDENTIFY = ("partition-id", "node-id", "auto")


class NodeDirectory:
    """node id <-> client id, refreshed from the grid."""

    def __init__(
        self,
        num_clients: int,
        query_timeout: float = 60.0,
        retry_after: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        identify: str = "partition-id",
    ) -> None:
        if identify not in IDENTIFY:
            raise ValueError(f"identify is {identify!r}; allowed: {', '.join(IDENTIFY)}")
        self.identify = identify
        self.num_clients = num_clients
        self.query_timeout = query_timeout
        self.retry_after = retry_after
        self.clock = clock
        self.node_to_client: dict[int, int] = {}
        self.client_to_node: dict[int, int] = {}
        self.unanswered: dict[int, float] = {}  # node -> when it was last asked
        self.duplicates: dict[int, int] = {}  # live node -> client id a live other node serves
        #: partition id -> key fingerprint (None: a node's claim is taken as it is)
        self.bindings: Optional[dict[int, str]] = None
        self.refused: dict[int, int] = {}  # live node -> the client id it claimed against the binding
        self._refusals: list[dict[str, Any]] = []  # every refusal of the run, once (node, client, reason)
        self._public_keys: dict[int, bytes] = {}
        self._registering_since: Optional[float] = None
        #: node id -> client id of the nodes identified by their node id (kept after they leave)
        self.by_node_id: dict[int, int] = {}

    def refresh(self, grid: Grid) -> None:
        """Drop departed nodes, identify new ones (and unanswered ones again after
        ``retry_after`` seconds).
        """
        if self.bindings is not None:  # one Runtime API call for the ids and the keys
            self._public_keys = {int(info.node_id): bytes(info.public_key) for info in grid.get_nodes()}
            live = set(self._public_keys)
        else:
            live = set(grid.get_node_ids())
        gone = self.node_to_client.keys() - live  # set arithmetic: 10,000 nodes a round
        for node in [n for n in self.node_to_client if n in gone] if gone else []:
            client = self.node_to_client.pop(node)
            if self.client_to_node.get(client) == node:
                del self.client_to_node[client]
            logger.info("client %d (node %d) left", client, node)
        now = self.clock()
        self.unanswered = {n: t for n, t in self.unanswered.items() if n in live}
        self.duplicates = {n: c for n, c in self.duplicates.items() if n in live}
        self.refused = {n: c for n, c in self.refused.items() if n in live}
        for node, client in sorted(self.duplicates.items()):
            if client not in self.client_to_node:  # the first holder left: take over
                del self.duplicates[node]
                self._add(node, client)
        new = [
            n
            for n in sorted(live - self.node_to_client.keys())
            if n not in self.duplicates
            and n not in self.refused
            and now - self.unanswered.get(n, -float("inf")) >= self.retry_after
        ]
        if new and self.identify == "auto":
            new = self._number_by_registration(grid, new)
        if new and self.identify in ("node-id", "auto"):
            for node in new:
                self._add_by_node_id(node)
            new = []
        if new and len(new) > self.SIMULATION_SHORTCUT_MIN and self.bindings is None:
            new = self._identify_simulated(grid, new)
        if new:
            self._identify(grid, new)

    #: below this many new nodes the QUERY round trip is cheap enough
    SIMULATION_SHORTCUT_MIN = 64
    #: nodes asked to confirm the simulation's registration order
    SIMULATION_PROBES = 8

    def _identify_simulated(self, grid: Grid, new: list[int]) -> list[int]:
        """Flower's simulation registers node i (node config ``partition-id=i``) as the
        i-th node of its in-memory state (``vce_api._register_nodes``), so the client ids
        of thousands of simulated nodes follow from that order without a QUERY each
        (10,000 queries through two Ray workers outlast any sensible timeout). The
        in-process :class:`fedflex.launch.local_grid.LocalGrid` says its nodes' partition
        ids (``registration_order``), which saves its 10,000 queries through the ClientApp
        likewise. The order is confirmed by asking a few random nodes; on any mismatch, or
        on another grid, every node is asked. Returns the nodes still to identify.
        """
        order = registration_order(grid)
        if type(grid).__name__ == "LocalGrid" and order is not None:
            if len(order) != self.num_clients or set(new) - set(order):
                return new
            return self._take_order(grid, new, order)
        if order is None or set(new) - set(order):
            return new
        if len(order) < self.num_clients:
            # Flower is still registering the simulated nodes: wait for all of them
            # (bounded: after ``retry_after`` seconds the nodes seen so far are asked)
            if self._registering_since is None:
                self._registering_since = self.clock()
            if self.clock() - self._registering_since < self.retry_after:
                return []
            return new
        if len(order) != self.num_clients:
            return new
        return self._take_order(grid, new, order)

    def _number_by_registration(self, grid: Grid, new: list[int]) -> list[int]:
        """``identify="auto"``: in Flower's simulation (``InMemoryGrid``) and fedflex's
        ``LocalGrid`` the i-th registered node is client id i (its ``partition-id``), with
        no message sent; returns the nodes still to number (all of them on another grid,
        or when the registered nodes are not exactly ``num_clients``).
        """
        order = registration_order(grid)
        if order is None or len(order) != self.num_clients or set(new) - set(order):
            return new
        position = {node: i for i, node in enumerate(order)}
        for node in new:
            if node not in self.by_node_id:
                self.by_node_id[node] = position[node]  # kept if it leaves and comes back
                self._add(node, position[node])
        return []

    def _take_order(self, grid: Grid, new: list[int], order: list[int]) -> list[int]:
        """``order[i]`` serves client id ``i``, confirmed by asking a few of ``new``."""
        mapping = {node: i for i, node in enumerate(order)}
        rng = np.random.default_rng(len(order))
        # pick positions, not ids: an array of 64-bit ids above 2**63 becomes float64
        picks = rng.choice(len(new), size=min(self.SIMULATION_PROBES, len(new)), replace=False)
        probes = [new[int(i)] for i in picks]
        before = dict(self.node_to_client)
        self._identify(grid, probes)
        if any(self.node_to_client.get(n) != mapping[n] for n in probes):
            logger.warning("simulated nodes are not in registration order; asking every node")
            return [n for n in new if n not in self.node_to_client]
        for node in new:
            if node not in before and node not in probes:
                self._add(node, mapping[node])
        logger.info("identified %d simulated nodes from their registration order", len(new))
        return []

    def wait_for(self, grid: Grid, n: int, timeout: float, poll: float = 1.0) -> int:
        """Refresh until at least ``n`` client ids have a live node or ``timeout`` seconds
        pass; return how many there are (fewer than ``n`` on timeout, logged).

        For a deployment's first round: SuperNodes connect over seconds, and a round
        started before they did would see a smaller online set (a spurious session
        change in the next round). ``timeout=0`` refreshes once.
        """
        n = min(n, self.num_clients)
        deadline = self.clock() + timeout
        while True:
            self.refresh(grid)
            have = len(self.client_to_node)
            if have >= n:
                logger.info("%d client id(s) online (waited for %d)", have, n)
                return have
            remaining = deadline - self.clock()
            if remaining <= 0:
                logger.warning(
                    "only %d of %d client id(s) online after waiting %.0f s; starting anyway", have, n, timeout
                )
                return have
            time.sleep(min(poll, remaining))

    def _identify(self, grid: Grid, nodes: list[int]) -> None:
        record = RecordDict({keys.CONFIG: ConfigRecord({})})
        # ttl: a node that cannot answer in time must not find the stale query later
        messages = [
            Message(content=record, dst_node_id=n, message_type=MessageType.QUERY, ttl=self.query_timeout)
            for n in nodes
        ]
        replies = grid.send_and_receive(messages, timeout=self.query_timeout)
        answered: set[int] = set()
        for reply in replies:
            node = reply.metadata.src_node_id
            if reply.has_error() or not _says_partition_id(reply):
                why = reply.error.reason if reply.has_error() else f"no {keys.PARTITION_ID} in its reply"
                logger.warning("node %d did not say its client id: %s", node, why)
                continue
            client = int(cast(Mapping[str, Any], reply.content[keys.CONFIG])[keys.PARTITION_ID])
            problem = self._key_problem(node, client)
            if problem:
                self._refuse(node, client, problem)
                self.refused[node] = client
                answered.add(node)
                continue
            if self._add(node, client) or node in self.duplicates:
                answered.add(node)
        asked = self.clock()
        for node in set(nodes) - answered:
            self.unanswered[node] = asked
        for node in answered:
            self.unanswered.pop(node, None)
        logger.info("identified %d new node(s); %d client id(s) online", len(answered), len(self.client_to_node))

    def _refuse(
        self, node: int, client: Optional[int], reason: str, level: int = ERROR, said: Optional[str] = None
    ) -> None:
        """Log a refused claim once (on Flower's logger, which a deployment's run log and
        console carry; ``said``: the line's start) and keep it for :meth:`refusals`.
        """
        entry = {"node": node, "client": client, "reason": reason}
        if entry in self._refusals:
            return
        self._refusals.append(entry)
        claim = "a client id" if client is None else f"client id {client}"
        log(level, "%s, %s", said or f"node {node} claims {claim}: refused", reason)

    def refusals(self) -> list[dict[str, Any]]:
        """Return every refused claim of the run, in order, once each: ``node``, the
        ``client`` id it claimed (None: it claimed none) and the ``reason`` (for
        summary.json's ``refused_nodes``).
        """
        return [dict(entry) for entry in self._refusals]

    def shortfall(self, served: Iterable[int]) -> Optional[str]:
        """Say which partition ids bound to node keys no node ever served (``served``: the
        client ids that were online in some round, i.e. had a node the binding accepted),
        with the refusals; None when every bound id was served or no key binding is in
        force. A bound id that was online but never sampled is no shortfall.
        """
        if self.bindings is None:
            return None
        bound = sorted(self.bindings)
        done = set(int(c) for c in served)
        missing = [c for c in bound if c not in done]
        if not missing:
            return None
        why = "; ".join(f"node {r['node']} refused: {r['reason']}" for r in self._refusals[:3])
        return (
            f"{len(bound) - len(missing)} of the {len(bound)} partition ids bound to node keys had their node "
            f"(never: partition id {', '.join(map(str, missing))})" + (f"; {why}" if why else "")
        )

    def _key_problem(self, node: int, client: int) -> Optional[str]:
        """Why ``node`` may not serve ``client`` under the key binding (None: it may)."""
        if self.bindings is None:
            return None
        bound = self.bindings.get(client)
        if bound is None:
            return "no key is bound to that partition id"
        key = self._public_keys.get(node, b"")
        if not key:
            return "the grid gives no public key for the node (not an authenticated deployment?)"
        try:
            actual = fingerprint(key)
        except ValueError:
            return "its public key cannot be read"
        if actual != bound:
            return f"it authenticated with key {actual}, but partition id {client} is bound to {bound}"
        return None

    def _add_by_node_id(self, node: int) -> bool:
        """Give ``node`` the client id it had, or the next one no node-id client holds;
        False (logged) when all ``num_clients`` ids are taken.
        """
        client = self.by_node_id.get(node)
        if client is None:
            taken = set(self.by_node_id.values()) | set(self.client_to_node)
            free = [c for c in range(self.num_clients) if c not in taken]
            if not free:
                self._refuse(node, None, f"all {self.num_clients} client ids are taken (num_clients)", WARNING)
                self.unanswered[node] = self.clock()
                return False
            client = self.by_node_id[node] = free[0]
        return self._add(node, client)

    def _add(self, node: int, client: int) -> bool:
        """Map ``node`` to ``client``; False (ignored) when the id is out of range or
        another live node serves it (then ``node`` waits in ``duplicates``).
        """
        if not 0 <= client < self.num_clients:
            self._refuse(node, client, f"outside 0..{self.num_clients - 1} of this scenario", WARNING)
            return False
        old = self.client_to_node.get(client)
        if old is not None and old != node:
            # two SuperNodes with one partition id, or a restarted SuperNode while the
            # SuperLink still lists the crashed one: the node that has it keeps it
            self._refuse(
                node,
                client,
                f"node {old} serves it (two SuperNodes started with partition-id={client}?); "
                f"it takes the id over only once node {old} has left",
                said=f"node {node} also says it holds client id {client}, which node {old} serves: refused",
            )
            self.duplicates[node] = client
            return False
        self.node_to_client[node] = client
        self.client_to_node[client] = node
        return True

    def answers_queries(self, node: int) -> bool:
        """Whether ``node`` said its partition id (it runs fedflex's ClientApp, which also
        answers loss queries); nodes identified by node id get EVALUATE messages instead.
        """
        return node not in self.by_node_id

    def clients(self) -> np.ndarray:
        """Sorted client ids with a live node."""
        return np.sort(np.fromiter(self.client_to_node, dtype=np.int64, count=len(self.client_to_node)))

    def nodes_of(self, clients: Iterable[int]) -> list[int]:
        """Return the node ids of ``clients``."""
        return [self.client_to_node[int(c)] for c in clients]

    def client_of(self, node: int) -> int | None:
        """Return the client id of ``node``, or None for an unknown node."""
        return self.node_to_client.get(node)


def simulated_node_count(
    grid: Grid,
    need: int,
    timeout: float,
    settle: float = 1.0,
    poll: float = 0.05,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """How many SuperNodes Flower's simulation runs (``num-supernodes``).

    The simulation registers all of its nodes in one loop just after the ServerApp
    thread starts (``vce_api._register_nodes``) and never adds any later, so the count is
    final once ``need`` nodes are there or once it stopped growing for ``settle``
    seconds (at most ``timeout`` seconds in all): no node that was not registered by
    then will ever come.
    """
    deadline = clock() + timeout
    count, since = -1, clock()
    while True:
        now_count = len(list(grid.get_node_ids()))
        if now_count >= need:
            return now_count
        now = clock()
        if now_count != count:
            count, since = now_count, now
        elif count > 0 and now - since >= settle:
            return count
        if now >= deadline:
            return count
        sleep(poll)


def registration_order(grid: Grid) -> Optional[list[int]]:
    """Return the node ids in the order their simulation registered them (node i holds
    ``partition-id`` i), or None when ``grid`` is not a simulation's: Flower's
    ``InMemoryGrid`` (``vce_api._register_nodes`` registers node i with partition id i,
    in one loop) or fedflex's ``LocalGrid`` (which says it).
    """
    if type(grid).__name__ == "LocalGrid":
        return list(cast(Any, grid).registration_order())
    if type(grid).__name__ == "InMemoryGrid":
        state = getattr(grid, "state", None)
        return list(getattr(state, "nodes", {}) or {})
    return None


def _says_partition_id(reply: Message) -> bool:
    """Whether a query reply carries an integer ``partition-id`` in its config."""
    try:
        int(cast(Mapping[str, Any], reply.content[keys.CONFIG])[keys.PARTITION_ID])
    except (KeyError, TypeError, ValueError):
        return False
    return True


def wait_for_nodes(grid: Grid, need: int, timeout: float) -> int:
    """Wait (at most ``timeout`` seconds) for ``need`` nodes, as Flower's FedAvg does; in
    Flower's simulation also until it registered all of its nodes (one loop at start-up),
    so that N is the simulation's node count. Returns the number of nodes (fewer than
    ``need`` when the timeout passed).
    """
    start = time.monotonic()
    have = len(list(grid.get_node_ids()))
    while have < need:
        waited = time.monotonic() - start
        if waited >= timeout:
            return have
        if int(waited) % 30 == 0:
            log(logging.INFO, "waiting for %d node(s) to connect", need)
        time.sleep(min(1.0, max(timeout - waited, 0.0)))
        have = len(list(grid.get_node_ids()))
    if registration_order(grid) is not None and type(grid).__name__ == "InMemoryGrid":
        have = simulated_node_count(grid, 1 << 31, timeout=min(timeout, 30.0))
    return have
