"""One module per Kafka API, named by key (``k08_offset_commit.py``), each opening with a docstring of
what every version adds. A module registers its API once, ``SPEC = register(key, name, min, max)``
(which builds its codecs, protocol.registry), and marks its handler ``@handles(SPEC, ...)``; ApiVersions,
the server's version check and dispatch all come from that one registration. Adding an API is one
new file.

A handler gets the runtime, the ``Request`` (header facts, reply slot) and the decoded body (or what the
API's ``prepare`` made of it) and returns the response. ``error_response`` is Kafka's
``getErrorResponse``: the whole request answered with one error (a shard that is loading or failed).
``prepare(runtime, body, version)`` is an optional function of the body alone (it must not read shard
state); for a large request the server runs it off the event loop together with decoding, so one huge
request does not hold up every other client. ``render(result, version)`` is for APIs whose handlers and
group operations produce version-independent results (a parked JoinGroup is answered by whatever
completes the rebalance): it makes the wire response when the reply is encoded.

``outcome(response)`` says what a reply did, for metrics: its first non-zero error code, and how many
of its innermost entries that carry an error code (partitions committed or fetched, groups deleted)
succeeded under parents that did too. The generic walker costs ~3 us; the hot APIs give their own,
over the tuples they answer with.
``encode(response, version, correlation_id)`` is for an API whose responses are not the generated
message objects (OffsetCommit and OffsetFetch answer with plain tuples): it makes the framed reply.
``decode(frame, version)``, likewise, is for an API whose handler takes something other than the
generated request object (OffsetCommit takes a ``CommitRequest``): ``(client id, body)`` of the whole
frame, DecodeError if malformed; ``error_response`` and ``prepare`` get that body too.
"""

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

from coordinator.request import Api, Decode, Encode, ErrorResponse, Handler, Outcome, Prepare, Render
from protocol.codec import Message
from protocol.registry import ApiSpec

__all__ = ["APIS", "Api", "handles", "load_all", "outcome"]


def outcome(msg: Any) -> tuple[int, int]:
    """(first non-zero ``error_code`` found depth first, entries without children that succeeded)."""
    code = getattr(msg, "error_code", 0)
    if code:
        return code, 0
    first, ok, nested = 0, 0, False
    for name in msg._fields:
        value = getattr(msg, name)
        if value and type(value) is list and isinstance(value[0], Message):
            nested = True
            for item in value:
                error, n = outcome(item)
                ok += n
                if error and not first:
                    first = error
    if not nested and hasattr(msg, "error_code"):
        return 0, 1
    return first, ok


APIS: dict[int, Api] = {}


def handles(spec: ApiSpec, *, error_response: ErrorResponse, prepare: Prepare | None = None,
            render: Render | None = None, outcome: Outcome = outcome,
            encode: Encode | None = None, decode: Decode | None = None) -> Callable[[Handler], Handler]:
    def register_handler(fn: Handler) -> Handler:
        APIS[spec.key] = Api(spec, fn, error_response, prepare, render, outcome, encode, decode or spec.decode_request)
        return fn

    return register_handler


def load_all() -> dict[int, Api]:
    """Imports every ``kNN_*`` module of this package (each registers itself) and returns the table."""
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("k"):
            importlib.import_module(f"{__name__}.{info.name}")
    return APIS
