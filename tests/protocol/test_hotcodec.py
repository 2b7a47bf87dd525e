"""The hand-written OffsetCommit and OffsetFetch codecs (protocol/hotcodec.py) against the generated ones,
which test_codec checks against kafka-python's classes: for every served version, compiled as installed
and interpreted from source, random requests decode to equal objects (unknown tagged fields in the
header and the body included), malformed bytes get the same verdict (both refuse with DecodeError, or
both read the same message), and random answers, as the two handlers make them (lists and tuples),
encode to the bytes of the same answer built as generated objects and encoded by the generated code."""

import dataclasses
import struct
import threading
import time
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.apis import k09_offset_fetch as k09
from coordinator.apis.k09_offset_fetch import FetchAnswer
from protocol import commit, hotcodec, offsetfetch, registry
from protocol.codec import DecodeError, EncodeError, MessageCodec
from protocol.records import OffsetAndMetadata
from protocol.registry import REGISTRY, ApiSpec
from tests.interpreted import interpreted, skip_unless_the_machine_compiles
from tests.protocol.test_codec import CODECS, _clear_junk, _set_everywhere, message_strategy, struct_strategy, with_junk

PURE = interpreted(hotcodec)
MODULES = [pytest.param(hotcodec, id="installed"), pytest.param(PURE, id="interpreted")]
APIS = {8: "OffsetCommit", 9: "OffsetFetch"}
CASES = [(key, v) for key in APIS for v in range(REGISTRY[key].min_version, REGISTRY[key].max_version + 1)]
IDS = [f"{APIS[k]}-v{v}" for k, v in CASES]
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def generated(key: int) -> ApiSpec:
    """The API as the generated codecs serve it."""
    return dataclasses.replace(REGISTRY[key], hot=None)


def hot(module: ModuleType, key: int) -> Any:
    codec = module.codec_for(key, REGISTRY[key].request.cls)
    assert codec is not None
    return codec


def flexible(key: int, version: int) -> bool:
    return REGISTRY[key].request.spec.is_flexible(version)


def header(key: int, version: int, client_id: str | None, tags: bytes = b"\x00") -> bytes:
    raw = client_id.encode() if client_id is not None else b""
    head = struct.pack(">hhih", key, version, 7, len(raw) if client_id is not None else -1) + raw
    return head + tags if flexible(key, version) else head


def verdict(decode: Any, frame: bytes, version: int) -> Any:
    try:
        return decode(frame, version)
    except DecodeError:
        return "refused"


def test_registry_uses_them_when_compiled() -> None:
    assert (REGISTRY[8].hot is not None) == (REGISTRY[9].hot is not None) == registry.HOT_CODECS
    skip_unless_the_machine_compiles()
    assert hotcodec.compiled(), "protocol/hotcodec was not compiled: see pip install -v -e ."
    assert registry.HOT_CODECS and not PURE.compiled()


@SETTINGS
@pytest.mark.parametrize("module", MODULES)
@pytest.mark.parametrize(("key", "version"), CASES, ids=IDS)
@given(data=st.data(), client_id=st.none() | st.text(max_size=8))
def test_requests_decode_as_generated(module: ModuleType, key: int, version: int, data: st.DataObject,
                                      client_id: str | None) -> None:
    name = APIS[key] + "Request"
    body = CODECS[name].encode(data.draw(message_strategy(name, version)), version)
    frame = header(key, version, client_id) + body
    expected = generated(key).decode_request(frame, version)
    assert hot(module, key).decode(frame, version) == expected
    if key == 8:  # what OffsetCommit's handler takes, straight from the frame
        direct = hot(module, key).decode_commit(frame, version)
        assert direct == (expected[0], commit.from_message(version, expected[1]))
    else:  # OffsetFetch's, likewise
        fetched = hot(module, key).decode_fetch(frame, version)
        assert fetched == (expected[0], offsetfetch.from_message(version, expected[1]))


@SETTINGS
@pytest.mark.parametrize("module", MODULES)
@pytest.mark.parametrize(("key", "version"), [c for c in CASES if flexible(*c)],
                         ids=[i for c, i in zip(CASES, IDS, strict=True) if flexible(*c)])
@given(data=st.data(), junk=st.text(min_size=1, max_size=40))
def test_unknown_tagged_fields_are_skipped(module: ModuleType, key: int, version: int, data: st.DataObject,
                                           junk: str) -> None:
    real = CODECS[APIS[key] + "Request"]
    patched_spec = dataclasses.replace(real.spec, root=with_junk(real.spec.root, real.spec.flexible))
    patched = MessageCodec(patched_spec)
    message = data.draw(struct_strategy(patched_spec.root, version, patched, True))
    _clear_junk(patched_spec.root, version, message)
    _set_everywhere(patched_spec.root, version, message, junk)
    raw = junk.encode()
    tags = b"\x01\xac\x02" + bytes([len(raw)]) + raw if len(raw) < 128 else b"\x00"
    frame = header(key, version, "c", tags) + patched.encode(message, version)
    assert hot(module, key).decode(frame, version) == generated(key).decode_request(frame, version)


def sample(key: int, version: int) -> bytes:
    """A request with a bit of everything: non-ASCII names, nulls, several topics and partitions."""
    cls = REGISTRY[key].request.cls
    if key == 8:
        topic = cls.OffsetCommitRequestTopic
        part = topic.OffsetCommitRequestPartition
        parts = [part(partition_index=i, committed_offset=i * 10, committed_leader_epoch=i, commit_timestamp=5,
                      committed_metadata=None if i else "mé") for i in range(3)]
        msg = cls(group_id="gröup", generation_id_or_member_epoch=4, member_id="m", group_instance_id="i",
                  retention_time_ms=9, topics=[topic(name="t", partitions=parts), topic(name="ü", partitions=[])])
    else:
        group = cls.OffsetFetchRequestGroup
        msg = cls(group_id="gröup", topics=[cls.OffsetFetchRequestTopic(name="t", partition_indexes=[0, 1, 2])],
                  groups=[group(group_id="g", member_id="m", member_epoch=3,
                                topics=[group.OffsetFetchRequestTopics(name="t", partition_indexes=[1, 2])]),
                          group(group_id="h", topics=None)],
                  require_stable=True)
    return header(key, version, "clïent") + REGISTRY[key].request.encode(msg, version)


@pytest.mark.parametrize("module", MODULES)
@pytest.mark.parametrize(("key", "version"), CASES, ids=IDS)
def test_every_truncation_gets_the_same_verdict(module: ModuleType, key: int, version: int) -> None:
    frame = sample(key, version)
    codec, reference = hot(module, key), generated(key)
    assert codec.decode(frame, version) == reference.decode_request(frame, version)
    for end in range(len(frame)):
        assert verdict(codec.decode, frame[:end], version) == verdict(reference.decode_request, frame[:end], version)


@settings(max_examples=200, deadline=None)
@pytest.mark.parametrize("module", MODULES)
@given(case=st.sampled_from(CASES),
       flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), min_size=1, max_size=4))
def test_corrupted_bytes_get_the_same_verdict(module: ModuleType, case: tuple[int, int],
                                              flips: list[tuple[int, int]]) -> None:
    key, version = case
    frame = bytearray(sample(key, version))
    for at, xor in flips:
        frame[at % len(frame)] ^= xor
    data = bytes(frame)
    assert verdict(hot(module, key).decode, data, version) == verdict(generated(key).decode_request, data, version)


@pytest.mark.parametrize("module", MODULES)
def test_bounds(module: ModuleType) -> None:
    """Varints of at most 5 bytes; counts and lengths beyond the bytes left refused before any reading."""
    codec = hot(module, 8)
    head = header(8, 8, "c")
    with pytest.raises(DecodeError, match="longer than 5"):
        codec.decode(head + b"\xff" * 5 + b"\x01", 8)
    with pytest.raises(DecodeError, match="cannot fit"):
        codec.decode(head + b"\x02g" + struct.pack(">i", -1) + b"\x01\x01" + b"\xff\xff\xff\xff\x0f", 8)
    with pytest.raises(DecodeError, match="too long"):
        codec.decode(head + b"\xff\xff\x02" + b"g" * 40_000, 8)
    with pytest.raises(DecodeError, match="null"):  # group_id is not nullable
        codec.decode(header(8, 3, "c") + b"\xff\xff", 3)


@pytest.mark.parametrize("module", MODULES)
def test_what_cannot_be_encoded_is_refused(module: ModuleType) -> None:
    """A handler bug (a None name, an int out of its field's range) is an error, never wrong bytes
    (compiled, a value of the wrong type is refused as such: TypeError)."""
    commit, fetch = hot(module, 8), hot(module, 9)
    bad: list[Any]
    for bad in ([(None, [])], [("t", [(2**31, 0)])], [("t", [(0, 2**15)])]):
        with pytest.raises((EncodeError, TypeError)):
            commit.encode_results(bad, 8, 1)
    value = OffsetAndMetadata(2**63, -1, "", 0, -1)
    groups: list[Any]
    for groups in ([["g", 0, [("t", [(0, value, 0)])]]], [[None, 0, []]], [["g", 2**15, []]]):
        with pytest.raises((EncodeError, TypeError)):
            fetch.encode_answer(groups, 9, 1)
    with pytest.raises(EncodeError):
        fetch.encode_answer([["g", 0, [("t", [(0, value, 0)])]]], 5, 1)


@pytest.mark.parametrize("module", MODULES)
def test_a_large_answer_lets_other_threads_run(module: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiled code holds the GIL until it returns: the encoders and the commit decoder offer it every
    YIELD_EVERY entries (a large request is decoded, and its answer encoded, on the bulk thread while
    the event loop waits for the GIL)."""
    offered: list[float] = []
    real_sleep, this_thread = time.sleep, threading.current_thread()

    def sleep(seconds: float) -> None:  # counted on this thread; other threads left (a client library's may sleep)
        if threading.current_thread() is this_thread:
            offered.append(seconds)
        else:
            real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", sleep)
    hot(module, 9).encode_answer([["g", 0, [("t", [(i, None, 0) for i in range(3 * module.YIELD_EVERY + 5)])]]], 7, 1)
    assert offered == [0, 0, 0]
    hot(module, 8).encode_results([("t", [(i, 0) for i in range(2 * module.YIELD_EVERY)])], 8, 1)
    assert offered == [0, 0, 0, 0, 0]
    # and a large commit is decoded on the bulk thread
    cls = REGISTRY[8].request.cls
    topic = cls.OffsetCommitRequestTopic
    parts = [topic.OffsetCommitRequestPartition(partition_index=i) for i in range(2 * module.YIELD_EVERY + 1)]
    message = cls(group_id="g", topics=[topic(name="t", partitions=parts)])
    frame = header(8, 8, "c") + REGISTRY[8].request.encode(message, 8)
    _, request = hot(module, 8).decode_commit(frame, 8)
    assert len(request.topics[0][1]) == len(parts) and offered == [0] * 7


@SETTINGS
@pytest.mark.parametrize("module", MODULES)
@given(version=st.integers(0, 9), correlation_id=st.integers(-(2**31), 2**31 - 1),
       results=st.lists(st.tuples(st.text(max_size=8), st.lists(st.tuples(st.integers(-(2**31), 2**31 - 1),
                                                                           st.integers(-(2**15), 2**15 - 1)),
                                                                 max_size=4)), max_size=3))
def test_commit_results_encode_as_their_generated_message(module: ModuleType, version: int, correlation_id: int,
                                                           results: list[tuple[str, list[tuple[int, int]]]]) -> None:
    """OffsetCommit's handler answers with tuples (coordinator/apis/k08: CommitAnswer)."""
    cls = REGISTRY[8].response.cls
    topic = cls.OffsetCommitResponseTopic
    message = cls(throttle_time_ms=0, topics=[
        topic(name=name, partitions=[topic.OffsetCommitResponsePartition(partition_index=p, error_code=e)
                                     for p, e in parts]) for name, parts in results])
    expected = generated(8).encode_response(message, version, correlation_id)
    assert hot(module, 8).encode_results(results, version, correlation_id) == expected


def _value_bytes(version: int, offset: int, epoch: int, metadata: str, commit_ts: int, expire_ts: int) -> bytes:
    """An offset-commit record value of ``version`` (0-3), written out by hand."""
    raw = metadata.encode()
    meta = struct.pack(">h", len(raw)) + raw
    if version == 3:
        return struct.pack(">hqi", 3, offset, epoch) + meta + struct.pack(">q", commit_ts)
    tail = struct.pack(">qq", commit_ts, expire_ts) if version == 1 else struct.pack(">q", commit_ts)
    return struct.pack(">hq", version, offset) + meta + tail


# A cached offset is an OffsetAndMetadata or the bytes of its record value, as a live commit writes them
# and the loader keeps them (coordinator.state.StoredOffset): the codec copies the bytes' fields across.
_values = st.none() | st.builds(OffsetAndMetadata, st.integers(-(2**63), 2**63 - 1), st.integers(-(2**31), 2**31 - 1),
                                st.text(max_size=6), st.integers(0, 2**40), st.just(-1)) | st.builds(
    _value_bytes, st.integers(0, 3), st.integers(-(2**63), 2**63 - 1), st.integers(-(2**31), 2**31 - 1),
    st.text(max_size=6), st.integers(0, 2**40), st.integers(-1, 2**40))
_offsets = st.lists(st.tuples(st.text(max_size=6), st.lists(st.tuples(st.integers(-(2**31), 2**31 - 1), _values,
                                                                       st.integers(-(2**15), 2**15 - 1)),
                                                             max_size=3)), max_size=3)


@SETTINGS
@pytest.mark.parametrize("module", MODULES)
@given(version=st.integers(0, 9), correlation_id=st.integers(-(2**31), 2**31 - 1),
       groups=st.lists(st.lists(st.tuples(st.text(max_size=6), st.integers(-(2**15), 2**15 - 1), _offsets)
                                .map(list), min_size=1, max_size=1), min_size=1, max_size=3))
def test_fetch_answers_encode_as_their_generated_message(module: ModuleType, version: int, correlation_id: int,
                                                          groups: list[list[list[Any]]]) -> None:
    """OffsetFetch's handler answers with lists and tuples (coordinator/apis/k09: FetchAnswer); v0-v7
    answer for one group."""
    answer = FetchAnswer([g[0] for g in groups] if version >= 8 else [groups[0][0]])
    expected = generated(9).encode_response(k09.message(answer, version), version, correlation_id)
    assert hot(module, 9).encode_answer(answer.groups, version, correlation_id) == expected
