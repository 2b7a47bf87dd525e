import pytest

from coordinator.state import GroupState, ShardData
from protocol.records import (
    GroupMetadata,
    GroupMetadataRecord,
    MemberMetadata,
    OffsetAndMetadata,
    OffsetCommitRecord,
    OffsetKey,
)

K0, K1 = OffsetKey("g", "t", 0), OffsetKey("g", "t", 1)


def value(offset: int) -> OffsetAndMetadata:
    return OffsetAndMetadata(offset, -1, "", 1)


@pytest.mark.parametrize(("commit", "expected"), [(False, 7), (True, 9)])
def test_reference_vector_20_transaction_markers(commit: bool, expected: int) -> None:
    data = ShardData()
    data.replay(0, OffsetCommitRecord(K0, value(5)))
    data.replay(1, OffsetCommitRecord(K0, value(7)))
    data.replay(2, OffsetCommitRecord(K1, None))
    data.replay(3, OffsetCommitRecord(K0, value(9)), producer_id=9)
    assert data.committed("g", "t", 0) == value(7)
    data.replay_end_transaction(9, commit)
    assert data.committed("g", "t", 0) == value(expected)
    assert not data.pending and not data.pending_count


def test_commit_marker_does_not_override_a_newer_plain_commit() -> None:
    data = ShardData()
    data.replay(3, OffsetCommitRecord(K0, value(9)), producer_id=9)
    data.replay(4, OffsetCommitRecord(K0, value(11)))
    data.replay_end_transaction(9, commit=True)
    assert data.committed("g", "t", 0) == value(11)


def test_simple_group_is_created_by_a_commit_and_survives_tombstones() -> None:
    data = ShardData()
    data.replay(0, OffsetCommitRecord(K0, value(1)))
    assert data.groups["g"].state is GroupState.EMPTY and data.groups["g"].protocol_type is None
    assert data.num_offsets == 1
    data.replay(1, OffsetCommitRecord(K0, None))
    assert data.num_offsets == 0 and "g" not in data.offsets and "g" in data.groups


def test_tombstone_for_an_offset_never_seen_is_harmless() -> None:
    data = ShardData()
    data.replay(0, OffsetCommitRecord(K1, None))
    assert data.num_offsets == 0


def test_group_metadata_loads_empty_or_stable() -> None:
    data = ShardData()
    data.replay(0, GroupMetadataRecord("e", GroupMetadata("consumer", 4, None, None, 1)))
    member = MemberMetadata("m1", "i1", "c", "/h", -1, 45000, b"", b"")
    data.replay(1, GroupMetadataRecord("s", GroupMetadata("consumer", 2, "range", "m1", 1, (member,))))
    assert data.groups["e"].state is GroupState.EMPTY
    assert data.groups["s"].state is GroupState.STABLE and data.groups["s"].static_members == {"i1": "m1"}
    data.replay(2, GroupMetadataRecord("s", None))
    assert "s" not in data.groups


def test_groups_share_one_key_per_topic_partition() -> None:
    """Memory: a million offsets over a few thousand partitions hold a few thousand key tuples. Both
    paths in (a whole batch, and a pending offset made visible by its COMMIT marker) share them."""
    data = ShardData()
    data.replay_records(0, [OffsetCommitRecord(OffsetKey(g, "t", 300), value(1)) for g in ("a", "b")])
    data.replay(2, OffsetCommitRecord(OffsetKey("c", "t", 300), value(1)), producer_id=4)
    data.replay_end_transaction(4, commit=True)
    keys = [next(iter(data.offsets[g])) for g in ("a", "b", "c")]
    assert keys[0] == ("t", 300) and keys[1] is keys[0] and keys[2] is keys[0]
    assert data.committed("b", "t", 300) == value(1)
