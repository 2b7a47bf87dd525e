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
       include_size=st.booleans())
@READERS
def test_any_split_gives_the_same_frames(reader_class: Any, sizes: list[int], cuts: list[int],
                                         include_size: bool) -> None:
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
        while reader.has_frame():
            frame = reader.next_frame()
            assert frame is not None
            got.append(frame)
        assert reader.buffered == len(wire[:pos]) - sum(len(f) + (0 if include_size else 4) for f in got)
    assert got == frames
    assert reader.buffered == 0
