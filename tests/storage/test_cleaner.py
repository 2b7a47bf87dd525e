import shutil
import struct
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

import storage.log
from protocol.records import (
    GroupMetadata,
    GroupMetadataRecord,
    OffsetAndMetadata,
    OffsetCommitRecord,
    OffsetKey,
    encode_record,
)
from storage import cleaner
from storage.batch import DELETE_HORIZON_FLAG, LOG_OVERHEAD, LogRecord, decode_batch, read_head
from storage.batchwriter import build_batch
from storage.cleaner import clean, cleanable_count, dirty_ratio
from storage.log import LogCorruptError, PartitionLog
from storage.segments import Segment, list_segments, swap_name

T = 1_700_000_000_000
DAY = 86_400_000
SEGMENT_BYTES = 600

Entry = tuple[bytes, bytes | None]


def new_log(directory: Path, segment_bytes: int = SEGMENT_BYTES) -> PartitionLog:
    plog = PartitionLog(directory, segment_bytes)
    list(plog.recover())
    return plog


def append(plog: PartitionLog, entries: list[Entry], ts: int = T, sync: bool = True) -> None:
    base = plog.next_offset
    plog.append(build_batch(base, entries, ts + base), base + len(entries) - 1)
    if sync:
        plog.sync()


def append_raw(plog: PartitionLog, batch: bytes) -> None:
    plog.append(batch, decode_batch(batch).last_offset)
    plog.sync()


def commit(group: str, partition: int, offset: int | None) -> Entry:
    value = None if offset is None else OffsetAndMetadata(offset, -1, "", T)
    return encode_record(OffsetCommitRecord(OffsetKey(group, "topic", partition), value))


def group(name: str, generation: int | None) -> Entry:
    value = None if generation is None else GroupMetadata("consumer", generation, "range", "m1", T)
    return encode_record(GroupMetadataRecord(name, value))


class Rec(NamedTuple):
    """A record's fields, compared by value (the readers' record objects are not)."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None


def read_back(directory: Path, segment_bytes: int = SEGMENT_BYTES) -> list[Rec]:
    """Every record, as a fresh process would read them (finishing any interrupted swap)."""
    plog = PartitionLog(directory, segment_bytes)
    records = [Rec(*fields(r)) for b in plog.recover() for r in b.records]
    plog.close()
    return records


def state(records: Sequence[LogRecord]) -> dict[bytes | None, bytes]:
    out: dict[bytes | None, bytes] = {}
    for r in records:
        if r.value is None:
            out.pop(r.key, None)
        else:
            out[r.key] = r.value
    return out


def assert_compacted_from(after: Sequence[LogRecord], before: Sequence[LogRecord]) -> None:
    """Same replayed state; every survivor is an original record at its original offset."""
    assert state(after) == state(before)
    offsets = [r.offset for r in after]
    assert offsets == sorted(set(offsets))
    by_offset = {r.offset: fields(r) for r in before}
    assert all(by_offset[r.offset] == fields(r) for r in after)


def fields(r: LogRecord) -> tuple[int, int, bytes | None, bytes | None]:
    return r.offset, r.timestamp, r.key, r.value


def assert_segments_match_disk(plog: PartitionLog) -> None:
    on_disk = [(s.base_offset, s.path, s.size) for s in list_segments(plog.directory)]
    assert [(s.base_offset, s.path, s.size) for s in plog.segments] == on_disk
    assert not list(plog.directory.glob("*.swap")) and not list(plog.directory.glob("*.cleaned"))


def txn_batch(base: int, entries: list[Entry], control: bool = False) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, True, 7, 0, 0, 1 << 30)
    for delta, (key, value) in enumerate(entries):
        builder.append(delta, T, key, value, [])
    buf = builder.build()
    struct.pack_into(">qi", buf, 0, base, len(buf) - LOG_OVERHEAD)
    if control:
        struct.pack_into(">h", buf, 21, struct.unpack_from(">h", buf, 21)[0] | 0x20)
        struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    return bytes(buf)


def fill(plog: PartitionLog, rounds: int) -> None:
    """Commits for a few partitions of two groups, overwritten round after round, and a group per
    round that is written once."""
    for n in range(rounds):
        append(plog, [commit("g1", p, n) for p in range(3)])
        append(plog, [commit("g2", n % 2, n), group("g2", n), group(f"once-{n}", 1)])


def test_keeps_only_the_newest_record_per_key(tmp_path: Path) -> None:
    plog = new_log(tmp_path)
    fill(plog, 20)
    before = read_back(tmp_path)
    active = plog.segments[-1]
    stats = clean(plog, T, DAY)
    after = read_back(tmp_path)
    assert_compacted_from(after, before)
    assert stats.records_dropped > 0 and stats.bytes_after < stats.bytes_before
    assert stats.clean_end_offset == active.base_offset
    closed = [r for r in after if r.offset < active.base_offset]
    assert len({r.key for r in closed}) == len(closed)  # one per key below the active segment
    assert_segments_match_disk(plog)


def test_keys_compare_as_bytes(tmp_path: Path) -> None:
    plog = new_log(tmp_path)
    legacy = b"\x00\x00" + commit("g", 0, 1)[0][2:]  # type 0 key with the type 1 key's struct
    append(plog, [(legacy, b"old"), (commit("g", 0, 1)[0], b"new")])
    append(plog, [(b"k" * 500, b"x")])
    append(plog, [(b"k" * 500, b"y")])
    clean(plog, T, DAY)
    after = state(read_back(tmp_path))
    assert (after[legacy], after[commit("g", 0, 1)[0]]) == (b"old", b"new")


def test_tombstones_stay_until_the_delete_horizon(tmp_path: Path) -> None:
    plog = new_log(tmp_path)
    append(plog, [commit("g", 0, 5), commit("g", 1, 5)])
    append(plog, [commit("g", 0, None), commit("g", 1, 6)], ts=T + 100)
    tombstone_offset = plog.next_offset - 2
    fill(plog, 8)
    before = read_back(tmp_path)
    now = T + 10_000
    for at, kept in ((now, True), (now + DAY - 1, True), (now + DAY, False)):
        stats = clean(plog, at, DAY)
        after = read_back(tmp_path)
        assert_compacted_from(after, before)
        assert any(r.offset == tombstone_offset for r in after) is kept
        # the horizon stamped by the first clean is reported while the tombstone stays (Compactor waits for it)
        assert stats.tombstone_horizon_ms == (now + DAY if kept else None)
    assert all(r.value is not None for r in read_back(tmp_path))


def test_delete_horizon_is_kafkas_bit_6_and_set_once(tmp_path: Path) -> None:
    plog = new_log(tmp_path)
    append(plog, [commit("g", 0, 1), commit("g", 1, None), commit("g", 2, 1)], ts=T)
    append(plog, [commit("g", 0, 2)], ts=T + 5)
    append(plog, [(b"pad", b"p" * 600)])
    original = {r.offset: fields(r) for r in read_back(tmp_path)}
    now = T + 1000
    clean(plog, now, DAY)
    first = next(iter(PartitionLog(tmp_path, SEGMENT_BYTES).recover()))
    assert first.attributes & DELETE_HORIZON_FLAG
    assert first.base_timestamp == now + DAY
    assert (first.base_offset, first.last_offset) == (0, 2)
    assert [r.offset for r in first.records] == [1, 2]
    assert all(fields(r) == original[r.offset] for r in first.records)  # timestamps preserved
    append(plog, [commit("g", 2, 2)])  # the batch is rewritten again: its horizon stays
    clean(plog, now + 50, DAY)
    first = next(iter(PartitionLog(tmp_path, SEGMENT_BYTES).recover()))
    assert first.attributes & DELETE_HORIZON_FLAG
    assert first.base_timestamp == now + DAY
    assert (first.base_offset, first.last_offset) == (0, 1)
    assert [fields(r) for r in first.records] == [original[1]]


def test_transactional_and_control_batches_are_copied(tmp_path: Path) -> None:
    plog = new_log(tmp_path)
    key, other = commit("t", 0, 0)[0], commit("t", 1, 0)[0]
    append(plog, [(key, b"plain"), (other, b"plain")])
    txn = txn_batch(plog.next_offset, [(key, b"txn"), (other, b"txn")])
    append_raw(plog, txn)
    marker = txn_batch(plog.next_offset, [(b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00")], control=True)
    append_raw(plog, marker)
    append(plog, [(key, None)])
    fill(plog, 8)
    for now in (T, T + 2 * DAY):
        stats = clean(plog, now, DAY)
        # the tombstone's horizon is reported while it may still pass, not once the tombstone stays for good
        # (a review's find: a passed horizon reported by every pass made the cleaner rewrite an idle log)
        assert stats.tombstone_horizon_ms == (T + DAY if now == T else None)
        data = b"".join(s.path.read_bytes() for s in plog.segments)
        assert txn in data and marker in data
        # the plain record is hidden by the tombstone, which outlives its horizon
        assert [r.value for r in read_back(tmp_path) if r.key == key] == [b"txn", None]
        # a transactional record hides nothing: its transaction may have been aborted
        assert [r.value for r in read_back(tmp_path) if r.key == other] == [b"plain", b"txn"]


def test_active_and_not_durable_segments_are_untouched(tmp_path: Path) -> None:
    plog = new_log(tmp_path)
    fill(plog, 12)
    last_g1 = plog.next_offset - 5  # g1/0 of the last round
    for n in range(3):
        append(plog, [(b"pad-%d" % n, b"p" * 300)])
    durable = read_back(tmp_path)
    for n in range(6):  # rolls segments that are never fsynced
        append(plog, [commit("g1", 0, 100 + n), (b"pad", b"p" * 200)], sync=False)
    count = cleanable_count(plog)
    untouched = {s.path: s.path.read_bytes() for s in plog.segments[count:]}
    assert len(untouched) >= 3
    assert last_g1 < plog.segments[count - 1].base_offset + 1 and count > 0
    assert plog.segments[count].base_offset > last_g1  # g1/0 = 11 is in a segment about to be cleaned
    active = plog.segments[-1]
    clean(plog, T, DAY)
    assert plog.segments[-1] is active
    assert {s.path: s.path.read_bytes() for s in plog.segments[-len(untouched) :]} == untouched
    plog.truncate_to_durable()  # a failed fsync takes the unsynced tail back
    append(plog, [commit("g3", 0, 1)])
    after = read_back(tmp_path)
    assert_compacted_from(after[:-1], durable)
    assert state(after)[commit("g1", 0, 0)[0]] == commit("g1", 0, 11)[1]


def test_merges_small_segments(tmp_path: Path) -> None:
    plog = new_log(tmp_path)
    fill(plog, 30)
    before_segments = len(plog.segments)
    stats = clean(plog, T, DAY)
    assert stats.segments_after < stats.segments_before
    assert len(plog.segments) == before_segments - stats.segments_before + stats.segments_after
    assert all(s.size <= SEGMENT_BYTES for s in plog.segments)
    assert_segments_match_disk(plog)
    while stats.segments_after < stats.segments_before:  # merged outputs may merge further
        stats = clean(plog, T, DAY)
        assert stats.records_dropped == 0
    files = {s.path: s.path.read_bytes() for s in plog.segments}
    again = clean(plog, T, DAY)  # nothing left to do: files are left alone
    assert again.records_dropped == 0 and again.bytes_after == again.bytes_before
    assert {s.path: s.path.read_bytes() for s in plog.segments} == files
    assert dirty_ratio(plog, again.clean_end_offset) == 0.0
    assert dirty_ratio(plog, 0) == 1.0
    fill(plog, 5)
    assert 0.0 < dirty_ratio(plog, again.clean_end_offset) < 1.0


def test_a_swap_first_moves_an_older_recovery_point_past_the_merged_segments(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A recovery point recorded while the first segment was active would, once that segment is merged
    with its successors, leave most of the merged (durable) file past the claim, where damage reads as
    a torn tail and is cut: acknowledged offsets lost instead of a partition refusing to serve. The
    swap records the current claim first, so damage in a merged file is corruption."""
    monkeypatch.setattr(storage.log, "CHECKPOINT_INTERVAL_S", 3600.0)
    plog = new_log(tmp_path)
    append(plog, [commit("first", 0, 0)])
    plog.checkpoint()  # the claim is in segment 0 from here on: no other is due for an hour
    _, claimed = plog.recorded_claim()
    fill(plog, 30)
    assert plog.recorded_claim() == (0, claimed) and plog.segments[-1].base_offset > 0
    stats = clean(plog, T, DAY)
    assert stats.segments_after < stats.segments_before
    merged = plog.segments[0]
    assert merged.base_offset == 0 and merged.size - 10 > claimed
    assert plog.recorded_claim() == plog.claim()
    assert plog.recorded_claim()[0] > merged.base_offset
    data = bytearray(merged.path.read_bytes())
    data[merged.size - 10] ^= 0xFF  # damage in the merged, durable file, past the old claim
    merged.path.write_bytes(bytes(data))
    with pytest.raises(LogCorruptError):
        list(PartitionLog(tmp_path, SEGMENT_BYTES).recover())


def test_cleaned_log_reads_with_kafka_python(tmp_path: Path) -> None:
    plog = new_log(tmp_path)
    append(plog, [commit("g", 0, 1), commit("g", 1, None)])
    fill(plog, 10)
    clean(plog, T, DAY)
    horizons = 0
    for seg in plog.segments:
        data = seg.path.read_bytes()
        pos = 0
        while pos < len(data):
            _, size = read_head(data, pos)
            raw = DefaultRecordBatch(data[pos : pos + size])
            assert raw.validate_crc()
            assert raw.last_offset == max(r.offset for r in raw)
            horizons += bool(raw.attributes & DELETE_HORIZON_FLAG)
            decode_batch(data[pos : pos + size])
            pos += size
    assert horizons == 1


def test_compressed_batch_is_rewritten_uncompressed_with_headers(tmp_path: Path) -> None:
    plog = new_log(tmp_path)
    builder = DefaultRecordBatchBuilder(2, 1, False, -1, -1, -1, 1 << 30)  # gzip
    builder.append(0, T, b"a", b"1", [("h", b"x")])
    builder.append(1, T + 7, b"b", b"1", [("h", None)])
    buf = builder.build()
    struct.pack_into(">qi", buf, 0, 0, len(buf) - LOG_OVERHEAD)
    append_raw(plog, bytes(buf))
    append(plog, [(b"a", b"2"), (b"pad", b"p" * 600)])
    append(plog, [(b"pad", b"q")])
    clean(plog, T, DAY)
    data = plog.segments[0].path.read_bytes()
    raw = DefaultRecordBatch(data[: read_head(data, 0)[1]])
    assert raw.validate_crc() and raw.compression_type == 0
    assert [(r.offset, r.timestamp, r.key, r.headers) for r in raw] == [(1, T + 7, b"b", [("h", None)])]


class Crash(BaseException):
    """The process dying at this point (BaseException: nothing may catch and carry on)."""


def crash(*args: object) -> None:
    raise Crash


def crash_after_first_delete(originals: list[Segment]) -> None:
    originals[0].path.unlink()
    crash()


@pytest.mark.parametrize("at", [crash, crash_after_first_delete])
def test_crash_after_the_swap_is_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at: Callable[[list[Segment]], None]
) -> None:
    crashed, reference = tmp_path / "crashed", tmp_path / "reference"
    plog = new_log(crashed)
    fill(plog, 20)
    before = read_back(crashed)
    shutil.copytree(crashed, reference)
    expected = new_log(reference)
    clean(expected, T, DAY)
    cleaned = read_back(reference)
    end = expected.segments[1].base_offset  # the first output replaced segments [0, end)
    assert end > plog.segments[1].base_offset  # ... and it was a merge of several
    monkeypatch.setattr(cleaner, "_delete_originals", at)
    with pytest.raises(Crash):
        clean(plog, T, DAY)
    plog.close()
    monkeypatch.undo()
    assert (crashed / swap_name(0, end)).exists()
    recovered = read_back(crashed)  # opening finishes the swap
    assert [r for r in recovered if r.offset < end] == [r for r in cleaned if r.offset < end]
    assert [r for r in recovered if r.offset >= end] == [r for r in before if r.offset >= end]
    reopened = new_log(crashed)
    assert_segments_match_disk(reopened)
    clean(reopened, T, DAY)
    assert read_back(crashed) == cleaned


def test_crash_before_the_swap_keeps_the_originals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plog = new_log(tmp_path)
    fill(plog, 20)
    before = read_back(tmp_path)
    monkeypatch.setattr(cleaner, "swap_name", crash)
    with pytest.raises(Crash):
        clean(plog, T, DAY)
    plog.close()
    assert list(tmp_path.glob("*.cleaned"))
    assert read_back(tmp_path) == before
    assert not list(tmp_path.glob("*.cleaned"))


ops = st.lists(st.tuples(st.integers(0, 5), st.one_of(st.none(), st.binary(max_size=40))), min_size=1, max_size=30)


@settings(max_examples=60, deadline=None)
@given(phases=st.lists(ops, min_size=1, max_size=4), per_batch=st.integers(1, 4), retention=st.integers(0, 3 * DAY))
def test_cleaning_preserves_replayed_state(
    phases: list[list[tuple[int, bytes | None]]], per_batch: int, retention: int
) -> None:
    """Appends and cleans interleave, the clock moving past delete horizons; after every clean the
    log replays to the state of everything ever written, from original records at their offsets."""
    with tempfile.TemporaryDirectory() as d:
        directory = Path(d)
        plog = new_log(directory, 300)
        history: dict[int, LogRecord] = {}
        for n, phase in enumerate(phases):
            entries: list[Entry] = [(b"\x00\x01key-%d" % k, v) for k, v in phase]
            for i in range(0, len(entries), per_batch):
                append(plog, entries[i : i + per_batch])
            history.update((r.offset, r) for r in read_back(directory, 300))
            active = plog.segments[-1].path.read_bytes()
            clean(plog, T + n * (retention + 1), retention)
            assert plog.segments[-1].path.read_bytes() == active
            assert_segments_match_disk(plog)
            assert_compacted_from(read_back(directory, 300), [history[o] for o in sorted(history)])
        plog.close()
