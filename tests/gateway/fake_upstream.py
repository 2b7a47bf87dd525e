"""A small fake upstream cluster for what no real upstream here can be made to show: N brokers (node ids
1..N) that each answer at once, late, or never, set per broker while kcoord runs; that differ in the API
versions and features they offer (a rolling upgrade); that close their connections (as a broker closes
an idle one); that answer DescribeCluster with an error.

Each broker answers ApiVersions (its ``offered`` versions and, from v3, its features; a version above
its own range gets KIP-511's v0 answer, as Kafka's), Metadata (the brokers in ``listed``; topic ``t``
with N partitions, partition i led by node i+1) and DescribeCluster (an endpoint type other than
brokers' gets MISMATCHED_ENDPOINT_TYPE, as from Kafka's brokers) itself, and any other request with a
reply of its correlation id and eight zero bytes, which kcoord relays untouched. It runs on an event
loop of its own in a thread of the test.
"""

import asyncio
import socket
import struct
import threading
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable

from coordinator.apis import k18_api_versions as k18
from coordinator.gateway import rewrite

OFFERED = [(0, 0, 8), (1, 0, 11), (3, 0, 9), (10, 0, 4), (18, 0, 2), (22, 0, 3), (60, 0, 1), (71, 0, 0), (72, 0, 0)]
MISMATCHED_ENDPOINT_TYPE = 114
UNSUPPORTED_VERSION = 35


class Features:
    """What a broker's ApiVersions v3+ answer says of features: (name, min, max) supported, and the
    finalized ones (name, min level, max level) with their epoch."""

    def __init__(self, supported: list[tuple[str, int, int]], epoch: int = -1,
                 finalized: list[tuple[str, int, int]] | None = None) -> None:
        self.supported = supported
        self.epoch = epoch
        self.finalized = finalized or []


class FakeUpstream:
    def __init__(self, brokers: int = 3) -> None:
        self.delay: dict[int, float | None] = {node: 0.0 for node in range(1, brokers + 1)}  # None: never answers
        self.asked: dict[int, Counter[int]] = {node: Counter() for node in self.delay}  # node -> api key -> requests
        self.ports: dict[int, int] = {}
        self.offered: dict[int, list[tuple[int, int, int]]] = {node: list(OFFERED) for node in self.delay}
        self.features: dict[int, Features] = {node: Features([]) for node in self.delay}
        self.listed: set[int] = set(self.delay)  # the brokers Metadata and DescribeCluster name
        self._connections: dict[int, set[asyncio.StreamWriter]] = {node: set() for node in self.delay}
        self._servers: list[asyncio.Server] = []
        self._holes: list[socket.socket] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for port in self.ports.values())

    def blackhole(self) -> None:
        """Every broker unreachable as when its SYNs are dropped: a connect never completes (the brokers'
        listening sockets now have a full backlog)."""

        async def close() -> None:
            for server in self._servers:
                server.close()
                await server.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        for port in self.ports.values():
            hole = socket.socket()
            hole.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            hole.bind(("127.0.0.1", port))
            hole.listen(0)
            self._holes += (hole, socket.create_connection(("127.0.0.1", port), timeout=1))  # fills the backlog

    def refuse(self, node: int) -> None:
        """``node`` stops listening: a connection to it is refused (a broker that is down)."""

        async def close() -> None:
            self._servers[list(self.delay).index(node)].close()  # its listening socket closes at once

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)

    def drop(self, node: int) -> None:
        """Closes every connection to ``node`` (as a broker closes one idle too long); it still listens."""

        def close() -> None:
            for writer in self._connections[node]:
                writer.transport.abort()

        self._loop.call_soon_threadsafe(close)

    def stop(self) -> None:
        for sock in self._holes:
            sock.close()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        for node in self.delay:
            server = self._loop.run_until_complete(asyncio.start_server(self._serving(node), "127.0.0.1", 0))
            self._servers.append(server)
            self.ports[node] = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    def _answer(self, node: int, api: int, version: int, correlation: int, frame: bytes) -> bytes:
        if api == 18:
            return self._api_versions(node, version, correlation)
        if api == 60:
            return self._describe_cluster(version, correlation, frame)
        if api == 3:
            cls = rewrite.METADATA_RESPONSE.cls
            part = cls.MetadataResponseTopic.MetadataResponsePartition
            partitions = [part(error_code=0, partition_index=i, leader_id=i + 1, leader_epoch=0, replica_nodes=[i + 1],
                               isr_nodes=[i + 1], offline_replicas=[]) for i in range(len(self.ports))]
            body = cls(throttle_time_ms=0, cluster_id="fake", controller_id=1,
                       brokers=[cls.MetadataResponseBroker(node_id=n, host="127.0.0.1", port=p, rack=None)
                                for n, p in self.ports.items() if n in self.listed],
                       topics=[cls.MetadataResponseTopic(error_code=0, name="t", topic_id=uuid.UUID(int=7),
                                                         is_internal=False, partitions=partitions)])
            payload = rewrite.METADATA_RESPONSE.encode(body, version)
            head = struct.pack(">i", correlation) + (b"\x00" if version >= 9 else b"")
            return struct.pack(">i", len(head) + len(payload)) + head + payload
        return struct.pack(">ii", 12, correlation) + bytes(8)

    def _api_versions(self, node: int, version: int, correlation: int) -> bytes:
        cls = k18.Response
        offered = self.offered[node]
        lo, hi = next((lo, hi) for key, lo, hi in offered if key == 18)
        if not lo <= version <= hi:  # KIP-511: the v0 body, its own ApiVersions range
            body = cls(error_code=UNSUPPORTED_VERSION, throttle_time_ms=0,
                       api_keys=[cls.ApiVersion(api_key=18, min_version=lo, max_version=hi)])
            return k18.SPEC.encode_response(body, 0, correlation)
        features = self.features[node]
        body = cls(error_code=0, throttle_time_ms=0,
                   api_keys=[cls.ApiVersion(api_key=k, min_version=lo, max_version=hi) for k, lo, hi in offered],
                   supported_features=[cls.SupportedFeatureKey(name=n, min_version=lo, max_version=hi)
                                       for n, lo, hi in features.supported if version >= 4 or lo > 0],
                   finalized_features_epoch=features.epoch,
                   finalized_features=[cls.FinalizedFeatureKey(name=n, min_version_level=lo, max_version_level=hi)
                                       for n, lo, hi in features.finalized])
        return k18.SPEC.encode_response(body, version, correlation)

    def _describe_cluster(self, version: int, correlation: int, frame: bytes) -> bytes:
        codec = rewrite.DESCRIBE_CLUSTER_RESPONSE
        cls = codec.cls
        (n,) = struct.unpack_from(">h", frame, 8)  # the client id, then the header's tagged fields (none)
        endpoint_type = frame[10 + max(n, 0) + 2] if version >= 1 else 1  # after IncludeClusterAuthorizedOperations
        if endpoint_type != 1:
            body = cls(throttle_time_ms=0, error_code=MISMATCHED_ENDPOINT_TYPE, cluster_id="", controller_id=-1,
                       error_message="The request was sent to an endpoint of type BROKER", brokers=[],
                       endpoint_type=endpoint_type)
        else:
            body = cls(throttle_time_ms=0, error_code=0, cluster_id="fake", controller_id=1, endpoint_type=1,
                       brokers=[cls.DescribeClusterBroker(broker_id=n, host="127.0.0.1", port=p, rack=None)
                                for n, p in self.ports.items() if n in self.listed])
        payload = codec.encode(body, version)
        head = struct.pack(">i", correlation) + b"\x00"  # flexible from v0
        return struct.pack(">i", len(head) + len(payload)) + head + payload

    def _serving(self, node: int) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
        return lambda reader, writer: self._serve(node, reader, writer)

    async def _serve(self, node: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        last = 0.0  # replies leave in request order
        self._connections[node].add(writer)
        try:
            while True:
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                frame = await reader.readexactly(size)
                api, version, correlation = struct.unpack_from(">hhi", frame)
                self.asked[node][api] += 1
                delay = self.delay[node]
                if delay is None:
                    continue
                last = max(last, loop.time() + delay)
                loop.call_at(last, writer.write, self._answer(node, api, version, correlation, frame))
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
        finally:
            self._connections[node].discard(writer)
