"""Record batch bytes from reference section 19.3 (reproduced there with Java's CRC32C)."""

import struct

import crc32c
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder

import storage.batch as batch_module
from storage.batch import DELETE_HORIZON_FLAG, BatchError, decode_batch, rebuild_batch
from storage.batchwriter import build_batch, build_batches

T = 1700000000000
KEY = bytes.fromhex("000100097465737447726f75700003666f6f00000000")
VALUE = bytes.fromhex("00030000000000000064ffffffff00000000018bcfe56800")
ONE_RECORD = (
    "00000000000000000000006600000000022ddaaf6f0000000000000000018bcfe568000000018bcfe56800ffffffffffffffffff"
    "ffffffffff00000001680000002c000100097465737447726f75700003666f6f000000003000030000000000000064ffffffff0000"
    "0000018bcfe5680000"
)
TOMBSTONE_AT_5 = (
    "00000000000000050000004e0000000002134634830000000000000000018bcfe568000000018bcfe56800ffffffffffffffffff"
    "ffffffffff00000001380000002c000100097465737447726f75700003666f6f000000000100"
)


def test_one_record_batch_vector() -> None:
    assert build_batch(0, [(KEY, VALUE)], T).hex() == ONE_RECORD


def test_tombstone_batch_vector_with_base_offset_5() -> None:
    assert build_batch(5, [(KEY, None)], T).hex() == TOMBSTONE_AT_5


def test_decode_vectors() -> None:
    batch = decode_batch(bytes.fromhex(TOMBSTONE_AT_5))
    assert (batch.base_offset, batch.last_offset, batch.producer_id, batch.control_type) == (5, 5, -1, None)
    assert [(r.offset, r.timestamp, r.key, r.value) for r in batch.records] == [(5, T, KEY, None)]


def test_offsets_of_many_records() -> None:
    batch = decode_batch(build_batch(100, [(b"\x00\x01k%d" % i, b"v") for i in range(10)], T))
    assert [r.offset for r in batch.records] == list(range(100, 110))
    assert batch.last_offset == 109


def test_crc_mismatch_is_detected() -> None:
    data = bytearray(bytes.fromhex(ONE_RECORD))
    data[-3] ^= 0xFF
    with pytest.raises(BatchError, match="CRC"):
        decode_batch(bytes(data))


def test_bad_magic_and_short_batches() -> None:
    data = bytearray(bytes.fromhex(ONE_RECORD))
    data[16] = 1
    with pytest.raises(BatchError, match="magic"):
        decode_batch(bytes(data))
    with pytest.raises(BatchError):
        decode_batch(bytes.fromhex(ONE_RECORD)[:40])


@pytest.mark.parametrize(("codec", "name"), [(1, "gzip"), (2, "snappy"), (3, "lz4"), (4, "zstd")])
def test_compressed_batches_as_kafka_may_write_them(codec: int, name: str) -> None:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i in range(50):
        builder.append(i, T, KEY, VALUE, [])
    batch = decode_batch(bytes(builder.build()))
    assert batch.attributes & 0x07 == codec, name
    assert [(r.offset, r.key, r.value) for r in batch.records] == [(i, KEY, VALUE) for i in range(50)]


def test_unknown_codec_is_a_batch_error_not_a_crash() -> None:
    import crc32c

    data = bytearray(bytes.fromhex(ONE_RECORD))
    data[22] |= 0x07  # codec 7 does not exist; re-sign so only the codec is wrong
    data[17:21] = crc32c.crc32c(bytes(data[21:])).to_bytes(4, "big")
    with pytest.raises(BatchError):
        decode_batch(bytes(data))


def test_rebuilding_every_record_gives_kafka_pythons_bytes() -> None:
    batch = build_batch(40, [(KEY, VALUE), (KEY, None), (b"k", b"")], T)
    assert rebuild_batch(batch, {40, 41, 42}, None) == batch


def test_rebuild_with_a_delete_horizon_keeps_record_timestamps() -> None:
    batch = build_batch(40, [(KEY, VALUE), (KEY, None), (b"k", b"")], T)
    rebuilt = decode_batch(rebuild_batch(batch, {41, 42}, T + 5000))
    assert rebuilt.attributes & DELETE_HORIZON_FLAG and rebuilt.base_timestamp == T + 5000
    assert [(r.offset, r.timestamp, r.value) for r in rebuilt.records] == [(41, T, None), (42, T, b"")]


@settings(max_examples=100)
@given(entries=st.lists(st.tuples(st.binary(max_size=40), st.one_of(st.none(), st.binary(max_size=80))),
                        min_size=1, max_size=50),
       base=st.integers(0, 2**40), timestamp=st.integers(0, 2**42))
def test_batches_are_byte_identical_to_kafka_pythons_builder(entries: list[tuple[bytes, bytes | None]], base: int,
                                                             timestamp: int) -> None:
    from kafka.record.default_records import DefaultRecordBatchBuilder as Reference

    ref = Reference(magic=2, compression_type=0, is_transactional=False, producer_id=-1, producer_epoch=-1,
                    base_sequence=-1, batch_size=1 << 62)
    for delta, (key, value) in enumerate(entries):
        ref.append(delta, timestamp, key, value, [])
    expected = ref.build()
    struct.pack_into(">qii", expected, 0, base, len(expected) - 12, 0)
    assert build_batch(base, entries, timestamp) == bytes(expected)


@settings(max_examples=200)
@given(entries=st.lists(st.tuples(st.binary(max_size=40), st.one_of(st.none(), st.binary(max_size=200))),
                        min_size=1, max_size=60),
       base=st.integers(0, 2**40), max_bytes=st.integers(1, 2000))
def test_a_flush_splits_into_build_batchs_batches_of_at_most_max_bytes(
        entries: list[tuple[bytes, bytes | None]], base: int, max_bytes: int) -> None:
    """What a flush cycle appends (storage.batchwriter.build_batches): in order, consecutive offsets,
    each batch exactly ``build_batch``'s bytes for its entries and within ``max_bytes`` unless it holds
    a single record that alone exceeds it."""
    batches = build_batches(base, entries, T, max_bytes)
    assert sum(count for _, count in batches) == len(entries) and all(count > 0 for _, count in batches)
    first = base
    for data, count in batches:
        assert data == build_batch(first, entries[first - base : first - base + count], T)
        assert len(data) <= max_bytes or count == 1
        decoded = decode_batch(data)
        assert [(r.offset, r.key, r.value) for r in decoded.records] == [
            (first + i, k, v) for i, (k, v) in enumerate(entries[first - base : first - base + count])]
        first += count
    assert build_batches(base, entries, T, 1 << 30) == [(build_batch(base, entries, T), len(entries))]


@settings(max_examples=300, deadline=None)  # a codec's first use imports it: 360 ms on a busy machine
@given(data=st.data(), codec=st.sampled_from([0, 1, 2, 3, 4]),
       entries=st.lists(st.tuples(st.binary(max_size=10), st.one_of(st.none(), st.binary(max_size=20))),
                        min_size=1, max_size=5))
def test_the_c_reader_agrees_with_kafka_pythons_on_damaged_batches(data: st.DataObject, codec: int,
                                                                    entries: list[tuple[bytes, bytes | None]]) -> None:
    """decode_batch reads with aiokafka's C reader: on any batch, re-signed after its records were damaged
    or cut, it must accept exactly what kafka-python's reader accepts and yield the same records."""
    import crc32c
    from kafka.record.default_records import DefaultRecordBatch as Reference

    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for delta, (key, value) in enumerate(entries):
        builder.append(delta, T + delta, key, value, [])
    raw = bytearray(builder.build())
    for _ in range(data.draw(st.integers(0, 3))):
        raw[data.draw(st.integers(57, len(raw) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(61, len(raw)))
    raw = raw[:cut]
    struct.pack_into(">i", raw, 8, len(raw) - 12)
    struct.pack_into(">I", raw, 17, crc32c.crc32c(bytes(raw[21:])))
    try:
        expected: object = [(r.offset, r.timestamp, r.key, r.value) for r in Reference(bytes(raw))]
    except Exception:
        expected = BatchError
    try:
        got: object = [(r.offset, r.timestamp, r.key, r.value) for r in decode_batch(bytes(raw)).records]
    except BatchError:
        got = BatchError
    assert got == expected


_FIELDS = ("base_offset", "last_offset", "size", "producer_id", "producer_epoch", "is_transactional", "control_type",
           "base_timestamp", "max_timestamp", "attributes")


@settings(max_examples=300, deadline=None)
@example(base=2**63 - 1, epoch=0, last_delta=1, attributes=0, times=(0, 0), producer=(-1, -1))  # a review's find:
@example(base=-(2**63), epoch=0, last_delta=-1, attributes=0, times=(0, 0), producer=(-1, -1))  # i64 sums wrapped
@given(base=st.integers(-(2**63), 2**63 - 1), epoch=st.integers(-(2**31), 2**31 - 1),
       last_delta=st.integers(-(2**31), 2**31 - 1), attributes=st.integers(-(2**15), 2**15 - 1),
       times=st.tuples(*[st.integers(-(2**63), 2**63 - 1)] * 2),
       producer=st.tuples(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**15), 2**15 - 1)))
def test_the_loaders_header_reading_matches_the_readers(base: int, epoch: int, last_delta: int, attributes: int,
                                                        times: tuple[int, int], producer: tuple[int, int]) -> None:
    """The loader's path reads a batch's header itself (storage.batch.decode_batch with ``replayable``);
    every field it gives equals what aiokafka's or kafka-python's reader gives for the same bytes, over
    the header's whole range: negative producer ids, epochs and timestamps, any attribute bits (the
    compressed and control ones send the batch down the readers' path, whose answer or refusal it
    then is)."""
    raw = bytearray(build_batch(0, [(KEY, VALUE), (KEY, None)], T))
    struct.pack_into(">qiib", raw, 0, base, len(raw) - 12, epoch, 2)
    struct.pack_into(">hiqqqh", raw, 21, attributes, last_delta, *times, *producer)
    struct.pack_into(">I", raw, 17, crc32c.crc32c(bytes(raw[21:])))
    data = bytes(raw)

    def decoded(data: bytes, fast: bool) -> tuple[object, ...] | str:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(batch_module, "FAST_REPLAY", fast)
            try:
                batch = decode_batch(data, replayable=True)
            except BatchError as exc:
                return f"BatchError {exc}"
        return tuple(getattr(batch, name) for name in _FIELDS)

    assert decoded(data, True) == decoded(data, False)
    damaged = bytearray(data)
    damaged[-1] ^= 1  # the CRC no longer matches: the same refusal, naming the same offset
    assert decoded(bytes(damaged), True) == decoded(bytes(damaged), False)
    if not attributes & 0x27:  # neither compressed nor a control batch: the loader's own path
        assert decoded(bytes(damaged), True) == f"BatchError CRC mismatch in batch at offset {base}"
