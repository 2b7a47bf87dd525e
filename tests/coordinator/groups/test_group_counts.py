"""The per-state group counts a metrics scrape reads (``ShardData.group_counts``), kept as groups change
instead of walked at each scrape: after every way a group comes, changes state or goes they equal a walk
of the groups, live and as loading the log brings them back. (test_replay_property.py checks the same
after random operations.)"""

from coordinator.groups.admin import delete_groups
from coordinator.groups.messages import GroupConfig
from coordinator.groups.model import ClassicGroup, GroupState
from coordinator.groups.retention import expire_offsets
from coordinator.offsets import commit_offsets
from coordinator.shard import OpResult
from coordinator.state import ShardData
from protocol.records import GroupMetadata, GroupMetadataRecord, MemberMetadata
from tests.coordinator.groups.harness import (
    Client,
    GroupShard,
    assert_counts_exact,
    stable_group,
    until_released,
)
from tests.coordinator.harness import commit as commit_record
from tests.coordinator.test_offsets import request

RETENTION_MS = 60_000


def counted(data: ShardData) -> dict[str, int]:
    """The kept counts, checked against a walk, without the states no group is in."""
    assert_counts_exact(data)
    return {s.value: n for s, n in data.group_counts.by_state.items() if n}


def checked(shard: GroupShard) -> dict[str, int]:
    """``counted`` live, and the same for what loading the log gives (groups between generation
    boundaries load as their last record says, so only the check against a walk applies there)."""
    counted(shard.reloaded())
    return counted(shard.data)


def commit(shard: GroupShard, group: str, partition: int = 0) -> None:
    def op(data: ShardData) -> OpResult:
        records, _ = commit_offsets(data, request(group=group, parts=[(partition, 1, -1, -1, "")]),
                                    shard.clock.now_ms(), 4096)
        return OpResult(records, None)
    shard.write(None, op)
    shard.flush()


def test_counts_follow_joins_rebalances_leaves_commits_deletions_and_expiry() -> None:
    shard = GroupShard(GroupConfig(offsets_retention_ms=RETENTION_MS))
    a, b = Client(shard, client_id="a", session_ms=10_000), Client(shard, client_id="b", session_ms=10_000)
    joining = a.join()  # creates the group, which starts rebalancing
    assert checked(shard) == {"PreparingRebalance": 1}
    until_released(shard, joining)
    a.joined(joining)
    assert checked(shard) == {"CompletingRebalance": 1}
    a.sync({a.member_id: b"all"})
    assert checked(shard) == {"Stable": 1}
    commit(shard, "simple")  # a commit to an unknown group creates a simple group: Empty
    assert checked(shard) == {"Stable": 1, "Empty": 1}
    joining_b = b.join()  # a second member: the Stable group rebalances
    assert checked(shard) == {"PreparingRebalance": 1, "Empty": 1}
    rejoining_a = a.join()
    until_released(shard, joining_b, rejoining_a)
    a.joined(rejoining_a), b.joined(joining_b)
    assert checked(shard) == {"CompletingRebalance": 1, "Empty": 1}
    b.sync()
    a.sync({a.member_id: b"a", b.member_id: b"b"})
    assert checked(shard) == {"Stable": 1, "Empty": 1}
    a.leave()
    assert checked(shard) == {"PreparingRebalance": 1, "Empty": 1}
    shard.advance(11_000)  # b sends no heartbeat: its session expires, and the rebalancing group is Empty
    assert checked(shard) == {"Empty": 2}
    b.member_id = ""
    stable_group(shard, b)
    assert checked(shard) == {"Stable": 1, "Empty": 1}
    shard.advance(11_000)  # b's session expires without a heartbeat: the group is left Empty
    assert checked(shard) == {"Empty": 2}
    shard.write(None, lambda data: delete_groups(data, ["g", "simple"]))
    assert checked(shard) == {}
    commit(shard, "old")
    shard.advance(RETENTION_MS)
    shard.write(None, lambda data: expire_offsets(data, shard.clock.now_ms(), RETENTION_MS))
    assert shard.data.groups == {} and checked(shard) == {}  # its offsets expired, and the group with them


def test_a_deletion_whose_group_gained_an_offset_leaves_a_simple_group_counted_once() -> None:
    """A group's tombstone replayed while it still has offsets (a commit landed between the slices of its
    deletion) leaves it a simple, Empty group: removed from its state, counted again as Empty."""
    data = ShardData()
    member = MemberMetadata("m", None, "c", "/h", 1000, 1000, b"", b"")
    data.replay(0, GroupMetadataRecord("g", GroupMetadata("consumer", 3, "range", "m", 1, (member,))))
    assert counted(data) == {"Stable": 1}
    data.replay(1, commit_record("g", 0, 1))
    data.replay(2, GroupMetadataRecord("g", None))
    assert counted(data) == {"Empty": 1}
    data.replay(3, GroupMetadataRecord("g", GroupMetadata("consumer", 4, "range", "m", 2, (member,))))
    assert counted(data) == {"Stable": 1}  # replaced, not added


def test_a_group_no_longer_in_its_shard_moves_no_count() -> None:
    """Code still holding a removed or replaced group (a callback waiting for a write) may change its
    state: the shard's counts must not move."""
    data = ShardData()
    data.replay(0, GroupMetadataRecord("g", GroupMetadata("consumer", 1, None, None, 1)))
    replaced = data.groups["g"]
    data.replay(1, GroupMetadataRecord("g", GroupMetadata("consumer", 2, None, None, 2)))
    replaced.transition(GroupState.PREPARING_REBALANCE, 3)
    assert counted(data) == {"Empty": 1}
    removed = data.groups["g"]
    data.replay(2, GroupMetadataRecord("g", None))
    removed.transition(GroupState.PREPARING_REBALANCE, 4)
    assert counted(data) == {} and removed.counts is None


def test_a_group_made_outside_a_shard_counts_nowhere_until_put() -> None:
    group = ClassicGroup("g")
    group.transition(GroupState.PREPARING_REBALANCE, 1)  # no counts to move
    data = ShardData()
    data.put_group(group)
    assert counted(data) == {"PreparingRebalance": 1}
