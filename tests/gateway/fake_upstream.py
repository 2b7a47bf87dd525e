"""A small fake upstream cluster for timing faults no real upstream here can be made to show: N brokers
(node ids 1..N) that each answer at once, late, or never, set per broker while kcoord runs.

Each broker answers ApiVersions and Metadata itself (every broker listed; topic ``t`` with N partitions,
partition i led by node i+1) and any other request with a reply of its correlation id and eight zero
bytes, which kcoord relays untouched. It runs on an event loop of its own in a thread of the test.
"""

import asyncio
import socket
import struct
import threading
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable

from coordinator.gateway import rewrite

OFFERED = [(0, 0, 8), (1, 0, 11), (3, 0, 9), (10, 0, 4), (18, 0, 2), (22, 0, 3), (60, 0, 1), (71, 0, 0), (72, 0, 0)]


class FakeUpstream:
    def __init__(self, brokers: int = 3) -> None:
        self.delay: dict[int, float | None] = {node: 0.0 for node in range(1, brokers + 1)}  # None: never answers
        self.asked: dict[int, Counter[int]] = {node: Counter() for node in self.delay}  # node -> api key -> requests
        self.ports: dict[int, int] = {}
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

    def _answer(self, api: int, version: int, correlation: int) -> bytes:
        if api == 18:
            body = struct.pack(">hi", 0, len(OFFERED)) + b"".join(struct.pack(">hhh", *k) for k in OFFERED)
            body += struct.pack(">i", 0) if version >= 1 else b""
            return struct.pack(">ii", 4 + len(body), correlation) + body
        if api == 3:
            cls = rewrite.METADATA_RESPONSE.cls
            part = cls.MetadataResponseTopic.MetadataResponsePartition
            partitions = [part(error_code=0, partition_index=i, leader_id=i + 1, leader_epoch=0, replica_nodes=[i + 1],
                               isr_nodes=[i + 1], offline_replicas=[]) for i in range(len(self.ports))]
            body = cls(throttle_time_ms=0, cluster_id="fake", controller_id=1,
                       brokers=[cls.MetadataResponseBroker(node_id=n, host="127.0.0.1", port=p, rack=None)
                                for n, p in self.ports.items()],
                       topics=[cls.MetadataResponseTopic(error_code=0, name="t", topic_id=uuid.UUID(int=7),
                                                         is_internal=False, partitions=partitions)])
            payload = rewrite.METADATA_RESPONSE.encode(body, version)
            head = struct.pack(">i", correlation) + (b"\x00" if version >= 9 else b"")
            return struct.pack(">i", len(head) + len(payload)) + head + payload
        return struct.pack(">ii", 12, correlation) + bytes(8)

    def _serving(self, node: int) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
        return lambda reader, writer: self._serve(node, reader, writer)

    async def _serve(self, node: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        last = 0.0  # replies leave in request order
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
                loop.call_at(last, writer.write, self._answer(api, version, correlation))
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
