"""The generated codecs against kafka-python's message classes as the reference, for every version of
every API kcoord serves: hypothesis-generated messages (nulls, non-ASCII, unknown tagged fields, large
arrays) must encode to kafka-python's exact bytes and decode to what kafka-python decodes; malformed
bytes must be refused with DecodeError and nothing else, within the varint and length bounds."""

import dataclasses
import struct
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol.api_message import ApiMessage

from coordinator.apis import load_all
from protocol.codec import JOIN_RUN, DecodeError, MessageCodec, join_parts, read_uvarint, write_uvarint
from protocol.registry import REGISTRY
from protocol.schema import FIXED, FieldSpec, MessageSpec, StructSpec, load_message

load_all()
INT_RANGES = {"int8": 8, "int16": 16, "int32": 32, "bitfield": 32, "int64": 64}
ALL = sorted((spec.name + kind, v) for spec in REGISTRY.values() for kind in ("Request", "Response")
             for v in range(spec.min_version, spec.max_version + 1))


def reference_class(name: str) -> Any:
    """kafka-python's class for a message name (it builds one per schema)."""
    stack: list[type] = [ApiMessage]
    while stack:
        cls = stack.pop()
        if cls.__name__ == name and getattr(cls, "_json", None) is not None:
            return cls
        stack.extend(cls.__subclasses__())
    raise KeyError(name)


CODECS = {name: MessageCodec(load_message(name)) for name in {n for n, _ in ALL}}


# -- message generation from the schema model -------------------------------------------------------

def field_strategy(f: FieldSpec, version: int, codec: MessageCodec, flexible: bool) -> st.SearchStrategy[Any]:
    if f.is_array:
        element = dataclasses.replace(f, type=f.element if f.element != "struct" else "struct", nullable=None)
        s: st.SearchStrategy[Any] = st.lists(field_strategy(element, version, codec, flexible), max_size=3)
    elif f.type == "struct":
        assert f.struct is not None
        s = struct_strategy(f.struct, version, codec, flexible)
    elif f.type in INT_RANGES:
        bits = INT_RANGES[f.type]
        s = st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    elif f.type == "uint16":
        s = st.integers(0, 65535)
    elif f.type == "bool":
        s = st.booleans()
    elif f.type == "float64":
        s = st.floats(allow_nan=False)
    elif f.type == "uuid":
        s = st.uuids()
    elif f.type == "string":
        s = st.text(max_size=12)
    else:
        s = st.binary(max_size=12)
    if f.nullable_at(version):
        s = st.none() | s
    return s


def struct_strategy(spec: StructSpec, version: int, codec: MessageCodec, flexible: bool) -> st.SearchStrategy[Any]:
    cls = codec.classes[spec.name]
    present = [f for f in spec.fields if f.present(version)]
    return st.builds(cls, **{f.name: field_strategy(f, version, codec, flexible) for f in present})


def message_strategy(name: str, version: int) -> st.SearchStrategy[Any]:
    codec = CODECS[name]
    return struct_strategy(codec.spec.root, version, codec, codec.spec.is_flexible(version))


# -- comparison with kafka-python's decoded objects ---------------------------------------------------

def assert_same(spec: StructSpec, version: int, mine: Any, ref: Any, path: str = "") -> None:
    """Field by field in schema order (kafka-python renames a few fields, e.g. Metadata's
    ClusterAuthorizedOperations, and reads them as bit sets: pair them by position)."""
    ref_fields = type(ref)._struct._fields
    assert len(ref_fields) == len(spec.fields)
    for f, rf in zip(spec.fields, ref_fields, strict=True):
        if not f.present(version):
            continue
        a, b = getattr(mine, f.name), getattr(ref, rf.name)
        where = f"{path}{f.name}"
        if f.is_array and a is not None:
            assert b is not None and len(a) == len(b), where
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                if f.element == "struct":
                    assert f.struct is not None
                    assert_same(f.struct, version, x, y, f"{where}[{i}].")
                else:
                    assert _scalar(f.element, x) == _scalar(f.element, y), where
        elif f.type == "struct" and a is not None:
            assert f.struct is not None
            assert_same(f.struct, version, a, b, where + ".")
        else:
            assert _scalar(rf.type_str, a) == _scalar(rf.type_str, b), (where, a, b)


def _scalar(type_name: str, value: Any) -> Any:
    """kafka-python reads a zero UUID as None and an authorized-operations bitfield as a set of bits."""
    if type_name == "uuid":
        return None if value in (None, uuid.UUID(int=0)) else value
    if type_name == "bitfield":
        if isinstance(value, set):
            return sum(1 << b for b in value) - (1 << 32 if 31 in value else 0)
        return -(2**31) if value is None else value
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    return value


def reference_decode(name: str, data: bytes, version: int) -> Any:
    """kafka-python's generic decode (ApiVersionsResponse overrides it with a client-side fallback that
    reads any error answer as v0; that is not what the schema says)."""
    return ApiMessage.decode.__func__(reference_class(name), data, version=version)


def reference_encode(name: str, version: int, ref: Any) -> bytes:
    cls = reference_class(name)
    flexible = cls.flexible_version_q(version)
    return bytes(cls._struct.encode(ref, version=version, compact=flexible, tagged=flexible))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@pytest.mark.parametrize(("name", "version"), ALL, ids=[f"{n}-v{v}" for n, v in ALL])
@given(data=st.data())
def test_generated_codec_matches_kafka_python(name: str, version: int, data: st.DataObject) -> None:
    codec = CODECS[name]
    message = data.draw(message_strategy(name, version))
    encoded = codec.encode(message, version)
    ref = reference_decode(name, encoded, version)  # the reference reads our bytes
    assert_same(codec.spec.root, version, message, ref)
    assert reference_encode(name, version, ref) == encoded  # and writes exactly the same bytes
    decoded, end = codec.decode(encoded, version)
    assert end == len(encoded)
    assert_same(codec.spec.root, version, decoded, ref)


# -- unknown tagged fields ----------------------------------------------------------------------------

JUNK_TAG = 300  # a two-byte tag number


def with_junk(spec: StructSpec, flexible: tuple[int, int]) -> StructSpec:
    junk = FieldSpec("junk_tag", "string", flexible, None, JUNK_TAG, flexible, "", False, None)
    fields = tuple(dataclasses.replace(f, struct=with_junk(f.struct, flexible)) if f.struct else f
                   for f in spec.fields)
    return StructSpec(spec.name, (*fields, junk))


FLEXIBLE = [(n, v) for n, v in ALL if CODECS[n].spec.is_flexible(v)]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@pytest.mark.parametrize(("name", "version"), FLEXIBLE, ids=[f"{n}-v{v}" for n, v in FLEXIBLE])
@given(data=st.data(), junk=st.text(min_size=1, max_size=40))
def test_unknown_tagged_fields_are_skipped(name: str, version: int, data: st.DataObject, junk: str) -> None:
    real = CODECS[name]
    patched_spec = dataclasses.replace(real.spec, root=with_junk(real.spec.root, real.spec.flexible))
    patched = MessageCodec(patched_spec)
    message = data.draw(struct_strategy(patched_spec.root, version, patched, True))
    _clear_junk(patched_spec.root, version, message)
    _set_everywhere(patched_spec.root, version, message, junk)
    encoded = patched.encode(message, version)
    decoded, end = real.decode(encoded, version)
    assert end == len(encoded)
    ref = reference_decode(name, encoded, version)
    assert_same(real.spec.root, version, decoded, ref)


def _clear_junk(spec: StructSpec, version: int, obj: Any) -> None:
    obj.junk_tag = ""
    for f in spec.fields:
        if f.struct is None or not f.present(version):
            continue
        children = getattr(obj, f.name)
        for child in (children if f.is_array else [children]) if children is not None else []:
            _clear_junk(f.struct, version, child)


def _set_everywhere(spec: StructSpec, version: int, obj: Any, value: str) -> None:
    """Every struct gets the unknown tag, except structs inside a tagged field: kafka-python (the
    reference here) only reads an empty tag section there."""
    obj.junk_tag = value
    for f in spec.fields:
        if f.struct is None or not f.present(version) or f.tagged_at(version):
            continue
        children = getattr(obj, f.name)
        for child in (children if f.is_array else [children]) if children is not None else []:
            _set_everywhere(f.struct, version, child, value)


# -- malformed input ----------------------------------------------------------------------------------

def sample(name: str, version: int, partitions: int = 3) -> bytes:
    codec = CODECS[name]
    if name == "OffsetCommitRequest":
        cls = codec.cls
        topic = cls.OffsetCommitRequestTopic
        parts = [topic.OffsetCommitRequestPartition(partition_index=i, committed_offset=i * 10,
                                                    committed_metadata="mé") for i in range(partitions)]
        return codec.encode(cls(group_id="gröup", topics=[topic(name="t", partitions=parts)]), version)
    return codec.encode(codec.cls(), version)


@pytest.mark.parametrize("version", range(0, 10))
def test_every_truncation_is_a_decode_error(version: int) -> None:
    codec = CODECS["OffsetCommitRequest"]
    data = sample("OffsetCommitRequest", version)
    for cut in range(len(data)):
        with pytest.raises(DecodeError):
            codec.decode(data[:cut], version)


@settings(max_examples=300, deadline=None)
@given(flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), min_size=1, max_size=4),
       version=st.integers(0, 9))
def test_corrupted_bytes_decode_or_raise_decode_error(flips: list[tuple[int, int]], version: int) -> None:
    codec = CODECS["OffsetCommitRequest"]
    data = bytearray(sample("OffsetCommitRequest", version))
    for pos, mask in flips:
        data[pos % len(data)] ^= mask
    try:
        codec.decode(bytes(data), version)
    except DecodeError:
        pass


def test_varints_are_at_most_five_bytes() -> None:
    assert read_uvarint(b"\xff\xff\xff\xff\x0f", 0) == (2**32 - 1, 5)
    with pytest.raises(DecodeError, match="longer than 5"):
        read_uvarint(b"\xff" * 6, 0)
    with pytest.raises(DecodeError):
        read_uvarint(b"\xff\xff", 0)  # runs out
    for n in (0, 1, 127, 128, 300, 2**21, 2**32 - 1):
        assert read_uvarint(write_uvarint(n), 0) == (n, len(write_uvarint(n)))


def test_a_run_of_continuation_bytes_is_refused_at_the_sixth_byte() -> None:
    """The fault campaign's 0.4 MB frame: 0xFF bytes where a compact length is expected."""
    codec = CODECS["OffsetCommitRequest"]
    valid = sample("OffsetCommitRequest", 8)
    # group id "gröup" is the first field: its compact length starts at byte 0
    with pytest.raises(DecodeError, match="longer than 5"):
        codec.decode(b"\xff" * 400_000, 8)
    assert codec.decode(valid, 8)[1] == len(valid)


def test_array_counts_beyond_the_bytes_left_are_refused_before_allocating() -> None:
    codec = CODECS["OffsetCommitRequest"]
    frame = struct.pack(">h", 1) + b"g" + struct.pack(">i", 2**31 - 1)  # v0: group, then a huge topic count
    with pytest.raises(DecodeError, match="cannot fit"):
        codec.decode(frame, 0)
    # v8: group "g", generation -1, member "", instance null, then the same count as a compact array
    compact = b"\x02g" + b"\xff\xff\xff\xff" + b"\x01" + b"\x00" + b"\xff\xff\xff\xff\x07"
    with pytest.raises(DecodeError, match="cannot fit"):
        codec.decode(compact, 8)


@pytest.mark.parametrize(("version", "frame", "field"), [
    (8, b"\x00", "group_id"),  # compact null group id
    (2, struct.pack(">h", -1), "group_id"),
    # v2: group "g", generation -1, member "", retention -1, one topic whose name is null
    (2, struct.pack(">h", 1) + b"g" + struct.pack(">ihqi", -1, 0, -1, 1) + struct.pack(">h", -1), "name"),
])
def test_null_where_the_version_forbids_it(version: int, frame: bytes, field: str) -> None:
    with pytest.raises(DecodeError, match=field):
        CODECS["OffsetCommitRequest"].decode(frame, version)


def test_nullable_fields_decode_to_none() -> None:
    codec = CODECS["OffsetFetchRequest"]
    req, _ = codec.decode(codec.encode(codec.cls(group_id="g", topics=None), 2), 2)
    assert req.topics is None
    with pytest.raises(DecodeError, match="topics"):
        codec.decode(struct.pack(">h", 1) + b"g" + struct.pack(">i", -1), 1)  # null topics before v2


def test_thousands_of_partitions_with_unknown_tags_decode() -> None:
    real = CODECS["OffsetCommitRequest"]
    patched_spec = dataclasses.replace(real.spec, root=with_junk(real.spec.root, real.spec.flexible))
    patched = MessageCodec(patched_spec)
    cls = patched.cls
    topic = cls.OffsetCommitRequestTopic
    parts = [topic.OffsetCommitRequestPartition(partition_index=i, committed_offset=i, junk_tag="x" * 5)
             for i in range(5000)]
    data = patched.encode(cls(group_id="g", topics=[topic(name="t", partitions=parts)]), 9)
    decoded, end = real.decode(data, 9)
    assert end == len(data)
    assert [p.committed_offset for p in decoded.topics[0].partitions] == list(range(5000))


def test_codec_classes_take_keywords_and_defaults() -> None:
    cls = CODECS["OffsetCommitRequest"].cls
    req = cls(group_id="g")
    assert (req.generation_id_or_member_epoch, req.member_id, req.group_instance_id, req.topics) == (-1, "", None, [])
    assert req == cls(group_id="g") and req != cls(group_id="h")


def test_fixed_types_cover_the_schemas() -> None:
    types = {f.type for name in CODECS for f in _fields(CODECS[name].spec)}
    assert types <= set(FIXED) | {"string", "bytes", "records", "struct"} | {"[]" + t for t in FIXED} | {
        "[]string", "[]struct"}


def _fields(spec: MessageSpec) -> list[FieldSpec]:
    out, stack = [], [spec.root]
    while stack:
        s = stack.pop()
        for f in s.fields:
            out.append(f)
            if f.struct is not None:
                stack.append(f.struct)
    return out


def test_join_parts_in_runs_equals_one_join() -> None:
    parts = [i.to_bytes(3, "big") for i in range(3 * JOIN_RUN + 7)]
    assert join_parts(parts) == b"".join(parts)
    assert join_parts(parts[:5]) == b"".join(parts[:5])
