"""``storage.loadcodec`` (the loader's whole-batch decoder) gives exactly what the reference path gives:
aiokafka's or kafka-python's record reader plus ``protocol.records.decode_record``, for the same bytes:
same records, same runs, same errors. Every test runs twice: against the mypyc-compiled module (when the
install built it) and against its source, interpreted, so both builds stay correct."""

import struct
from pathlib import Path
from types import ModuleType
from typing import Any

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder

import storage.batch as batch_module
import storage.loadcodec as installed
from protocol.codec import write_uvarint
from protocol.records import (
    GroupMetadata,
    GroupMetadataRecord,
    MemberMetadata,
    OffsetAndMetadata,
    OffsetCommitRecord,
    OffsetKey,
    RecordError,
    encode_offset_value,
    encode_record,
)
from storage.batch import BatchError, decode_batch, decode_runs, rebuild_batch
from storage.batchwriter import Entry, build_batch
from tests.interpreted import interpreted, skip_unless_the_machine_compiles

T = 1_700_000_000_000
SOURCE = Path(installed.__file__).with_name("loadcodec.py")


PURE = interpreted(installed)


@pytest.fixture(params=["compiled", "interpreted"])
def codec(request: pytest.FixtureRequest) -> ModuleType:
    if request.param == "interpreted":
        return PURE
    if not installed.COMPILED:
        pytest.skip("this install has no compiled loadcodec (no C compiler, or KCOORD_PURE_PYTHON at install)")
    return installed


def test_the_interpreted_module_is_really_interpreted() -> None:
    assert not PURE.compiled() and PURE.__file__ == str(SOURCE)


def test_compiled_when_the_machine_can_compile() -> None:
    """A build that silently stopped compiling would otherwise only show up as a slower restart."""
    skip_unless_the_machine_compiles()
    assert installed.COMPILED, ("storage/loadcodec was not compiled: see the 'kcoord build:' line of pip install -v -e "
                                ". (an install made with KCOORD_PURE_PYTHON=1 is tested with it set too)")
    assert not batch_module.codec_stale(), "the compiled storage/loadcodec is older than its source: pip install -e ."
    assert batch_module.FAST_REPLAY


def reference(data: bytes) -> tuple[list[Any], int]:
    return decode_runs(decode_batch(data).records)


def decoded(codec: ModuleType, data: bytes) -> tuple[list[Any], int]:
    """The codec's runs, with every kept offset value (bytes: see ``test_offset_values_are_kept_as_read``)
    read back through ``loaded_value``, for comparison with the reference's records."""
    runs, unknown = codec.decode_records(data, struct.unpack_from(">q", data)[0])
    return [(start, [_read_back(codec, r) for r in run]) for start, run in runs], unknown


_TOMBSTONE = ([(0, [OffsetCommitRecord(OffsetKey("g", "t", 0), None)])], 0)  # (runs, unknown)


def _outcome(codec: ModuleType | None, data: bytes) -> Any:
    try:
        return reference(data) if codec is None else decoded(codec, data)
    except (BatchError, RecordError) as exc:
        return type(exc)
    except Exception as exc:
        if codec is not None and isinstance(exc, codec.RecordsError):
            return BatchError
        raise


def _read_back(codec: ModuleType, record: Any) -> Any:
    """A loaded commit, (group, topic, partition, value bytes or None), as the reference's record reads."""
    if type(record) is tuple and len(record) == 4:
        value = record[3]
        return record[:3], codec.loaded_value(value) if type(value) is bytes else None
    return record


def value_bytes(version: int, value: OffsetAndMetadata) -> bytes:
    """Offset values in every version Kafka has written (v3 through the encoder the live path uses)."""
    meta = value.metadata.encode()
    head = struct.pack(">hq", version, value.offset)
    if version == 3:
        return encode_offset_value(value._replace(expire_timestamp=-1))
    tail = struct.pack(">qq", value.commit_timestamp, value.expire_timestamp) if version == 1 else (
        struct.pack(">q", value.commit_timestamp))
    return head + struct.pack(">h", len(meta)) + meta + tail


names = st.text(min_size=0, max_size=12)
offset_values = st.builds(
    OffsetAndMetadata,
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(2**31), 2**31 - 1),
    st.text(max_size=20),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(2**63), 2**63 - 1),
)


@st.composite
def entries(draw: Any) -> tuple[bytes | None, bytes | None]:
    kind = draw(st.sampled_from(["offset", "offset", "offset", "tombstone", "legacy", "group", "unknown", "raw"]))
    key = OffsetKey(draw(names), draw(names), draw(st.integers(-(2**31), 2**31 - 1)))
    if kind in ("offset", "legacy"):
        k, _ = encode_record(OffsetCommitRecord(key, None))
        if kind == "legacy":
            k = b"\x00\x00" + k[2:]
        version = draw(st.sampled_from([0, 1, 2, 3]))
        value = draw(offset_values)
        if version in (0, 2):
            value = value._replace(expire_timestamp=-1)
        if version != 3:
            value = value._replace(leader_epoch=-1)
        return k, value_bytes(version, value)
    if kind == "tombstone":
        return encode_record(OffsetCommitRecord(key, None))
    if kind == "group":
        member = MemberMetadata(draw(names), None, "client", "/127.0.0.1", 300, 10, b"\x01", b"")
        meta = GroupMetadata("consumer", draw(st.integers(0, 100)), "range", member.member_id, T, (member,))
        return encode_record(GroupMetadataRecord(draw(names), draw(st.sampled_from([meta, None]))))
    if kind == "unknown":
        return struct.pack(">h", draw(st.integers(3, 20))) + draw(st.binary(max_size=6)), draw(st.binary(max_size=6))
    # arbitrary bytes, often starting like an offset key: must fail (or decode) exactly as the reference does
    rtype = struct.pack(">h", draw(st.sampled_from([0, 1, 2])))
    return rtype + draw(st.binary(max_size=30)), draw(st.one_of(st.none(), st.binary(max_size=40)))


def same(codec: ModuleType, data: bytes) -> None:
    try:
        expected = reference(data)
    except RecordError:
        with pytest.raises(RecordError):
            decoded(codec, data)
        return
    assert decoded(codec, data) == expected


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(entries(), min_size=1, max_size=30), st.integers(0, 2**40))
def test_batches_decode_as_the_reference_does(codec: ModuleType, items: list[Any], base: int) -> None:
    same(codec, build_batch(base, items, T))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(entries(), min_size=2, max_size=30), st.data())
def test_compaction_gaps_split_runs(codec: ModuleType, items: list[Any], data: Any) -> None:
    raw = build_batch(1000, items, T)
    keep = set(data.draw(st.sets(st.integers(1000, 1000 + len(items) - 1), min_size=1)))
    same(codec, rebuild_batch(raw, keep, data.draw(st.sampled_from([None, T + 5]))))


def test_runs_and_unknown_records(codec: ModuleType) -> None:
    a = encode_record(OffsetCommitRecord(OffsetKey("g", "t", 0), OffsetAndMetadata(5, 1, "", T)))
    b = encode_record(OffsetCommitRecord(OffsetKey("g", "t", 1), None))
    unknown = (b"\x00\x07xyz", b"v")
    raw = build_batch(10, [a, unknown, b, a, a], T)
    runs, skipped = decoded(codec, rebuild_batch(raw, {10, 11, 12, 14}, None))
    assert skipped == 1
    assert [(start, len(run)) for start, run in runs] == [(10, 1), (12, 1), (14, 1)]
    assert runs[1][1][0] == OffsetCommitRecord(OffsetKey("g", "t", 1), None)
    # offset commits come as flat plain tuples standing for the records (LoadedCommit)
    loaded = runs[0][1][0]
    assert loaded == OffsetCommitRecord(OffsetKey("g", "t", 0), OffsetAndMetadata(5, 1, "", T))
    flat = codec.decode_records(rebuild_batch(raw, {10, 11, 12, 14}, None), 0)[0][0][1][0]
    assert type(flat) is tuple and flat[:3] == ("g", "t", 0) and type(flat[3]) is bytes


def test_offset_values_are_kept_as_read(codec: ModuleType) -> None:
    """Memory and time: a loaded offset is cached as the value's bytes from the log (no OffsetAndMetadata,
    nothing the garbage collector tracks), and ``loaded_value`` reads them back, in every value version."""
    values = [(3, OffsetAndMetadata(7, 4, "m\u00e9ta", T)), (2, OffsetAndMetadata(8, -1, "", T + 1)),
              (1, OffsetAndMetadata(9, -1, "x", T + 2, T + 9)), (0, OffsetAndMetadata(10, -1, "", T + 3))]
    entries: list[Entry] = [(encode_record(OffsetCommitRecord(OffsetKey("g", "t", p), None))[0],
                             value_bytes(version, value)) for p, (version, value) in enumerate(values)]
    runs, _ = codec.decode_records(build_batch(0, entries, T), 0)
    kept = [record[3] for _, run in runs for record in run]
    assert kept == [value for _, value in entries]
    assert all(type(raw) is bytes for raw in kept)
    assert [codec.loaded_value(raw) for raw in kept] == [value for _, value in values]


@pytest.mark.parametrize("raw", [b"", b"\x00\x03" + bytes(13), b"\x00\x04" + bytes(24),
                                 b"\x00\x03" + bytes(12) + b"\x00\x01\xff" + bytes(8), b"\x00\x00" + bytes(19)])
def test_loaded_value_refuses_what_the_loader_would_not_keep(codec: ModuleType, raw: bytes) -> None:
    """Short, of an unknown version, metadata that is not UTF-8, sizes that do not add up."""
    with pytest.raises(ValueError):
        codec.loaded_value(raw)


headers = st.lists(st.tuples(st.text(max_size=4), st.one_of(st.none(), st.binary(max_size=4))), max_size=3)


def with_headers(items: list[tuple[bytes | None, bytes | None]], record_headers: list[Any]) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    for delta, (key, value) in enumerate(items):
        builder.append(delta, T, key, value, record_headers)
    return bytes(builder.build())


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(entries(), min_size=1, max_size=10), headers)
def test_headers_are_checked_and_skipped(codec: ModuleType, items: list[Any], record_headers: list[Any]) -> None:
    same(codec, with_headers(items, record_headers))


def test_headers_are_skipped(codec: ModuleType) -> None:
    key, value = encode_record(OffsetCommitRecord(OffsetKey("g", "t", 0), OffsetAndMetadata(5, 1, "m", T)))
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    builder.append(0, T, key, value, [("h", b"x"), ("n", None)])
    builder.append(1, T, key, None, [])
    same(codec, bytes(builder.build()))


def signed(data: bytearray) -> bytes:
    struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[21:])))
    return bytes(data)


def test_an_offset_repeated_inside_a_batch_splits_the_runs_as_the_reference_does(codec: ModuleType) -> None:
    """Found by the damage test below: a batch whose first and last offsets span exactly its count but
    which repeats one inside (a damaged batch with a valid CRC). Both paths now check every offset."""
    entry = encode_record(OffsetCommitRecord(OffsetKey("g", "t", 0), OffsetAndMetadata(5, 1, "", T)))
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    for delta in (0, 1, 2, 0, 4):
        builder.append(delta, T, *entry, [])
    data = bytes(builder.build())
    same(codec, data)
    assert [(start, len(run)) for start, run in reference(data)[0]] == [(0, 3), (0, 1), (4, 1)]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(entries(), min_size=1, max_size=5), st.data())
def test_damaged_records_sections_are_refused_like_the_reference(codec: ModuleType, items: list[Any],
                                                                 data: Any) -> None:
    """Bytes changed, cut or added after the header (CRC made valid again, as a buggy writer would):
    the codec refuses with RecordsError (a BatchError for the loader) or decodes the same records."""
    raw = bytearray(with_headers(items, data.draw(headers)) if data.draw(st.booleans()) else build_batch(0, items, T))
    how = data.draw(st.sampled_from(["flip", "cut", "extend", "count"]))
    if how == "flip":
        i = data.draw(st.integers(61, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    elif how == "cut":
        del raw[data.draw(st.integers(61, len(raw) - 1)):]
    elif how == "extend":
        raw += data.draw(st.binary(min_size=1, max_size=8))
    else:
        struct.pack_into(">i", raw, 57, data.draw(st.integers(-2, len(items) + 2)))
    struct.pack_into(">i", raw, 8, len(raw) - 12)
    damaged = signed(raw)
    assert _outcome(codec, damaged) == _outcome(None, damaged)


def test_decode_batch_uses_the_codec_only_when_asked_and_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    entry = encode_record(OffsetCommitRecord(OffsetKey("g", "t", 0), OffsetAndMetadata(5, 1, "", T)))
    data = build_batch(3, [entry, entry], T)
    monkeypatch.setattr(batch_module, "FAST_REPLAY", True)
    fast = decode_batch(data, replayable=True)
    assert fast.runs is not None and fast.records == () and fast.last_offset == 4
    assert [(start, [_read_back(installed, r) for r in run]) for start, run in fast.runs] == reference(data)[0]
    assert decode_batch(data).runs is None
    monkeypatch.setattr(batch_module, "FAST_REPLAY", False)
    assert decode_batch(data, replayable=True).runs is None


def test_any_negative_value_length_is_a_null_as_kafka_reads_it(codec: ModuleType) -> None:
    """Found by the property above: a value length of -65 (varint 0x81 0x01) is a null value for
    Kafka's DefaultRecord and the reference readers, so a tombstone, not a refusal."""
    raw = bytearray(build_batch(0, [(b"\x00" * 10, b"\x01")], T))
    assert raw[76] == 0x02  # the value's length, 1, zigzag-encoded, just after the 10-byte key
    raw[76] = 0x81
    damaged = signed(raw)
    assert decoded(codec, damaged) == reference(damaged) == ([(0, [OffsetCommitRecord(OffsetKey("", "", 0), None)])], 0)


def _zigzag_varint(value: int) -> bytes:
    """Kafka's varlong encoding of any int, as many bytes as it takes (more than 10 for huge ones)."""
    return write_uvarint((value << 1) ^ (value >> 127))  # zigzag over 128 bits: enough for the values here


@pytest.mark.parametrize("field", ["key", "value", "header key", "header value"])
@pytest.mark.parametrize("length", [2**31, 2**62, 2**63 + 5, 2**69, -(2**69)])
def test_huge_field_lengths_are_refused_like_the_reference(codec: ModuleType, field: str, length: int) -> None:
    """A length read from the bytes far beyond the record (up to the 10-byte varint's 70 bits) is refused
    as the reference refuses it, never an overflow: the compiled codec keeps positions in C integers."""
    fields = {"key": b"\x00\x01k", "value": b"v", "header key": b"h", "header value": b"x"}
    def part(name: str) -> bytes:
        data = fields[name]
        return (_zigzag_varint(length) if name == field else _zigzag_varint(len(data))) + data
    body = b"\x00" + _zigzag_varint(0) + _zigzag_varint(0) + part("key") + part("value") + _zigzag_varint(1) \
        + part("header key") + part("header value")
    raw = bytearray(build_batch(0, [(b"\x00\x01k", b"v")], T)[:61]) + _zigzag_varint(len(body)) + body
    struct.pack_into(">i", raw, 8, len(raw) - 12)
    data = signed(raw)
    assert _outcome(codec, data) == _outcome(None, data)


def _one_record(klen: bytes, key: bytes, vlen: bytes, value: bytes, headers: bytes) -> bytes:
    body = b"\x00\x00\x00" + klen + key + vlen + value + headers  # attributes, timestampDelta, offsetDelta
    raw = bytearray(build_batch(0, [(key, None)], T)[:61]) + _zigzag_varint(len(body)) + body
    struct.pack_into(">i", raw, 8, len(raw) - 12)
    return signed(raw)


@pytest.mark.parametrize("length", [-1, -65, -(2**31), -(2**63), -(2**63) - 1, -(2**64), -(2**69)])
def test_a_null_value_of_any_negative_length_is_a_tombstone(codec: ModuleType, length: int) -> None:
    """Found by review: after an offset-commit key, a value length below what an i64 holds (a 10-byte
    varint) made the compiled codec raise ValueError, which no loader path expects; the reference reads
    a null value. A varint keeps its low 64 bits, as aiokafka's reader and Kafka's readVarlong do."""
    key, _ = encode_record(OffsetCommitRecord(OffsetKey("g", "t", 0), None))
    data = _one_record(_zigzag_varint(len(key)), key, _zigzag_varint(length), b"", b"\x00")
    assert _outcome(codec, data) == _outcome(None, data) == _TOMBSTONE


@pytest.mark.parametrize("field", ["key", "value", "headers"])
def test_bits_beyond_64_of_a_varint_are_dropped_as_the_reference_drops_them(codec: ModuleType, field: str) -> None:
    key, _ = encode_record(OffsetCommitRecord(OffsetKey("g", "t", 0), None))
    beyond = 1 << 64
    klen = write_uvarint((beyond if field == "key" else 0) + 2 * len(key))
    vlen = write_uvarint((beyond if field == "value" else 0) + 1)  # -1: a null value
    headers = write_uvarint(beyond if field == "headers" else 0)
    data = _one_record(klen, key, vlen, b"", headers)
    assert max(len(klen), len(vlen), len(headers)) == 10
    assert _outcome(codec, data) == _outcome(None, data) == _TOMBSTONE


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(-(2**63), 2**63 - 1) | st.sampled_from([0, -1, 63, 64, -65, 2**62, 2**63 - 1, -(2**63)]),
       st.integers(0, 3))
def test_varints_of_every_length_read_as_kafka_reads_them(codec: ModuleType, value: int, before: int) -> None:
    """The varint reader has a one-byte path, a 64-bit one up to 9 bytes and an exact one for the 10th;
    every length must read the same (a zigzag varlong, Kafka's ByteUtils), and one cut short is refused."""
    encoded = _zigzag_varint(value)
    data = b"\xff" * before + encoded + b"\x00"
    assert codec._varint(data, before, len(data)) == (value, before + len(encoded))
    with pytest.raises(codec.RecordsError):
        codec._varint(data, before, before + len(encoded) - 1)  # the record ends inside it


@pytest.mark.parametrize(("base", "deltas"), [(1, [2**63 - 1]), (0, [2**63 - 1, -(2**63)]), (2**63 - 1, [0, 1])])
def test_offsets_past_64_bits_do_not_wrap(codec: ModuleType, base: int, deltas: list[int]) -> None:
    """Found by review: reading one-byte varints in line made the offset delta a C integer, and a corrupt
    delta near 2^63 (CRC intact) wrapped the record's offset in the compiled codec, merging runs that are
    apart. Offsets are Python ints, as the reference reader's are."""
    key, _ = encode_record(OffsetCommitRecord(OffsetKey("g", "t", 0), None))
    raw = bytearray(build_batch(0, [(key, None)], T)[:61])
    for delta in deltas:
        body = b"\x00\x00" + _zigzag_varint(delta) + _zigzag_varint(len(key)) + key + _zigzag_varint(-1) + b"\x00"
        raw += _zigzag_varint(len(body)) + body
    struct.pack_into(">i", raw, 57, len(deltas))
    runs, unknown = codec.decode_records(bytes(raw), base)
    expected: list[tuple[int, int]] = []
    for delta in deltas:
        if expected and expected[-1][0] + expected[-1][1] == base + delta:
            expected[-1] = (expected[-1][0], expected[-1][1] + 1)
        else:
            expected.append((base + delta, 1))
    assert [(start, len(run)) for start, run in runs] == expected and unknown == 0
