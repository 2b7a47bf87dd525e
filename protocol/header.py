"""Request header peek and response header encoding.

The first eight bytes of every request header (api key, api version, correlation id) have the same
layout in header v0-v2, so they are read before anything else: that is what lets the server answer
a too-new ApiVersions (KIP-511) and route a request without trusting the rest of the frame."""

import struct
from typing import NamedTuple

_PEEK = struct.Struct(">hhi")
_CORRELATION = struct.Struct(">i")


class HeaderError(Exception):
    """The frame is too short to hold a request header."""


class HeaderPeek(NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int


def peek_header(frame: bytes) -> HeaderPeek:
    if len(frame) < _PEEK.size:
        raise HeaderError(f"request of {len(frame)} bytes has no header")
    return HeaderPeek(*_PEEK.unpack_from(frame, 0))


def response_header(correlation_id: int, flexible: bool) -> bytes:
    """Response header v0 (``correlation_id``) or v1 (plus an empty tagged-field section)."""
    head = _CORRELATION.pack(correlation_id)
    return head + b"\x00" if flexible else head
