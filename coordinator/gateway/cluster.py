"""The gateway's view of the upstream cluster: its brokers (node id -> upstream address), the API versions
it speaks, and kcoord's listener for each node id.

The view is read at start-up and every ``--upstream-refresh-ms`` from the upstream's own Metadata (any
broker that answers, the configured bootstrap addresses last), and every Metadata reply relayed to a
client updates it too, so a broker that joins gets a listener before any client is told about it.
Brokers are never forgotten: one missing from a Metadata answer (down for a moment) keeps its listener
and its address, so clients that still know it reconnect to the same place.

The API versions offered are those every live broker (the last broker list) speaks: brokers may differ
(a rolling upgrade, or a downgrade), and a request relayed at a version one of them lacks would be
refused by it. Each broker is asked ApiVersions when it appears in a broker list (or again after it
left one), and one more in turn every round, so one restarted with other software is seen within a
round per broker; the broker that answered discovery is asked there. Kafka clients keep versions per
broker; kcoord's listeners answer as one cluster, and the bootstrap and coordinator's listeners relay
to any broker.
"""

import asyncio
import logging
import socket
import struct
import time
from collections.abc import Callable, Iterable

import coordinator
from coordinator.config import Config
from coordinator.gateway import rewrite
from coordinator.gateway.topiccache import TopicCache
from coordinator.gateway.upstream import LinkOwner, UpstreamLink, upstream_reached_again
from protocol.framing import FrameError

log = logging.getLogger(__name__)

CLIENT_ID = b"kcoord-gateway"
RETRY_S = 1.0  # discovery retry while no upstream broker has answered yet
DOWN_S = 5.0  # a broker that could not be reached is tried last for Metadata for this long


def _request(api_key: int, version: int, correlation: int, body: bytes) -> bytes:
    """A non-flexible request frame (header v1) without its size prefix."""
    return struct.pack(">hhih", api_key, version, correlation, len(CLIENT_ID)) + CLIENT_ID + body


def _api_versions_request(version: int, correlation: int) -> bytes:
    """ApiVersions at ``version``: from v3 a flexible header (its tagged fields) and the client software."""
    if version < 3:
        return _request(rewrite.API_VERSIONS, version, correlation, b"")
    software = b"".join(bytes([len(v) + 1]) + v for v in (CLIENT_ID, coordinator.__version__.encode()))
    return _request(rewrite.API_VERSIONS, version, correlation, b"\x00" + software + b"\x00")


API_VERSIONS_ASKED = 4  # v3+ answers carry the features; v4 also those whose minimum is 0
METADATA_V1_NO_TOPICS = _request(rewrite.METADATA, 1, 2, struct.pack(">i", 0))  # empty list: no topics


Answer = tuple[dict[int, tuple[int, int]], rewrite.Features]  # an ApiVersions answer: key -> (min, max), features


class Cluster:
    def __init__(self, config: Config, add_listener: Callable[[socket.socket, int], None]) -> None:
        self.config = config
        self.brokers: dict[int, tuple[str, int]] = {}  # upstream addresses
        self.listeners: dict[int, int] = {}  # node id -> kcoord's port for it
        self.coordinator_node = config.coordinator_node_id
        self.live: list[int] = []  # the node ids of the last broker list seen (a left broker keeps its listener)
        self.offered: list[tuple[int, int, int]] | None = None  # ApiVersions answer, once known
        self.enabled: dict[int, tuple[int, int]] = {}  # the same, key -> (min, max), for every request's check
        self.upstream_versions: dict[int, tuple[int, int]] = {}  # what every live broker speaks
        self.features = rewrite.NO_FEATURES  # the upstream's, as the gateway offers them
        self.node_versions: dict[int, Answer] = {}  # each live broker's ApiVersions answer
        self._discovered: Answer = ({}, rewrite.NO_FEATURES)  # the last discovery answer (if no broker's is)
        self._turn = 0  # the broker asked again this round, in turn
        self._asking: asyncio.Task[None] | None = None  # brokers new in a relayed Metadata answer, being asked
        self.advertised_host = config.broker_host or config.advertised[0]
        self.cluster_id: str | None = None  # the upstream's, as last seen
        # every topic a relayed Metadata answer described, for answering while the upstream is away
        self.topics = TopicCache()
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

    def coordinator(self) -> tuple[int, str, int]:
        """The node given for every group key, from every listener: kcoord's coordinator, a broker of its
        own that leads no partition. Clients then send their group requests on a connection of their own
        (librdkafka, kafkajs and Sarama send a coordinator's requests on the connection of the broker with
        its node id), where none waits behind a relayed Fetch or Metadata that a stalled upstream does
        not answer: with the coordinator on an upstream broker's node id, members were expired while
        only the upstream stalled (a fault campaign's find)."""
        node = self.coordinator_node
        host, port = self.address(node) or ("", -1)  # (never None: its id is not negative)
        return node, host, port

    def offers(self, api_key: int, version: int) -> bool:
        """Whether the gateway's ApiVersions answer offers this version of this API (any, until the
        upstream has answered once and that answer is not known)."""
        if self.offered is None:
            return True
        found = self.enabled.get(api_key)
        return found is not None and found[0] <= version <= found[1]

    def lists_groups(self, node: int | None) -> bool:
        """Whether ListGroups on the listener of ``node`` names kcoord's groups: on the coordinator's and
        on the bootstrap listener (no broker's), not on an upstream broker's, so admin clients, which ask
        every broker Metadata names and merge the answers, get each group once."""
        return node is None or node == self.coordinator_node

    def coordinators_own(self, node: int | None) -> bool:
        """Whether ``node``'s listener is the coordinator's and no upstream broker has its node id."""
        return node == self.coordinator_node and node not in self.brokers

    def target(self, node: int | None) -> tuple[str, int] | None:
        """The upstream address a listener relays to: its node's; for the bootstrap and the coordinator's
        listener, the lowest node's of the last broker list (else of any known, else the first configured
        bootstrap address)."""
        if node is not None and not self.coordinators_own(node):
            return self.brokers.get(node)
        if self.live:
            return self.brokers[self.live[0]]
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

    def learn(self, brokers: Iterable[tuple[int, str, int]], ask: bool = True) -> None:
        """Upstream brokers seen in a Metadata (or DescribeCluster) answer: all of them, each time. A
        broker not listed is asked its API versions again when it is (it may have restarted with other
        software); with ``ask`` those never asked are asked now (on the loop, if one runs)."""
        brokers = list(brokers)
        self.live = sorted({node for node, _, _ in brokers})
        for node in [node for node in self.node_versions if node not in self.live]:
            del self.node_versions[node]
        for node, host, port in brokers:
            if node == self.coordinator_node and node not in self.brokers:
                log.warning("upstream broker %d has the node id of kcoord's group coordinator "
                            "(--coordinator-node-id): its listener relays to it, and group requests may wait "
                            "behind relayed ones there; choose another id", node)
            if self.brokers.get(node) != (host, port):
                log.info("upstream broker %d at %s:%d", node, host, port)
                self.brokers[node] = (host, port)
                self.node_versions.pop(node, None)
            if node not in self.listeners:
                self._listen(node)
        if ask and self.offered is not None and any(node not in self.node_versions for node in self.live):
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            if self._asking is None or self._asking.done():
                self._asking = loop.create_task(self._ask_brokers())

    def listen_coordinator(self) -> None:
        """The coordinator's listener, made before any client is told of it (``--coordinator-port``)."""
        if self.coordinator_node not in self.listeners:
            self._listen(self.coordinator_node)

    def _listen(self, node: int) -> int:
        """Binds the node's listener now (so its port can be given out at once); serving starts on the
        loop. ``--broker-port-base`` + node id if set and free, else any free port; the coordinator's on
        ``--coordinator-port``."""
        host = self.config.host
        base = self.config.broker_port_base
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        coordinator = node == self.coordinator_node
        if coordinator:
            wanted = self.config.coordinator_port
        else:
            wanted = base + node if base is not None and base + node <= 65535 else 0
        what = "kcoord's group coordinator, node" if coordinator else "upstream node"
        try:
            sock.bind((host, wanted))
        except OSError as exc:
            log.error("cannot listen on %s:%d for %s %d (%s); using a free port", host, wanted, what, node, exc)
            sock.bind((host, 0))
        sock.listen(512)
        sock.setblocking(False)
        port = int(sock.getsockname()[1])
        self.listeners[node] = port
        self._add_listener(sock, node)
        log.info("listening on %s:%d for %s %d (advertised as %s:%d)", host, port, what, node,
                 self.advertised_host, port)
        return port

    # -- discovery -----------------------------------------------------------------------------

    @property
    def reachable(self) -> bool:
        """Whether the last discovery round got an answer (every --upstream-refresh-ms)."""
        return self._healthy

    async def _api_versions(self, link: UpstreamLink) -> Answer:
        """The broker's ApiVersions answer, asked at v4 (its features), else the highest it speaks
        (told in KIP-511's answer to a version above its range), on the same connection."""
        timeout = self.config.upstream_timeout_ms / 1000.0
        version = API_VERSIONS_ASKED
        for correlation in (1, 3):
            reply = await asyncio.wait_for(link.request(_api_versions_request(version, correlation)), timeout)
            try:
                return rewrite.parse_api_versions(reply, version)
            except rewrite.UnsupportedApiVersions as exc:
                version = min(exc.highest, version - 1) if exc.highest >= 3 else 0
        raise rewrite.RewriteError(f"upstream {link.addr[0]}:{link.addr[1]} refused ApiVersions v{version}")

    async def _ask(self, node: int) -> None:
        addr = self.brokers[node]
        link = UpstreamLink(addr, LinkOwner(), self.config.upstream_timeout_ms / 1000.0)
        try:
            answer = await self._api_versions(link)
            # Kept only for the broker still listed at that address: one that left meanwhile (a broker list
            # relayed while it was asked) is asked again when it comes back, perhaps with other software,
            # and an answer from its old address is not its new one's.
            if node in self.live and self.brokers.get(node) == addr:
                self.node_versions[node] = answer
        except (TimeoutError, ConnectionError, FrameError, rewrite.RewriteError) as exc:
            log.debug("upstream broker %d at %s:%d did not answer ApiVersions: %r", node, *addr, exc)
        finally:
            link.close()

    async def _ask_brokers(self, asked: Iterable[int] = (), turn: bool = False) -> None:
        """Asks the live brokers never asked (and with ``turn`` the next in turn, unless in ``asked``
        already) their API versions, then offers what they all speak."""
        nodes = [node for node in self.live if node not in self.node_versions]
        if turn and self.live:
            self._turn += 1
            node = self.live[self._turn % len(self.live)]
            if node not in nodes and node not in asked:
                nodes.append(node)
        await asyncio.gather(*(self._ask(node) for node in nodes))
        self._offer()

    def _offer(self) -> None:
        """Offers the API versions every live broker that answered speaks (the discovery answer's, if
        none has answered yet), and the features they all support, finalized as the latest says."""
        known = [self.node_versions[node] for node in self.live if node in self.node_versions] or [self._discovered]
        self.features = rewrite.gateway_features(rewrite.common_features([features for _, features in known]))
        versions = rewrite.common_ranges([versions for versions, _ in known])
        if versions == self.upstream_versions:
            return
        if self.offered is not None:
            log.info("upstream API versions changed (brokers %s asked): offering what all of them speak",
                     sorted(node for node in self.live if node in self.node_versions))
        self.upstream_versions = versions
        offered = rewrite.api_versions(versions)
        self.enabled = {key: (lo, hi) for key, lo, hi in offered}
        self.offered = offered

    async def refresh(self) -> bool:
        """One discovery round: the first broker that answers ApiVersions and Metadata wins; then the
        brokers it lists that were never asked (and one in turn) are asked their API versions."""
        candidates = list(dict.fromkeys([*self.brokers.values(), *self.config.upstream]))
        timeout = self.config.upstream_timeout_ms / 1000.0
        for addr in candidates:
            link = UpstreamLink(addr, LinkOwner(), timeout)
            try:
                versions = await self._api_versions(link)
                reply = await asyncio.wait_for(link.request(METADATA_V1_NO_TOPICS), timeout)
                _, body = rewrite.decode_reply(rewrite.METADATA_RESPONSE, reply, 1)
            except (TimeoutError, ConnectionError, FrameError, rewrite.RewriteError) as exc:
                log.debug("upstream %s:%d did not answer discovery: %r", *addr, exc)
                continue
            finally:
                link.close()
            self._discovered = versions
            self.learn(((b.node_id, b.host, b.port) for b in body.brokers), ask=False)
            answered = [node for node in self.live if self.brokers[node] == addr]
            for node in answered:
                self.node_versions[node] = versions
            if self.offered is None:
                self._offer()  # ready at once; narrowed below if another broker speaks less
            if body.controller_id >= 0:
                self.controller_id = body.controller_id
            if not self._healthy:
                log.info("upstream cluster reachable: %d brokers %s", len(self.brokers), sorted(self.brokers))
                upstream_reached_again()
            self._healthy = True
            await self._ask_brokers(answered, turn=True)
            return True
        if self._healthy or self.offered is None:
            log.warning("no upstream broker answers (tried %s)", ", ".join(f"{h}:{p}" for h, p in candidates))
        self._healthy = False
        return False

    def stop(self) -> None:
        if self._asking is not None:
            self._asking.cancel()

    async def run(self) -> None:
        """Refreshes for ever: quickly until the first success, then every --upstream-refresh-ms."""
        while True:
            ok = await self.refresh()
            await asyncio.sleep(self.config.upstream_refresh_ms / 1000.0 if ok else RETRY_S)
