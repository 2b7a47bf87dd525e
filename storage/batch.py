"""Kafka v2 record batches (magic 2): built with aiokafka's record builder (C; byte-identical to
kafka-python's once base offset and leader epoch are stamped, checked in tests), read with aiokafka's C
reader (1M records in ~0.25 s against ~4.5 s with kafka-python's) unless compressed: kcoord never
compresses, a Kafka broker may, and kafka-python's reader has the codecs this package depends on.

Layout (reference section 8.1, all big-endian): baseOffset int64 | batchLength int32 |
partitionLeaderEpoch int32 | magic int8 = 2 | crc uint32 (CRC-32C over attributes..end) |
attributes int16 | lastOffsetDelta int32 | baseTimestamp int64 | maxTimestamp int64 | producerId int64 |
producerEpoch int16 | baseSequence int32 | recordsCount int32 | records. The CRC leaves out baseOffset and
partitionLeaderEpoch, so both are stamped after the batch is built.
"""

import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final, Protocol

from protocol import compiled
from protocol.hotcodec import int16_at, int32_at, int64_at, uint32_at
from protocol.records import LoadedRecord, RecordError, UnknownRecord, decode_record
from storage import loadcodec
from storage.batchwriter import LOG_OVERHEAD as LOG_OVERHEAD
from storage.batchwriter import MAGIC as MAGIC
from storage.loadcodec import RecordsError, Run

try:  # the C function itself: the package's __init__ imports importlib.metadata, ~20-35 ms of a start that
    # coordinator/startup.py keeps from running
    from crc32c._crc32c import crc32c
except ImportError:  # a release that moved it
    from crc32c import crc32c

if TYPE_CHECKING:
    from kafka.record.default_records import DefaultRecordBatch

try:
    from aiokafka.record._crecords.default_records import DefaultRecordBatch as BatchReader
except ImportError:  # a platform without aiokafka's C extension
    BatchReader = None


def _reference_reader() -> "type[DefaultRecordBatch]":
    """kafka-python's batch reader, for compressed batches (it has the codecs) and the cleaner's
    rebuilds. Imported when first needed: with its codec modules and crc32c's package ``__init__`` it
    is ~30-60 ms of a start that reads no compressed batch (``python -X importtime``)."""
    from kafka.record.default_records import DefaultRecordBatch as reader

    return reader  # type: ignore[no-any-return]  # kafka-python is untyped


def codec_stale() -> bool:
    """True when the compiled loadcodec was built from other sources than those beside it (protocol/compiled.py)."""
    return compiled.stale(loadcodec)


# The loader's fast path needs the compiled codec (interpreted, it is slower than the path it replaces);
# KCOORD_PURE_PYTHON=1 turns it off at run time too, tests flip it to load both ways.
FAST_REPLAY = (loadcodec.COMPILED and not codec_stale()
               and not compiled.pure_python_forced())

BATCH_HEADER_BYTES: Final = 61
_HEAD: Final = struct.Struct(">qi")
# where the header's fields are (reference section 8.1); Final: compiled code reads them as constants
_MAGIC_OFFSET: Final = 16
_CRC_POSITION: Final = 17
ATTRIBUTES_POSITION: Final = 21
LAST_DELTA_POSITION: Final = 23
_BASE_TIMESTAMP_POSITION: Final = 27
_MAX_TIMESTAMP_POSITION: Final = 35
_PRODUCER_ID_POSITION: Final = 43
_PRODUCER_EPOCH_POSITION: Final = 51
RECORDS_COUNT_POSITION: Final = 57
COMPRESSION_MASK: Final = 0x07
_TRANSACTIONAL_FLAG: Final = 0x10
_CONTROL_FLAG: Final = 0x20
DELETE_HORIZON_FLAG: Final = 0x40

ControlType = int
ABORT: Final[ControlType] = 0
COMMIT: Final[ControlType] = 1


class BatchError(Exception):
    """A batch whose bytes are not a valid v2 batch (bad magic, size, CRC or record structure)."""


class LogRecord(Protocol):
    """One record of a batch, as both readers give it (no copy into an object of our own)."""

    @property
    def offset(self) -> int: ...

    @property
    def timestamp(self) -> int: ...

    @property
    def key(self) -> bytes | None: ...

    @property
    def value(self) -> bytes | None: ...


class Batch:
    """One decoded batch: its placement, producer fields and records (or its control marker); treated
    as immutable. A plain class rather than a dataclass: compiled, its ``__init__`` is C, where a
    dataclass's is generated Python that sets each field through a descriptor (~1 us of the ~2 us a
    flush cycle's 3-record batch took to load; a frozen one's took 1.3 us more)."""

    __slots__ = ("attributes", "base_offset", "base_timestamp", "control_type", "is_transactional", "last_offset",
                 "max_timestamp", "producer_epoch", "producer_id", "records", "runs", "size", "unknown")

    def __init__(self, base_offset: int, last_offset: int, size: int, producer_id: int, producer_epoch: int,
                 is_transactional: bool, control_type: ControlType | None, records: Sequence[LogRecord],
                 base_timestamp: int, max_timestamp: int, attributes: int, runs: "list[Run] | None" = None,
                 unknown: int = 0) -> None:
        self.base_offset = base_offset
        self.last_offset = last_offset
        self.size = size
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.is_transactional = is_transactional
        self.control_type = control_type
        self.records = records
        self.base_timestamp = base_timestamp
        self.max_timestamp = max_timestamp
        self.attributes = attributes
        # set instead of ``records`` when read with ``replayable``: the decoded records in runs of
        # consecutive offsets, and how many records of types kcoord does not model were left out
        self.runs = runs
        self.unknown = unknown

    def __repr__(self) -> str:
        return (f"Batch(offsets [{self.base_offset}, {self.last_offset}], {self.size} bytes, producer "
                f"{self.producer_id}/{self.producer_epoch}, control {self.control_type})")


def read_head(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """``(base_offset, total batch size)`` of the batch starting at ``pos``."""
    base_offset, length = _HEAD.unpack_from(buf, pos)
    return base_offset, length + LOG_OVERHEAD


def decode_batch(data: bytes, replayable: bool = False) -> Batch:
    """Decodes a whole batch (``data`` is exactly its bytes), checking magic, CRC and record layout.
    With ``replayable`` and the compiled ``storage.loadcodec``, an uncompressed data batch comes with its
    decoded ``runs`` (and no ``records``): the loader's fast path, same checks, same errors. Neither path
    raises here for a record of a known type that does not parse (RecordError) in a batch whose layout
    does: ``decode_runs`` raises it when the batch's records are read, after recovery kept the batch."""
    if len(data) < BATCH_HEADER_BYTES:
        raise BatchError(f"batch of {len(data)} bytes is shorter than the v2 header")
    if data[_MAGIC_OFFSET] != MAGIC:
        raise BatchError(f"magic {data[_MAGIC_OFFSET]} is not 2")
    attributes = int16_at(data, ATTRIBUTES_POSITION)
    # the crc32c package's (hardware) CRC: ~5 us for a 62 kB batch, against ~45 us in the readers' own
    crc_matches = crc32c(memoryview(data)[ATTRIBUTES_POSITION:]) == uint32_at(data, _CRC_POSITION)
    if replayable and FAST_REPLAY and not attributes & (COMPRESSION_MASK | _CONTROL_FLAG):
        # The loader's path: the header read here (compiled, in line) rather than by a reader object
        # and a Batch built from it, ~1 us of the ~2.1 us a flush cycle's 3-record batch took to read.
        # int, not i64, so that base + delta cannot wrap (a damaged base offset is outside the CRC)
        base_offset: int = int64_at(data, 0)
        last_delta: int = int32_at(data, LAST_DELTA_POSITION)
        if not crc_matches:
            raise BatchError(f"CRC mismatch in batch at offset {base_offset}")
        try:
            runs, unknown = loadcodec.decode_records(data, base_offset)
        except RecordsError as bad_records:  # a name of its own: compiled, a name has one type
            raise BatchError(f"batch at offset {base_offset}: {bad_records}") from bad_records
        except RecordError:
            # A record that does not parse in a whole batch (a writer's, not a torn write: its CRC holds) is
            # not this batch's damage: read on as the pure-Python path reads it, the batch with its reader's
            # records, whose decode_runs raises the RecordError when the loader replays it. Raised here, it
            # came before recovery's own verdict on the batch (offsets gone back: cut as damage; where the
            # journal's run starts: replaced) and failed a partition the other build loaded.
            pass
        else:
            return Batch(base_offset, base_offset + last_delta, len(data),
                         int64_at(data, _PRODUCER_ID_POSITION), int16_at(data, _PRODUCER_EPOCH_POSITION),
                         bool(attributes & _TRANSACTIONAL_FLAG), None, (), int64_at(data, _BASE_TIMESTAMP_POSITION),
                         int64_at(data, _MAX_TIMESTAMP_POSITION), attributes, runs, unknown)
    compressed = attributes & COMPRESSION_MASK
    raw = _reference_reader()(data) if compressed or BatchReader is None else BatchReader(data)
    if not crc_matches:
        raise BatchError(f"CRC mismatch in batch at offset {raw.base_offset}")
    try:
        records = list(raw)
    except Exception as exc:  # corrupt records, an unknown or unavailable codec: never a crash
        raise BatchError(f"batch at offset {raw.base_offset}: {exc!r}") from exc
    control: ControlType | None = None
    if raw.is_control_batch:
        key = records[0].key if records else None
        if key is None or len(key) < 4:
            raise BatchError(f"control batch at offset {raw.base_offset} without a marker key")
        control = int.from_bytes(key[2:4], "big", signed=True)
    return _batch(raw, data, records, control)


def decode_run(buf: bytes, rel: int, end: int, replayable: bool, out: list[Batch], limit: int = 65536) -> int:
    """Appends to ``out`` the batches of ``buf`` from byte ``rel`` on (at least one, then until ``limit``
    bytes: decoded far ahead of their replay, 1,000-record batches loaded ~50% slower) while each is
    whole within ``buf`` and ``end`` (where the file ends, as a position in ``buf``), has a valid size
    and decodes; returns the bytes they take. It stops, consuming nothing more, at the first that does
    not: the caller's own checks (storage.segments.read_segment: a refill, or the damage it reports)
    take over there, so this only ever accepts what they would. Compiled, and not a generator (mypyc's
    generators crashed: tests/protocol/test_compiled.py), it spares the interpreted loop ~4k
    instructions a batch."""
    start = rel
    size = len(buf)
    while rel - start < limit and size - rel >= LOG_OVERHEAD:
        batch_size = int32_at(buf, rel + 8) + LOG_OVERHEAD
        if batch_size < LOG_OVERHEAD + 49 or rel + batch_size > end or rel + batch_size > size:
            break
        try:
            batch = decode_batch(buf[rel : rel + batch_size], replayable)
        except Exception:  # any refusal is raised by the caller's own decode, in order: after the batches
            break  # before it are consumed, which may stop short of it
        out.append(batch)
        rel += batch_size
    return rel - start


def _batch(raw: "DefaultRecordBatch", data: bytes, records: Sequence[LogRecord], control: ControlType | None) -> Batch:
    base_offset = raw.base_offset
    # positional, in the fields' order: keywords cost ~0.3 us more per batch
    return Batch(base_offset, base_offset + raw.last_offset_delta, len(data), raw.producer_id, raw.producer_epoch,
                 raw.is_transactional, control, records, raw.first_timestamp, raw.max_timestamp, raw.attributes)


def decode_runs(records: Sequence[LogRecord]) -> tuple[list[Run], int]:
    """What ``loadcodec.decode_records`` gives, from a batch's reader records: the pure-Python loader's
    path and the reference the compiled one is tested against."""
    first = records[0].offset if records else 0
    # no compaction gaps (every offset checked: a damaged batch with a valid CRC may repeat one inside)
    if records and all(rec.offset == first + i for i, rec in enumerate(records)):
        decoded = [decode_record(rec.key, rec.value) for rec in records]
        if not any(type(r) is UnknownRecord for r in decoded):
            return [(records[0].offset, decoded)], 0  # type: ignore[list-item]
    runs: list[Run] = []
    run: list[LoadedRecord] = []  # records at consecutive offsets (compaction leaves gaps)
    next_expected = unknown = 0
    for rec in records:
        record = decode_record(rec.key, rec.value)
        if isinstance(record, UnknownRecord):
            unknown += 1
            continue
        if rec.offset != next_expected or not run:
            run = []
            runs.append((rec.offset, run))
        run.append(record)
        next_expected = rec.offset + 1
    return runs, unknown


# baseOffset batchLength leaderEpoch magic crc attributes lastOffsetDelta baseTimestamp maxTimestamp
# producerId producerEpoch baseSequence recordsCount (reference section 8.1)
_HEADER: Final = struct.Struct(">qiibIhiqqqhii")
_CRC: Final = struct.Struct(">I")


def rebuild_batch(raw: bytes, keep: set[int], horizon: int | None) -> bytes:
    """``raw`` with only the records at offsets in ``keep``, uncompressed, same base offset, producer
    fields and leader epoch; baseTimestamp is ``horizon`` (with bit 6) when given. Written by hand
    because kafka-python's builder cannot set the delete horizon, and with it set every record's
    timestamp delta must be relative to the horizon (the log cleaner's output)."""
    head = _HEADER.unpack_from(raw)
    base, epoch, magic, attributes = head[0], head[2], head[3], head[5]
    producer_id, producer_epoch, base_sequence = head[9], head[10], head[11]
    records = [r for r in _reference_reader()(raw) if r.offset in keep]
    base_ts = horizon if horizon is not None else records[0].timestamp
    body = bytearray(_HEADER.size)
    for r in records:
        _encode_record(body, r.offset - base, r.timestamp - base_ts, r.key, r.value, r.headers)
    attributes &= ~(COMPRESSION_MASK | DELETE_HORIZON_FLAG)
    if horizon is not None:
        attributes |= DELETE_HORIZON_FLAG
    last_delta = records[-1].offset - base
    max_ts = max(r.timestamp for r in records)
    length = len(body) - LOG_OVERHEAD
    fields = (attributes, last_delta, base_ts, max_ts, producer_id, producer_epoch, base_sequence, len(records))
    _HEADER.pack_into(body, 0, base, length, epoch, magic, 0, *fields)
    _CRC.pack_into(body, _CRC_POSITION, crc32c(bytes(body[ATTRIBUTES_POSITION:])))
    return bytes(body)


def _encode_record(
    out: bytearray,
    offset_delta: int,
    timestamp_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, bytes | None]],
) -> None:
    """One v2 record (reference section 8.2): length, attributes 0, deltas, key, value, headers."""
    from kafka.record.util import encode_varint  # imported by _reference_reader already: a dict lookup

    rec = bytearray(b"\x00")
    encode_varint(timestamp_delta, rec.append)
    encode_varint(offset_delta, rec.append)
    _put_bytes(rec, key)
    _put_bytes(rec, value)
    encode_varint(len(headers), rec.append)
    for h_key, h_value in headers:
        _put_bytes(rec, h_key.encode("utf-8"))
        _put_bytes(rec, h_value)
    encode_varint(len(rec), out.append)
    out += rec


def _put_bytes(out: bytearray, data: bytes | None) -> None:
    from kafka.record.util import encode_varint

    if data is None:
        encode_varint(-1, out.append)
        return
    encode_varint(len(data), out.append)
    out += data
