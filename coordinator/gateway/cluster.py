"""The gateway's view of the upstream cluster: its brokers (node id -> upstream address), the API versions
it speaks, and kcoord's listener for each node id.

The view is read at start-up and every ``--upstream-refresh-ms`` from the upstream's own Metadata (any
broker that answers, the configured bootstrap addresses last), and every Metadata reply relayed to a
client updates it too, so a broker that joins gets a listener before any client is told about it.
Brokers are never forgotten: one missing from a Metadata answer (down for a moment) keeps its listener
and its address, so clients that still know it reconnect to the same place.
"""

import asyncio
import logging
import socket
import struct
import time
from collections.abc import Callable, Iterable

from coordinator.config import Config
from coordinator.gateway import rewrite
from coordinator.gateway.upstream import LinkOwner, UpstreamLink, upstream_reached_again
from protocol.partitioning import partition_for

log = logging.getLogger(__name__)

CLIENT_ID = b"kcoord-gateway"
RETRY_S = 1.0  # discovery retry while no upstream broker has answered yet
DOWN_S = 5.0  # a broker that could not be reached is tried last for Metadata for this long


def _request(api_key: int, version: int, correlation: int, body: bytes) -> bytes:
    """A non-flexible request frame (header v1) without its size prefix."""
    return struct.pack(">hhih", api_key, version, correlation, len(CLIENT_ID)) + CLIENT_ID + body


API_VERSIONS_V0 = _request(rewrite.API_VERSIONS, 0, 1, b"")
METADATA_V1_NO_TOPICS = _request(rewrite.METADATA, 1, 2, struct.pack(">i", 0))  # empty list: no topics


class Cluster:
    def __init__(self, config: Config, add_listener: Callable[[socket.socket, int], None]) -> None:
        self.config = config
        self.brokers: dict[int, tuple[str, int]] = {}  # upstream addresses
        self.listeners: dict[int, int] = {}  # node id -> kcoord's port for it
        self.live: list[int] = []  # the node ids of the last broker list seen (a left broker keeps its listener)
        self.offered: list[tuple[int, int, int]] | None = None  # ApiVersions answer, once known
        self.upstream_versions: dict[int, tuple[int, int]] = {}
        self.advertised_host = config.broker_host or config.advertised[0]
        self.cluster_id: str | None = None  # the upstream's, as last seen
        # every topic a relayed Metadata answer described, for answering while the upstream is away
        self.topics: dict[str, rewrite.TopicFacts] = {}
        self.controller_id = -1
        self._add_listener = add_listener
        self._healthy = False
        self._down: dict[tuple[str, int], float] = {}  # upstream address -> when it last failed

    # -- addresses -----------------------------------------------------------------------------

    def address(self, node: int) -> tuple[str, int] | None:
        """kcoord's listener for upstream node ``node`` (made now if the node is new)."""
        port = self.listeners.get(node)
        if port is None:
            if node < 0:
                return None
            port = self._listen(node)
        return self.advertised_host, port

    def nodes(self) -> list[int]:
        return sorted(self.listeners)

    def group_nodes(self) -> list[int]:
        """The nodes groups are spread over: the upstream's brokers as last seen (clients ask only
        those for ListGroups), each with a listener; every listener's node before any list is seen."""
        live = [node for node in self.live if node in self.listeners]
        return live or self.nodes()

    def coordinator_of(self, group_id: str) -> tuple[int, str, int] | None:
        """The node given for a group key, the same from every listener, as Kafka has one coordinator
        per group: the group's offsets partition spread over the nodes (every listener serves every
        group; this is what clients are told, and what ListGroups on each listener names)."""
        node = self._coordinator_of_partition(partition_for(group_id, self.config.offsets_partitions))
        return None if node is None else (node, self.advertised_host, self.listeners[node])

    def _coordinator_of_partition(self, partition: int) -> int | None:
        nodes = self.group_nodes()
        return nodes[partition % len(nodes)] if nodes else None

    def lists_partition(self, node: int | None, partition: int) -> bool:
        """Whether ListGroups on the listener of ``node`` names the groups of offsets ``partition``: those
        it coordinates (``coordinator_of``), so admin clients, which ask every broker and merge the
        answers, get each group once. The bootstrap listener, no broker's, names every group; a
        listener whose broker has left names none (its groups have moved to the brokers left). While
        brokers join or leave, a listing merged before the clients' next Metadata may miss or repeat
        groups whose node moved."""
        return node is None or self._coordinator_of_partition(partition) == node

    def target(self, node: int | None) -> tuple[str, int] | None:
        """The upstream address a listener relays to: its node's, or for the bootstrap listener the
        lowest known node's (else the first configured bootstrap address)."""
        if node is not None:
            return self.brokers.get(node)
        if self.brokers:
            return self.brokers[min(self.brokers)]
        return self.config.upstream[0]

    def mark_down(self, addr: tuple[str, int]) -> None:
        self._down[addr] = time.monotonic()

    def candidates(self, primary: tuple[str, int]) -> list[tuple[str, int]]:
        """Where a request any broker can answer (Metadata) is tried, in order: ``primary`` first
        unless it failed lately, brokers that failed lately last."""
        now = time.monotonic()
        addresses = list(dict.fromkeys([primary, *(self.brokers[n] for n in sorted(self.brokers))]))
        return sorted(addresses, key=lambda a: now - self._down.get(a, float("-inf")) < DOWN_S)

    def learn(self, brokers: Iterable[tuple[int, str, int]]) -> None:
        """Upstream brokers seen in a Metadata (or DescribeCluster) answer: all of them, each time."""
        brokers = list(brokers)
        self.live = sorted({node for node, _, _ in brokers})
        for node, host, port in brokers:
            if self.brokers.get(node) != (host, port):
                log.info("upstream broker %d at %s:%d", node, host, port)
                self.brokers[node] = (host, port)
            if node not in self.listeners:
                self._listen(node)

    def _listen(self, node: int) -> int:
        """Binds the node's listener now (so its port can be given out at once); serving starts on the
        loop. ``--broker-port-base`` + node id if set and free, else any free port."""
        host = self.config.host
        base = self.config.broker_port_base
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        wanted = base + node if base is not None and base + node <= 65535 else 0
        try:
            sock.bind((host, wanted))
        except OSError as exc:
            log.error("cannot listen on %s:%d for upstream node %d (%s); using a free port", host, wanted, node, exc)
            sock.bind((host, 0))
        sock.listen(512)
        sock.setblocking(False)
        port = int(sock.getsockname()[1])
        self.listeners[node] = port
        self._add_listener(sock, node)
        log.info("listening on %s:%d for upstream node %d (advertised as %s:%d)", host, port, node,
                 self.advertised_host, port)
        return port

    # -- discovery -----------------------------------------------------------------------------

    @property
    def reachable(self) -> bool:
        """Whether the last discovery round got an answer (every --upstream-refresh-ms)."""
        return self._healthy

    async def refresh(self) -> bool:
        """One discovery round: the first broker that answers ApiVersions and Metadata wins."""
        candidates = list(dict.fromkeys([*self.brokers.values(), *self.config.upstream]))
        timeout = self.config.upstream_timeout_ms / 1000.0
        for addr in candidates:
            link = UpstreamLink(addr, LinkOwner(), timeout)
            try:
                versions = rewrite.parse_api_versions(await asyncio.wait_for(link.request(API_VERSIONS_V0), timeout))
                reply = await asyncio.wait_for(link.request(METADATA_V1_NO_TOPICS), timeout)
                _, body = rewrite.decode_reply(rewrite.METADATA_RESPONSE, reply, 1)
            except (TimeoutError, ConnectionError, rewrite.RewriteError) as exc:
                log.debug("upstream %s:%d did not answer discovery: %r", *addr, exc)
                continue
            finally:
                link.close()
            if versions != self.upstream_versions:
                self.upstream_versions = versions
                self.offered = rewrite.api_versions(versions)
            self.learn((b.node_id, b.host, b.port) for b in body.brokers)
            if body.controller_id >= 0:
                self.controller_id = body.controller_id
            if not self._healthy:
                log.info("upstream cluster reachable: %d brokers %s", len(self.brokers), sorted(self.brokers))
                upstream_reached_again()
            self._healthy = True
            return True
        if self._healthy or self.offered is None:
            log.warning("no upstream broker answers (tried %s)", ", ".join(f"{h}:{p}" for h, p in candidates))
        self._healthy = False
        return False

    async def run(self) -> None:
        """Refreshes for ever: quickly until the first success, then every --upstream-refresh-ms."""
        while True:
            ok = await self.refresh()
            await asyncio.sleep(self.config.upstream_refresh_ms / 1000.0 if ok else RETRY_S)
