"""One request in flight, from its decoding to its reply, and the contract between handlers and shards.

A handler returns the response object. If that response may only be sent later (its records are not
durable yet, it read state a pending write could still take back, or it is a JoinGroup waiting for the
rebalance), something calls ``wait()`` before the handler returns and ``done()`` exactly once later;
the reply leaves when the last wait is done. There is no future or callback per request: a shard keeps
``(request, fixup)`` pairs per batch and releases them all when the batch is durable.
"""

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Protocol

from protocol.errors import ErrorCode
from protocol.registry import ApiSpec

if TYPE_CHECKING:
    from coordinator.connection import Connection
    from coordinator.metrics import AbortReason
    from coordinator.runtime import Runtime

Fixup = Callable[[ErrorCode], None]
log = logging.getLogger(__name__)

# What an API module gives (coordinator/apis says what each is for).
Handler = Callable[["Runtime", "Request", Any], Any]
ErrorResponse = Callable[[Any, int, ErrorCode], Any]
Prepare = Callable[["Runtime", Any, int], Any]
Render = Callable[[Any, int], Any]
Outcome = Callable[[Any], tuple[int, int]]
Encode = Callable[[Any, int, int], bytes]
Decode = Callable[[bytes, int], tuple[str, Any]]


class Api:
    """One served API as coordinator/apis registers it. Here, compiled, rather than a dataclass there:
    the server reads five to eight of its fields for every request, and each read of an interpreted
    object's attribute from compiled code is a lookup by name (~150-250 instructions under callgrind;
    here a field load)."""

    __slots__ = ("decode", "encode", "error_response", "handle", "outcome", "prepare", "render", "spec")

    def __init__(self, spec: ApiSpec, handle: Handler, error_response: ErrorResponse, prepare: Prepare | None,
                 render: Render | None, outcome: Outcome, encode: Encode | None, decode: Decode) -> None:
        self.spec = spec
        self.handle = handle
        self.error_response = error_response
        self.prepare = prepare
        self.render = render
        self.outcome = outcome
        self.encode = encode
        self.decode = decode  # ``(client id, body)`` as the handler takes it: the API's own, else the spec's


class ReplySink(Protocol):
    """Where a request's reply goes: its connection."""

    def reply_ready(self, request: "Request") -> None: ...

    def hold(self) -> None:
        """Start none of this sink's later requests until ``unhold``: an operation applied over several
        loop passes (coordinator.shard's slices, coordinator.apis.slices) must be whole before the same
        client's next request runs, as Kafka runs one connection's requests in order."""
        ...

    def unhold(self) -> None: ...

    def forget(self, request: "Request") -> bool:
        """Drops ``request`` unanswered if no later request of this sink's waits behind it (coordinator.
        groups.membership, at a stop); False if one does."""
        ...

    def abort(self, why: str, reason: "AbortReason") -> None:
        """Close the connection at once (a request of it could not be answered)."""
        ...


class Lazy:
    """A response built only when it is encoded: for a large request that happens on the bulk thread,
    so hundreds of thousands of response objects are not made on the event loop."""

    __slots__ = ("_args", "_build")

    def __init__(self, build: Callable[..., Any], *args: Any) -> None:
        self._build = build
        self._args = args

    def __call__(self) -> Any:
        return self._build(*self._args)


PARKED: Final[Any] = object()  # a handler's return value when its response arrives later through ``complete``


class ShardUnavailable(Exception):
    """The shard of a group cannot serve it now: the API's error response carries ``error``."""

    def __init__(self, error: ErrorCode) -> None:
        super().__init__(error.name)
        self.error = error


class Relayed:
    """A reply slot whose bytes come from elsewhere (gateway mode: an upstream broker's reply, passed on
    unchanged or rewritten); it keeps its place among the connection's replies."""

    __slots__ = ("data",)
    holds_gc = False
    large = False  # never a reason to stop starting requests behind it (coordinator.server)
    parked = False

    def __init__(self) -> None:
        self.data: bytes | None = None


class Gateway(Protocol):
    """Gateway mode (coordinator/gateway), as the server sees it: takes the frames kcoord does not
    answer itself, and hears when a connection closes or can take replies again."""

    def route(self, conn: "Connection", frame: bytes, api_key: int, version: int, correlation_id: int) -> bool:
        """True if the gateway took the frame (it queued a ``Relayed`` slot with ``conn.enqueue``)."""
        ...

    def closed(self, conn: "Connection") -> None: ...

    def writable(self, conn: "Connection", writable: bool) -> None: ...

    @property
    def ready(self) -> bool:
        """An upstream broker has answered once (until then every client connection is closed at its
        ApiVersions request): what ``/readyz`` waits for besides the partitions."""
        ...


class Request:
    __slots__ = ("api", "body", "client_host", "client_id", "correlation_id", "data", "holds_gc", "large",
                 "outcome", "parked", "pending", "released", "response", "sink", "started", "version")

    def __init__(self, sink: ReplySink | None, api: "Api", version: int, correlation_id: int,
                 client_id: str = "", client_host: str = "") -> None:
        self.sink = sink
        self.api = api
        self.version = version
        self.correlation_id = correlation_id
        self.client_id = client_id
        self.client_host = client_host
        self.body: Any = None
        self.response: Any = None
        self.data: bytes | None = None  # the encoded reply, once it may be sent
        self.pending = 0
        self.released = False  # handed to the sink for encoding: happens once
        self.large = False  # a large request: its reply is encoded off the event loop
        self.holds_gc = False  # holds the collector's pause until it is dropped (coordinator/gcpause.py)
        self.parked = False  # waits for a rebalance (JoinGroup, SyncGroup): nothing behind it starts meanwhile
        self.started = time.perf_counter()
        self.outcome = (0, 0)  # (first error code, entries done): set when the reply is encoded

    def wait(self) -> None:
        """The response must also wait for one more ``done()``."""
        self.pending += 1

    def done(self, fixup: Fixup | None = None, error: ErrorCode | None = None) -> None:
        """One wait is over; with ``error`` the part of the response it guarded becomes an error (through
        ``fixup``, or the whole response becomes the API's error response). Never raises: callers
        release many requests in a loop (a durable batch's, a rebalance's members), and a bug in one
        must not leave the others waiting. That request's connection is closed instead, as the server
        does when a handler fails: its client reconnects and retries."""
        try:
            if error is not None:
                if fixup is not None:
                    fixup(error)
                else:
                    self.response = self.api.error_response(self.body, self.version, error)
            self.pending -= 1
            if self.pending == 0 and self.sink is not None and not self.released:
                self.released = True
                self.sink.reply_ready(self)
        except Exception:
            self._abandon()

    def _abandon(self) -> None:
        spec: Any = getattr(self.api, "spec", None)  # untyped: this path must not fail on its own account
        log.exception("%s v%d (correlation id %d) could not be answered; closing its connection",
                      getattr(spec, "name", "a request"), self.version, self.correlation_id)
        self.released = True  # whatever completes it later sends nothing
        if self.sink is not None:
            try:
                self.sink.abort("a reply could not be made", "server_error")
            except Exception:
                log.exception("closing the connection failed")

    def complete(self, response: Any) -> None:
        """Ends a wait by supplying the response itself (a parked JoinGroup or SyncGroup)."""
        self.response = response
        self.parked = False
        self.done()


def encode_reply(req: Request) -> bytes:
    """The framed reply; a Lazy response is built first (on the bulk thread for a large request)."""
    response = req.response
    if isinstance(response, Lazy):
        response = response()
    if req.api.render is not None:
        response = req.api.render(response, req.version)
    req.outcome = req.api.outcome(response)
    if req.api.encode is not None:
        return req.api.encode(response, req.version, req.correlation_id)
    return req.api.spec.encode_response(response, req.version, req.correlation_id)


def decode_and_prepare(runtime: "Runtime", api: "Api", frame: bytes, version: int) -> tuple[str, Any, Any]:
    """Bulk thread: a large request's decoding and its API's state-independent preparation."""
    client_id, body = api.decode(frame, version)
    return client_id, body, api.prepare(runtime, body, version) if api.prepare else body
