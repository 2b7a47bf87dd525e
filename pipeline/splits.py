"""Planning the read: segments cut into byte ranges at batch boundaries, ranges packed into tasks.

A segment larger than the split size is walked once, header to header (8-byte base offset, 4-byte length,
then the magic byte at 16; no decoding), to find batch boundaries about every ``split_bytes``. Each range
then holds whole batches: those starting in ``[start, end)``. A length or magic that makes no sense ends
the walk: the rest of the segment becomes one range, and its decoder reports the damage with its position.
Ranges are packed into tasks largest first onto the least loaded task, as Spark packs small files.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.layout import SegmentFile
from storage.batch import BATCH_HEADER_BYTES, LOG_OVERHEAD, MAGIC, read_head

MAGIC_POSITION = 16
WALK_CHUNK_BYTES = 8 << 20
MIN_SPLIT_BYTES = 4 << 20
MAX_SPLIT_BYTES = 128 << 20


@dataclass(frozen=True, slots=True)
class Split:
    """The batches of ``segment`` that start in ``[start, end)``. ``expected``: the offset the log had got
    to before ``start``, when a read before this one found it (``reader.LogRead.cut_read``); -1 if unknown."""

    segment: SegmentFile
    start: int
    end: int
    expected: int = -1

    @property
    def size(self) -> int:
        return self.end - self.start


def split_bytes_for(total_bytes: int, parallelism: int) -> int:
    """Spark's rule for files: a core's share of the input, within [4 MiB, 128 MiB]."""
    return min(MAX_SPLIT_BYTES, max(MIN_SPLIT_BYTES, total_bytes // max(parallelism, 1)))


def batch_boundaries(read: Callable[[int, int], bytes], size: int, split_bytes: int) -> list[int]:
    """Start positions of ranges of about ``split_bytes`` (the first is 0), found by walking batch
    headers through ``read(start, length)``."""
    cuts = [0]
    chunk, chunk_start = b"", 0
    pos, next_cut = 0, split_bytes
    while size - pos >= BATCH_HEADER_BYTES:
        if pos + MAGIC_POSITION + 1 > chunk_start + len(chunk):
            chunk, chunk_start = read(pos, min(WALK_CHUNK_BYTES, size - pos)), pos
        rel = pos - chunk_start
        _, batch_size = read_head(chunk, rel)
        if batch_size < BATCH_HEADER_BYTES or chunk[rel + MAGIC_POSITION] != MAGIC or pos + batch_size > size:
            break
        pos += batch_size
        if pos >= next_cut and size - pos >= LOG_OVERHEAD:
            cuts.append(pos)
            next_cut = pos + split_bytes
    return cuts


def ranges(segment: SegmentFile, cuts: list[int]) -> list[Split]:
    ends = [*cuts[1:], segment.size]
    return [Split(segment, start, end) for start, end in zip(cuts, ends, strict=True)]


def pack(splits: list[Split], split_bytes: int, parallelism: int) -> list[list[Split]]:
    """Splits grouped into tasks: at least one task per ``split_bytes`` of input and two per core (when
    there are that many splits), largest first onto the least loaded; each task reads in log order."""
    if not splits:
        return []
    total = sum(s.size for s in splits)
    tasks = min(len(splits), max(2 * parallelism, math.ceil(total / max(split_bytes, 1))))
    bins: list[list[Split]] = [[] for _ in range(tasks)]
    loads = [0] * tasks
    for split in sorted(splits, key=lambda s: -s.size):
        i = loads.index(min(loads))
        bins[i].append(split)
        loads[i] += split.size + 1  # +1: empty segments spread too
    for b in bins:
        b.sort(key=lambda s: (s.segment.log_partition, s.segment.base_offset, s.start))
    return [b for b in bins if b]
