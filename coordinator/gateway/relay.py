"""Gateway mode's per-request routing, plugged into the server (``Server.gateway``).

Every frame is routed by its api key before anything is decoded:

* group APIs (``rewrite.LOCAL``) go to kcoord's own handlers, as in standalone mode;
* ApiVersions is answered here from the upstream's versions and features (``rewrite.api_versions``,
  ``rewrite.gateway_features``);
* FindCoordinator is decoded: group keys are answered here with kcoord's coordinator node (a broker of
  its own in every Metadata answer, with a listener of its own), transaction keys go upstream and come
  back with the coordinator's address rewritten;
* Metadata and DescribeCluster go upstream and come back with every broker address rewritten;
* an API or version the gateway does not offer (``rewrite.HIDDEN``, versions above ``rewrite.CAPS``) is
  refused, as Kafka refuses one it does not enable: the connection closes after the replies before it;
* everything else goes upstream untouched, and its reply comes back untouched.

A relayed request takes a ``Relayed`` slot in the connection's reply queue, so replies leave in request
order whoever answers them. When an upstream broker cannot be reached, does not answer within
``--upstream-timeout-ms`` or closes the link, the client's connection is closed: every Kafka client
treats that as a retriable network error (it refreshes metadata and reconnects), and kcoord itself
keeps serving groups and offsets on every listener.
"""

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

from coordinator.apis import k03_metadata as k03
from coordinator.apis import k10_find_coordinator as k10
from coordinator.apis import k18_api_versions as k18
from coordinator.config import Config
from coordinator.connection import Connection
from coordinator.gateway import rewrite
from coordinator.gateway.cluster import Cluster
from coordinator.gateway.metrics import GatewayMetrics
from coordinator.gateway.upstream import CLIENT_CLOSES, LinkOwner, UpstreamLink, Waiting
from coordinator.request import Relayed
from coordinator.server import Server
from protocol.registry import ApiSpec, DecodeError, api_versions_fallback

log = logging.getLogger(__name__)

SWEEP_S = 1.0
# A Metadata request on the coordinator's listener waits this long in all for the upstream's brokers, then
# kcoord answers it from its own view: the client's group requests on that connection, answered in order,
# would wait behind it (heartbeats every 3 s by default).
METADATA_WAIT_S = 2.0


class ClientLinks(LinkOwner):
    """One client connection's upstream links, by upstream address."""

    def __init__(self, gateway: "Gateway", conn: Connection) -> None:
        self.gateway = gateway
        self.conn = conn
        self.links: dict[tuple[str, int], UpstreamLink] = {}

    def link_for(self, addr: tuple[str, int], node: int) -> UpstreamLink:
        link = self.links.get(addr)
        if link is None or link.failed is not None:
            link = UpstreamLink(addr, self, self.gateway.timeout_s, node, self.gateway.server.admission.highest_fd)
            self.links[addr] = link
        return link

    def link_blocked(self, blocked: bool) -> None:
        if blocked:
            self.conn.held += 1
        else:
            self.conn.unhold()

    def link_failed(self, link: UpstreamLink, why: str, outstanding: int) -> None:
        """A link with requests outstanding takes its client's connection with it (their replies can
        never come); an idle one is just dropped, and the next request opens a new one."""
        if self.links.get(link.addr) is link:
            del self.links[link.addr]
        if self.gateway.stopping:
            return  # the stop gives up what the link still waited for (Gateway.stop)
        if "cannot connect" in why or "did not answer" in why:
            self.gateway.cluster.mark_down(link.addr)
        if outstanding and not self.conn.closed:
            self.gateway.metrics.upstream_error(link.node, why)
            self.conn.abort(why, "upstream", CLIENT_CLOSES)

    def close(self) -> None:
        for link in list(self.links.values()):
            link.close()
        self.links.clear()


class _Relay:
    """One relayed request, from the link's reply (or failure) to its client's slot. An object whose bound
    methods the link and the timer hold, not closures: closures that call each other are a cycle, which
    held the client's closed connection, its buffers and its links until a full collection (rare:
    coordinator.cli's thresholds), and a gateway's RSS grew by ~250 MB per ~600 short-lived connections
    that had asked Metadata (a fault campaign's find). Nothing here refers back to it once it is done."""

    __slots__ = ("api_key", "candidates", "conn", "end", "fallback", "finish", "frame", "gateway", "links", "node",
                 "sent", "slot", "started", "timer", "version")

    def __init__(self, gateway: "Gateway", conn: Connection, slot: Relayed, api_key: int, version: int, node: int,
                 sent: int, finish: Callable[[bytes], bytes] | None) -> None:
        self.gateway = gateway
        self.conn = conn
        self.slot = slot
        self.api_key = api_key
        self.version = version
        self.node = node
        self.sent = sent
        self.finish = finish
        self.started = time.perf_counter()
        self.timer: asyncio.TimerHandle | None = None
        # the fail-over's, with a fallback (fail_over)
        self.links: ClientLinks | None = None
        self.frame = b""
        self.candidates: list[tuple[str, int]] = []
        self.fallback: Callable[[bool], bytes] | None = None
        self.end: float | None = None

    def on_reply(self, reply: bytes) -> None:
        self._stop_timer()
        self.links = None
        if self.finish is not None:
            try:
                reply = self.finish(reply)
            except rewrite.RewriteError as exc:
                self.gateway.metrics.upstream_error(self.node, "unparsable reply")
                self.conn.abort(f"upstream reply could not be rewritten: {exc}", "upstream")
                return
        self.slot.data = reply
        self.gateway.metrics.relayed(self.api_key, self.node, self.sent, len(reply), time.perf_counter() - self.started)
        self.conn.slot_filled()

    def fail_over(self, links: ClientLinks, frame: bytes, candidates: list[tuple[str, int]],
                  fallback: Callable[[bool], bytes], wait_s: float | None) -> None:
        """Asks the candidates in turn (see Gateway._relay), then the fallback answers."""
        self.links, self.frame, self.candidates, self.fallback = links, frame, candidates, fallback
        self.end = None if wait_s is None else asyncio.get_running_loop().time() + wait_s
        self._attempt()

    def _attempt(self) -> None:
        assert self.links is not None
        addr = self.candidates.pop(0)
        self.debug(addr)
        link = self.links.link_for(addr, self.node)
        waiting = link.send(self.frame, self.on_reply, self._on_fail)
        if self.end is not None:
            loop = asyncio.get_running_loop()
            left = self.end - loop.time()
            self.timer = loop.call_later(left / 2 if self.candidates else left, self._give_up, waiting, link)

    def _give_up(self, waiting: Waiting, link: UpstreamLink) -> None:
        self.timer = None
        if self.conn.closed:
            self.links = None
            return  # the client left (its links closed, a reply perhaps dropped): nothing to say of the broker
        waiting.abandon()
        self.gateway.cluster.mark_down(link.addr)
        # slow if the broker took the connection; one still connecting may be unreachable
        self._next_or_fallback(link.connected)

    def _on_fail(self) -> None:
        self._stop_timer()
        if self.conn.closed:
            self.links = None
        else:
            self._next_or_fallback(False)

    def _next_or_fallback(self, slow: bool) -> None:
        assert self.fallback is not None
        if self.candidates and not self.gateway.stopping and (
                self.end is None or asyncio.get_running_loop().time() < self.end):
            self._attempt()
            return
        self.links = None
        self.slot.data = self.fallback(slow)  # decoded before it was relayed (route): nothing left to refuse here
        self.conn.slot_filled()

    def debug(self, addr: tuple[str, int]) -> None:
        """Each broker asked, in turn: a fail-over's first may not be the listener's (it failed lately)."""
        if self.gateway.server.debug:
            log.debug("%s: api %d v%d relayed to node %d at %s:%d", self.conn.peer, self.api_key, self.version,
                      self.node, *addr)

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class Gateway:
    """Implements ``coordinator.server.Gateway``; owns the cluster view and the per-node listeners."""

    def __init__(self, server: Server, config: Config, metrics: GatewayMetrics | None = None) -> None:
        self.server = server
        self.config = config
        self.timeout_s = config.upstream_timeout_ms / 1000.0
        self.metrics = metrics or GatewayMetrics()
        self.cluster = Cluster(config, self._serve_listener)
        server.runtime.lists_groups = self.cluster.lists_groups
        self.metrics.upstream_brokers = lambda: len(self.cluster.brokers)
        self.metrics.upstream_reachable = lambda: self.cluster.reachable
        self._tasks: list[asyncio.Task[None]] = []
        self._starting: set[asyncio.Task[None]] = set()  # listeners being set up (a task needs a reference)
        self.stopping = False

    async def start(self, wait_s: float = 10.0) -> None:
        """The timeout sweeper, then the first discovery (bounded: an upstream that is down at start-up is
        retried in the background, while kcoord already serves groups and offsets), then the refresher.
        The sweeper first: a discovery round also asks every listed broker its API versions, and relayed
        requests may already wait on a broker that is slow to answer."""
        loop = asyncio.get_running_loop()
        if self.config.broker_port_base is None or self.config.coordinator_port == 0:
            log.warning("gateway listeners on ports chosen at this start (no --broker-port-base or "
                        "--coordinator-port): after a restart they change, and consumers that keep the addresses "
                        "they learned (aiokafka, kafka-python) reconnect to the old ones and stop consuming; "
                        "fix both for a service that restarts")
        self.cluster.listen_coordinator()
        self._tasks = [loop.create_task(self._sweep())]
        deadline = loop.time() + wait_s
        while not await self.cluster.refresh() and loop.time() < deadline:
            await asyncio.sleep(0.5)
        self._tasks.append(loop.create_task(self.cluster.run()))

    def stop(self) -> None:
        """Called just before the server's stop (which then starts no request): relayed requests still
        waiting for the upstream are given up (a stalled upstream held every such connection, and the
        stop, until --shutdown-timeout-ms), a Metadata request answered from kcoord's own view; the
        replies before the first one given up are written, and the stop closes the connection with the
        others: the client retries elsewhere, as after kill -9."""
        self.stopping = True
        for task in self._tasks:
            task.cancel()
        self.cluster.stop()
        dropped = 0
        for conn in list(self.server.connections):
            if isinstance(conn.links, ClientLinks):
                for link in list(conn.links.links.values()):
                    link.fail("kcoord is stopping")
                dropped += conn.drop_unanswered_relays()
        if dropped:
            log.info("stopping: %d requests behind relayed ones still waiting for the upstream are not answered; "
                     "their connections close after the replies before them", dropped)

    @property
    def ready(self) -> bool:
        return self.cluster.offered is not None  # a plain read: /readyz asks from the metrics thread

    def _serve_listener(self, sock: socket.socket, node: int) -> None:
        """The socket is bound and listening already (its port is given out at once); serving starts on
        the loop. Connections arriving in between wait in its backlog."""
        task = asyncio.get_running_loop().create_task(self.server.add_listener(sock, node))
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)

    # -- coordinator.server.Gateway ------------------------------------------------------------

    def route(self, conn: Connection, frame: bytes, api_key: int, version: int, correlation_id: int) -> bool:
        if api_key in rewrite.LOCAL:
            return False
        if api_key == rewrite.API_VERSIONS:
            self._api_versions(conn, frame, version, correlation_id)
        elif api_key == rewrite.FIND_COORDINATOR:
            self._find_coordinator(conn, frame, version, correlation_id)
        elif not self.cluster.offers(api_key, version):
            # As Kafka refuses an API or version it does not enable: closed after the replies before it. A
            # client that does not ask ApiVersions (or pins a version) sent a TxnOffsetCommit, say, to the
            # upstream's coordinator, which wrote it to the upstream's __consumer_offsets, where no consumer
            # of kcoord's looks; a Produce v10+ or Fetch v16+ reply would carry upstream addresses.
            known = api_key in self.cluster.enabled
            conn.refuse(f"api {api_key} v{version} is not offered by the gateway",
                        "unsupported_version" if known else "unknown_api")
        elif api_key == rewrite.METADATA and version <= rewrite.CAPS[rewrite.METADATA]:
            try:
                asked: Any = rewrite.METADATA_REQUEST.decode_request(frame, version)[1]
            except DecodeError as exc:  # refused as standalone refuses it: after the replies before it
                conn.refuse(f"malformed request: {exc}", "malformed")
                return True
            every_topic = k03.every_topic_asked(asked.topics, version)
            self._relay(conn, frame, api_key, version,
                        lambda reply: rewrite.rewrite_metadata(reply, version, self.cluster, every_topic),
                        lambda slow: self._metadata_from_cache(asked, version, correlation_id, slow),
                        self._metadata_wait(conn))
        elif api_key == rewrite.DESCRIBE_CLUSTER and version <= rewrite.CAPS[rewrite.DESCRIBE_CLUSTER]:
            self._relay(conn, frame, api_key, version,
                        lambda reply: rewrite.rewrite_brokers(rewrite.DESCRIBE_CLUSTER_RESPONSE, reply, version,
                                                              self.cluster))
        elif api_key in (rewrite.METADATA, rewrite.DESCRIBE_CLUSTER):
            conn.refuse(f"api {api_key} v{version} is above what the gateway offers", "unsupported_version")
        elif api_key == rewrite.PRODUCE and self._unanswered(conn, frame, version):
            pass
        else:
            self._relay(conn, frame, api_key, version, None)
        return True

    def _unanswered(self, conn: Connection, frame: bytes, version: int) -> bool:
        """A Produce with acks=0 gets no reply from the broker (nor from Kafka): sent on, no reply slot."""
        try:
            acks = rewrite.produce_acks(frame, version)
        except rewrite.RewriteError as exc:
            conn.refuse(f"malformed request: {exc}", "malformed")
            return True
        if acks != 0:
            return False
        addr = self.cluster.target(conn.node)
        if addr is None:
            conn.abort(f"no upstream address known for node {conn.node}", "upstream")
            return True
        links = conn.links
        if not isinstance(links, ClientLinks):
            links = conn.links = ClientLinks(self, conn)
        links.link_for(addr, -1 if conn.node is None else conn.node).send_only(frame)
        self.metrics.relayed(rewrite.PRODUCE, -1 if conn.node is None else conn.node, len(frame) + 4, 0, 0.0)
        return True

    def closed(self, conn: Connection) -> None:
        if isinstance(conn.links, ClientLinks):
            conn.links.close()
            conn.links = None  # it refers back to conn: a cycle only a full collection would free

    def writable(self, conn: Connection, writable: bool) -> None:
        if isinstance(conn.links, ClientLinks):
            for link in conn.links.links.values():
                link.pause(not writable)

    # -- answers -------------------------------------------------------------------------------

    def _reply(self, conn: Connection, data: bytes) -> None:
        slot = Relayed()
        slot.data = data
        conn.enqueue(slot)
        conn.slot_filled()

    @staticmethod
    def _decoded(conn: Connection, spec: ApiSpec, frame: bytes, version: int) -> Any | None:
        """The request's body, or None once a malformed one has closed the connection (as standalone)."""
        try:
            return spec.decode_request(frame, version)[1]
        except DecodeError as exc:
            conn.refuse(f"malformed request: {exc}", "malformed")
            return None

    def _api_versions(self, conn: Connection, frame: bytes, version: int, correlation_id: int) -> None:
        spec = k18.SPEC
        if not spec.supports(version):  # KIP-511: any version it does not know, below the range too, as Kafka
            self._reply(conn, api_versions_fallback(correlation_id))
            return
        offered = self.cluster.offered
        if offered is None:
            conn.abort("no upstream broker has answered yet: cannot say which APIs are available", "upstream",
                       CLIENT_CLOSES)  # each client retries at once: logged once a minute
            return
        body = self._decoded(conn, spec, frame, version)
        if body is None:
            return
        if self.cluster.coordinators_own(conn.node):
            # librdkafka sends its client telemetry to a broker that offers it, every few seconds; on this
            # connection the group requests behind it would wait for the upstream's answer
            offered = [api for api in offered if api[0] not in rewrite.TELEMETRY]
        software = (body.client_software_name, body.client_software_version) if version >= 3 else None
        self._reply(conn, rewrite.api_versions_response(offered, version, correlation_id, software,
                                                        self.cluster.features))

    def _find_coordinator(self, conn: Connection, frame: bytes, version: int, correlation_id: int) -> None:
        spec = k10.SPEC
        if not spec.supports(version):
            conn.refuse(f"FindCoordinator v{version} is not supported", "unsupported_version")
            return
        body = self._decoded(conn, spec, frame, version)
        if body is None:
            return
        key_type = body.key_type if version >= 1 else k10.GROUP
        if key_type == k10.TRANSACTION:
            self._relay(conn, frame, rewrite.FIND_COORDINATOR, version,
                        lambda reply: rewrite.rewrite_find_coordinator(reply, version, self.cluster.address))
            return
        keys = list(body.coordinator_keys) if version >= 4 else [body.key]
        error, message = k10.resolve(key_type)  # NONE for group keys: every group's is kcoord's coordinator node
        node = self.cluster.coordinator() if key_type == k10.GROUP else (-1, "", -1)
        answer = k10.answer(version, keys, error, message, node)
        self._reply(conn, spec.encode_response(answer, version, correlation_id))

    def _metadata_from_cache(self, asked: Any, version: int, correlation_id: int, slow: bool) -> bytes:
        """The upstream did not answer a Metadata request: kcoord answers from what it knows (every broker,
        each topic asked for LEADER_NOT_AVAILABLE, which clients retry), so clients keep a usable broker
        list and keep reaching the group coordinator while the upstream is away. When it is only slow
        (the request was given up on the coordinator's listener), a topic's partitions are as the
        upstream last gave them: clients go on fetching from the leaders they had."""
        self.metrics.metadata_from_cache += 1
        return rewrite.metadata_from_cache(asked, version, correlation_id, self.cluster, last_seen=slow)

    # -- relay ---------------------------------------------------------------------------------

    def _metadata_wait(self, conn: Connection) -> float | None:
        """How long a Metadata request on ``conn`` waits for the upstream before kcoord answers it from
        its own view: on the coordinator's listener ``METADATA_WAIT_S`` (its group requests would wait
        behind it), elsewhere the upstream timeout."""
        return min(METADATA_WAIT_S, self.timeout_s) if self.cluster.coordinators_own(conn.node) else None

    def _relay(self, conn: Connection, frame: bytes, api_key: int, version: int,
               finish: Callable[[bytes], bytes] | None, fallback: Callable[[bool], bytes] | None = None,
               wait_s: float | None = None) -> None:
        """Relays to the listener's broker. With a ``fallback`` (Metadata, which any broker answers),
        brokers known to be down are tried last and, when a link fails, the next broker is tried, then
        the fallback answers: a client asking a dead broker's listener still learns where leaders went.
        With ``wait_s`` too, the fallback answers once that long has passed: a broker that has not
        answered within its share of it (half what is left while another remains to be asked) is left
        to answer nobody, marked down and the next one asked; its link and the requests behind it on
        that link are not disturbed. The fallback is told whether the last broker asked was given up
        (slow) rather than failed (unreachable)."""
        primary = self.cluster.target(conn.node)
        node = -1 if conn.node is None else conn.node
        if primary is None:
            self.metrics.upstream_error(node, "unknown node")
            conn.abort(f"no upstream address known for node {conn.node}", "upstream")
            return
        links = conn.links
        if not isinstance(links, ClientLinks):
            links = conn.links = ClientLinks(self, conn)
        slot = Relayed()
        conn.enqueue(slot)
        relay = _Relay(self, conn, slot, api_key, version, node, len(frame) + 4, finish)
        if fallback is None:
            # Produce, Fetch and the rest: one broker, no retry, and nothing that keeps the frame once the
            # link has taken it (a ~1 MB Produce frame held till a full collection took RSS to ~940 MiB under
            # 8 producers, for good: a memory campaign's find).
            relay.debug(primary)
            links.link_for(primary, node).send(frame, relay.on_reply, holds_s=self._holds_s(api_key, frame, version))
            return
        relay.fail_over(links, frame, self.cluster.candidates(primary), fallback, wait_s)

    @staticmethod
    def _holds_s(api_key: int, frame: bytes, version: int) -> float:
        """How long the upstream may hold the request by design: a Fetch's max wait (a long poll, which a
        consumer may set above --upstream-timeout-ms: each such poll timed out, closing the consumer's
        connection, while the upstream did as asked). A Fetch too short to say is the upstream's to refuse."""
        if api_key != rewrite.FETCH:
            return 0.0
        try:
            return rewrite.fetch_max_wait_ms(frame, version) / 1000.0
        except rewrite.RewriteError:
            return 0.0

    async def _sweep(self) -> None:
        """Fails links whose oldest request has waited longer than --upstream-timeout-ms."""
        while True:
            await asyncio.sleep(SWEEP_S)
            self._sweep_once(asyncio.get_running_loop().time())

    def _sweep_once(self, now: float) -> None:
        """(A function of its own: the loop's last connection and link, as locals of the sweeper's
        frame, kept the last connection swept, closed since, in memory till the next sweep that met one.)"""
        for conn in list(self.server.connections):
            if isinstance(conn.links, ClientLinks):
                for link in list(conn.links.links.values()):
                    if link.overdue(now):
                        link.fail(f"upstream {link.addr[0]}:{link.addr[1]} did not answer within {self.timeout_s:g} s")
