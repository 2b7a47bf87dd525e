"""Kafka framing (``int32 size`` + payload), sans-IO.

The size is checked against the limit as soon as its 4 bytes arrive, *before* any buffer for the payload
is grown, so a hostile prefix cannot make the server allocate 2 GiB (Kafka: ``socket.request.max.bytes``).
Frames are taken one at a time, so the caller decides how many to handle per turn.
"""

import struct

DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024
_SIZE = struct.Struct(">i")


class FrameError(Exception):
    """The peer sent a size that no valid request can have; the connection must be closed."""


class FrameReader:
    """Accumulates received bytes and hands out whole request payloads (without the size prefix)."""

    __slots__ = ("_buf", "_max_bytes", "_pos")

    def __init__(self, max_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()
        self._pos = 0
        self._max_bytes = max_bytes

    def feed(self, data: bytes) -> None:
        """Adds ``data``; raises FrameError if the frame now at the head declares an impossible size."""
        self._buf += data
        self._head_size()

    def _head_size(self) -> int | None:
        if len(self._buf) - self._pos < 4:
            return None
        (size,) = _SIZE.unpack_from(self._buf, self._pos)
        if size < 0 or size > self._max_bytes:
            raise FrameError(f"frame size {size} outside [0, {self._max_bytes}]")
        return int(size)

    def next_frame(self) -> bytes | None:
        """The next complete payload, or None until more bytes arrive."""
        size = self._head_size()
        if size is None:
            return None
        start = self._pos + 4
        end = start + size
        if end > len(self._buf):
            return None
        frame = bytes(self._buf[start:end])
        if end == len(self._buf):
            self._buf.clear()
            self._pos = 0
        elif end > 65536 and end > len(self._buf) // 2:
            del self._buf[:end]  # amortised: the copy is at most the size of what was consumed
            self._pos = 0
        else:
            self._pos = end
        return frame

    def has_frame(self) -> bool:
        size = self._head_size()
        return size is not None and self._pos + 4 + size <= len(self._buf)

    @property
    def buffered(self) -> int:
        """Bytes received and not yet handed out (a truncated request at close, if any)."""
        return len(self._buf) - self._pos

    def needed(self) -> int:
        """Bytes this reader will hold before its head frame can be handed out: what is buffered, or the
        head frame's whole declared size if larger. Reserving this much ahead means a frame that is
        allowed to start arriving is also allowed to finish (a memory budget never deadlocks)."""
        size = self._head_size()
        return max(self.buffered, 4 + size if size is not None else 0)


def frame(payload: bytes) -> bytes:
    """Prefixes ``payload`` with its size."""
    return _SIZE.pack(len(payload)) + payload
