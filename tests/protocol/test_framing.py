import struct
from types import ModuleType
from typing import Any

import pytest

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
