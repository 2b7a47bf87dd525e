"""Decoding without Spark: every record kind becomes a row of the schema, damage is found where it is
and judged as kcoord's recovery would, and the snapshot's map-side combine keeps the last commit."""

import shutil
import struct
from pathlib import Path
from typing import Any

import crc32c
import pyarrow as pa
import pytest

from pipeline.decode import COLUMNS, INDEX, RECORD_SCHEMA, Damage, latest_per_key, rows, to_batch
from pipeline.layout import LocalFiles, find_segments
from pipeline.splits import Split
from tests.coordinator.test_load_kafka_logs import GZIP, kafka_batch, marker, offset
from tests.pipeline.logs import commit, group_record, plain_batches, tombstone, write_partition

UNKNOWN_KEY = struct.pack(">h", 3) + struct.pack(">h", 1) + b"g"  # a KIP-848 record type kcoord does not model


def read_all(data_dir: Path) -> tuple[list[tuple[object, ...]], list[Damage]]:
    damages: list[Damage] = []
    out = [r for seg in find_segments([str(data_dir)]) for r in rows(Split(seg, 0, seg.size), LocalFiles(),
                                                                     damages.append)]
    return out, damages


def col(row: tuple[object, ...], name: str) -> object:
    return row[INDEX[name]]


def test_every_kind_of_record_is_a_row_of_the_schema(tmp_path: Path) -> None:
    write_partition(tmp_path / "__consumer_offsets-4", [
        kafka_batch(0, [offset("g", 0, 5), offset("g", 1, 50)], compression=GZIP),
        kafka_batch(2, [offset("g", 0, 9)], producer=(9, 0), transactional=True),
        kafka_batch(3, [marker(commit=True)], producer=(9, 0), transactional=True, control=True),
        kafka_batch(4, [group_record("g", 3, ("m-1", "m-2")), tombstone("g", "t", 1), (UNKNOWN_KEY, b"\0\0")]),
    ])
    got, damages = read_all(tmp_path)
    assert damages == []
    assert all(len(r) == len(COLUMNS) for r in got)
    kinds = [(col(r, "log_offset"), col(r, "record_type")) for r in got]
    assert kinds == [(0, "offset_commit"), (1, "offset_commit"), (2, "offset_commit"), (3, "control"),
                     (4, "group_metadata"), (5, "offset_commit"), (6, "unknown")]
    first, txn, control, group, gone, unknown = got[0], got[2], got[3], got[4], got[5], got[6]
    assert (col(first, "log_partition"), col(first, "group"), col(first, "topic"), col(first, "partition"),
            col(first, "offset"), col(first, "tombstone"), col(first, "producer_id")) == (4, "g", "t", 0, 5, False, -1)
    assert (col(txn, "transactional"), col(txn, "producer_id")) == (True, 9)
    assert (col(control, "control_type"), col(control, "producer_id")) == ("COMMIT", 9)
    assert (col(group, "generation"), col(group, "leader"), col(group, "protocol_type")) == (3, "m-1", "consumer")
    assert [m["member_id"] for m in col(group, "members")] == ["m-1", "m-2"]  # type: ignore[attr-defined]
    assert col(gone, "tombstone") is True and col(gone, "offset") is None
    assert (col(unknown, "key_version"), col(unknown, "group")) == (3, None)
    batch = to_batch(got, COLUMNS)
    assert batch.schema == RECORD_SCHEMA and batch.num_rows == 7
    assert to_batch(got, ("group", "offset")).to_pydict()["offset"] == [5, 50, 9, None, None, None, None]


def batches_of_three(tmp_path: Path, checkpoint: bool = True) -> tuple[Path, list[int]]:
    entries = [[commit("g", "t", p, i) for p in range(3)] for i in range(5)]
    directory = tmp_path / "__consumer_offsets-0"
    positions = write_partition(directory, plain_batches(entries), checkpoint)
    return directory / "00000000000000000000.log", positions


def damage(path: Path, position: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position + 70)
        byte = f.read(1)
        f.seek(position + 70)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_a_corrupt_batch_is_reported_and_the_batches_after_it_are_read(tmp_path: Path) -> None:
    path, positions = batches_of_three(tmp_path)
    damage(path, positions[2])
    got, damages = read_all(tmp_path)
    assert [(d.path, d.position, d.torn_tail) for d in damages] == [(str(path), positions[2], False)]
    assert "CRC" in damages[0].reason
    assert [col(r, "log_offset") for r in got] == [0, 1, 2, 3, 4, 5, 9, 10, 11, 12, 13, 14]


def test_a_damaged_length_skips_only_the_damaged_bytes(tmp_path: Path) -> None:
    """A bit flipped in a batch's length (outside its CRC) below the recovery point: the walk stopped
    there and every later batch of the segment was dropped uncounted, so ``--skip-corrupt`` sent
    groups back to older offsets (a fault campaign's find). It goes on at the next whole batch."""
    path, positions = batches_of_three(tmp_path)
    for bad, why in ((b"\x40", "runs past the end of the file"), (b"\0\0\0\0", "is invalid")):
        with open(path, "r+b") as f:
            f.seek(positions[1] + 8)
            f.write(bad)
        got, damages = read_all(tmp_path)
        skipped = positions[2] - positions[1]
        assert [(d.position, d.torn_tail) for d in damages] == [(positions[1], False)]
        assert why in damages[0].reason
        assert damages[0].reason.endswith(f"; {skipped} bytes skipped to the next readable batch, at byte "
                                          f"{positions[2]}")
        assert [col(r, "log_offset") for r in got] == [0, 1, 2, *range(6, 15)]


def test_damage_with_nothing_readable_after_it_skips_to_the_end(tmp_path: Path) -> None:
    path, positions = batches_of_three(tmp_path)
    with open(path, "r+b") as f:
        f.seek(positions[3] + 16)
        f.write(b"\x07")  # magic
        f.seek(positions[4] + 16)
        f.write(b"\x07")
    got, damages = read_all(tmp_path)
    size = path.stat().st_size
    assert [(d.position, d.reason) for d in damages] == [(positions[3], f"magic 7 is not 2; {size - positions[3]} "
                                                                          "bytes skipped")]
    assert [col(r, "log_offset") for r in got] == list(range(9))


def test_a_torn_last_batch_past_the_recovery_point_is_a_torn_tail(tmp_path: Path) -> None:
    path, positions = batches_of_three(tmp_path, checkpoint=False)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 5)
    _, damages = read_all(tmp_path)
    assert [(d.position, d.torn_tail) for d in damages] == [(positions[-1], True)]


def test_damage_below_the_recovery_point_is_corruption_even_at_the_end(tmp_path: Path) -> None:
    path, positions = batches_of_three(tmp_path, checkpoint=True)  # the whole file is known durable
    damage(path, positions[-1])
    _, damages = read_all(tmp_path)
    assert [(d.position, d.torn_tail) for d in damages] == [(positions[-1], False)]


def test_damage_past_the_recovery_point_is_cut_whatever_its_shape(tmp_path: Path) -> None:
    """kcoord's recovery cuts a partition at any damage past its recovery point, with every batch after
    it (storage.log ``recover``). Only a torn-looking last batch of the last segment was taken for that
    here: a damaged batch with whole ones after it, or a zeroed block a power cut left inside the file,
    was corruption (the job wrote nothing), and with --skip-corrupt the batches after it, which kcoord
    sets aside, were read."""
    path, positions = batches_of_three(tmp_path, checkpoint=False)
    damage(path, positions[2])
    got, damages = read_all(tmp_path)
    assert [(d.position, d.torn_tail) for d in damages] == [(positions[2], True)]
    assert [col(r, "log_offset") for r in got] == list(range(6))
    with open(path, "r+b") as f:
        f.seek(positions[1])
        f.write(bytes(positions[2] - positions[1]))
    got, damages = read_all(tmp_path)
    assert [(d.position, d.torn_tail) for d in damages] == [(positions[1], True)]
    assert [col(r, "log_offset") for r in got] == [0, 1, 2]


def test_a_batch_whose_offsets_go_back_is_damage_as_kcoord_reads_it(tmp_path: Path) -> None:
    """A batch repeated (or out of order) is damage to kcoord's recovery: cut with what follows past the
    recovery point, corruption below it. It was read as any other batch, so the pipeline served
    offsets kcoord never does."""
    entries = [[commit("g", "t", p, i) for p in range(3)] for i in range(5)]
    batches = plain_batches(entries)
    directory = tmp_path / "__consumer_offsets-0"
    positions = write_partition(directory, [*batches[:3], batches[1], *batches[3:]], checkpoint=False)
    got, damages = read_all(tmp_path)
    assert [(d.position, d.torn_tail, d.reason) for d in damages] == [(positions[3], True,
                                                                       "batch offset 3 below expected 9")]
    assert [col(r, "log_offset") for r in got] == list(range(9))
    shutil.rmtree(directory)
    positions = write_partition(directory, [*batches[:3], batches[1], *batches[3:]])  # all below the recovery point
    got, damages = read_all(tmp_path)
    assert [(d.position, d.torn_tail) for d in damages] == [(positions[3], False)]
    assert [col(r, "log_offset") for r in got] == list(range(15))  # the repeated batch skipped


def test_a_record_that_does_not_parse_is_reported_with_its_offset(tmp_path: Path) -> None:
    bad_value = struct.pack(">h", 3) + b"\x01"  # OffsetCommitValue v3 cut short
    batch = bytearray(plain_batches([[commit("g", "t", 0, 1), (commit("g", "t", 1, 2)[0], bad_value)]])[0])
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    write_partition(tmp_path / "__consumer_offsets-0", [bytes(batch)])
    got, damages = read_all(tmp_path)
    assert len(got) == 1 and len(damages) == 1
    assert damages[0].position == 0 and "offset 1" in damages[0].reason and not damages[0].torn_tail


def test_the_map_side_combine_keeps_the_last_plain_commit_and_every_transactional_row(tmp_path: Path) -> None:
    write_partition(tmp_path / "__consumer_offsets-0", [
        kafka_batch(0, [offset("g", 0, 5), offset("g", 1, 6)]),
        kafka_batch(2, [offset("g", 0, 7)], producer=(3, 0), transactional=True),
        kafka_batch(3, [marker(commit=False)], producer=(3, 0), transactional=True, control=True),
        kafka_batch(4, [offset("g", 0, 8), group_record("g", 1, ())]),
    ])
    got, _ = read_all(tmp_path)
    kept = sorted((col(r, "log_offset"), col(r, "record_type")) for r in latest_per_key(got))
    assert kept == [(1, "offset_commit"), (2, "offset_commit"), (3, "control"), (4, "offset_commit")]
    assert isinstance(to_batch(list(latest_per_key(got)), ("log_offset",)), pa.RecordBatch)


def test_offsets_without_records_are_counted_as_removed_by_compaction(tmp_path: Path) -> None:
    """What kcoord's cleaner leaves: offsets that hold no record any more. history says so."""
    entries = [[commit("g", "t", 0, i)] for i in range(3)]
    batches = plain_batches(entries[:2]) + plain_batches(entries[2:], first_offset=9)
    write_partition(tmp_path / "__consumer_offsets-0", batches)
    removed: list[int] = []
    (seg,) = find_segments([str(tmp_path)])
    got = list(rows(Split(seg, 0, seg.size), LocalFiles(), lambda d: None, removed.append))
    assert [col(r, "log_offset") for r in got] == [0, 1, 9] and removed == [7]
    full = tmp_path / "full"
    write_partition(full / "__consumer_offsets-0", plain_batches(entries))
    (seg,) = find_segments([str(full)])
    removed.clear()
    list(rows(Split(seg, 0, seg.size), LocalFiles(), lambda d: None, removed.append))
    assert removed == [0]


def test_garbage_showing_the_magic_byte_is_rarely_read_in_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding the next batch after damage checked every position showing the magic byte and a length
    within the file by reading that length and its CRC: in a large segment a random length mostly is
    one, so a damaged megabyte cost thousands of reads of up to the segment's size (a review's find).
    The header is checked first now. Garbage here: every 64 bytes a magic byte and a length that fits."""
    import random

    import pipeline.decode

    path, positions = batches_of_three(tmp_path)
    good = path.read_bytes()
    rng = random.Random(7)
    garbage = bytearray(rng.randbytes(64 * 1000))
    for at in range(0, len(garbage), 64):
        garbage[at + 8 : at + 12] = (100).to_bytes(4, "big")
        garbage[at + 16] = 2
    path.write_bytes(good[: positions[2]] + bytes(garbage) + good[positions[2]:])
    reads: list[int] = []
    real = pipeline.decode.decode_batch  # type: ignore[attr-defined]

    def counted(data: bytes, *args: Any) -> Any:
        reads.append(len(data))
        return real(data, *args)

    monkeypatch.setattr(pipeline.decode, "decode_batch", counted)
    got, damages = read_all(tmp_path)
    assert [col(r, "log_offset") for r in got] == list(range(15))
    assert len(damages) == 1 and damages[0].position == positions[2]
    assert len(reads) < 20  # the 5 batches, the damage, and a few candidates (1,000 before)
