import struct
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import protocol.framing as installed
from protocol.framing import frame
from tests.interpreted import assert_compiled, build, interpreted

# Every test runs against the module the install compiled (setup.py) and against its source.
PURE = interpreted(installed)


@pytest.fixture(params=["compiled", "interpreted"])
def framing(request: pytest.FixtureRequest) -> ModuleType:
    return build(request.param, installed, PURE)


def test_compiled_when_the_machine_can_compile() -> None:
    assert_compiled(installed, PURE)


def drain(reader: Any) -> list[bytes]:
    frames = []
    while (f := reader.next_frame()) is not None:
        frames.append(f)
    return frames


def test_frames_split_across_and_within_reads(framing: ModuleType) -> None:
    reader = framing.FrameReader(max_bytes=100)
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
def test_bad_sizes_are_refused_before_the_payload_arrives(framing: ModuleType, size: int) -> None:
    reader = framing.FrameReader(max_bytes=100)
    with pytest.raises(framing.FrameError):
        reader.feed(struct.pack(">i", size))


def test_a_bad_size_behind_a_good_frame_is_refused_when_reached(framing: ModuleType) -> None:
    reader = framing.FrameReader(max_bytes=100)
    reader.feed(frame(b"ok") + struct.pack(">i", 1000))
    assert reader.next_frame() == b"ok"
    with pytest.raises(framing.FrameError):
        reader.next_frame()


def test_limit_is_inclusive(framing: ModuleType) -> None:
    reader = framing.FrameReader(max_bytes=3)
    reader.feed(frame(b"xyz"))
    assert drain(reader) == [b"xyz"]


def test_the_head_frames_declared_size_is_known_from_its_first_four_bytes(framing: ModuleType) -> None:
    reader = framing.FrameReader(max_bytes=1000)
    reader.feed(struct.pack(">i", 500)[:3])
    assert reader.head_size() is None
    reader.feed(struct.pack(">i", 500)[3:] + b"x" * 10)
    assert reader.head_size() == 500 and not reader.has_frame()
    reader.feed(b"x" * 490)
    assert reader.has_frame()


def test_queries_never_raise_once_a_bad_size_is_found(framing: ModuleType) -> None:
    reader = framing.FrameReader(max_bytes=100)
    reader.feed(frame(b"ok") + struct.pack(">i", 1000))
    assert reader.next_frame() == b"ok"
    assert reader.head_size() is None and reader.has_frame()  # has_frame: come and get the error
    with pytest.raises(framing.FrameError):
        reader.next_frame()


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.sampled_from([0, 1, 5, 3000, 40_000, 70_000]), min_size=1, max_size=12),
       cuts=st.lists(st.integers(1, 90_000), max_size=20), takes=st.lists(st.integers(0, 3), max_size=20))
def test_any_split_and_any_pace_of_taking_gives_back_the_frames_sent(sizes: list[int], cuts: list[int],
                                                                      takes: list[int]) -> None:
    """Frames of every kind (empty, small, over CHUNKED_BYTES) in arbitrary reads, taken a few at a time
    between reads, come out as sent: the head's size, read once per frame and kept, is never a stale
    one after the buffer's bytes move (cleared, compacted, or handed to chunk assembly)."""
    for framing in (installed, PURE):
        reader = framing.FrameReader(max_bytes=100_000)
        sent = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
        data = b"".join(frame(f) for f in sent)
        got: list[bytes] = []
        pos = 0
        for i, cut in enumerate([*cuts, len(data)]):
            reader.feed(data[pos:pos + cut])
            pos += cut
            for _ in range(takes[i] if i < len(takes) else 0):
                reader.head_size()
                if reader.has_frame():
                    got.append(reader.next_frame())
            if pos >= len(data):
                break
        got += drain(reader)
        assert got == sent and reader.buffered == 0


def test_a_frame_behind_a_large_one_read_together_keeps_its_own_size(framing: ModuleType) -> None:
    """Taking a frame of over 64 KiB from a buffer holding more compacts the buffer (its bytes move to
    the front): the next frame's size is read again, not the one kept for the large frame there."""
    reader = framing.FrameReader(max_bytes=100_000)
    large = b"x" * 70_000
    reader.feed(frame(large) + frame(b"abc") + frame(b"de")[:3])
    assert reader.next_frame() == large
    assert reader.head_size() == 3 and reader.next_frame() == b"abc"
    reader.feed(frame(b"de")[3:])
    assert drain(reader) == [b"de"] and reader.buffered == 0
