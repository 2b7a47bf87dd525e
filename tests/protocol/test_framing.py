import struct

import pytest

from protocol.framing import FrameError, FrameReader, frame


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


def test_the_head_frames_declared_size_is_known_from_its_first_four_bytes() -> None:
    reader = FrameReader(max_bytes=1000)
    reader.feed(struct.pack(">i", 500)[:3])
    assert reader.head_size() is None
    reader.feed(struct.pack(">i", 500)[3:] + b"x" * 10)
    assert reader.head_size() == 500 and not reader.has_frame()
    reader.feed(b"x" * 490)
    assert reader.has_frame()


def test_queries_never_raise_once_a_bad_size_is_found() -> None:
    reader = FrameReader(max_bytes=100)
    reader.feed(frame(b"ok") + struct.pack(">i", 1000))
    assert reader.next_frame() == b"ok"
    assert reader.head_size() is None and reader.has_frame()  # has_frame: come and get the error
    with pytest.raises(FrameError):
        reader.next_frame()
