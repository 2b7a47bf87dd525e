"""Connections to upstream brokers.

One ``UpstreamLink`` per (client connection, upstream broker): the client's frames go out unchanged, in
order, with the client's own correlation ids, and the broker answers in order on that connection, so a
FIFO of reply callbacks is all the matching needed (no id rewriting, no shared state between clients).
Each reply's correlation id is still checked against the request it is handed to: some Kafka-compatible
brokers (Tansu, librdkafka's mock cluster) answer a Produce with acks=0, which Kafka never does; such a
reply is dropped, and any other reply that does not match fails the link rather than answer the wrong
request.
Replies are handed on as whole frames *including* their size prefix, copied once out of the receive
buffer, so a pass-through reply is written to the client without being re-framed.

Flow control both ways: the link tells its owner when its send buffer is over the high-water mark (the
owner stops reading requests from its client), and can be paused while the client does not take replies
(the upstream socket then pushes back on the broker).
"""

import asyncio
import contextlib
import errno
import logging
import socket
import struct
from collections import deque
from collections.abc import Callable
from typing import cast

from coordinator.logfmt import Repeated
from protocol.framing import FrameError, FrameReader

log = logging.getLogger(__name__)
_LINK_FAILURES = Repeated(log, 60.0)  # reset when a discovery round reaches the upstream again (cluster.py)
# Client connections closed for the upstream's sake (coordinator.gateway.relay): a link of theirs failed, or
# no upstream broker has answered yet. Each is counted (kcoord_connections_aborted_total{reason="upstream"});
# logged each, they were 80-100 lines a second from five clients retrying their bootstrap (a fault campaign).
CLIENT_CLOSES = Repeated(log, 60.0)


def upstream_reached_again() -> None:
    """The next link failure, and the next client connection closed for the upstream, are logged at once:
    the upstream answered discovery after failing it. (Not reset per link connected: a stalled upstream
    accepts every link before it fails.)"""
    _LINK_FAILURES.reset()
    CLIENT_CLOSES.reset()

_INT32 = struct.Struct(">i")  # a frame's size prefix; a header's correlation id
MAX_UNANSWERED_IDS = 1024  # acks=0 requests remembered per link, in case the broker answers them
MAX_REPLY_BYTES = 1 << 30  # a Fetch reply is bounded by the client's fetch.max.bytes; this only refuses nonsense
WRITE_BUFFER_HIGH = 1024 * 1024
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024

Reply = Callable[[bytes], None]
Fallback = Callable[[], None]  # a request's own answer when its link fails (else the client's connection closes)


class Waiting:
    """A request sent on a link, waiting for its reply. ``abandon`` leaves it to someone else: its reply,
    when it comes, is dropped, and a failure of the link no longer concerns it. ``due``: when the broker
    would answer it at the earliest without being slow (the timeout counts from then)."""

    __slots__ = ("abandoned", "correlation", "due", "on_fail", "on_reply", "seq")

    def __init__(self, on_reply: Reply, on_fail: Fallback | None, due: float, correlation: int, seq: int) -> None:
        self.on_reply = on_reply
        self.on_fail = on_fail
        self.due = due
        self.correlation = correlation
        self.seq = seq  # its place among the frames sent on the link
        self.abandoned = False

    def abandon(self) -> None:
        self.abandoned = True


class LinkOwner:
    """What a link reports to: its client connection's side in the gateway (or nothing, for probes)."""

    def link_blocked(self, blocked: bool) -> None:
        pass

    def link_failed(self, link: "UpstreamLink", why: str, outstanding: int) -> None:
        pass


class UpstreamLink(asyncio.Protocol):
    """A connection to one upstream broker; ``send`` may be called before it is connected."""

    def __init__(self, addr: tuple[str, int], owner: LinkOwner, timeout_s: float, node: int = -1,
                 highest_fd: int | None = None) -> None:
        self.addr = addr
        # A client's link may not take a descriptor past this one (coordinator.admission: the rest are
        # the logs'); None for the gateway's own discovery links, which it cannot do without.
        self.highest_fd = highest_fd
        self.node = node
        self.owner = owner
        self.timeout_s = timeout_s
        self.failed: str | None = None
        self._pending: deque[Waiting] = deque()
        self._out: list[bytes] = []  # frames sent before the connection is up
        self._reader = FrameReader(MAX_REPLY_BYTES, include_size=True)  # large ones assembled from chunks
        self._transport: asyncio.Transport | None = None
        self._paused = False
        self._blocked = False
        self._probe: asyncio.Future[bytes] | None = None
        self._closing = False  # its owner closed it: deliver what was sent, then close
        self._sent = 0  # frames sent (or queued) on the link, in order
        # The latest request the broker does not answer (Produce with acks=0), by its place in ``_sent``
        # (0: none since a reply showed the broker had got past it), and when it was sent. Kafka closes the
        # connection to say such a request failed (a partition it no longer leads, say), so when the broker
        # closes it or cannot be reached with one still unconfirmed, the client's connection closes too
        # (``fail``). A broker works through a connection's requests in order: the reply to a request sent
        # after it (or to itself, from a broker that answers acks=0) confirms it.
        self._unanswered_seq = 0
        self._unanswered_at = 0.0
        # correlation ids of the latest requests sent unanswered (acks=0), oldest first, with their places:
        # a broker that answers them anyway has its replies dropped (bounded: Kafka never answers, so most stay)
        self._unanswered_ids: dict[int, int] = {}
        self._loop = asyncio.get_running_loop()
        self._connect = self._loop.create_task(self._open())

    async def _open(self) -> None:
        try:
            await asyncio.wait_for(self._loop.create_connection(lambda: self, *self.addr), self.timeout_s)
        except (TimeoutError, OSError) as exc:
            if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):  # ours, not the broker's
                self.fail(f"no file descriptor for a link to upstream {self.addr[0]}:{self.addr[1]}: {exc!r}")
            else:
                self.fail(f"cannot connect to upstream {self.addr[0]}:{self.addr[1]}: {exc!r}", lost=True)

    # -- asyncio callbacks ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        if self.failed is not None:
            self._transport.abort()
            return
        sock = self._transport.get_extra_info("socket")
        if self.highest_fd is not None and sock is not None and sock.fileno() > self.highest_fd:
            # Checked when connected: a link opens on a client's first relayed request, long after the
            # client's own connection was admitted, and each client may open one per broker.
            self.fail(f"no file descriptor to spare for a link to upstream {self.addr[0]}:{self.addr[1]} "
                      f"(descriptor {sock.fileno()} is past {self.highest_fd}: the rest are kept for the logs)")
            return
        self._transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
        if sock is not None:  # a relayed Produce request of ~1 MB goes to the kernel in one write
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
        if self._paused:
            self._transport.pause_reading()
        if self._out:
            self._transport.writelines(self._out)
            self._out = []
        if self._closing:
            self.failed = "closed"
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        if not reader.buffered and len(data) >= 4 and _INT32.unpack_from(data)[0] + 4 == len(data):
            self._deliver(data)  # exactly one reply, the common case for small ones: no copy
            return
        try:
            reader.feed(data)
            while self.failed is None and (reply := reader.next_frame()) is not None:
                self._deliver(reply)
        except FrameError as exc:
            self.fail(f"upstream {self.addr[0]}:{self.addr[1]} sent a bad frame: {exc}")

    def _deliver(self, reply: bytes) -> None:
        if self.failed is not None or self._closing:
            return
        if len(reply) < 8:
            self.fail(f"upstream {self.addr[0]}:{self.addr[1]} sent a reply of {len(reply) - 4} bytes, no header")
            return
        correlation = _INT32.unpack_from(reply, 4)[0]  # after the size prefix
        if not self._pending or self._pending[0].correlation != correlation:
            seq = self._unanswered_ids.pop(correlation, None)
            if seq is not None:  # an answer to a Produce with acks=0, which Kafka does not send: dropped
                self._confirmed(seq)
                return
            what = "nobody asked for" if not self._pending else "for another request than the next one sent"
            self.fail(f"upstream {self.addr[0]}:{self.addr[1]} sent a reply {what} (correlation id {correlation})")
            return
        waiting = self._pending.popleft()
        if self._unanswered_seq:
            self._confirmed(waiting.seq)
        if not waiting.abandoned:
            waiting.on_reply(reply)

    def _confirmed(self, seq: int) -> None:
        """The broker answered the request sent ``seq``-th: it got past every acks=0 request before it."""
        if seq >= self._unanswered_seq:
            self._unanswered_seq = 0

    def connection_lost(self, exc: Exception | None) -> None:
        if self.failed is None:
            why = f"upstream {self.addr[0]}:{self.addr[1]} closed the connection"
            self.fail(why + (f" ({exc})" if exc else ""), lost=True)

    def pause_writing(self) -> None:
        self._set_blocked(True)

    def resume_writing(self) -> None:
        self._set_blocked(False)

    # -- use -----------------------------------------------------------------------------------

    def send(self, frame: bytes, on_reply: Reply, on_fail: Fallback | None = None, holds_s: float = 0.0) -> Waiting:
        """Sends a request frame (without its size prefix); ``on_reply`` gets the framed reply, or
        ``on_fail`` is called if the link fails first. ``holds_s``: how long the broker may hold it by
        design (a Fetch's max wait, a long poll), not counted against the timeout; nor is it for the
        requests behind it, which a broker takes up only once it has answered."""
        if self.failed is not None:
            raise FrameError(self.failed)
        self._sent += 1
        now = self._loop.time()
        due = (max(now, self._pending[-1].due) if self._pending else now) + holds_s
        waiting = Waiting(on_reply, on_fail, due, _INT32.unpack_from(frame, 4)[0], self._sent)
        self._pending.append(waiting)
        head = _INT32.pack(len(frame))
        if self._transport is None:
            self._out += (head, frame)
        else:
            self._transport.writelines((head, frame))
        return waiting

    def send_only(self, frame: bytes) -> None:
        """A request the broker does not answer (Produce with acks=0): nothing is waited for."""
        if self.failed is not None:
            raise FrameError(self.failed)
        self._sent += 1
        self._unanswered_seq = self._sent
        self._unanswered_at = self._loop.time()
        ids = self._unanswered_ids
        ids[_INT32.unpack_from(frame, 4)[0]] = self._sent
        if len(ids) > MAX_UNANSWERED_IDS:
            del ids[next(iter(ids))]
        head = _INT32.pack(len(frame))
        if self._transport is None:
            self._out += (head, frame)
        else:
            self._transport.writelines((head, frame))

    def request(self, frame: bytes) -> "asyncio.Future[bytes]":
        """``send`` for callers that await the reply (discovery); fails with ConnectionError."""
        future: asyncio.Future[bytes] = self._loop.create_future()

        def got(reply: bytes) -> None:
            if not future.done():
                future.set_result(reply)

        self.send(frame, got)
        self._probe = future
        return future

    def pause(self, paused: bool) -> None:
        """Stops (or resumes) reading replies: the client is not taking them."""
        self._paused = paused
        if self._transport is not None and self.failed is None:
            if paused:
                self._transport.pause_reading()
            else:
                self._transport.resume_reading()

    def overdue(self, now: float) -> bool:
        """True if the oldest reply waited for is later than the timeout past when it was due (or the link
        is still connecting after it), abandoned or not: checked by the gateway's sweeper, not by a timer
        per request."""
        return bool(self._pending) and now - self._pending[0].due > self.timeout_s

    @property
    def connected(self) -> bool:
        return self._transport is not None and self.failed is None

    @property
    def waiting(self) -> int:
        return len(self._pending)

    def _set_blocked(self, blocked: bool) -> None:
        if blocked != self._blocked:
            self._blocked = blocked
            self.owner.link_blocked(blocked)

    def fail(self, why: str, lost: bool = False) -> None:
        """Ends the link: the owner is told once, with the number of replies the client will now never get
        (its connection is then closed; clients retry). ``lost``: the broker closed the connection or
        could not be reached, which a request it does not answer (acks=0) counts among those while it is
        unconfirmed (no reply to it or to a later request yet) and was sent within the timeout: with
        Kafka the client's own connection would have closed, its way of learning that such a request
        failed (it then refreshes its metadata and finds the partition's new leader). A broker closes the
        connection as it handles the request that failed; one that closes a link idle since (Kafka's
        connections.max.idle.ms, 10 minutes by default) leaves nothing waiting, and the next request opens
        a new link, as after an idle link's close."""
        if self.failed is not None:
            return
        self.failed = why
        self._connect.cancel()
        if self._transport is not None:
            self._transport.abort()
        self._set_blocked(False)
        if self._probe is not None and not self._probe.done():
            self._probe.set_exception(ConnectionError(why))
        pending = list(self._pending)
        self._pending.clear()
        if pending and why != "closed":
            # once, then once a minute while links keep failing: with the upstream down, every client's
            # retry fails a link (a campaign counted ~1,000 such lines a second)
            _LINK_FAILURES.report(logging.INFO, "%s (%d replies outstanding)", why, len(pending))
        unconfirmed = self._unanswered_seq and self._loop.time() - self._unanswered_at <= self.timeout_s
        outstanding = 1 if lost and unconfirmed else 0
        for waiting in pending:
            if waiting.abandoned:
                continue
            if waiting.on_fail is None:
                outstanding += 1
            else:
                waiting.on_fail()
        self.owner.link_failed(self, why, outstanding)
        # Nothing more to tell or send: the failed link lets go of its owner (the client's connection, by
        # way of its ClientLinks) and of frames never sent. A connect that failed leaves the link in a
        # reference cycle with the event loop's exception, its traceback and frames (the connect's,
        # ``_open``'s: ``self``), which only a full collection frees, rare in kcoord: each client
        # connection closed because its broker refused the link stayed in memory with its buffers.
        self.owner = LinkOwner()
        self._out = []

    def close(self) -> None:
        """Closed by its owner (the client left): nobody is told, replies are dropped, but what the
        client sent is still delivered first (a Produce with acks=0 just before it closed, as a broker
        would have received it)."""
        self.owner = LinkOwner()
        self._pending.clear()
        if self.failed is not None:
            return
        self._closing = True
        if self._transport is not None:  # else connection_made writes what waits, then closes
            self.failed = "closed"
            self._transport.close()  # after the send buffer is flushed
