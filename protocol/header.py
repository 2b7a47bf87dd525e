"""Request header peek and response header encoding.

The first eight bytes of every request header (api key, api version, correlation id) have the same
layout in header v0-v2, so they are read before anything else: that is what lets the server answer
a too-new ApiVersions (KIP-511) and route a request without trusting the rest of the frame.

Compiled with mypyc where the install can (setup.py): it then takes ``bytes`` only, not a bytearray
or memoryview (interpreted it would take any buffer).
"""

import struct
from typing import Final

_PEEK: Final = struct.Struct(">hhi")
_CORRELATION: Final = struct.Struct(">i")


class HeaderError(Exception):
    """The frame is too short to hold a request header."""


def peek_header(frame: bytes) -> tuple[int, int, int]:
    """``(api_key, api_version, correlation_id)``: a plain tuple, as every request pays for it."""
    if len(frame) < 8:
        raise HeaderError(f"request of {len(frame)} bytes has no header")
    peeked: tuple[int, int, int] = _PEEK.unpack_from(frame, 0)
    return peeked


def response_header(correlation_id: int, flexible: bool) -> bytes:
    """Response header v0 (``correlation_id``) or v1 (plus an empty tagged-field section)."""
    head = _CORRELATION.pack(correlation_id)
    return head + b"\x00" if flexible else head
