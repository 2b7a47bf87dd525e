import struct

import pytest

from protocol.framing import FrameError, FrameReader, frame
from protocol.header import HeaderError, peek_header, response_header


def test_frames_split_across_and_within_reads() -> None:
    reader = FrameReader(max_bytes=100)
    data = frame(b"abc") + frame(b"") + frame(b"defgh")
    assert reader.feed(data[:2]) == []
    assert reader.feed(data[2:13]) == [b"abc", b""]
    assert reader.buffered == 2
    assert reader.feed(data[13:]) == [b"defgh"]
    assert reader.buffered == 0


@pytest.mark.parametrize("size", [-1, -(2**31), 101, 2**31 - 1])
def test_bad_sizes_are_refused_before_the_payload_arrives(size: int) -> None:
    reader = FrameReader(max_bytes=100)
    with pytest.raises(FrameError):
        reader.feed(struct.pack(">i", size))


def test_limit_is_inclusive() -> None:
    assert FrameReader(max_bytes=3).feed(frame(b"xyz")) == [b"xyz"]


def test_header_peek() -> None:
    req = bytes.fromhex("001200030000000100047465737400076b636f6f726404302e3100")
    assert peek_header(req) == (18, 3, 1)
    with pytest.raises(HeaderError):
        peek_header(req[:7])


def test_response_headers() -> None:
    assert response_header(3, flexible=False) == b"\x00\x00\x00\x03"
    assert response_header(3, flexible=True) == b"\x00\x00\x00\x03\x00"
