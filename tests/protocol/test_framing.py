import struct

import pytest

from protocol.framing import FrameError, FrameReader, frame
from protocol.header import HeaderError, peek_header, response_header


def drain(reader: FrameReader) -> list[bytes]:
    frames = []
    while (f := reader.next_frame()) is not None:
        frames.append(f)
    return frames


def test_frames_split_across_and_within_reads() -> None:
    reader = FrameReader(max_bytes=100)
    data = frame(b"abc") + frame(b"") + frame(b"defgh")
    reader.feed(data[:2])
    assert drain(reader) == [] and not reader.has_frame()
    reader.feed(data[2:13])
    assert reader.has_frame()
    assert drain(reader) == [b"abc", b""]
    assert reader.buffered == 2
    reader.feed(data[13:])
    assert drain(reader) == [b"defgh"]
    assert reader.buffered == 0


@pytest.mark.parametrize("size", [-1, -(2**31), 101, 2**31 - 1])
def test_bad_sizes_are_refused_before_the_payload_arrives(size: int) -> None:
    reader = FrameReader(max_bytes=100)
    with pytest.raises(FrameError):
        reader.feed(struct.pack(">i", size))


def test_a_bad_size_behind_a_good_frame_is_refused_when_reached() -> None:
    reader = FrameReader(max_bytes=100)
    reader.feed(frame(b"ok") + struct.pack(">i", 1000))
    assert reader.next_frame() == b"ok"
    with pytest.raises(FrameError):
        reader.next_frame()


def test_limit_is_inclusive() -> None:
    reader = FrameReader(max_bytes=3)
    reader.feed(frame(b"xyz"))
    assert drain(reader) == [b"xyz"]


def test_needed_reserves_the_whole_declared_frame() -> None:
    reader = FrameReader(max_bytes=1000)
    reader.feed(struct.pack(">i", 500) + b"x" * 10)
    assert reader.needed() == 504
    reader.feed(b"x" * 490)
    assert reader.needed() == 504 and reader.has_frame()


def test_header_peek() -> None:
    req = bytes.fromhex("001200030000000100047465737400076b636f6f726404302e3100")
    assert peek_header(req) == (18, 3, 1)
    with pytest.raises(HeaderError):
        peek_header(req[:7])


def test_response_headers() -> None:
    assert response_header(3, flexible=False) == b"\x00\x00\x00\x03"
    assert response_header(3, flexible=True) == b"\x00\x00\x00\x03\x00"
