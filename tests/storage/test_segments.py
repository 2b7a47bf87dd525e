"""storage.segments.read_segment: a segment's batches in order, the valid ones taken in compiled runs
(storage.batch.decode_run) and everything else left to the per-batch checks, in the same order."""

from pathlib import Path

import pytest

import storage.batch
from protocol.records import OffsetAndMetadata, OffsetCommitRecord, OffsetKey, RecordError, encode_record
from storage.batch import Batch, decode_batch, decode_runs
from storage.batchwriter import build_batch
from storage.segments import LOAD_BUFFER_BYTES, Damage, read_segment

T = 1_700_000_000_000


def batches(count: int, records: int = 3, first: int = 0) -> list[bytes]:
    out = []
    for i in range(count):
        base = first + i * records
        out.append(build_batch(base, [encode_record(OffsetCommitRecord(OffsetKey(f"g{base}", "t", r),
                                                                       OffsetAndMetadata(base + r, -1, "", T)))
                                      for r in range(records)], T))
    return out


def read(path: Path, replayable: bool = True) -> list[Batch | Damage]:
    return list(read_segment(path, replayable=replayable))


@pytest.mark.parametrize("replayable", [True, False])
def test_every_batch_across_buffer_refills_and_runs(tmp_path: Path, replayable: bool) -> None:
    """More than one 5 MiB read and many runs of 64 KiB: every batch once, in order, as a
    batch-by-batch decode gives it."""
    raw = batches(30_000)
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(b"".join(raw))
    assert path.stat().st_size > LOAD_BUFFER_BYTES
    got = read(path, replayable)
    assert all(isinstance(b, Batch) for b in got) and len(got) == len(raw)
    for b, data in zip(got, raw, strict=True):
        want = decode_batch(data, replayable)
        assert isinstance(b, Batch)
        assert (b.base_offset, b.last_offset, b.size, b.runs) == (want.base_offset, want.last_offset, want.size,
                                                                  want.runs)


def test_a_record_that_does_not_parse_is_left_to_the_batchs_reader(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A record kcoord cannot read inside a batch with a valid CRC is not the segment's damage, on either
    path: the batch comes in order, with the records the pure-Python path reads, and ``decode_runs``
    raises the RecordError when they are replayed. The compiled decoder raised it here, before recovery
    judged the batch (a recovery may cut it as damage, or replace it with a journal run, unread)."""
    monkeypatch.setattr(storage.batch, "FAST_REPLAY", True)  # the loader's decoder: it reads the records
    bad = build_batch(30, [(b"\x00\x01\xff", b"\x00\x01")], T)
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(b"".join(batches(10)) + bad + b"".join(batches(5, first=31)))
    got = read(path)
    assert all(isinstance(b, Batch) for b in got)
    assert [b.base_offset for b in got if isinstance(b, Batch)] == [*range(0, 30, 3), 30, *range(31, 46, 3)]
    unread = got[10]
    assert isinstance(unread, Batch) and unread.runs is None and len(unread.records) == 1
    with pytest.raises(RecordError):
        decode_runs(unread.records)
    assert all(isinstance(b, Batch) and b.runs is not None for b in got[:10] + got[11:])


def test_damage_after_valid_batches_is_reported_where_it_starts(tmp_path: Path) -> None:
    raw = batches(2_000)
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(b"".join(raw) + raw[0][:40])  # a torn batch: its header only in part
    got = read(path)
    assert len(got) == 2_001 and isinstance(got[-1], Damage)
    assert (got[-1].position, got[-1].torn) == (sum(len(b) for b in raw), True)
    corrupt = bytearray(b"".join(raw))
    at = sum(len(b) for b in raw[:1500])
    corrupt[at + 70] ^= 0xFF  # a record byte of batch 1,500: its CRC fails
    path.write_bytes(bytes(corrupt))
    got = read(path)
    assert len(got) == 1_501 and isinstance(got[-1], Damage) and not got[-1].torn
    assert got[-1].position == at and "CRC" in got[-1].reason
