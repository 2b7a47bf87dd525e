"""The pure handlers: exact records and per-partition errors (reference 5.2, 6.2, 19.5)."""

import re
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator import offsets
from coordinator.groups.model import GroupMember
from coordinator.offsets import (
    LARGE_FETCH,
    OffsetsCopy,
    commit_offsets,
    copied_offsets,
    fetch_offsets,
    group_id_error,
    prepare_commit,
    refuse_all,
)
from coordinator.state import ClassicGroup, GroupState, ShardData
from protocol import compiled, hotcodec
from protocol.commit import CommitRequest, PartitionCommit
from protocol.errors import ErrorCode
from protocol.records import (
    LiveRecord,
    OffsetAndMetadata,
    OffsetCommitRecord,
    OffsetKey,
    encode_offset_key,
    encode_offset_value,
    offset_key_prefix,
)
from storage.loadcodec import loaded_value
from tests.interpreted import interpreted, skip_unless_the_machine_compiles

NOW = 1_700_000_000_000
E = ErrorCode
PURE = interpreted(offsets)


def request(version: int = 8, generation: int = -1, member: str = "", instance: str | None = None,
            retention: int = -1, parts: list[PartitionCommit] | None = None, group: str = "g") -> CommitRequest:
    parts = parts if parts is not None else [(0, 10, -1, -1, "m")]
    return CommitRequest(version, group, generation, member, instance, retention, [("t", parts)])


def errors(data: ShardData, req: CommitRequest) -> list[ErrorCode]:
    return [e for _, parts in commit_offsets(data, req, NOW, 4096)[1] for _, e in parts]


def member(member_id: str, instance: str | None = None) -> GroupMember:
    return GroupMember(member_id, instance, "c", "/127.0.0.1", 300000, 45000, "consumer", [])


def stable_group(state: GroupState = GroupState.STABLE) -> ShardData:
    data = ShardData()
    data.put_group(ClassicGroup("g", state=state, generation=3, protocol_type="consumer",
                                members={"m": member("m"), "m1": member("m1", "i1")},
                                static_members={"i1": "m1"}))
    return data


def named(records: list[LiveRecord]) -> list[OffsetCommitRecord]:
    """A commit's records, (key, value bytes) pairs, as the named records they stand for."""
    out = []
    for key, value in records:
        assert type(value) is bytes
        out.append(OffsetCommitRecord(OffsetKey(*key), loaded_value(value)))
    return out


def reference_bytes(req: CommitRequest, now: int, max_metadata: int = 4096) -> list[tuple[bytes, bytes]]:
    """What protocol.records' encoders write for the request's acceptable partitions (a legal topic, a
    partition >= 0, metadata of at most ``max_metadata`` UTF-16 units), worked out from the request."""
    expire = -1 if req.retention_ms == -1 else min(now + req.retention_ms, 2**63 - 1)
    out = []
    for topic, parts in req.topics:
        for partition, offset, epoch, ts, metadata in parts:
            meta = metadata or ""
            if (re.fullmatch(r"[a-zA-Z0-9._-]{1,249}", topic) is None or partition < 0
                    or len(meta.encode("utf-16-le")) // 2 > max_metadata):
                continue
            value = OffsetAndMetadata(offset, epoch, meta, now if ts == -1 else ts, expire)
            out.append((encode_offset_key((req.group_id, topic, partition)), encode_offset_value(value)))
    return out


def test_simple_commit_writes_one_v3_record_per_partition() -> None:
    parts = [(0, 10, 4, -1, "a"), (1, 11, -1, -1, None)]
    records, result = commit_offsets(ShardData(), request(parts=parts), NOW, 4096)
    assert named(records) == [
        OffsetCommitRecord(OffsetKey("g", "t", 0), OffsetAndMetadata(10, 4, "a", NOW, -1)),
        OffsetCommitRecord(OffsetKey("g", "t", 1), OffsetAndMetadata(11, -1, "", NOW, -1)),
    ]
    assert result == [("t", [(0, E.NONE), (1, E.NONE)])]


def test_prepared_record_bytes_are_what_the_record_encoder_writes() -> None:
    """prepare_commit builds keys from a per-topic prefix and values directly: the same bytes."""
    parts: list[PartitionCommit] = [(p, 10 + p, p % 3 - 1, -1, "é" * p) for p in range(5)]
    parts.append((-1, 1, -1, -1, ""))
    topics = [("t", parts), ("other.topic", parts[:2]), ("b@d", parts)]
    for retention in (-1, 1000):
        req = CommitRequest(8, "grüppe", -1, "", None, retention, topics)
        prepared = prepare_commit(req, NOW, 4096)
        assert len(prepared.records) == 7
        assert prepared.encoded == reference_bytes(req, NOW)
        # the cache keeps the value bytes the record carries
        assert [value for _, value in prepared.encoded] == [value for _, value in prepared.records]


def test_retention_and_explicit_commit_timestamp() -> None:
    parts: list[PartitionCommit] = [(0, 10, -1, 12345, "")]
    records, _ = commit_offsets(ShardData(), request(version=2, retention=1000, parts=parts), NOW, 4096)
    expected = OffsetAndMetadata(10, -1, "", 12345, NOW + 1000)
    assert named(records) == [OffsetCommitRecord(OffsetKey("g", "t", 0), expected)]


def test_unknown_group_with_generation() -> None:
    assert errors(ShardData(), request(version=8, generation=5, member="m")) == [E.ILLEGAL_GENERATION]
    assert errors(ShardData(), request(version=9, generation=5, member="m")) == [E.GROUP_ID_NOT_FOUND]


def test_stable_group_member_checks() -> None:
    data = stable_group()
    assert errors(data, request(generation=-1, member="")) == [E.UNKNOWN_MEMBER_ID]
    assert errors(data, request(generation=3, member="x")) == [E.UNKNOWN_MEMBER_ID]
    assert errors(data, request(generation=2, member="m")) == [E.ILLEGAL_GENERATION]
    assert errors(data, request(generation=3, member="m")) == [E.NONE]


def test_rebalance_states() -> None:
    assert errors(stable_group(GroupState.COMPLETING_REBALANCE), request(generation=3, member="m")) == [
        E.REBALANCE_IN_PROGRESS
    ]
    assert errors(stable_group(GroupState.PREPARING_REBALANCE), request(generation=3, member="m")) == [E.NONE]
    assert errors(stable_group(GroupState.DEAD), request(generation=3, member="m")) == [E.COORDINATOR_NOT_AVAILABLE]


def test_static_members() -> None:
    data = stable_group()
    assert errors(data, request(generation=3, member="m2", instance="i1")) == [E.FENCED_INSTANCE_ID]
    assert errors(data, request(generation=3, member="m1", instance="i9")) == [E.UNKNOWN_MEMBER_ID]
    assert errors(data, request(generation=3, member="m1", instance="i1")) == [E.NONE]


def test_group_errors_apply_to_every_partition_and_write_nothing() -> None:
    parts: list[PartitionCommit] = [(p, 1, -1, -1, "") for p in range(3)]
    records, result = commit_offsets(stable_group(), request(generation=1, member="m", parts=parts), NOW, 4096)
    assert records == []
    assert result == [("t", [(0, E.ILLEGAL_GENERATION), (1, E.ILLEGAL_GENERATION), (2, E.ILLEGAL_GENERATION)])]


def test_metadata_limit_counts_utf16_units_per_partition() -> None:
    parts: list[PartitionCommit] = [
        (0, 1, -1, -1, "x" * 4097),
        (1, 1, -1, -1, "x" * 4096),
        (2, 1, -1, -1, "\U0001F600" * 2049),  # 4098 UTF-16 units, 2049 code points
        (-1, 1, -1, -1, ""),
    ]
    records, result = commit_offsets(ShardData(), request(parts=parts), NOW, 4096)
    assert [key[2] for key, _ in records] == [1]
    assert result == [("t", [(0, E.OFFSET_METADATA_TOO_LARGE), (1, E.NONE), (2, E.OFFSET_METADATA_TOO_LARGE),
                             (-1, E.UNKNOWN_TOPIC_OR_PARTITION)])]


def test_fetch_unknown_partitions_and_groups() -> None:
    data = ShardData()
    data.replay(0, OffsetCommitRecord(OffsetKey("g", "t", 0), OffsetAndMetadata(7, 2, "m", NOW)))
    assert fetch_offsets(data, "g", [("t", [0, 1])], False) == [
        ("t", [(0, OffsetAndMetadata(7, 2, "m", NOW), E.NONE), (1, None, E.NONE)])
    ]
    assert fetch_offsets(data, "nobody", None, False) == []
    assert fetch_offsets(data, "g", None, False) == [("t", [(0, OffsetAndMetadata(7, 2, "m", NOW),
                                                                            E.NONE)])]


def large_group(topics: int = 3) -> ShardData:
    """A group with more than LARGE_FETCH offsets over ``topics`` topics, committed out of order."""
    data = ShardData()
    per_topic = LARGE_FETCH // topics + 5
    keys = [(f"t{t}", p) for p in reversed(range(per_topic)) for t in reversed(range(topics))]
    for i, (topic, partition) in enumerate(keys):
        data.replay(i, OffsetCommitRecord(OffsetKey("big", topic, partition), OffsetAndMetadata(i, -1, "", NOW)))
    data.replay(len(keys), OffsetCommitRecord(OffsetKey("small", "t", 0), OffsetAndMetadata(1, -1, "", NOW)))
    return data


@pytest.mark.parametrize("module", [offsets, PURE], ids=["compiled", "interpreted"])
def test_a_fetch_of_all_of_a_large_group_reads_a_copy_that_answers_the_same(module: Any) -> None:
    data = large_group()
    m = module
    copy = m.read_offsets(data, "big", None, False)
    assert type(copy) is m.OffsetsCopy
    expected = fetch_offsets(data, "big", None, False)
    assert [t for t, _ in expected] == ["t0", "t1", "t2"]
    assert all([p for p, _, _ in parts] == sorted(p for p, _, _ in parts) for _, parts in expected)
    # a commit made after the copy is not in the answer made from it
    data.replay(99_999, OffsetCommitRecord(OffsetKey("big", "t9", 0), OffsetAndMetadata(5, -1, "", NOW)))
    assert m.copied_offsets(copy) == expected
    # small groups, named partitions and a stable fetch with a transaction pending are read at once
    assert m.read_offsets(data, "small", None, False) == fetch_offsets(data, "small", None, False)
    asked = [("t0", [0, 1])]
    assert m.read_offsets(data, "big", asked, False) == fetch_offsets(data, "big", asked, False)
    # that many partitions named (some never committed, of a group or of nobody) are read as a copy too
    many = [("t1", list(range(LARGE_FETCH))), ("t9", [0, 3]), ("zz", [7])]
    for group in ("big", "nobody"):
        named = m.read_offsets(data, group, many, False)
        assert type(named) is m.OffsetsCopy
        data.replay(100_001, OffsetCommitRecord(OffsetKey(group, "zz", 7), OffsetAndMetadata(1, -1, "", NOW)))
        assert m.copied_offsets(named) != fetch_offsets(data, group, many, False)  # the copy is as it was read
        data.replay(100_002, OffsetCommitRecord(OffsetKey(group, "zz", 7), None))
        assert m.copied_offsets(named) == fetch_offsets(data, group, many, False)
    # but not from a group holding over COPY_MAX_RATIO times what was asked: those are looked up at once
    huge = ShardData()
    asked_many = [("t", list(range(LARGE_FETCH + 1)))]
    for p in range(m.COPY_MAX_RATIO * (LARGE_FETCH + 1) + 1):
        huge.replay(p, OffsetCommitRecord(OffsetKey("g", "t", p), OffsetAndMetadata(p, -1, "", NOW)))
    assert m.read_offsets(huge, "g", asked_many, False) == fetch_offsets(huge, "g", asked_many, False)
    huge.replay(10**6, OffsetCommitRecord(OffsetKey("g", "t", 0), None))
    assert type(m.read_offsets(huge, "g", asked_many, False)) is m.OffsetsCopy
    data.replay(100_000, OffsetCommitRecord(OffsetKey("big", "t0", 0), OffsetAndMetadata(8, -1, "", NOW)),
                producer_id=3)
    assert type(m.read_offsets(data, "big", None, True)) is list


def test_an_answer_from_a_copy_offers_the_gil(monkeypatch: pytest.MonkeyPatch) -> None:
    """It is made on the bulk thread, where compiled code would otherwise hold the GIL throughout."""
    offered: list[float] = []
    monkeypatch.setattr(time, "sleep", offered.append)
    copy = offsets.read_offsets(large_group(1), "big", None, False)
    assert isinstance(copy, OffsetsCopy)
    offered.clear()
    assert len(copied_offsets(copy)[0][1]) > LARGE_FETCH
    assert len(offered) >= 1
    # offered every YIELD_EVERY entries however they are split over topics, not once per topic
    offered.clear()
    many_topics = [(f"t{i}", [0]) for i in range(2 * hotcodec.YIELD_EVERY + 1)]
    assert len(copied_offsets(OffsetsCopy({}, many_topics))) == len(many_topics) and len(offered) == 2


def test_require_stable_reports_pending_transactional_offsets() -> None:
    data = ShardData()
    data.replay(0, OffsetCommitRecord(OffsetKey("g", "t", 0), OffsetAndMetadata(7, -1, "", NOW)), producer_id=9)
    assert fetch_offsets(data, "g", [("t", [0])], True) == [("t", [(0, None,
                                                                                    E.UNSTABLE_OFFSET_COMMIT)])]
    assert fetch_offsets(data, "g", [("t", [0])], False) == [("t", [(0, None, E.NONE)])]


def test_partitions_that_cannot_exist_are_refused_before_group_checks() -> None:
    parts: list[PartitionCommit] = [(-1, 1, -1, -1, ""), (0, 1, -1, -1, "")]
    _, result = commit_offsets(ShardData(), request(generation=5, member="m", parts=parts), NOW, 4096)
    assert result == [("t", [(-1, E.UNKNOWN_TOPIC_OR_PARTITION), (0, E.ILLEGAL_GENERATION)])]
    bad_topics = CommitRequest(8, "g", -1, "", None, -1, [("no spaces!", [(0, 1, -1, -1, "")]),
                                                         ("x" * 250, [(0, 1, -1, -1, "")]),
                                                         ("", [(0, 1, -1, -1, "")])])
    records, result = commit_offsets(ShardData(), bad_topics, NOW, 4096)
    assert records == [] and {e for _, parts in result for _, e in parts} == {E.UNKNOWN_TOPIC_OR_PARTITION}


def test_refuse_all_keeps_unknown_partitions_distinct() -> None:
    parts: list[PartitionCommit] = [(-1, 1, -1, -1, ""), (0, 1, -1, -1, "")]
    assert refuse_all(request(parts=parts), E.COORDINATOR_LOAD_IN_PROGRESS) == [
        ("t", [(-1, E.UNKNOWN_TOPIC_OR_PARTITION), (0, E.COORDINATOR_LOAD_IN_PROGRESS)])
    ]


def test_group_ids_too_long_for_a_record_key() -> None:
    assert group_id_error("g" * 32767) == E.NONE
    assert group_id_error("g" * 32768) == E.INVALID_GROUP_ID
    assert group_id_error("\u20ac" * 10923) == E.INVALID_GROUP_ID  # 32769 UTF-8 bytes


def test_retention_overflow_is_clamped_to_int64() -> None:
    records, _ = commit_offsets(ShardData(), request(version=2, retention=2**63 - 1), NOW, 4096)
    value = named(records)[0].value
    assert value is not None and value.expire_timestamp == 2**63 - 1


# -- compiled and interpreted --------------------------------------------------------------------------

_names = st.sampled_from(["t", "topic.a-b_c", "ü", "", "bad name", "x" * 249, "x" * 250])
_parts = st.tuples(st.integers(-2, 2**31 - 1), st.integers(-(2**63), 2**63 - 1),
                    st.integers(-(2**31), 2**31 - 1), st.sampled_from([-1, 0, NOW - 5]),
                    st.none() | st.text(max_size=6) | st.sampled_from(["m" * 4096, "m" * 4097, "\U0001F600" * 2049]))


@settings(max_examples=200, deadline=None)
@given(topics=st.lists(st.tuples(_names, st.lists(_parts, max_size=5)), max_size=4),
       retention=st.sampled_from([-1, 0, 1000, 2**63 - 1]), group=st.sampled_from(["g", "grüppe"]))
def test_prepare_commit_compiled_and_interpreted_agree(topics: list[tuple[str, list[PartitionCommit]]],
                                                       retention: int, group: str) -> None:
    """``coordinator.offsets`` is compiled by the install where it can be: both builds prepare the same
    records, errors and bytes, and the bytes are what the record encoder writes."""
    prepared = []
    for module in (offsets, PURE):
        req = module.CommitRequest(8, group, -1, "", None, retention, topics)
        prepared.append(module.prepare_commit(req, NOW, 4096))
    compiled_one, pure_one = prepared
    assert compiled_one.records == pure_one.records and compiled_one.results == pure_one.results
    assert compiled_one.encoded == pure_one.encoded == reference_bytes(req, NOW)
    # plain (key, value bytes) pairs with a plain key tuple (protocol.records.CommitPair), as replay takes them
    assert all(type(r) is tuple and type(r[0]) is tuple and type(r[1]) is bytes for r in compiled_one.records)
    # what the preparation counts for the metrics (OffsetCommit's outcome) is what walking its errors finds
    walked = [error for _, parts in compiled_one.results for _, error in parts]
    assert compiled_one.first_error == pure_one.first_error == next((e for e in walked if e), 0)
    assert len(compiled_one.records) == sum(1 for e in walked if not e)


def test_a_huge_commit_lets_other_threads_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiled code holds the GIL until it returns, and a huge commit is prepared on the bulk thread
    while the event loop waits: ``prepare_commit``, and ``refuse_all`` for a refused group, offer the GIL
    every YIELD_EVERY partitions."""
    for module in (offsets, PURE):
        offered: list[float] = []
        monkeypatch.setattr(time, "sleep", offered.append)
        parts: list[PartitionCommit] = [(p, 1, -1, -1, "") for p in range(2 * hotcodec.YIELD_EVERY + 1)]
        req = CommitRequest(8, "g", -1, "", None, -1, [("t", parts)])
        prepared = module.prepare_commit(req, NOW, 4096)
        assert len(prepared.records) == len(parts) and offered == [0, 0]
        refused = module.refuse_all(req, ErrorCode.INVALID_GROUP_ID)
        assert len(refused[0][1]) == len(parts) and offered == [0, 0, 0, 0]


def test_offsets_compiled_when_the_machine_can_compile() -> None:
    skip_unless_the_machine_compiles()
    assert compiled.is_compiled(offsets) and not compiled.stale(offsets), "pip install -v -e ."
    assert not compiled.is_compiled(PURE)


def test_legal_topic_is_kafkas_rule() -> None:
    legal = re.compile(r"[a-zA-Z0-9._-]{1,249}")
    for name in ["", "a", "A.b-c_9", "x" * 249, "x" * 250, "a b", "é", "a/b", "a\x00", "\U0001F600", "-", ".", "..",
                 "...", ".a"]:
        for module in (offsets, PURE):
            expected = legal.fullmatch(name) is not None and name not in (".", "..")
            assert module.legal_topic(name) == expected, name


def test_a_commit_to_an_illegal_topic_after_legal_ones_is_refused_and_the_prefixes_stay_bounded() -> None:
    """Key prefixes are remembered for legal topic names only (a name remembered is taken as checked),
    and all are forgotten once KEY_PREFIXES_KEPT are held."""
    for module in (offsets, PURE):
        legal = CommitRequest(8, "g", -1, "", None, -1, [("t", [(0, 5, -1, -1, "")])])
        illegal = CommitRequest(8, "g", -1, "", None, -1, [("a b", [(0, 5, -1, -1, "")]), ("t", [(1, 6, -1, -1, "")])])
        assert module.prepare_commit(legal, NOW, 4096).results == [("t", [(0, ErrorCode.NONE)])]
        prepared = module.prepare_commit(illegal, NOW, 4096)
        assert prepared.results == [("a b", [(0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)]), ("t", [(1, ErrorCode.NONE)])]
        assert [key for key, _ in prepared.encoded] == [encode_offset_key(OffsetKey("g", "t", 1))]
        assert module._key_prefix("g", "a b") is None and "a b" not in module._key_prefixes.get("g", {})
        held = module._key_prefixes_held[0]
        for i in range(module.KEY_PREFIXES_KEPT - held + 1):
            assert module._key_prefix(f"g{i % 7}", f"t{i}") == offset_key_prefix(f"g{i % 7}", f"t{i}")
        assert module._key_prefixes_held[0] <= module.KEY_PREFIXES_KEPT
        assert sum(len(topics) for topics in module._key_prefixes.values()) == module._key_prefixes_held[0]
