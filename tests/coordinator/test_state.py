"""``coordinator.state`` (the one ``replay``) is compiled with mypyc by the install when it can be: every
test here runs against the module the install built and against its source interpreted, and random
record sequences must leave both in the same state."""

from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import coordinator.state as installed
from coordinator.state import GroupState, ShardData
from protocol.records import (
    GroupMetadata,
    GroupMetadataRecord,
    LoadedRecord,
    MemberMetadata,
    OffsetAndMetadata,
    OffsetCommitRecord,
    OffsetKey,
    Record,
    encode_offset_value,
)
from tests.coordinator.harness import offsets_of, pending_of
from tests.interpreted import assert_compiled, interpreted

PURE = interpreted(installed)
K0, K1 = OffsetKey("g", "t", 0), OffsetKey("g", "t", 1)


@pytest.fixture(params=["installed", "interpreted"])
def shard_data(request: pytest.FixtureRequest) -> type[ShardData]:
    module = installed if request.param == "installed" else PURE
    cls: type[ShardData] = module.ShardData
    return cls


def test_compiled_when_the_machine_can_compile() -> None:
    assert_compiled(installed, PURE)


def value(offset: int) -> OffsetAndMetadata:
    return OffsetAndMetadata(offset, -1, "", 1)


@pytest.mark.parametrize(("commit", "expected"), [(False, 7), (True, 9)])
def test_reference_vector_20_transaction_markers(shard_data: type[ShardData], commit: bool, expected: int) -> None:
    data = shard_data()
    data.replay(0, OffsetCommitRecord(K0, value(5)))
    data.replay(1, OffsetCommitRecord(K0, value(7)))
    data.replay(2, OffsetCommitRecord(K1, None))
    data.replay(3, OffsetCommitRecord(K0, value(9)), producer_id=9)
    assert data.committed("g", "t", 0) == value(7)
    data.replay_end_transaction(9, commit)
    assert data.committed("g", "t", 0) == value(expected)
    assert not data.pending and not data.pending_count


def test_commit_marker_does_not_override_a_newer_plain_commit(shard_data: type[ShardData]) -> None:
    data = shard_data()
    data.replay(3, OffsetCommitRecord(K0, value(9)), producer_id=9)
    data.replay(4, OffsetCommitRecord(K0, value(11)))
    data.replay_end_transaction(9, commit=True)
    assert data.committed("g", "t", 0) == value(11)


def test_a_transaction_committed_later_does_not_override_a_newer_transactional_offset(
        shard_data: type[ShardData]) -> None:
    """Two producers' transactions on one partition committed in the other order than they wrote: the
    newer record stays, as Kafka's replayEndTransactionMarker keeps it (it compares record offsets). The
    older one was installed over it, so kcoord served another offset than Kafka and the pipeline."""
    data = shard_data()
    data.replay(3, OffsetCommitRecord(K0, value(9)), producer_id=1)
    data.replay(4, OffsetCommitRecord(K0, value(11)), producer_id=2)
    data.replay(5, OffsetCommitRecord(K0, value(12)))  # plain, then the older producer's again
    data.replay(6, OffsetCommitRecord(K0, value(13)), producer_id=1)
    data.replay_end_transaction(2, commit=True)
    assert data.committed("g", "t", 0) == value(12)
    data.replay(8, OffsetCommitRecord(K0, value(15)), producer_id=2)
    data.replay_end_transaction(2, commit=True)
    assert data.committed("g", "t", 0) == value(15)
    data.replay_end_transaction(1, commit=True)
    assert data.committed("g", "t", 0) == value(15)
    assert not data.pending and not data.pending_count and not data.contested


def test_simple_group_is_created_by_a_commit_and_survives_tombstones(shard_data: type[ShardData]) -> None:
    data = shard_data()
    data.replay(0, OffsetCommitRecord(K0, value(1)))
    assert data.groups["g"].state is GroupState.EMPTY and data.groups["g"].protocol_type is None
    assert data.num_offsets == 1
    data.replay(1, OffsetCommitRecord(K0, None))
    assert data.num_offsets == 0 and "g" not in data.offsets and "g" in data.groups


def test_tombstone_for_an_offset_never_seen_is_harmless(shard_data: type[ShardData]) -> None:
    data = shard_data()
    data.replay(0, OffsetCommitRecord(K1, None))
    assert data.num_offsets == 0


def test_group_metadata_loads_empty_or_stable(shard_data: type[ShardData]) -> None:
    data = shard_data()
    data.replay(0, GroupMetadataRecord("e", GroupMetadata("consumer", 4, None, None, 1)))
    member = MemberMetadata("m1", "i1", "c", "/h", -1, 45000, b"", b"")
    data.replay(1, GroupMetadataRecord("s", GroupMetadata("consumer", 2, "range", "m1", 1, (member,))))
    assert data.groups["e"].state is GroupState.EMPTY
    assert data.groups["s"].state is GroupState.STABLE and data.groups["s"].static_members == {"i1": "m1"}
    data.replay(2, GroupMetadataRecord("s", None))
    assert "s" not in data.groups


def test_a_group_deleted_while_it_still_has_offsets_stays_as_a_simple_group(shard_data: type[ShardData]) -> None:
    """A deletion of a group with many offsets is appended in slices; a commit of a partition it did not
    list may land between them. The group's tombstone then leaves the group as that commit alone would
    have (simple, Empty), not an offset of no group (one ListGroups would not show, nor DeleteGroups find)."""
    data = shard_data()
    data.replay(0, GroupMetadataRecord("g", GroupMetadata("consumer", 4, None, None, 1)))
    data.replay(1, OffsetCommitRecord(K0, value(1)))
    data.replay(2, OffsetCommitRecord(K0, None))  # the deletion's offset tombstones...
    data.replay(3, OffsetCommitRecord(K1, value(7)))  # ...a commit between its slices...
    data.replay(4, GroupMetadataRecord("g", None))  # ...and its group tombstone
    assert data.committed("g", "t", 1) == value(7)
    group = data.groups["g"]
    assert group.state is GroupState.EMPTY and group.protocol_type is None and group.generation == 0
    data.replay(5, OffsetCommitRecord(K1, None))
    data.replay(6, GroupMetadataRecord("g", None))  # a deletion with nothing left: the group goes
    assert "g" not in data.groups and "g" not in data.offsets


def test_a_group_emptied_and_committed_to_again_in_one_batch_keeps_the_new_offset(
        shard_data: type[ShardData]) -> None:
    """Replay reuses the previous record's group: a tombstone that empties the group (its offsets dict
    goes) must not leave a later commit of the same batch writing into the dropped dict."""
    data = shard_data()
    for records in ([loaded(r) for r in _emptied_and_again()], _emptied_and_again()):
        data.replay_records(0, records)
        assert data.committed("g", "t", 0) == value(3) and data.committed("g", "u", 1) == value(4)
        assert data.num_offsets == 2 and set(data.offsets["g"]) == {("t", 0), ("u", 1)}


def _emptied_and_again() -> list[Record]:
    return [OffsetCommitRecord(K0, value(1)), OffsetCommitRecord(K0, None), OffsetCommitRecord(K0, value(3)),
            OffsetCommitRecord(OffsetKey("g", "u", 1), value(4))]


def test_interned_keys_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past its bound the table of shared keys starts again; the offsets cached meanwhile stay right.
    (Interpreted only: compiled, the bound is a constant.)"""
    monkeypatch.setattr(PURE, "INTERNED_PARTITIONS_MAX", 3)
    data = PURE.ShardData()
    data.replay_records(0, [OffsetCommitRecord(OffsetKey("g", t, p), value(p)) for t in "ab" for p in range(4)])
    assert data.interned <= 3 and data.num_offsets == 8
    assert all(data.committed("g", t, p) == value(p) for t in "ab" for p in range(4))
    # the table the batch went on with stays registered and counted: later batches share its keys
    assert data.interned == sum(len(by_partition) for by_partition in data.partitions.values())
    data.replay_records(8, [OffsetCommitRecord(OffsetKey("h", "b", 3), value(3))])
    assert next(k for k in data.offsets["h"]) is next(k for k in data.offsets["g"] if k == ("b", 3))


def test_shared_keys_of_offsets_that_are_gone_are_dropped(shard_data: type[ShardData]) -> None:
    """Groups that commit to topics of their own and are deleted: the table of shared keys is cut back
    to what the offsets still cached need (it kept up to a million keys per partition: an operator's
    soak of 200k such groups held ~80 MB after every offset was gone)."""
    data = shard_data()
    at = 0
    for round_ in range(5):
        keys = [OffsetKey(f"g{round_}", f"r{round_}-{i}", 0) for i in range(3000)]
        data.replay_records(at, [OffsetCommitRecord(k, value(1)) for k in keys])
        data.replay_records(at + 3000, [OffsetCommitRecord(k, None) for k in keys])
        at += 6000
        assert data.num_offsets == 0 and not data.offsets
    assert data.interned <= 3000 + 1024, data.interned
    assert data.interned == sum(len(by_partition) for by_partition in data.partitions.values())
    # offsets still cached keep theirs, and share them with later commits
    data.replay_records(at, [OffsetCommitRecord(OffsetKey("live", "t", p), value(p)) for p in range(2000)])
    data.replay_records(at + 2000, [OffsetCommitRecord(OffsetKey(f"other{i}", f"x{i}", 0), value(1))
                                    for i in range(5000)])
    data.replay_records(at + 7000, [OffsetCommitRecord(OffsetKey("late", "t", 5), value(5))])
    assert next(iter(data.offsets["late"])) is next(k for k in data.offsets["live"] if k == ("t", 5))
    assert all(data.committed("live", "t", p) == value(p) for p in range(2000))


def test_groups_share_one_key_per_topic_partition(shard_data: type[ShardData]) -> None:
    """Memory: a million offsets over a few thousand partitions hold a few thousand key tuples. Both
    paths in (a whole batch, and a pending offset made visible by its COMMIT marker) share them."""
    data = shard_data()
    data.replay_records(0, [OffsetCommitRecord(OffsetKey(g, "t", 300), value(1)) for g in ("a", "b")])
    data.replay(2, OffsetCommitRecord(OffsetKey("c", "t", 300), value(1)), producer_id=4)
    data.replay_end_transaction(4, commit=True)
    keys = [next(iter(data.offsets[g])) for g in ("a", "b", "c")]
    assert keys[0] == ("t", 300) and keys[1] is keys[0] and keys[2] is keys[0]
    assert data.committed("b", "t", 300) == value(1)


def snapshot(data: ShardData) -> tuple[Any, ...]:
    groups = {g: (x.state, x.generation, x.protocol_type, tuple(x.members)) for g, x in data.groups.items()}
    return (offsets_of(data), groups, data.num_offsets, pending_of(data), data.pending_count, data.contested)


def _metadata(members: int) -> GroupMetadata:
    ids = [f"m{i}" for i in range(members)]
    return GroupMetadata("consumer", 3, "range" if ids else None, ids[0] if ids else None, 1, tuple(
        MemberMetadata(m, None, "c", "/h", -1, 45000, b"", b"") for m in ids))


keys = st.builds(OffsetKey, st.sampled_from(["a", "b", "é"]), st.sampled_from(["t", "u"]), st.integers(0, 3))
# a commit that sets its own expiry is a v1 request, which has no leader epoch (and is stored as value v1)
offsets = st.builds(OffsetAndMetadata, st.integers(-1, 1 << 40), st.integers(-1, 5), st.sampled_from(["", "m", "ü"]),
                    st.integers(0, 1 << 42), st.sampled_from([-1, 1 << 41])).map(
    lambda v: v if v.expire_timestamp == -1 else v._replace(leader_epoch=-1))
# (producer id or -1, records) for a batch, or (producer id, COMMIT/ABORT) for a marker
batches = st.one_of(
    st.tuples(st.sampled_from([-1, -1, 7, 9]), st.lists(st.one_of(
        st.builds(OffsetCommitRecord, keys, st.one_of(st.none(), offsets)),
        st.builds(GroupMetadataRecord, st.sampled_from(["a", "b", "z"]),
                  st.one_of(st.none(), st.builds(_metadata, st.integers(0, 2))))), min_size=1, max_size=6)),
    st.tuples(st.sampled_from([7, 9]), st.booleans()),
)


def loaded(record: Record) -> LoadedRecord:
    """An offset commit as the compiled loader hands it over: plain tuples, the value's bytes as logged."""
    if isinstance(record, OffsetCommitRecord):
        value = None if record.value is None else encode_offset_value(record.value)
        return (tuple(record.key), value)  # type: ignore[return-value]
    return record


def paired(record: Record) -> LoadedRecord:
    """An offset commit as the commit path prepares it (coordinator.offsets): a plain key tuple and
    the value object (protocol.records.CommitPair)."""
    if isinstance(record, OffsetCommitRecord) and record.value is not None:
        return (tuple(record.key), record.value)  # type: ignore[return-value]
    return record


@settings(max_examples=300, deadline=None)
@given(st.lists(batches, max_size=12))
def test_installed_and_interpreted_replay_agree(log: list[tuple[int, Any]]) -> None:
    """The compiled replay is the interpreted one, and a commit in plain tuples (loaded, with the
    value's bytes; or prepared by a commit, with its value object) is applied as its record is: same
    offsets, groups, pending transactions."""
    states = [installed.ShardData(), PURE.ShardData(), installed.ShardData(), PURE.ShardData(),
              installed.ShardData(), PURE.ShardData()]
    for i, data in enumerate(states):
        offset = 0
        for producer, item in log:
            if isinstance(item, bool):
                data.replay_end_transaction(producer, commit=item)
                offset += 1
                continue
            shape = loaded if i in (2, 3) else paired if i >= 4 else None
            records: list[LoadedRecord] = [shape(r) for r in item] if shape is not None else item
            data.replay_records(offset, records, producer)
            offset += len(records)
    assert all(snapshot(data) == snapshot(states[0]) for data in states[1:])
    for i, data in enumerate(states):  # the classes survive too (compiled code could rebuild a named tuple)
        kept = bytes if i in (2, 3) else OffsetAndMetadata  # loaded commits are cached as the bytes read
        assert all(type(k) is tuple and type(v) is kept for group in data.offsets.values() for k, v in group.items())
        assert all(type(k) is OffsetKey and type(v[1]) is kept
                   for offs in data.pending.values() for k, v in offs.items())
        assert all(type(k) is OffsetKey for k in [*data.pending_count, *data.contested])


def test_the_fixture_really_runs_both(shard_data: type[ShardData]) -> None:
    module: ModuleType = installed if shard_data is installed.ShardData else PURE
    assert shard_data is module.ShardData
