"""Kafka framing (``int32 size`` + payload), sans-IO.

The size is checked against the limit *before* any buffer for the payload is grown, so a hostile
4-byte prefix cannot make the server allocate 2 GiB (Kafka: ``socket.request.max.bytes``)."""

import struct

DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024
_SIZE = struct.Struct(">i")


class FrameError(Exception):
    """The peer sent a size that no valid request can have; the connection must be closed."""


class FrameReader:
    """Accumulates received bytes and yields whole request payloads (without the size prefix)."""

    __slots__ = ("_buf", "_max_bytes")

    def __init__(self, max_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()
        self._max_bytes = max_bytes

    def feed(self, data: bytes) -> list[bytes]:
        """Adds ``data`` and returns every frame now complete; raises FrameError on a bad size."""
        buf = self._buf
        buf += data
        frames: list[bytes] = []
        pos = 0
        end = len(buf)
        while end - pos >= 4:
            (size,) = _SIZE.unpack_from(buf, pos)
            if size < 0 or size > self._max_bytes:
                raise FrameError(f"frame size {size} outside [0, {self._max_bytes}]")
            if end - pos - 4 < size:
                break
            frames.append(bytes(buf[pos + 4 : pos + 4 + size]))
            pos += 4 + size
        if pos:
            del buf[:pos]
        return frames

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a complete frame (a truncated request at close)."""
        return len(self._buf)


def frame(payload: bytes) -> bytes:
    """Prefixes ``payload`` with its size."""
    return _SIZE.pack(len(payload)) + payload
