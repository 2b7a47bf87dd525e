"""Decoding one split into rows: the work every executor does, with no Spark in it.

Batches are read with ``storage.batch.decode_batch`` (aiokafka's C reader) and records with
``protocol.records.decode_record``, the service's own decoders. A batch that cannot be read is a
``Damage`` at its byte position; the walk goes on at the next position where a whole batch checks out
(magic, length, CRC), so ``--skip-corrupt`` loses only the damaged bytes: stopping at a length that made
no sense dropped every later batch of the segment uncounted, and groups went back to older offsets (a
fault campaign's find). The damage says how many bytes were skipped. Damage that kcoord's own recovery would
cut aside is reported as a torn tail (never acknowledged, so not corruption) and ends the split: as
storage.log's ``recover``, that is any damage past the recovery point, whatever its shape and in whichever
segment, and a batch whose offsets fall below where the log had got to (a batch repeated or out of
order). kcoord cuts the partition there and sets its later segments aside, so ``reader.LogRead`` has
what the splits after such a cut read dropped (``SplitRead`` says what each split found). A record whose
key or value does not parse is a Damage too.

Rows are tuples in ``COLUMNS`` order (see ``RECORD_SCHEMA``); ``to_batch`` turns them into an Arrow batch
of the requested columns.
"""

from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import pyarrow as pa

from pipeline.layout import Files
from pipeline.splits import MAGIC_POSITION, Split
from protocol.hotcodec import int16_at, int32_at
from protocol.records import (
    GroupMetadataRecord,
    OffsetCommitRecord,
    RecordError,
    UnknownRecord,
    decode_record,
)
from storage.batch import (
    ATTRIBUTES_POSITION,
    BATCH_HEADER_BYTES,
    COMMIT,
    COMPRESSION_MASK,
    LAST_DELTA_POSITION,
    LOG_OVERHEAD,
    MAGIC,
    RECORDS_COUNT_POSITION,
    Batch,
    BatchError,
    decode_batch,
    read_head,
)

RESYNC_CHUNK_BYTES = 1 << 20
MAGIC_BYTE = bytes([MAGIC])

OFFSET_COMMIT = "offset_commit"
GROUP_METADATA = "group_metadata"
CONTROL = "control"
UNKNOWN = "unknown"
CONTROL_TYPES = {0: "ABORT", COMMIT: "COMMIT"}

MEMBER = pa.struct([
    ("member_id", pa.string()), ("group_instance_id", pa.string()), ("client_id", pa.string()),
    ("client_host", pa.string()), ("rebalance_timeout", pa.int32()), ("session_timeout", pa.int32()),
    ("subscription", pa.binary()), ("assignment", pa.binary()),
])
RECORD_SCHEMA = pa.schema([
    ("log_partition", pa.int32()),  # the __consumer_offsets partition the record is in
    ("log_offset", pa.int64()),  # its offset in that partition
    ("timestamp", pa.int64()),  # the record's (append) timestamp, ms
    ("record_type", pa.string()),  # offset_commit, group_metadata, control or unknown
    ("key_version", pa.int16()),  # the key's int16 record type (0/1 offsets, 2 group, 3+ not modelled)
    ("group", pa.string()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),  # the committed offset
    ("leader_epoch", pa.int32()),
    ("metadata", pa.string()),
    ("commit_timestamp", pa.int64()),
    ("expire_timestamp", pa.int64()),  # -1 unless the commit set a retention (value v1)
    ("tombstone", pa.bool_()),  # a null value: the offset or the group is deleted
    ("protocol_type", pa.string()),
    ("generation", pa.int32()),
    ("protocol", pa.string()),
    ("leader", pa.string()),
    ("current_state_timestamp", pa.int64()),
    ("members", pa.list_(MEMBER)),
    ("producer_id", pa.int64()),  # -1 outside transactions
    ("transactional", pa.bool_()),  # written in a transaction: visible only once its marker commits it
    ("control_type", pa.string()),  # COMMIT or ABORT on control rows
    ("key", pa.binary()),  # the record's bytes, for jobs that rewrite them (reshard)
    ("value", pa.binary()),
])
COLUMNS = tuple(RECORD_SCHEMA.names)
INDEX = {name: i for i, name in enumerate(COLUMNS)}
Row = tuple[Any, ...]
_NO_GROUP_FIELDS = (None,) * 6  # protocol_type .. members
_NO_OFFSET_FIELDS = (None,) * 8  # group .. expire_timestamp


class Damage(NamedTuple):
    """A batch (or record) that could not be read; ``torn_tail``: one kcoord would cut aside on load."""

    path: str
    log_partition: int
    position: int
    reason: str
    torn_tail: bool


class SplitRead(NamedTuple):
    """What reading one split found, for the checks across splits (``reader.LogRead``): where its first
    batch is and its base offset, the offset after its last batch, and where kcoord's recovery would cut
    the partition inside it (-1 for none of these)."""

    path: str
    log_partition: int
    base_offset: int  # the segment's
    start: int
    first_position: int
    first_offset: int
    next_offset: int
    cut_position: int
    # the offsets of its first and last record (-1: none), and the offsets between its records that hold
    # none: what compaction removed inside it (``reader.LogRead`` adds the gaps between splits)
    first_record: int = -1
    last_record: int = -1
    removed: int = 0


def walk(split: Split, files: Files) -> Iterator[tuple[int, Batch] | Damage]:
    """``(byte position, batch)`` for every batch starting in the split, and a Damage for each one that
    cannot be read or whose offsets go back (below the previous batch's end, or the segment's base
    offset for its first batch). A damage kcoord's recovery cuts aside (past the recovery point) ends the
    walk; one below it is corruption, and the walk goes on after it."""
    seg = split.segment
    buf, buf_start = files.read(seg.path, split.start, split.size), split.start

    def ensure(pos: int, need: int) -> None:
        nonlocal buf, buf_start
        if pos + need > buf_start + len(buf):
            keep = buf[pos - buf_start:]
            buf = keep + files.read(seg.path, pos + len(keep), pos + need - (pos + len(keep)))
            buf_start = pos

    def damage(pos: int, reason: str) -> Damage:
        # storage.log's recover: any damage past the recovery point is cut aside, whatever its shape
        return Damage(seg.path, seg.log_partition, pos, reason, pos >= seg.durable_below)

    def resync(after: int, next_offset: int) -> int | None:
        """The first position past ``after`` and before the split's end where a whole batch checks out
        (magic, length within the file, CRC), or None. Its header is checked first (attributes, offsets
        no lower than ``next_offset``, a record count its offset range can hold), so garbage that
        happens to show the magic byte and a length within the file (a random length is one for most
        of a large segment) is rarely read in full and CRC-checked: each such read is up to the
        segment's size."""
        cand = after + 1
        while cand < split.end and seg.size - cand >= BATCH_HEADER_BYTES:
            ensure(cand, min(RESYNC_CHUNK_BYTES, seg.size - cand))
            found = buf.find(MAGIC_BYTE, cand - buf_start + MAGIC_POSITION)
            if found < 0:
                cand = max(cand + 1, buf_start + len(buf) - MAGIC_POSITION)
                continue
            cand = buf_start + found - MAGIC_POSITION
            if cand >= split.end or seg.size - cand < BATCH_HEADER_BYTES:
                break
            ensure(cand, BATCH_HEADER_BYTES)
            rel = cand - buf_start
            base, size = read_head(buf, rel)
            attributes = int16_at(buf, rel + ATTRIBUTES_POSITION)
            last_delta = int32_at(buf, rel + LAST_DELTA_POSITION)
            count = int32_at(buf, rel + RECORDS_COUNT_POSITION)
            if (BATCH_HEADER_BYTES <= size <= seg.size - cand and 0 <= attributes < 0x80
                    and attributes & COMPRESSION_MASK <= 4 and base >= next_offset and 0 <= count <= last_delta + 1):
                ensure(cand, size)
                rel = cand - buf_start  # the buffer may have moved
                try:
                    decode_batch(buf[rel : rel + size])
                    return cand
                except BatchError:
                    pass
            cand += 1
        return None

    # where the log has got to (storage.log's recover); a split does not know how far the segments and
    # splits before it got unless a read before this one told it (``expected``: reader.LogRead checks each
    # split's first batch against the splits before it), which at a segment's start may be past its base
    # offset (the segment before it went on past that base)
    pos, next_offset = split.start, (max(seg.base_offset, split.expected) if split.start == 0 else split.expected)
    while pos < split.end:
        if seg.size - pos < LOG_OVERHEAD:
            yield damage(pos, f"{seg.size - pos} bytes too short for a batch header")
            return
        ensure(pos, LOG_OVERHEAD)
        _, batch_size = read_head(buf, pos - buf_start)
        if batch_size < BATCH_HEADER_BYTES:
            found = damage(pos, f"batch length {batch_size - LOG_OVERHEAD} is invalid")
        elif pos + batch_size > seg.size:
            found = damage(pos, f"batch of {batch_size} bytes runs past the end of the file")
        else:
            ensure(pos, batch_size)
            rel = pos - buf_start
            try:
                batch = decode_batch(buf[rel : rel + batch_size])
            except BatchError as exc:
                found = damage(pos, str(exc))
            else:
                if batch.base_offset < next_offset:  # repeated or out of order: as storage.log's recover
                    found = damage(pos, f"batch offset {batch.base_offset} below expected {next_offset}")
                    if not found.torn_tail:  # readable, but not a batch of this log: skip just it
                        yield found
                        pos += batch_size
                        continue
                else:
                    yield pos, batch
                    pos += batch_size
                    next_offset = batch.last_offset + 1
                    continue
        if found.torn_tail:  # kcoord cuts it aside from here on: nothing after it counts
            yield found
            return
        after = resync(pos, next_offset)
        end = split.end if after is None else after
        yield found._replace(reason=f"{found.reason}; {end - pos} bytes skipped" + (
            f" to the next readable batch, at byte {after}" if after is not None else ""))
        if after is None:
            return
        pos = after


def rows(split: Split, files: Files, on_damage: Callable[[Damage], None],
         on_removed: Callable[[int], None] | None = None,
         on_read: Callable[[SplitRead], None] | None = None) -> Iterator[Row]:
    """One row per record of the split, in log order. ``on_removed`` hears how many offsets between the
    split's first and last record hold no record: what compaction took out (kcoord and Kafka write
    consecutive offsets; a damage's skipped bytes are not counted). ``on_read`` hears the split's
    ``SplitRead`` once it is read to its end."""
    partition = split.segment.log_partition
    removed, expected = 0, -1
    first_position = first_offset = next_offset = cut_position = first_record = -1
    for item in walk(split, files):
        if isinstance(item, Damage):
            on_damage(item)
            expected = -1
            if item.torn_tail:
                cut_position = item.position
            continue
        pos, batch = item
        if first_position < 0:
            first_position, first_offset = pos, batch.base_offset
        next_offset = batch.last_offset + 1
        records = batch.records
        if records:
            first, last = records[0].offset, records[-1].offset
            removed += (first - expected if expected >= 0 else 0) + last - first + 1 - len(records)
            expected = last + 1
            if first_record < 0:
                first_record = first
        producer = batch.producer_id
        txn = batch.is_transactional
        if batch.control_type is not None:
            rec = records[0]
            yield control_row(partition, rec.offset, rec.timestamp, producer, batch.control_type, rec.key, rec.value)
            continue
        for rec in records:
            try:
                record = decode_record(rec.key, rec.value)
            except RecordError as exc:
                on_damage(Damage(split.segment.path, partition, pos, f"record at offset {rec.offset}: {exc}", False))
                continue
            yield record_row(partition, rec.offset, rec.timestamp, producer, txn, rec.key, rec.value, record)
    if on_removed is not None:
        on_removed(removed)
    if on_read is not None:
        seg = split.segment
        on_read(SplitRead(seg.path, partition, seg.base_offset, split.start, first_position, first_offset, next_offset,
                          cut_position, first_record, expected - 1 if first_record >= 0 else -1, removed))


def record_row(partition: int, log_offset: int, timestamp: int, producer: int, txn: bool, key: bytes | None,
               value: bytes | None, record: OffsetCommitRecord | GroupMetadataRecord | UnknownRecord) -> Row:
    if type(record) is OffsetCommitRecord:
        k, v = record
        assert key is not None  # decode_record refuses records without a key
        if v is None:
            return (partition, log_offset, timestamp, OFFSET_COMMIT, key[1], k.group, k.topic, k.partition,
                    None, None, None, None, None, True, *_NO_GROUP_FIELDS, producer, txn, None, key, value)
        return (partition, log_offset, timestamp, OFFSET_COMMIT, key[1], k.group, k.topic, k.partition,
                v.offset, v.leader_epoch, v.metadata, v.commit_timestamp, v.expire_timestamp, False,
                *_NO_GROUP_FIELDS, producer, txn, None, key, value)
    if isinstance(record, GroupMetadataRecord):
        g = record.value
        head = (partition, log_offset, timestamp, GROUP_METADATA, 2, record.group, *_NO_OFFSET_FIELDS[1:])
        if g is None:
            return (*head, True, *_NO_GROUP_FIELDS, producer, txn, None, key, value)
        members = [{
            "member_id": m.member_id, "group_instance_id": m.group_instance_id, "client_id": m.client_id,
            "client_host": m.client_host, "rebalance_timeout": m.rebalance_timeout,
            "session_timeout": m.session_timeout, "subscription": m.subscription, "assignment": m.assignment,
        } for m in g.members]
        return (*head, False, g.protocol_type, g.generation, g.protocol, g.leader, g.current_state_timestamp,
                members, producer, txn, None, key, value)
    assert isinstance(record, UnknownRecord)
    return (partition, log_offset, timestamp, UNKNOWN, record.record_type, *_NO_OFFSET_FIELDS,
            value is None, *_NO_GROUP_FIELDS, producer, txn, None, key, value)


def control_row(partition: int, log_offset: int, timestamp: int, producer: int, control_type: int,
                key: bytes | None, value: bytes | None) -> Row:
    name = CONTROL_TYPES.get(control_type, str(control_type))
    return (partition, log_offset, timestamp, CONTROL, None, *_NO_OFFSET_FIELDS, None, *_NO_GROUP_FIELDS,
            producer, True, name, key, value)


def latest_per_key(rows_in: Iterable[Row]) -> Iterator[Row]:
    """A map-side combine for the snapshot: of the plain (non-transactional) offset commits, only the
    last row per (group, topic, partition); transactional rows and markers pass through, since whether
    they count is decided later; group and unknown records are dropped. Rows must come in log order."""
    latest: dict[tuple[str, str, int], Row] = {}
    kind, group, topic, partition, txn = (INDEX[c] for c in ("record_type", "group", "topic", "partition",
                                                              "transactional"))
    for row in rows_in:
        if row[kind] == OFFSET_COMMIT:
            if row[txn]:
                yield row
            else:
                latest[(row[group], row[topic], row[partition])] = row
        elif row[kind] == CONTROL:
            yield row
    yield from latest.values()


def to_batch(batch_rows: list[Row], columns: tuple[str, ...]) -> pa.RecordBatch:
    """An Arrow batch of ``columns`` (a subset of COLUMNS, in any order) from rows."""
    if not batch_rows:
        return pa.RecordBatch.from_pylist([], schema=schema_of(columns))
    transposed = list(zip(*batch_rows, strict=True))
    arrays = [pa.array(transposed[INDEX[c]], type=RECORD_SCHEMA.field(c).type) for c in columns]
    return pa.RecordBatch.from_arrays(arrays, schema=schema_of(columns))


def schema_of(columns: tuple[str, ...]) -> pa.Schema:
    return pa.schema([RECORD_SCHEMA.field(c) for c in columns])
