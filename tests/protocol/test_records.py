"""Byte vectors from reference section 19.2: our schemas must encode exactly as Kafka does, and the
hot path's hand-written offset encoders match the schema encoders byte for byte."""

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import protocol.records as records
from protocol.records import (
    GroupMetadata,
    GroupMetadataRecord,
    MemberMetadata,
    OffsetAndMetadata,
    OffsetCommitRecord,
    OffsetKey,
    RecordError,
    UnknownRecord,
    decode_record,
    encode_group_value,
    encode_offset_key,
    encode_offset_value,
    encode_record,
)

T = 1700000000000
KEY_HEX = "000100097465737447726f75700003666f6f00000000"


def test_offset_commit_key() -> None:
    assert encode_offset_key(OffsetKey("testGroup", "foo", 0)).hex() == KEY_HEX


def test_offset_commit_value_v3_with_and_without_leader_epoch() -> None:
    assert encode_offset_value(OffsetAndMetadata(100, 5, "", T)).hex() == (
        "000300000000000000640000000500000000018bcfe56800"
    )
    assert encode_offset_value(OffsetAndMetadata(100, -1, "", T)).hex() == (
        "00030000000000000064ffffffff00000000018bcfe56800"
    )


def test_offset_commit_value_v1_when_an_expire_timestamp_exists() -> None:
    value = OffsetAndMetadata(100, -1, "", T, T + 86400000)
    assert encode_offset_value(value).hex() == "0001000000000000006400000000018bcfe568000000018bd50bc400"


@pytest.mark.parametrize(
    ("hexvalue", "expected"),
    [
        ("0000000000000000006400000000018bcfe56800", OffsetAndMetadata(100, -1, "", T)),
        ("0001000000000000006400000000018bcfe568000000018bd50bc400", OffsetAndMetadata(100, -1, "", T, T + 86400000)),
        ("0002000000000000006400000000018bcfe56800", OffsetAndMetadata(100, -1, "", T)),
        ("000300000000000000640000000500000000018bcfe56800", OffsetAndMetadata(100, 5, "", T)),
        ("0004000000000000006400000005010000018bcfe5680000", OffsetAndMetadata(100, 5, "", T)),
    ],
)
def test_every_offset_value_version_decodes(hexvalue: str, expected: OffsetAndMetadata) -> None:
    record = decode_record(bytes.fromhex(KEY_HEX), bytes.fromhex(hexvalue))
    assert record == OffsetCommitRecord(OffsetKey("testGroup", "foo", 0), expected)


def test_legacy_type_0_key_decodes_like_type_1() -> None:
    key = bytes.fromhex("0000" + KEY_HEX[4:])
    record = decode_record(key, None)
    assert record == OffsetCommitRecord(OffsetKey("testGroup", "foo", 0), None)


def test_group_metadata_key_and_empty_group_value() -> None:
    key, value = encode_record(GroupMetadataRecord("testGroup", GroupMetadata("", 0, None, None, T)))
    assert key.hex() == "000200097465737447726f7570"
    assert value is not None and value.hex() == "0003000000000000ffffffff0000018bcfe5680000000000"


def test_group_metadata_value_with_one_member() -> None:
    member = MemberMetadata("m1", None, "c", "/127.0.0.1", 300000, 45000, b"\x00", b"")
    value = GroupMetadata("consumer", 1, "range", "m1", T, (member,))
    expected = (
        "00030008636f6e73756d657200000001000572616e676500026d310000018bcfe568000000000100026d31ffff000163"
        "000a2f3132372e302e302e31000493e00000afc8000000010000000000"
    )
    assert encode_group_value(value).hex() == expected
    assert decode_record(bytes.fromhex("000200097465737447726f7570"), bytes.fromhex(expected)) == (
        GroupMetadataRecord("testGroup", value)
    )


def test_tombstones_round_trip() -> None:
    record = OffsetCommitRecord(OffsetKey("g", "t", 7), None)
    key, value = encode_record(record)
    assert value is None
    assert decode_record(key, value) == record


def test_unknown_record_types_are_reported_not_parsed() -> None:
    assert decode_record(b"\x00\x05garbage", b"\x00\x00") == UnknownRecord(5)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (None, b""),
        (b"\x00", None),
        (bytes.fromhex(KEY_HEX)[:-2], None),
        (bytes.fromhex(KEY_HEX), bytes.fromhex("0003000000")),
        (bytes.fromhex(KEY_HEX) + b"\x00", None),
    ],
)
def test_corrupt_known_records_raise(key: bytes | None, value: bytes | None) -> None:
    with pytest.raises(RecordError):
        decode_record(key, value)


def test_newer_value_versions_are_read_with_our_newest_schema() -> None:
    v4 = bytes.fromhex("0004000000000000006400000005010000018bcfe5680000")
    v5 = b"\x00\x05" + v4[2:]
    record = decode_record(bytes.fromhex(KEY_HEX), v5)
    assert isinstance(record, OffsetCommitRecord) and record.value == OffsetAndMetadata(100, 5, "", T)


def _reference(cls: Any, version: int, obj: Any) -> bytes:
    """The schema-driven encoding (kafka-python's machinery over our JSON schema) of ``obj``."""
    encoder = records._compile_encoder(cls, version)
    return records._encode(encoder, version, obj)


@settings(max_examples=300)
@given(group=st.text(max_size=40), topic=st.text(max_size=40), partition=st.integers(-(2**31), 2**31 - 1))
def test_offset_keys_written_straight_to_bytes_match_the_schema(group: str, topic: str, partition: int) -> None:
    key = OffsetKey(group, topic, partition)
    assert encode_offset_key(key) == _reference(records.schema_class("OffsetCommitKey"), 1, key)


@settings(max_examples=300)
@given(offset=st.integers(-(2**63), 2**63 - 1), epoch=st.integers(-(2**31), 2**31 - 1),
       metadata=st.text(max_size=60), commit=st.integers(-(2**63), 2**63 - 1),
       expire=st.one_of(st.just(-1), st.integers(-(2**63), 2**63 - 1)))
def test_offset_values_written_straight_to_bytes_match_the_schema(offset: int, epoch: int, metadata: str,
                                                                  commit: int, expire: int) -> None:
    value = OffsetAndMetadata(offset, epoch, metadata, commit, expire)
    version = 3 if expire == -1 else 1
    assert encode_offset_value(value) == _reference(records.schema_class("OffsetCommitValue"), version, value)


def test_records_of_one_commit_share_their_commit_timestamp() -> None:
    """Memory: 32 bytes per cached offset saved when a commit's records carry the same time."""
    ts = 1_700_000_000_123
    got = [decode_record(*encode_record(OffsetCommitRecord(OffsetKey("g", "t", p), OffsetAndMetadata(p, -1, "", ts))))
           for p in range(3)]
    values = [r.value for r in got if isinstance(r, OffsetCommitRecord) and r.value is not None]
    assert [v.commit_timestamp for v in values] == [ts] * 3
    assert values[1].commit_timestamp is values[0].commit_timestamp is values[2].commit_timestamp


def test_the_schema_classes_are_built_once_however_many_threads_ask_first() -> None:
    """They are built on first use (not at import), possibly by two loader threads at once; every caller
    must get the same classes. Run in a fresh interpreter, where nothing has asked yet."""
    code = (
        "import threading\n"
        "import protocol.records as records\n"
        "assert not records._built\n"
        "barrier = threading.Barrier(8)\n"
        "seen = []\n"
        "def ask():\n"
        "    barrier.wait()\n"
        "    seen.append(records.schema_class('GroupMetadataValue'))\n"
        "threads = [threading.Thread(target=ask) for _ in range(8)]\n"
        "for t in threads: t.start()\n"
        "for t in threads: t.join()\n"
        "print(len(seen), len({id(c) for c in seen}), seen[0].__name__)\n")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["8", "1", "GroupMetadataValue"]
