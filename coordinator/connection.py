"""One client connection: an ``asyncio.Protocol`` (StreamReader measured ~4x slower here) that buffers
frames, starts requests when the dispatcher (coordinator.server) gives it a turn and writes their
replies in request order, every reply ready in one loop pass joined into one write.

Bounded memory (a client that pipelines without reading must not starve the others):

* ``data_received`` only buffers; the dispatcher starts the requests.
* A connection stops starting requests while ``MAX_IN_FLIGHT`` of its replies are unsent, while a
  large request's reply is, while a JoinGroup or SyncGroup waits for its rebalance (as Kafka, which
  reads a connection's next request once the last is answered), while its transport's send buffer
  is over the high-water mark or while it is held (one of its huge writes is still being applied, a
  slice per pass: coordinator.shard; or a DescribeGroups or DeleteGroups of thousands of groups:
  coordinator.apis.slices), and stops *reading* while it also has a backlog of
  ``READ_BACKLOG_BYTES`` of complete frames, so its socket buffers push back on the client.
* Frames over ``SMALL_FRAME_BYTES`` are read only while their declared size fits in
  ``max_buffered_bytes`` (first come first served) and must arrive within a deadline; smaller frames
  never wait for that budget, so nobody's large (or never-sent) request blocks small requests.
* A request frame over ``BULK_FRAME_BYTES`` is decoded (and its API's ``prepare`` run) on a worker
  thread, and its reply encoded there too, so one huge request does not freeze every other client.
  Such a request (or one whose answer is as large) holds the cyclic collector's pause until it is
  dropped: its objects are not scanned again and again while it lives (coordinator/gcpause.py).

Bad input (a frame size outside [0, max], an unknown API or version, a body that does not parse, a
connection that ends inside a frame) closes that connection with a log line; nothing else is touched.
Except ApiVersions of a version it does not know, above or below its range: answered UNSUPPORTED_VERSION
in the v0 body (KIP-511), as Kafka does, and the connection stays open.
"""

import asyncio
import concurrent.futures
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Final, cast

from coordinator import gcpause
from coordinator.apis import APIS
from coordinator.handoff import on_loop
from coordinator.logfmt import Repeated
from coordinator.metrics import AbortReason
from coordinator.request import PARKED, Relayed, Request, ShardUnavailable, decode_and_prepare, encode_reply
from protocol.errors import ErrorCode
from protocol.framing import FrameError, FrameReader
from protocol.header import HeaderError, peek_header
from protocol.registry import API_VERSIONS, DecodeError, api_versions_fallback

if TYPE_CHECKING:
    from coordinator.server import Server

# Enum members as C variables, not class attributes (tests/protocol/test_compiled.py says why).
_ERR_UNSUPPORTED_VERSION: Final = ErrorCode.UNSUPPORTED_VERSION

# The server's logger: connection events were always logged as coordinator.server, and log filters
# and alerts key on it.
log = logging.getLogger("coordinator.server")

MAX_IN_FLIGHT: Final = 16
READ_BACKLOG_BYTES: Final = 256 * 1024
SMALL_FRAME_BYTES: Final = 256 * 1024  # frames up to this size never wait for the buffered-bytes budget
LARGE_FRAME_BASE_S: Final = 30.0
LARGE_FRAME_MIN_RATE: Final = 1024 * 1024  # bytes/s a large frame must arrive at, after LARGE_FRAME_BASE_S
BULK_FRAME_BYTES: Final = 64 * 1024
WRITE_BUFFER_HIGH: Final = 256 * 1024
MAX_IDLE_S: Final = 600.0  # Kafka's connections.max.idle.ms


class Connection(asyncio.Protocol):
    def __init__(self, server: "Server", node: int | None = None) -> None:
        self._server = server
        self.node = node  # gateway mode: the upstream node id this connection's listener stands for
        self.held = 0  # no request starts: a huge write is being applied, or gateway links are full
        self.links: Any = None  # gateway mode: this connection's upstream links
        self._runtime = server.runtime
        self._reader = FrameReader(server.runtime.config.max_frame_bytes)
        self._queue: deque[Request | Relayed] = deque()  # requests in reply order
        self._transport: asyncio.Transport | None = None
        self.peer = "?"
        self.closed = False
        self.scheduled = False  # queued for the dispatcher
        self.write_wanted = False  # queued for the next write pass
        self._reading = True
        self._send_blocked = False
        self._memory_blocked = False
        self._reserved = 0  # bytes of the server's memory budget this connection holds
        self._bulk: bytes | None = None  # a large frame being decoded on the bulk thread
        self._slow_timer: asyncio.TimerHandle | None = None
        self._eof = False  # the peer closed its side: serve the complete requests read, then close
        self._refusing = False  # a request it cannot serve: answer the ones before it, then close (``refuse``)
        self.last_active = 0.0
        self.refused = False  # closed as soon as made (coordinator.admission)

    # -- asyncio callbacks ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self._transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        refusal = self._server.admission.refusal(transport.get_extra_info("socket").fileno(),
                                                 len(self._server.connections))
        if refusal is not None:  # coordinator.admission: logged there, at most once a minute
            self._runtime.metrics.connection_refused(refusal)
            self.closed = self.refused = True
            self._transport.close()
            return
        self._transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
        self._server.connections.add(self)
        self._runtime.metrics.connection_accepted()
        self.last_active = self._server.loop.time()
        log.debug("%s: connected", self.peer)
        if self._server.stopping:
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.refused:  # closed when made: nothing was set up
            return
        self.closed = True
        self._server.connections.discard(self)
        held = sum(req.holds_gc for req in self._queue)
        self._queue.clear()  # nothing is sent now; what nothing else holds (a shard, the bulk thread) goes first
        gcpause.release(held)
        if self._server.gateway is not None:
            self._server.gateway.closed(self)
        self._watch_large_frame(0)
        self._server.memory.release(self._reserved)
        self._reserved = 0
        if self._reader.buffered:
            log.info("%s: connection ended inside a frame (%d bytes unread)", self.peer, self._reader.buffered)
        else:
            log.debug("%s: disconnected (%s)", self.peer, exc or "closed")

    def data_received(self, data: bytes) -> None:
        if self.closed or self._refusing:
            return
        self.last_active = self._server.loop.time()
        try:
            self._reader.feed(data)
        except FrameError as exc:
            self.refuse(str(exc), "frame")
            return
        self._account()
        if self._reader.has_frame():
            self._server.schedule(self)
        self._update_reading()

    def eof_received(self) -> bool | None:
        """The peer closed its side. Requests it sent before are still served, as Kafka does (a client
        may write a Produce with acks=0 or a commit and close at once), a few per dispatcher pass;
        then the connection closes (``run``). Nothing is read after the end of the stream."""
        if self.idle and not self._reader.has_frame():
            return None  # nothing left to answer: close now
        self._eof = True
        self._server.schedule(self)
        return True

    def pause_writing(self) -> None:
        self._send_blocked = True
        if self._server.gateway is not None:
            self._server.gateway.writable(self, False)
        self._update_reading()

    def resume_writing(self) -> None:
        self._send_blocked = False
        if self._server.gateway is not None:
            self._server.gateway.writable(self, True)
        self._server.schedule(self)
        self._update_reading()

    # -- flow control --------------------------------------------------------------------------

    def _account(self, turn: bool = False) -> None:
        """Large frames (over SMALL_FRAME_BYTES) must hold their declared size in the server's budget
        before they are read, first come first served, and then arrive within a deadline; small frames
        never wait for the budget, so big requests (or a client declaring them and sending nothing)
        cannot keep anyone's small requests from being read."""
        size = None if self._refusing else self._reader.head_size()  # refused: no more frames are read
        head = size + 4 if size is not None and size > SMALL_FRAME_BYTES else 0
        need = head + (len(self._bulk) if self._bulk is not None and len(self._bulk) > SMALL_FRAME_BYTES else 0)
        if need > self._reserved:
            if self._server.memory.reserve(need - self._reserved, self._reserved, turn):
                self._reserved = need
                self._memory_blocked = False
            elif not self._memory_blocked:
                self._memory_blocked = True
                self._server.memory.waiters.append(self)
                log.debug("%s: buffered-bytes budget full: not reading until %d bytes are free", self.peer,
                          need - self._reserved)
        else:
            # It holds all it needs now (its next frame is smaller, or it was refused): no longer waiting,
            # so the queue's next release passes it (memory_turn). And the count goes down before the
            # release, which gives the head of the queue its turn: that may be this connection, which
            # recursed here until RecursionError, hanging it and failing another client's dispatch (a
            # review's find).
            self._memory_blocked = False
            if need < self._reserved:
                freed, self._reserved = self._reserved - need, need
                self._server.memory.release(freed)
        self._watch_large_frame(head if head and not self._memory_blocked and not self._reader.has_frame() else 0)

    def _watch_large_frame(self, size: int) -> None:
        """A large frame being received must be complete by a deadline (a client trickling it would
        otherwise hold its share of the budget for ever)."""
        if size and self._slow_timer is None:
            limit = LARGE_FRAME_BASE_S + size / LARGE_FRAME_MIN_RATE
            self._slow_timer = self._server.loop.call_later(limit, self._too_slow, size, limit)
        elif not size and self._slow_timer is not None:
            self._slow_timer.cancel()
            self._slow_timer = None

    def _too_slow(self, size: int, limit: float) -> None:
        self._slow_timer = None
        self.abort(f"a {size}-byte request did not arrive within {limit:.0f} s", "too_slow")

    def memory_turn(self) -> bool:
        """At the head of the memory queue after a release: True once this connection stops waiting."""
        if self.closed or not self._memory_blocked:
            return True
        self._account(turn=True)
        if self._memory_blocked:
            return False
        self._update_reading()
        return True

    def _can_start(self) -> bool:
        """Not behind a large request (a huge frame, or an answer of thousands of offsets) until its reply
        is written: as a Kafka broker mutes a connection for each request, so a client pipelining large
        fetches without reading holds one such answer, not MAX_IN_FLIGHT of them (80-97 MiB each
        measured for 20 pipelined fetches of a 100k-partition group). Nor behind a JoinGroup or SyncGroup
        waiting for its rebalance: Kafka reads what follows only once it is answered, so a commit or a
        LeaveGroup sent behind it takes effect in the group the rebalance leaves (started at once, a
        previous generation's commit was applied mid-rebalance where Kafka answers ILLEGAL_GENERATION,
        and a leave made the join behind which it waited fail: a conformance sweep's find)."""
        queue = self._queue
        return (not self._send_blocked and self._bulk is None and len(queue) < MAX_IN_FLIGHT
                and not (queue and (queue[-1].large or queue[-1].parked)) and not self.held
                and not self._server.stopping and not self._refusing)

    def _update_reading(self) -> None:
        """Reads unless memory is short or a backlog of complete frames waits for the dispatcher (which
        then also stops when the client does not take its replies: the socket pushes back)."""
        if self._transport is None or self.closed:
            return
        backlog = self._reader.buffered >= READ_BACKLOG_BYTES and self._reader.has_frame()
        read = not (self._memory_blocked or self._server.stopping or backlog or self._refusing)
        if read != self._reading:
            self._reading = read
            if read:
                self._transport.resume_reading()
            else:
                self._transport.pause_reading()

    # -- request handling ----------------------------------------------------------------------

    def run(self, budget: int) -> tuple[int, bool]:
        """Starts up to ``budget`` requests; returns how many, and whether more are waiting."""
        started = 0
        reader = self._reader
        while started < budget and self._can_start() and not self.closed:
            try:
                frame = reader.next_frame()
            except FrameError as exc:
                self.refuse(str(exc), "frame")
                break
            if frame is None:
                break
            started += 1
            self._start(frame)
        if started:
            self._account()
            self._update_reading()
        more = not self.closed and self._can_start() and reader.has_frame()
        self._close_if_finished()
        return started, more

    def _close_if_finished(self) -> None:
        """After the peer closed its side, or a refusal: once every request read is answered (the
        transport sends what was written before it closes). A refused connection whose peer takes none
        of that is dropped after the server's ``refused_linger_s``: it held its descriptor and unsent replies
        for good (a review's find)."""
        if self.idle and (self._refusing or (self._eof and not self._reader.has_frame())):
            if self._refusing and self._transport is not None and not self._transport.is_closing():
                self._server.loop.call_later(self._server.refused_linger_s, self._linger_over)
            self.close()

    def _linger_over(self) -> None:
        if not self.closed:
            log.info("%s: dropping a refused connection whose peer took none of its last replies", self.peer)
            self.kill()

    def _start(self, frame: bytes) -> None:
        try:
            api_key, version, correlation_id = peek_header(frame)
        except HeaderError as exc:
            self.refuse(str(exc), "header")
            return
        gateway = self._server.gateway
        if gateway is not None and gateway.route(self, frame, api_key, version, correlation_id):
            return
        api = APIS.get(api_key)
        if api is None:
            self.refuse(f"unknown api key {api_key}", "unknown_api")
            return
        spec = api.spec
        if not spec.supports(version):
            if api_key == API_VERSIONS:  # KIP-511: any version it does not know, below the range too, as Kafka
                req = Request(self, api, 0, correlation_id)
                req.released = True
                req.data = api_versions_fallback(correlation_id)
                # One label for every version it does not know: a client could make up to 64k series.
                self._runtime.metrics.request(API_VERSIONS, -1, _ERR_UNSUPPORTED_VERSION, 0, 0.0)
                self._queue.append(req)
                self._server.want_write(self)
                return
            self.refuse(f"{spec.name} v{version} is not supported ({spec.min_version}-{spec.max_version})",
                        "unsupported_version")
            return
        req = Request(self, api, version, correlation_id, "", self.peer)
        self._queue.append(req)
        if len(frame) > BULK_FRAME_BYTES:
            req.large = req.holds_gc = True
            gcpause.hold()  # released when the request is dropped, in write_ready or at the end
            self._bulk = frame
            try:
                done = self._server.bulk.submit(decode_and_prepare, self._runtime, api, frame, version)
            except RuntimeError:  # the bulk pool has shut down: the server is stopping
                self.abort("stopping", "stopping")
                return
            on_loop(self._server.loop, done, self._bulk_done, req)
            return
        try:
            req.client_id, body = api.decode(frame, version)
        except DecodeError as bad:  # not ``exc``: compiled, one name holds one type (the HeaderError above)
            self.forget(req)  # its own slot, the last
            self.refuse(f"malformed request: {bad}", "malformed")
            return
        self._run(req, body, api.prepare(self._runtime, body, version) if api.prepare else body)

    def _bulk_done(self, req: Request, done: "concurrent.futures.Future[tuple[str, Any, Any]]") -> None:
        self._bulk = None
        if self.closed:
            return
        self._account()
        if done.cancelled():
            self.abort("stopping", "stopping")
            return
        exc = done.exception()
        if isinstance(exc, DecodeError):
            self.forget(req)  # its own slot, the last: nothing starts behind a bulk one
            self.refuse(f"malformed request: {exc}", "malformed")
            return
        if exc is not None:
            log.error("%s: %s v%d could not be prepared: %r", self.peer, req.api.spec.name, req.version, exc)
            self.abort("request preparation failed", "server_error")
            return
        req.client_id, body, prepared = done.result()
        self._run(req, body, prepared)
        self._server.schedule(self)

    def _run(self, req: Request, body: Any, prepared: Any) -> None:
        api = req.api
        req.body = body
        if self._server.debug:
            log.debug("%s: %s v%d correlation %d client %r", self.peer, api.spec.name, req.version,
                      req.correlation_id, req.client_id)
        req.wait()  # the handler's own: whatever it completes is not sent before its writes are waited on
        try:
            response = api.handle(self._runtime, req, prepared)
        except ShardUnavailable as exc:
            response = api.error_response(body, req.version, exc.error)
        except Exception:
            log.exception("%s: %s v%d handler failed; closing the connection", self.peer, api.spec.name, req.version)
            self.abort("handler error", "server_error")
            return
        if response is not PARKED:
            req.response = response
        else:  # unless the handler's own records completed it already (the last member of a rebalance)
            req.parked = req.response is None
        req.done()

    def enqueue(self, slot: Relayed) -> None:
        """Gateway mode: a reply slot in request order, filled later by ``slot_filled``."""
        self._queue.append(slot)

    def slot_filled(self) -> None:
        self._server.want_write(self)

    def drop_unanswered_relays(self) -> int:
        """At a stop (gateway mode): the replies from the first relayed request still waiting for the
        upstream on are given up, as they must be sent in order; those before it are written, and the
        stop closes the connection with the others (coordinator.server). Returns how many were dropped."""
        queue = self._queue
        first = next((i for i, slot in enumerate(queue) if isinstance(slot, Relayed) and slot.data is None), None)
        if first is None or self.closed:
            return 0
        return self._drop_from(first)

    def hold(self) -> None:
        self.held += 1

    def unhold(self) -> None:
        self.held -= 1
        if not self.held:
            self._server.schedule(self)

    def reply_ready(self, req: Request) -> None:
        """The request's response is final: encode it (off the loop if large), then queue a write."""
        if self.closed:
            return
        if req.large:
            if not req.holds_gc:  # a small request with a large answer (a copy of 150k offsets)
                req.holds_gc = True
                gcpause.hold()
            try:
                done = self._server.bulk.submit(encode_reply, req)
            except RuntimeError:  # the bulk pool has shut down: encode here, it is the last reply anyway
                req.large = False
                self.reply_ready(req)
                return
            on_loop(self._server.loop, done, self._encoded, req)
            return
        try:
            req.data = encode_reply(req)
        except Exception:
            log.exception("%s: %s v%d response could not be encoded", self.peer, req.api.spec.name, req.version)
            self.abort("response encoding failed", "server_error")
            return
        self._replied(req)

    def _replied(self, req: Request) -> None:
        error, items = req.outcome  # not ``*req.outcome``: compiled, that is a call through the interpreter's protocol
        self._runtime.metrics.request(req.api.spec.key, req.version, error, items, time.perf_counter() - req.started)
        self._server.want_write(self)

    def _encoded(self, req: Request, done: "concurrent.futures.Future[bytes]") -> None:
        if self.closed:
            return
        if done.cancelled():
            req.large = False
            self.reply_ready(req)
            return
        if done.exception() is not None:
            log.error("%s: %s response could not be encoded: %r", self.peer, req.api.spec.name, done.exception())
            self.abort("response encoding failed", "server_error")
            return
        req.data = done.result()
        self._replied(req)

    def write_ready(self) -> None:
        """Writes every reply at the head of the queue that is ready, in request order, in one send."""
        self.write_wanted = False
        queue, transport = self._queue, self._transport
        if transport is None or self.closed:
            return
        out, held = [], 0
        while queue and queue[0].data is not None:
            req = queue.popleft()
            out.append(req.data)
            held += req.holds_gc
        if not out:
            return
        if held:
            del req  # the last large request is freed first: the pause ends when nothing of it is left
            gcpause.release(held)
        transport.write(b"".join(out))  # type: ignore[arg-type]
        if self._reader.has_frame() or self._reading is False:
            self._server.schedule(self)
        self._update_reading()
        self._close_if_finished()

    def refuse(self, why: str, reason: AbortReason) -> None:
        """A request it cannot serve (a bad frame or header, an unknown API or version, a malformed
        body): nothing more is read or started, and the connection closes once the replies to the
        requests before it are written. Kafka reads a connection's next request only after answering
        the last, so those replies were sent before it closed; aborting at once threw away the answers
        to commits already applied (a fuzzing campaign's find)."""
        if self.closed:
            return
        if not self._refusing:  # once: a large request refused off the loop may follow a bad frame read since
            log.warning("%s: closing connection: %s", self.peer, why)
            self._runtime.metrics.connection_refused(reason)
            self._refusing = True
            self._account()  # what the budget held for a frame that will not be read
            self._update_reading()
        self._close_if_finished()

    def abort(self, why: str, reason: AbortReason, repeated: Repeated | None = None) -> None:
        """Closes the connection at once; ``reason`` is a fixed word for the refused-connections metric.
        Once only: several of its requests may fail to be answered in one pass (coordinator.request).
        With ``repeated``, logged through it (once, then once in a while) instead of each time: a cause
        outside the connection that every client's retry meets again (gateway mode's upstream away)."""
        if self.closed:
            return
        if repeated is None:
            log.warning("%s: closing connection: %s", self.peer, why)
        else:
            repeated.report(logging.WARNING, "%s: closing connection: %s", self.peer, why)
        self._runtime.metrics.connection_refused(reason)
        self.closed = True
        if self._transport is not None:
            self._transport.abort()

    @property
    def unsent_bytes(self) -> int:
        """Replies written to the transport that the peer has not taken yet."""
        return self._transport.get_write_buffer_size() if self._transport is not None and not self.closed else 0

    @property
    def idle(self) -> bool:
        return not self._queue and self._bulk is None

    def close_if_idle_since(self, deadline: float) -> None:
        if self.idle and self.last_active < deadline and self._transport is not None and not self.closed:
            if self._transport.is_closing():  # closed before, its peer still not taking what was written
                self.kill()
                return
            log.info("%s: closing connection idle for more than %d s", self.peer, MAX_IDLE_S)
            self._transport.close()

    def stop_reading(self) -> None:
        self._update_reading()

    def forget(self, req: Request) -> bool:
        """Drops ``req`` unanswered if it is the last request started on this connection (a stop then
        closes the connection once the replies before it are written); False if others follow it."""
        queue = self._queue
        if self.closed or not queue or queue[-1] is not req:
            return False
        self._drop_from(len(queue) - 1)
        return True

    def _drop_from(self, first: int) -> int:
        """Drops the replies from queue position ``first`` on, unanswered (the collector holds of those
        that took one released), and lets the ones before it be written; returns how many."""
        queue = self._queue
        dropped = len(queue) - first
        released = 0
        for _ in range(dropped):
            slot = queue.pop()
            if isinstance(slot, Request) and slot.holds_gc:
                slot.holds_gc = False
                released += 1
        if released:
            gcpause.release(released)
        self._server.want_write(self)
        return dropped

    def close(self) -> None:
        if self._transport is not None and not self.closed:
            self._transport.close()

    def kill(self) -> None:
        if self._transport is not None:
            self.closed = True
            self._transport.abort()
