"""The ``__consumer_offsets`` records, byte-for-byte as Kafka writes them.

A record key is ``int16 record type`` + key struct; a value is ``int16 value version`` + value struct,
or null for a tombstone (reference section 7). The structs are defined by our own JSON schemas in
``protocol/schemas`` and encoded/decoded by kafka-python's schema machinery. Record types kcoord does not
model yet (KIP-848, share groups) decode to ``UnknownRecord`` so a loader can skip them, as Kafka does.
"""

import functools
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

OFFSET_COMMIT_LEGACY_TYPE: Final = 0
OFFSET_COMMIT_TYPE: Final = 1
GROUP_METADATA_TYPE: Final = 2

# Value versions Kafka writes today: v3, or v1 when the commit carries an explicit expire timestamp.
OFFSET_VALUE_VERSION: Final = 3
OFFSET_VALUE_VERSION_WITH_EXPIRY: Final = 1
GROUP_VALUE_VERSION: Final = 3


class RecordError(Exception):
    """A key or value of a known record type that does not parse: the log is corrupt."""


class OffsetKey(NamedTuple):
    group: str
    topic: str
    partition: int


class OffsetAndMetadata(NamedTuple):
    """One committed offset as stored; ``expire_timestamp`` is -1 unless the commit set a retention."""

    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int
    expire_timestamp: int = -1


class OffsetCommitRecord(NamedTuple):
    """A committed offset, or (value None) a tombstone deleting it."""

    key: OffsetKey
    value: OffsetAndMetadata | None


@dataclass(frozen=True, slots=True)
class MemberMetadata:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout: int
    session_timeout: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupMetadata:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int
    members: tuple[MemberMetadata, ...] = ()


class GroupMetadataRecord(NamedTuple):
    """A classic group's metadata, or (value None) a tombstone deleting the group."""

    group: str
    value: GroupMetadata | None


class UnknownRecord(NamedTuple):
    """A record type this version of kcoord does not model; skipped on load, kept by the cleaner."""

    record_type: int


Record = OffsetCommitRecord | GroupMetadataRecord

# An offset commit as the compiled loader decodes it: (group, topic, partition, value), flat, the value the
# bytes read from the log (None for a tombstone), checked and kept as they are
# (storage.loadcodec.loaded_value reads them back). No NamedTuple constructors, no value object and no key
# tuple: a million records loaded make and free a million tuples fewer. ``replay`` applies every form.
LoadedCommit = tuple[str, str, int, bytes | None]
# An offset commit as the commit path prepares it (coordinator/offsets.py): the same plain key tuple and
# the value's bytes as they are written (``encode_offset_value``), which the cache keeps as it keeps a
# loaded value. Constructing an OffsetKey and an OffsetAndMetadata instead cost two ``tuple.__new__``
# calls per partition, over half of preparing a 100-partition commit. ``replay`` and ``encode_record``
# take every form.
CommitPair = tuple[tuple[str, str, int], bytes]
LiveRecord = Record | CommitPair  # what an operation returns to be written
LoadedRecord = Record | LoadedCommit | CommitPair


_Decoder = Callable[[memoryview, int], tuple[Any, int]]
_Encoder = Callable[[Any, Any], None]
SCHEMA_CLASSES = ("OffsetCommitKey", "OffsetCommitValue", "GroupMetadataKey", "GroupMetadataValue")


class _Schemas:
    """kafka-python's message classes for our record schemas (``protocol/schemas``) and the decoders and
    encoders it generates from them. Built on first use, not at import: importing kafka-python's schema
    machinery and generating them took ~89M instructions (~30 ms, cachegrind), 10% of a start, and only
    group metadata records and offset record versions the byte-level code below and storage.loadcodec
    do not read need them. A log of offset commits alone (consumers that assign their partitions
    themselves and commit, as Spark and Flink do) is served without them; a log with group metadata
    builds them while loading, as it did at import before (``prepare_schemas``)."""

    def __init__(self) -> None:
        from kafka.protocol.api_data import ApiData
        from kafka.protocol.schemas.fields.codecs import EncodeBufferPool

        from protocol import schemas

        def message(name: str) -> Any:
            return type(ApiData)(name, (ApiData,), {"__module__": __name__}, load_json=schemas)

        self.classes = {name: message(name) for name in SCHEMA_CLASSES}
        self.offset_key = _compile(self.classes["OffsetCommitKey"])
        self.offset_value = _compile(self.classes["OffsetCommitValue"])
        self.group_key = _compile(self.classes["GroupMetadataKey"])
        self.group_value = _compile(self.classes["GroupMetadataValue"])
        # kafka-python's generated encoders read fields by name, so our tuples and dataclasses (same
        # field names as the schemas) are encoded directly, with no intermediate message object.
        self.group_key_encoder = _compile_encoder(self.classes["GroupMetadataKey"], GROUP_METADATA_TYPE)
        self.group_value_encoder = _compile_encoder(self.classes["GroupMetadataValue"], GROUP_VALUE_VERSION)
        self.buffers = EncodeBufferPool


_built: list[_Schemas] = []
_building = threading.Lock()


def _schemas() -> _Schemas:
    """The one ``_Schemas`` (the loader threads may ask at the same time: each gets the same classes)."""
    if not _built:
        with _building:
            if not _built:
                _built.append(_Schemas())
    return _built[0]


def prepare_schemas() -> None:
    """Builds them now. The server asks on a thread once its partitions are loaded, so that its first
    rebalance does not wait for them on the loop (a log holding group metadata records has had them
    built by then: its load needed them)."""
    _schemas()


def schema_class(name: str) -> Any:
    """kafka-python's class for one of our record schemas (``SCHEMA_CLASSES``): the reference in tests."""
    return _schemas().classes[name]


def _compile(cls: Any) -> dict[int, _Decoder]:
    """kafka-python's generated decoder for each version of ``cls`` (built once)."""
    lo, hi = cls._valid_versions
    out = {}
    for version in range(lo, hi + 1):
        flexible = cls.flexible_version_q(version)
        out[version] = cls._struct.compiled_decode_from(version, compact=flexible, tagged=flexible, data_class=cls)
    return out


def _compile_encoder(cls: Any, version: int) -> _Encoder:
    flexible = cls.flexible_version_q(version)
    encoder: _Encoder = cls._struct.compiled_encode_into(version, compact=flexible, tagged=flexible)
    return encoder


def _decode_struct(decoders: dict[int, _Decoder], data: bytes, version: int, name: str) -> Any:
    """Decodes ``data[2:]`` at ``version``; versions newer than ours are read with our newest schema,
    which is how Kafka evolves these records (KIP-915: new fields only as tagged fields)."""
    newest = max(decoders)
    fn = decoders.get(min(version, newest))
    if fn is None:
        raise RecordError(f"{name} version {version} is not defined")
    try:
        obj, end = fn(memoryview(data), 2)
    except Exception as exc:
        raise RecordError(f"{name} v{version}: {exc!r}") from exc
    if version <= newest and end != len(data):
        raise RecordError(f"{name} v{version}: {len(data) - end} trailing bytes")
    return obj


def _version_of(data: bytes) -> int:
    if len(data) < 2:
        raise RecordError(f"record part of {len(data)} bytes has no version")
    return int.from_bytes(data[:2], "big", signed=True)


def _encode(encoder: _Encoder, version: int, obj: Any) -> bytes:
    with _schemas().buffers.acquire() as out:
        out.buf[0:2] = version.to_bytes(2, "big")
        out.pos = 2
        encoder(obj, out)
        return bytes(out.result())


# The hot path writes offset keys and values straight to bytes (tests check them byte for byte against
# the schema encoders above): a commit's key repeats its group and topic, so their encoded prefixes are
# cached, and the common empty metadata is a constant.
_I16 = struct.Struct(">h")
_KEY_TAIL = struct.Struct(">i")
_VALUE_V3_HEAD = struct.Struct(">hqi")  # version 3, offset, leader epoch
_VALUE_V1_HEAD = struct.Struct(">hq")  # version 1, offset
_TIMESTAMP = struct.Struct(">q")
_TIMESTAMPS = struct.Struct(">qq")
MAX_STRING_BYTES = 32767


def _string(s: str) -> bytes:
    data = s.encode()
    if len(data) > MAX_STRING_BYTES:
        raise RecordError(f"string of {len(data)} bytes does not fit an int16 length")
    return _I16.pack(len(data)) + data


@functools.lru_cache(maxsize=1 << 14)
def _key_head(group: str) -> bytes:
    return _I16.pack(OFFSET_COMMIT_TYPE) + _string(group)


@functools.lru_cache(maxsize=1 << 14)
def _cached_string(s: str) -> bytes:
    return _string(s)


_EMPTY_STRING = _string("")


def encode_offset_key(key: tuple[str, str, int]) -> bytes:
    """An OffsetKey, or the plain (group, topic, partition) of a ``CommitPair``."""
    group, topic, partition = key
    return _key_head(group) + _cached_string(topic) + _KEY_TAIL.pack(partition)


def offset_key_prefix(group: str, topic: str) -> bytes:
    """An offset key's bytes before its partition's int32 (a commit of many partitions of one topic
    builds the prefix once)."""
    return _key_head(group) + _cached_string(topic)


def encode_offset_value(value: OffsetAndMetadata) -> bytes:
    """v3 without an expiry, v1 with one. The commit path writes the same bytes with compiled code
    (coordinator/offsets.py; the tests hold the two equal)."""
    offset, leader_epoch, metadata, commit_timestamp, expire_timestamp = value
    meta = _string(metadata) if metadata else _EMPTY_STRING
    if expire_timestamp == -1:
        return (_VALUE_V3_HEAD.pack(OFFSET_VALUE_VERSION, offset, leader_epoch) + meta
                + _TIMESTAMP.pack(commit_timestamp))
    return (_VALUE_V1_HEAD.pack(OFFSET_VALUE_VERSION_WITH_EXPIRY, offset) + meta
            + _TIMESTAMPS.pack(commit_timestamp, expire_timestamp))


def encode_group_value(value: GroupMetadata) -> bytes:
    return _encode(_schemas().group_value_encoder, GROUP_VALUE_VERSION, value)


def encode_record(record: LiveRecord) -> tuple[bytes, bytes | None]:
    """``(key bytes, value bytes or None for a tombstone)`` exactly as Kafka's serde writes them."""
    if not isinstance(record, GroupMetadataRecord):  # an OffsetCommitRecord or a CommitPair
        key, commit = record
        if commit is None or isinstance(commit, bytes):
            return encode_offset_key(key), commit
        return encode_offset_key(key), encode_offset_value(commit)
    group_key = _encode(_schemas().group_key_encoder, GROUP_METADATA_TYPE, record)
    return group_key, None if record.value is None else encode_group_value(record.value)


def _decode_offset_value(data: bytes) -> OffsetAndMetadata:
    version = _version_of(data)
    v = _decode_struct(_schemas().offset_value, data, version, "OffsetCommitValue")
    # Only touch fields the version has: an absent one goes through kafka-python's slow fallback.
    epoch = v.leader_epoch if version >= 3 else -1
    expire = v.expire_timestamp if version == 1 else -1
    return OffsetAndMetadata(v.offset, epoch, v.metadata or "", v.commit_timestamp, expire)


def _decode_group_value(data: bytes) -> GroupMetadata:
    v = _decode_struct(_schemas().group_value, data, _version_of(data), "GroupMetadataValue")
    members = tuple(
        MemberMetadata(
            member_id=m.member_id,
            group_instance_id=m.group_instance_id,
            client_id=m.client_id,
            client_host=m.client_host,
            rebalance_timeout=m.rebalance_timeout if m.rebalance_timeout is not None else -1,
            session_timeout=m.session_timeout,
            subscription=bytes(m.subscription or b""),
            assignment=bytes(m.assignment or b""),
        )
        for m in v.members
    )
    cst = v.current_state_timestamp if v.current_state_timestamp is not None else -1
    return GroupMetadata(v.protocol_type or "", v.generation, v.protocol, v.leader, cst, members)


# Loading replays every record of a log: offset keys and values v0-v3 (all Kafka has written) are read
# straight from their bytes by ``decode_record`` (~4x faster than the schema decoders, which remain the
# reference in tests, read every other version and say precisely what is wrong with a bad record).
# Group and topic names are cached by their bytes: a million keys share a few thousand strings, and
# the records are made with ``tuple.__new__``, which skips the NamedTuple constructors' Python frames.
_KEY_HEAD = struct.Struct(">hh")  # record type, group length
_PARTITION = struct.Struct(">i")
_V3_HEAD = struct.Struct(">hqih")  # version, offset, leader epoch, metadata length
_V0_HEAD = struct.Struct(">hqh")  # version, offset, metadata length (v0-v2)
_TIMESTAMP_PAIR = struct.Struct(">qq")
_NAMES_MAX = 1 << 16
_names: dict[bytes, str] = {}
_new = tuple.__new__
_last_commit_ts = [0]


def _name(raw: bytes) -> str:
    name = _names.get(raw)
    if name is None:
        if len(_names) >= _NAMES_MAX:
            _names.clear()
        name = _names[raw] = raw.decode()
    return name


def _fast_offset_record(key: bytes, value: bytes | None) -> OffsetCommitRecord:
    """Raises ValueError, struct.error or UnicodeDecodeError for anything it does not read exactly."""
    glen = _KEY_HEAD.unpack_from(key)[1]
    pos = 4 + glen
    tlen = _I16.unpack_from(key, pos)[0]
    end = pos + 2 + tlen
    if glen < 0 or tlen < 0 or end + 4 != len(key):
        raise ValueError("lengths do not match the key's size")
    okey = _new(OffsetKey, (_name(key[4:pos]), _name(key[pos + 2 : end]), _PARTITION.unpack_from(key, end)[0]))
    if value is None:
        return _new(OffsetCommitRecord, (okey, None))
    version = _I16.unpack_from(value)[0]
    if version == 3:
        _, offset, epoch, mlen = _V3_HEAD.unpack_from(value)
        pos, tail = 16, 8
    elif 0 <= version <= 2:
        _, offset, mlen = _V0_HEAD.unpack_from(value)
        epoch, pos, tail = -1, 12, 16 if version == 1 else 8
    else:
        raise ValueError(f"value version {version} is read by the schema decoder")
    end = pos + mlen
    if mlen < 0 or len(value) != end + tail:
        raise ValueError("lengths do not match the value's size")
    metadata = value[pos:end].decode() if mlen else ""
    if version == 1:
        commit_ts, expire_ts = _TIMESTAMP_PAIR.unpack_from(value, end)
    else:
        commit_ts, expire_ts = _TIMESTAMP.unpack_from(value, end)[0], -1
    if commit_ts == _last_commit_ts[0]:  # the records of one commit share one int (32 bytes each)
        commit_ts = _last_commit_ts[0]
    else:
        _last_commit_ts[0] = commit_ts
    return _new(OffsetCommitRecord, (okey, _new(OffsetAndMetadata, (offset, epoch, metadata, commit_ts, expire_ts))))


def _offset_record(key: bytes, value: bytes | None) -> OffsetCommitRecord:
    try:
        return _fast_offset_record(key, value)
    except (struct.error, ValueError, UnicodeDecodeError):
        pass
    k = _decode_struct(_schemas().offset_key, key, _version_of(key), "OffsetCommitKey")
    okey = OffsetKey(k.group, k.topic, k.partition)
    return OffsetCommitRecord(okey, None if value is None else _decode_offset_value(value))


def decode_record(key: bytes | None, value: bytes | None) -> Record | UnknownRecord:
    """Decodes one ``__consumer_offsets`` record; raises RecordError for a known type that is corrupt."""
    if key is None:
        raise RecordError("record without key")
    record_type = _version_of(key)
    if record_type in (OFFSET_COMMIT_LEGACY_TYPE, OFFSET_COMMIT_TYPE):
        return _offset_record(key, value)
    if record_type == GROUP_METADATA_TYPE:
        g = _decode_struct(_schemas().group_key, key, record_type, "GroupMetadataKey")
        return GroupMetadataRecord(g.group, None if value is None else _decode_group_value(value))
    return UnknownRecord(record_type)
