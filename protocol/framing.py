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
    """Accumulates received bytes and hands out whole request payloads (without the size prefix).

    A bad size is found as soon as its frame reaches the head of the buffer (on ``feed``, or when the
    frame before it is taken); from then on ``next_frame`` raises FrameError, while ``has_frame`` (True,
    so the caller comes to ``next_frame``) and ``needed`` never raise."""

    __slots__ = ("_buf", "_max_bytes", "_pos", "error")

    def __init__(self, max_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()
        self._pos = 0
        self._max_bytes = max_bytes
        self.error: FrameError | None = None

    def feed(self, data: bytes) -> None:
        """Adds ``data``; raises FrameError if the frame now at the head declares an impossible size."""
        self._buf += data
        self._head_size()
        if self.error is not None:
            raise self.error

    def _head_size(self) -> int | None:
        if self.error is not None or len(self._buf) - self._pos < 4:
            return None
        (size,) = _SIZE.unpack_from(self._buf, self._pos)
        if size < 0 or size > self._max_bytes:
            self.error = FrameError(f"frame size {size} outside [0, {self._max_bytes}]")
            return None
        return int(size)

    def next_frame(self) -> bytes | None:
        """The next complete payload, or None until more bytes arrive."""
        size = self._head_size()
        if self.error is not None:
            raise self.error
        if size is None:
            return None
        start = self._pos + 4
        end = start + size
        if end > len(self._buf):
            return None
        with memoryview(self._buf) as view:  # one copy (slicing the bytearray itself would make two)
            frame = bytes(view[start:end])
        if end == len(self._buf):
            self._buf.clear()
            self._pos = 0
        elif end > 65536 and end > len(self._buf) // 2:
            del self._buf[:end]  # amortised: the copy is at most the size of what was consumed
            self._pos = 0
        else:
            self._pos = end
        self._head_size()  # a bad size behind this frame is an error from now on
        return frame

    def has_frame(self) -> bool:
        """A frame can be taken, or an error is waiting to be raised by ``next_frame``."""
        size = self._head_size()
        if self.error is not None:
            return True
        return size is not None and self._pos + 4 + size <= len(self._buf)

    @property
    def buffered(self) -> int:
        """Bytes received and not yet handed out (a truncated request at close, if any)."""
        return len(self._buf) - self._pos

    def head_size(self) -> int | None:
        """The declared size of the frame at the head, once its 4 bytes are in (None before, or if bad)."""
        return self._head_size()


def frame(payload: bytes) -> bytes:
    """Prefixes ``payload`` with its size."""
    return _SIZE.pack(len(payload)) + payload
