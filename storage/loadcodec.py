"""Loading's hot loop: the records of a whole uncompressed v2 batch decoded straight from its bytes into
``__consumer_offsets`` records, with no per-record reader objects in between.

Written for mypyc (plain ints and bytes indexing, no closures; byte arithmetic in ``i64``, which mypyc
keeps in C registers where an ``int`` would be boxed and overflow-checked: decoding ~30% faster): built
as a C extension when the package is installed with a compiler present (setup.py), where it replaces
aiokafka's record reader plus ``protocol.records.decode_record`` on the loader's path. Interpreted it is
slower than those two C-assisted steps, so the loader only uses it compiled (``COMPILED``); the tests run it both ways
against the reference readers. Offset commits of key v0/v1 and value v0-v3 (all Kafka writes) are read
here, their values checked and kept as bytes (``loaded_value``); every other record goes through
``decode_record`` (same results, same errors).
"""

from typing import Final, NoReturn

from mypy_extensions import i64

from protocol.hotcodec import int16_at, int32_at, int64_at, value_leader_epoch, value_metadata_at
from protocol.records import (
    OFFSET_COMMIT_LEGACY_TYPE,
    OFFSET_COMMIT_TYPE,
    LoadedCommit,
    LoadedRecord,
    OffsetAndMetadata,
    RecordError,
    UnknownRecord,
    decode_record,
)

RECORDS_START: Final = 61  # the v2 batch header's size (reference section 8.1)
_COUNT_POSITION: Final = 57
_NAMES_MAX: Final = 1 << 16
_LOW_64: Final = (1 << 64) - 1

# ``(first log offset, records at consecutive offsets)``: compaction leaves gaps between runs.
Run = tuple[int, list[LoadedRecord]]


class RecordsError(ValueError):
    """The records section does not parse as its header says (a batch that is not valid v2)."""


def compiled() -> bool:
    """Whether this module runs as mypyc's C extension rather than from its source."""
    return not __file__.endswith(".py")


COMPILED: Final = compiled()

# Final: mypyc keeps these in C statics instead of looking them up in the module's dict on every use.
_names: Final[dict[bytes, str]] = {}
_new: Final = tuple.__new__
_OffsetAndMetadata: Final = OffsetAndMetadata
_COMMIT: Final = OFFSET_COMMIT_TYPE  # compared for every record loaded
_LEGACY_COMMIT: Final = OFFSET_COMMIT_LEGACY_TYPE


def _name(raw: bytes) -> str:
    """Group and topic names shared across keys (1M keys have a few thousand names: memory and time)."""
    name = _names.get(raw)
    if name is None:
        if len(_names) >= _NAMES_MAX:
            _names.clear()
        name = raw.decode()
        _names[raw] = name
    return name


class _Previous:
    """The previous offset key's group and topic, and its bytes but the partition's (version, group,
    topic): the keys of one commit share them. One slice and comparison of those bytes then stands for
    parsing, slicing and hashing the names again. Comparing them a byte at a time, as this did, cost
    ~550 instructions a record; ``bytes.startswith`` (no slice) more, for parsing its arguments
    (cachegrind)."""

    def __init__(self) -> None:
        self.head = b""
        self.group = self.topic = ""


def _offset_record(
    data: bytes, kpos: i64, kend: i64, vpos: i64, vend: i64, prev: _Previous
) -> LoadedCommit | None:
    """The offset commit whose key is ``data[kpos:kend]`` and value ``data[vpos:vend]`` (vpos -1 for a
    tombstone), as one flat tuple (``LoadedCommit``); None for anything it does not read exactly (the
    schema decoders then decide)."""
    if kend - kpos < 8:
        return None
    tend = kend - 4  # the partition is the key's last 4 bytes
    head = data[kpos:tend]
    if head == prev.head:
        group, topic = prev.group, prev.topic  # the same bytes: the same checked names
    else:
        glen = int16_at(data, kpos + 2)
        gstart = kpos + 4
        tpos = gstart + glen
        if glen < 0 or tpos + 2 > kend:
            return None
        tlen = int16_at(data, tpos)
        if tlen < 0 or tpos + 2 + tlen != tend:
            return None
        try:
            group = _name(data[gstart:tpos])
            topic = _name(data[tpos + 2 : tend])
        except UnicodeDecodeError:
            return None
        prev.head, prev.group, prev.topic = head, group, topic
    partition = int32_at(data, tend)
    if vpos < 0:
        return group, topic, partition, None
    if _metadata_end(data, vpos, vend) < 0:
        return None
    return group, topic, partition, data[vpos:vend]


def _metadata_end(data: bytes, vpos: i64, vend: i64, check_text: bool = True) -> i64:
    """Where the metadata of the offset-commit value ``data[vpos:vend]`` ends, or -1 unless the value
    is one this module reads exactly (v0-v3, sizes that add up, UTF-8 metadata unless ``check_text``
    is False: ``loaded_value`` decodes it anyway). What the loader keeps and what ``loaded_value``
    reads back are checked by this one function."""
    if vend - vpos < 12:
        return -1
    version = int16_at(data, vpos)
    if not 0 <= version <= 3:
        return -1
    mpos = vpos + value_metadata_at(version)
    tail: i64 = 16 if version == 1 else 8  # the commit timestamp, and v1's expire timestamp
    if mpos > vend:
        return -1
    mlen = int16_at(data, mpos - 2)
    mend = mpos + mlen
    if mlen < 0 or mend + tail != vend:
        return -1
    if mlen and check_text:
        try:
            data[mpos:mend].decode()
        except UnicodeDecodeError:
            return -1
    return mend


def loaded_value(raw: bytes) -> OffsetAndMetadata:
    """The committed offset a loaded value stands for. The loader keeps an offset commit's value as the
    bytes it read (checked by ``_metadata_end``), not as an OffsetAndMetadata: ~64 bytes of RSS instead of
    ~112 (the tuple and its offset's int), one allocation instead of three, and nothing for the garbage
    collector to track, which is what loading a large log spent most of its time on after decoding.
    Read this way when a handler reads it (coordinator.state.offset_value); raises ValueError for bytes
    the loader would not have kept (UnicodeDecodeError, a ValueError, for metadata that is not UTF-8:
    it is decoded once, here)."""
    size: i64 = len(raw)
    mend = _metadata_end(raw, 0, size, False)
    if mend < 0:
        raise ValueError("not an offset-commit value the loader keeps")
    version = int16_at(raw, 0)
    epoch = value_leader_epoch(raw, 0, version)
    mpos = value_metadata_at(version)
    metadata = raw[mpos:mend].decode() if mend > mpos else ""
    expire_ts = int64_at(raw, mend + 8) if version == 1 else -1
    return _new(_OffsetAndMetadata, (int64_at(raw, 2), epoch, metadata, int64_at(raw, mend), expire_ts))


def decode_records(data: bytes, base_offset: int) -> tuple[list[Run], int]:
    """``(runs, unknown)``: every record of the uncompressed batch ``data`` (CRC already checked), in
    runs of consecutive offsets, and how many were of types kcoord does not model (left out). Raises
    RecordsError for a records section that does not parse, RecordError for a corrupt known record."""
    size: i64 = len(data)
    if size < RECORDS_START:
        raise RecordsError(f"batch of {size} bytes is shorter than the v2 header")
    count = int32_at(data, _COUNT_POSITION)
    runs: list[Run] = []
    run: list[LoadedRecord] = []
    run_start = next_expected = -1
    unknown = 0
    error: RecordError | None = None
    prev = _Previous()
    pos: i64 = RECORDS_START
    # Positions are i64 (C integers when compiled); a length read from the bytes is checked against the
    # bytes left before it moves a position, so a huge one is refused here rather than overflowing.
    for _i in range(count):
        # length, attributes, timestampDelta, offsetDelta, key, value, headers (reference section 8.2)
        # Each one-byte varint (nearly every field of an offsets record) is read in line, here and
        # below: mypyc does not inline calls, and a call to _varint per field cost ~190 instructions
        # a record of the ~2,860 a loaded record took (cachegrind). Longer ones, and the refusals, are
        # _varint's.
        b: i64 = data[pos] if pos < size else 0x80
        if b < 0x80:
            length: int = (b >> 1) ^ -(b & 1)
            pos += 1
        elif pos + 1 < size and data[pos + 1] < 0x80:  # two bytes: a record of 64-8191 bytes
            b2: i64 = data[pos + 1]
            b = (b & 0x7F) | (b2 << 7)
            length = (b >> 1) ^ -(b & 1)
            pos += 2
        else:
            length, pos = _varint(data, pos, size)
        if length < 6 or length > size - pos:
            raise RecordsError(f"record of {length} bytes at byte {pos} does not fit the batch")
        end: i64 = pos + length
        # attributes (an int8, read as a varint as the reference readers do), then timestampDelta
        # (every record of a flush carries the batch's time): skipped, one byte each nearly always
        if pos + 1 < end and data[pos] < 0x80 and data[pos + 1] < 0x80:
            pos += 2
        else:
            pos = _skip_varint(data, pos, end)
            pos = _skip_varint(data, pos, end)
        b = data[pos] if pos < end else 0x80
        if b < 0x80:
            # int, not i64: base_offset + delta must not wrap (a corrupt delta near 2^63, CRC intact)
            delta: int = (b >> 1) ^ -(b & 1)
            pos += 1
        elif pos + 1 < end and data[pos + 1] < 0x80:  # two bytes: the 64th to 8191st record of a batch
            b2 = data[pos + 1]
            b = (b & 0x7F) | (b2 << 7)
            delta = (b >> 1) ^ -(b & 1)
            pos += 2
        else:
            delta, pos = _varint(data, pos, end)
        b = data[pos] if pos < end else 0x80
        if b < 0x80:
            klen = (b >> 1) ^ -(b & 1)
            pos += 1
        else:
            klen, pos = _varint(data, pos, end)
        kpos: i64 = pos
        if klen >= 0:
            if klen > end - pos:  # _advance, in line
                _past_record(klen, pos)
            pos += klen
        b = data[pos] if pos < end else 0x80
        if b < 0x80:
            vlen = (b >> 1) ^ -(b & 1)
            pos += 1
        else:
            vlen, pos = _varint(data, pos, end)
        vpos: i64 = pos
        vend: i64 = -1
        if vlen >= 0:
            if vlen > end - pos:
                _past_record(vlen, pos)
            pos += vlen
            vend = pos
        else:
            vpos = -1
        b = data[pos] if pos < end else 0x80
        if b < 0x80:
            headers = (b >> 1) ^ -(b & 1)
            pos += 1
        else:
            headers, pos = _varint(data, pos, end)
        for _h in range(headers):  # kcoord has no use for them, but they must be well formed
            hlen, pos = _varint(data, pos, end)
            if hlen < 0 or hlen > end - pos:
                raise RecordsError(f"record header key of {hlen} bytes at byte {pos}")
            try:
                data[pos : pos + hlen].decode()
            except UnicodeDecodeError as not_utf8:  # compiled, one name holds one type: ``exc`` is below
                raise RecordsError(f"record header key at byte {pos} is not UTF-8") from not_utf8
            pos += hlen
            hlen, pos = _varint(data, pos, end)
            if hlen > 0:
                pos = _advance(pos, hlen, end)
        # any negative key or value length is a null, as Kafka's DefaultRecord and the reference readers read it
        if pos != end or headers < 0:
            raise RecordsError(f"record at byte {end - length} does not match its length")
        if error is not None:
            continue  # a corrupt record was found: only the remaining layout is still checked
        record: LoadedRecord | UnknownRecord | None = None
        if klen >= 2:
            rtype = int16_at(data, kpos)
            if rtype == _COMMIT or rtype == _LEGACY_COMMIT:
                record = _offset_record(data, kpos, kpos + klen, vpos, vend, prev)
        if record is None:
            key = data[kpos : kpos + klen] if klen >= 0 else None
            value = data[vpos:vend] if vpos >= 0 else None
            try:
                record = decode_record(key, value)
            except RecordError as exc:
                error = exc
                continue
            if type(record) is UnknownRecord:
                unknown += 1
                continue
        offset = base_offset + delta
        if offset != next_expected:
            if run:
                runs.append((run_start, run))
            run = []
            run_start = offset
        run.append(record)  # type: ignore[arg-type]
        next_expected = offset + 1
    if pos != size:
        raise RecordsError(f"{size - pos} bytes follow the batch's {count} records")
    if error is not None:
        raise error  # as the reference readers do: a batch's layout is checked before its records
    if run:
        runs.append((run_start, run))
    return runs, unknown


def _advance(pos: i64, n: int, end: i64) -> i64:
    """``pos`` moved past ``n`` bytes of a field; past ``end`` (the record's) it is refused here, where
    the next read would refuse it anyway, before a huge ``n`` (up to 2^63 - 1: ``_varint`` keeps 64
    bits) could overflow the position."""
    if n > end - pos:
        _past_record(n, pos)
    return pos + n


def _past_record(n: int, pos: i64) -> NoReturn:
    raise RecordsError(f"field of {n} bytes at byte {pos} runs past its record")


def _skip_varint(data: bytes, pos: i64, end: i64) -> i64:
    """The position after the varint at ``pos`` (at most 10 bytes), for a field whose value is not used."""
    limit = min(end, pos + 10)
    while pos < limit:
        b: i64 = data[pos]
        pos += 1
        if b < 0x80:
            return pos
    raise RecordsError(f"varint at byte {pos} runs past its record")


def _varint(data: bytes, pos: i64, end: i64) -> tuple[int, i64]:
    """A zigzag varint (at most 10 bytes) at ``pos`` and the position after it."""
    if pos < end:
        b: i64 = data[pos]
        if b < 0x80:  # one byte, as nearly every field of an offsets record is: no loop
            return (b >> 1) ^ -(b & 1), pos + 1
    # Up to 9 bytes (63 bits) fit an i64: a record's length (two bytes from 64 bytes on) is read
    # without the arbitrary-precision ints and the 64-bit mask below (~60 instructions a record).
    value64: i64 = 0
    shift64: i64 = 0
    at = pos
    while at < end and shift64 < 63:
        b = data[at]
        at += 1
        value64 |= (b & 0x7F) << shift64
        if b < 0x80:
            return (value64 >> 1) ^ -(value64 & 1), at
        shift64 += 7
    shift = 0
    value = 0  # an int while it is read: a 10th byte carries bits beyond 64, dropped below
    while True:
        if pos >= end or shift > 63:
            raise RecordsError(f"varint at byte {pos} runs past its record")
        byte: int = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            break
        shift += 7
    value &= _LOW_64  # as aiokafka's reader and Kafka's readVarlong keep it: the low 64 bits
    return (value >> 1) ^ -(value & 1), pos
