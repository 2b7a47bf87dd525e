"""Split planning without Spark: cuts fall on batch boundaries, ranges cover each segment once, damage
ends the walk, and tasks are balanced."""

import itertools
import random
from pathlib import Path

from pipeline.decode import Damage, walk
from pipeline.layout import LocalFiles, SegmentFile
from pipeline.splits import Split, batch_boundaries, pack, ranges, split_bytes_for
from tests.pipeline.logs import commit, plain_batches, write_partition


def segment(tmp_path: Path, batches: int = 200, seed: int = 7) -> tuple[SegmentFile, list[int]]:
    rnd = random.Random(seed)
    entries = [[commit(f"g{rnd.randrange(20)}", "t", p, i, "x" * rnd.randrange(40)) for p in range(rnd.randint(1, 9))]
               for i in range(batches)]
    positions = write_partition(tmp_path / "__consumer_offsets-0", plain_batches(entries))
    path = tmp_path / "__consumer_offsets-0" / "00000000000000000000.log"
    size = path.stat().st_size
    return SegmentFile(str(path), 0, 0, size, True, size), positions



def test_cuts_are_batch_starts_and_ranges_cover_the_segment_once(tmp_path: Path) -> None:
    seg, positions = segment(tmp_path)
    files = LocalFiles()
    cuts = batch_boundaries(lambda s, n: files.read(seg.path, s, n), seg.size, 2000)
    assert cuts[0] == 0 and len(cuts) > 5
    assert set(cuts) <= set(positions) and cuts == sorted(cuts)
    splits = ranges(seg, cuts)
    assert splits[-1].end == seg.size and all(a.end == b.start for a, b in itertools.pairwise(splits))
    read = [item[0] for s in splits for item in walk(s, files) if not isinstance(item, Damage)]
    assert read == positions  # every batch exactly once, in order


def test_a_walk_in_small_chunks_finds_the_same_cuts(tmp_path: Path) -> None:
    import pipeline.splits as splits_module

    seg, _ = segment(tmp_path)
    files = LocalFiles()
    expected = batch_boundaries(lambda s, n: files.read(seg.path, s, n), seg.size, 3000)
    old = splits_module.WALK_CHUNK_BYTES
    splits_module.WALK_CHUNK_BYTES = 100  # headers straddle chunk ends
    try:
        assert batch_boundaries(lambda s, n: files.read(seg.path, s, n), seg.size, 3000) == expected
    finally:
        splits_module.WALK_CHUNK_BYTES = old


def test_a_damaged_length_ends_the_walk_and_the_last_range_reports_it(tmp_path: Path) -> None:
    seg, positions = segment(tmp_path)
    bad = positions[120]
    with open(seg.path, "r+b") as f:
        f.seek(bad + 8)
        f.write((5).to_bytes(4, "big"))  # a batch length no batch can have
    files = LocalFiles()
    cuts = batch_boundaries(lambda s, n: files.read(seg.path, s, n), seg.size, 2000)
    assert max(cuts) < bad
    splits = ranges(seg, cuts)
    damages = [item for s in splits for item in walk(s, files) if isinstance(item, Damage)]
    assert [(d.position, d.torn_tail) for d in damages] == [(bad, False)]
    assert "length" in damages[0].reason


def test_pack_balances_and_keeps_log_order_within_a_task() -> None:
    segs = [SegmentFile(f"/p{i}", i, 0, size, True, 0) for i, size in enumerate([900, 100, 100, 300, 500, 0, 700])]
    splits = [Split(s, 0, s.size) for s in segs]
    tasks = pack(splits, split_bytes=1000, parallelism=2)
    assert sorted(s.segment.path for t in tasks for s in t) == sorted(s.path for s in segs)
    loads = [sum(s.size for s in t) for t in tasks]
    assert len(tasks) == 4 and max(loads) - min(loads) <= 400
    for t in tasks:
        assert t == sorted(t, key=lambda s: (s.segment.log_partition, s.start))


def test_split_size_is_a_cores_share_within_bounds() -> None:
    assert split_bytes_for(10, 2) == 4 << 20
    assert split_bytes_for(100 << 20, 2) == 50 << 20
    assert split_bytes_for(10 << 30, 2) == 128 << 20


def test_a_split_told_where_the_log_got_to_skips_a_repeat_at_its_segments_start(tmp_path: Path) -> None:
    """A segment whose first batch repeats offsets the segment before it holds (its base offset below
    where that one ends): kcoord's recovery reads it as a batch whose offsets go back. The split that
    starts the segment, told where the log had got to (LogRead.cut_read's ``starts``), skips it as it
    skips one inside a split, not only from inside a segment."""
    b0, b1, b2 = plain_batches([[commit("g", "t", p, r) for p in range(3)] for r in range(3)])
    directory = tmp_path / "__consumer_offsets-0"
    write_partition(directory, [b0, b1, b1, b2], segment_bytes=len(b0) + len(b1))  # rolls at the repeat
    path = directory / "00000000000000000003.log"
    size = path.stat().st_size
    assert size == len(b1) + len(b2)
    seg = SegmentFile(str(path), 0, 3, size, True, size)
    files = LocalFiles()
    unknown = [item for item in walk(Split(seg, 0, size), files)]
    assert [item[0] for item in unknown if not isinstance(item, Damage)] == [0, len(b1)]  # base 3: cannot tell
    told = list(walk(Split(seg, 0, size, 6), files))
    assert [(d.position, d.reason, d.torn_tail) for d in told if isinstance(d, Damage)] == [
        (0, "batch offset 3 below expected 6", False)]
    assert [item[0] for item in told if not isinstance(item, Damage)] == [len(b1)]
