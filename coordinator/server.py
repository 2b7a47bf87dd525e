"""The TCP front: the listener, and one dispatcher that shares the event loop fairly between the
connections (coordinator.connection: one ``asyncio.Protocol`` each, which buffers frames and writes
replies).

A request's way: bytes -> frame -> header peek -> version check against the registry -> decode ->
handler -> reply waits until its writes are durable -> encoded -> written, in request order per
connection, every reply ready in one loop pass joined into one write.

Fairness (a client that pipelines without reading must not starve the others): connections with
complete frames queue for the dispatcher, which starts at most ``FRAMES_PER_PASS`` requests per pass
before letting the loop poll sockets again, shared round robin by the connections waiting (one each
when many wait, up to ``FRAMES_PER_TURN`` for a lone one). What bounds each connection's memory is in
coordinator.connection.

Stopping: stop accepting and stop starting requests, let the shards make pending batches durable
(their requests are answered), write what is ready, then close every connection, all by a deadline.
"""

import asyncio
import dataclasses
import logging
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

from coordinator import gcpause
from coordinator.admission import Admission
from coordinator.apis import load_all
from coordinator.budget import MemoryBudget
from coordinator.connection import BULK_FRAME_BYTES, MAX_IDLE_S, Connection
from coordinator.request import Gateway
from coordinator.runtime import Runtime
from protocol.registry import REGISTRY

__all__ = ["BULK_FRAME_BYTES", "Connection", "Server"]

log = logging.getLogger(__name__)

FRAMES_PER_TURN: Final = 16
FRAMES_PER_PASS: Final = 32
IDLE_SWEEP_S: Final = 30.0
GC_CHECK_S: Final = 1.0


STALLED_WRITE_S: Final = 1.0  # at a stop, how long connections may send nothing before they are dropped
REFUSED_LINGER_S: Final = 30.0  # how long a refused connection's last replies may take to be read


class Server:
    """Listens; dispatches fairly; on stop: stops taking requests, lets pending writes finish, closes."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.connections: set[Connection] = set()
        self.stopping = False
        self.debug = log.isEnabledFor(logging.DEBUG)
        self.bulk = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kcoord-bulk")
        self.memory = MemoryBudget(runtime.config.max_buffered_bytes)
        self.admission = Admission(runtime.config.offsets_partitions, runtime.config.max_connections)
        self._ready: deque[Connection] = deque()
        self._writes: list[Connection] = []
        self._dispatch_scheduled = False
        self._write_scheduled = False
        self._server: asyncio.AbstractServer | None = None
        self._chores: list[asyncio.Task[None]] = []  # periodic tasks, cancelled at stop
        self.loop = asyncio.get_event_loop_policy().get_event_loop()
        self.gateway: Gateway | None = None
        self.refused_linger_s = REFUSED_LINGER_S  # an attribute: tests shorten it
        self._listeners: list[asyncio.AbstractServer] = []  # gateway mode: one per upstream broker
        apis = load_all()
        missing = set(REGISTRY) - set(apis)
        if missing:
            raise RuntimeError(f"APIs registered without a handler: {sorted(missing)}")

    async def start(self) -> tuple[str, int]:
        """Binds first (a port in use fails before anything is created on disk), then opens the data
        directory and starts loading every partition while already answering."""
        cfg = self.runtime.config
        self.loop = asyncio.get_running_loop()
        try:
            self._server = await self.loop.create_server(lambda: Connection(self), cfg.host, cfg.port,
                                                         reuse_address=True, start_serving=False)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot listen on {cfg.host}:{cfg.port} (--listen / KCOORD_LISTEN): "
                                     f"{exc.strerror or exc}") from exc
        listening: Any = self._server  # uvloop gives a list where asyncio's stubs say tuple: read it untyped
        sock = listening.sockets[0].getsockname()
        if cfg.port == 0 and cfg.advertised_port is None:  # the port the system chose, not 0 (Kafka does so too)
            cfg = self.runtime.config = dataclasses.replace(cfg, advertised_port=sock[1])
        try:
            self.runtime.open()
        except BaseException:
            self._server.close()
            raise
        self.runtime.start()
        await self._server.start_serving()
        self._chores = [self.loop.create_task(self._close_idle_connections()),
                        self.loop.create_task(self._collect_when_overdue())]
        log.info("kcoord listening on %s:%d (node %d, %d offsets partitions, data in %s)",
                 sock[0], sock[1], cfg.node_id, cfg.offsets_partitions, cfg.data_dir)
        if cfg.cluster:
            log.info("cluster mode: node %d of nodes %s, coordinating the groups of %d of the %d partitions",
                     cfg.node_id, ",".join(f"{n.node_id}@{n.host}:{n.port}" for n in cfg.cluster),
                     len(self.runtime.shards), cfg.offsets_partitions)
        return sock[0], sock[1]

    async def add_listener(self, sock: Any, node: int) -> None:
        """Gateway mode: serves an already bound socket whose connections stand for upstream ``node``."""
        listener = await self.loop.create_server(lambda: Connection(self, node), sock=sock)
        self._listeners.append(listener)

    # -- dispatch ------------------------------------------------------------------------------

    def schedule(self, conn: Connection) -> None:
        if conn.scheduled or conn.closed:
            return
        conn.scheduled = True
        self._ready.append(conn)
        if not self._dispatch_scheduled:
            self._dispatch_scheduled = True
            self.loop.call_soon(self._dispatch)

    def _dispatch(self) -> None:
        """One pass: every waiting connection in turn gets to start a few requests."""
        self._dispatch_scheduled = False
        budget = FRAMES_PER_PASS
        ready = self._ready
        # One pass is shared by the connections waiting: many busy ones get a frame each, one alone gets
        # up to FRAMES_PER_TURN (a loop iteration per request would cost a pipelining client dearly).
        turn = max(1, min(FRAMES_PER_TURN, FRAMES_PER_PASS // max(len(ready), 1)))
        for _ in range(len(ready)):
            if budget <= 0:
                break
            conn = ready.popleft()
            conn.scheduled = False
            try:
                started, more = conn.run(min(turn, budget))
            except Exception:  # one connection's bug must not cost the others their turn
                log.exception("%s: dispatch failed; closing the connection", conn.peer)
                conn.abort("internal error", "server_error")
                continue
            budget -= started
            if more:
                self.schedule(conn)
        if ready and not self._dispatch_scheduled:
            self._dispatch_scheduled = True
            self.loop.call_soon(self._dispatch)
        self._write_all()

    def want_write(self, conn: Connection) -> None:
        if conn.write_wanted:
            return
        conn.write_wanted = True
        self._writes.append(conn)
        if not self._write_scheduled:
            self._write_scheduled = True
            self.loop.call_soon(self._write_all)

    def _write_all(self) -> None:
        self._write_scheduled = False
        writes, self._writes = self._writes, []
        for conn in writes:
            try:
                conn.write_ready()
            except Exception:  # one connection's bug must not cost the others their replies
                log.exception("%s: write failed; closing the connection", conn.peer)
                conn.abort("internal error", "server_error")

    # -- lifecycle -----------------------------------------------------------------------------

    async def _collect_when_overdue(self) -> None:
        """A long pause of the collector still gets young collections (coordinator/gcpause.py)."""
        while True:
            await asyncio.sleep(GC_CHECK_S)
            gcpause.collect_if_overdue()

    async def _close_idle_connections(self) -> None:
        while True:
            await asyncio.sleep(IDLE_SWEEP_S)
            deadline = self.loop.time() - MAX_IDLE_S
            for conn in list(self.connections):
                conn.close_if_idle_since(deadline)

    async def stop(self, timeout_s: float) -> bool:
        """Stops within ``timeout_s``: returns False if something had to be abandoned at the deadline."""
        deadline = self.loop.time() + timeout_s
        self.stopping = True
        for chore in self._chores:
            chore.cancel()
        if self._server is not None:
            self._server.close()
        for listener in self._listeners:
            listener.close()
        for conn in list(self.connections):
            conn.stop_reading()
        # Pending batches become durable (their requests are answered) or are failed at the deadline.
        shards_closed = await self.runtime.stop(deadline)
        self._write_all()
        while any(not c.idle for c in self.connections) and self.loop.time() < deadline:
            await asyncio.sleep(0.01)
        clean = shards_closed and all(c.idle for c in self.connections)
        for conn in list(self.connections):
            conn.close()
        # The replies written go out while their peers read them, until the deadline; but a peer that
        # reads nothing held every stop for the whole of it (10 s; a campaign's find), so once nothing
        # has gone out for STALLED_WRITE_S the connections left are dropped, as Kafka closes its own.
        unsent, since, stalled = -1, self.loop.time(), False
        while self.connections and self.loop.time() < deadline:
            now_unsent = sum(c.unsent_bytes for c in self.connections)
            if now_unsent != unsent:
                unsent, since = now_unsent, self.loop.time()
            elif self.loop.time() - since >= STALLED_WRITE_S:
                stalled = True
                break
            await asyncio.sleep(0.01)
        if self.connections:
            log.info("dropping %d connection(s) with %d bytes of replies unsent: %s", len(self.connections),
                     sum(c.unsent_bytes for c in self.connections),
                     f"their peers took none for {STALLED_WRITE_S:g} s" if stalled else "the deadline passed")
        for conn in list(self.connections):
            conn.kill()  # a peer that does not read its last replies does not hold up the exit
        self.bulk.shutdown(wait=False, cancel_futures=True)
        log.info("kcoord stopped%s", "" if clean else " (some requests were not answered by the deadline)")
        return clean
