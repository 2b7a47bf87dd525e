"""FrameReader assembles large frames from a list of chunks: any split of any mix of small and large
frames must give back the same frames, in order, with ``buffered``/``has_frame`` consistent."""

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import protocol.framing as installed
from protocol.framing import CHUNKED_BYTES
from tests.protocol.test_framing import PURE

# both builds of protocol/framing (test_framing.py); a class rather than the fixture, for hypothesis
READERS = pytest.mark.parametrize("reader_class", [installed.FrameReader, PURE.FrameReader],
                                  ids=["installed", "interpreted"])

sizes = st.lists(st.sampled_from([0, 1, 9, 1000, CHUNKED_BYTES, CHUNKED_BYTES + 1, 3 * CHUNKED_BYTES + 7]),
                 min_size=1, max_size=6)


@settings(max_examples=25, deadline=None)
@given(sizes=sizes, cuts=st.lists(st.integers(min_value=1, max_value=300_000), min_size=1, max_size=40),
       include_size=st.booleans(), takes=st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=8))
@READERS
def test_any_split_gives_the_same_frames(reader_class: Any, sizes: list[int], cuts: list[int],
                                         include_size: bool, takes: list[int]) -> None:
    """``takes``: how many frames the caller takes after each read, at most (a connection leaves complete
    frames waiting while it has 16 requests in flight, and reads on: the gateway's load glued a large
    frame's successors onto it, a memory campaign's find)."""
    payloads = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    wire = b"".join(struct.pack(">i", len(f)) + f for f in payloads)
    frames = [struct.pack(">i", len(f)) + f for f in payloads] if include_size else payloads
    reader = reader_class(1 << 24, include_size)
    got: list[bytes] = []
    pos, i = 0, 0
    while pos < len(wire):
        step = cuts[i % len(cuts)]
        i += 1
        reader.feed(wire[pos:pos + step])
        pos += step
        for _ in range(takes[i % len(takes)]):
            if not reader.has_frame():
                break
            frame = reader.next_frame()
            assert frame is not None
            got.append(frame)
        assert reader.buffered == len(wire[:pos]) - sum(len(f) + (0 if include_size else 4) for f in got)
    while reader.has_frame():
        frame = reader.next_frame()
        assert frame is not None
        got.append(frame)
    assert got == frames
    assert reader.buffered == 0


@READERS
def test_frames_read_while_a_large_one_waits_to_be_taken_stay_apart(reader_class: Any) -> None:
    """The case the property above is about, fixed: a complete large frame left waiting while reads go
    on (three frames came back as one of 151,012 bytes)."""
    payloads = [b"a" * 100_000, b"b" * 100_000, b"c" * 1000]
    wire = b"".join(struct.pack(">i", len(f)) + f for f in payloads)
    reader = reader_class(1 << 24)
    for pos in range(0, len(wire), 50_000):  # nothing taken until everything is read
        reader.feed(wire[pos:pos + 50_000])
    got = []
    while reader.has_frame():
        got.append(reader.next_frame())
    assert got == payloads and reader.buffered == 0
