"""Group administration as operations on one shard's state (reference 12.6-12.9): describe, list and
delete groups, and delete a group's offsets. Pure functions: they read the state and return results (and
for deletions, tombstones, replayed like any other record)."""

from dataclasses import dataclass, field

from coordinator.groups.model import GroupState
from coordinator.offsets import partition_error
from coordinator.shard import OpResult
from coordinator.state import ShardData
from protocol.errors import ErrorCode
from protocol.records import GroupMetadataRecord, LiveRecord, OffsetCommitRecord, OffsetKey

CLASSIC = "classic"  # KIP-848 group type of every group kcoord hosts


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    error: ErrorCode
    state: str
    protocol_type: str
    protocol: str
    members: list[MemberDescription] = field(default_factory=list)


def describe_group(data: ShardData, group_id: str) -> GroupDescription:
    """An unknown group is described as Dead with no members (not an error, as in Kafka). The protocol and
    the members' metadata are shown only while the group is Stable; each member's assignment in any state
    (its last one, until a rebalance's sync replaces or clears it), as Kafka's group coordinator does
    (GroupMetadataManager.describeGroups: ClassicGroupMember.describeNoMetadata keeps it)."""
    group = data.groups.get(group_id)
    if group is None:
        return GroupDescription(group_id, ErrorCode.NONE, GroupState.DEAD.value, "", "")
    stable = group.is_in(GroupState.STABLE)
    members = [
        MemberDescription(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                          m.metadata(group.protocol) if stable else b"", m.assignment)
        for m in group.members.values()
    ]
    return GroupDescription(group_id, ErrorCode.NONE, group.state.value, group.protocol_type or "",
                            (group.protocol or "") if stable else "", members)


_JAVA_TRIM = "".join(map(chr, range(0x21)))  # what Java's String.trim() strips: every char up to U+0020


def list_filter(states: set[str], types: set[str]) -> frozenset[str] | None:
    """The states a ListGroups asks for, trimmed and lower-cased as Kafka compares them (Java's trim;
    empty: every state), or None when its types filter leaves classic groups out (types only
    lower-cased, as Kafka's GroupType.parse: " classic" is no type). Once per request: done per
    shard, a filter of 200k states cost 50 times its size on the event loop (8 s; a fuzzing campaign's
    find)."""
    if types and CLASSIC not in {t.lower() for t in types}:
        return None
    return frozenset(s.strip(_JAVA_TRIM).lower() for s in states)


def list_groups(data: ShardData, wanted: frozenset[str] | None) -> list[tuple[str, str, str, str]]:
    """``(group id, protocol type, state, type)`` of the groups passing ``list_filter``'s ``wanted``."""
    if wanted is None:
        return []
    return [
        (gid, g.protocol_type or "", g.state.value, CLASSIC)
        for gid, g in data.groups.items()
        if not wanted or g.state.value.lower() in wanted
    ]


def _offset_tombstones(data: ShardData, group_id: str) -> list[LiveRecord]:
    """Tombstones for every committed offset of the group and every pending transactional one."""
    keys = {OffsetKey(group_id, t, p) for (t, p) in data.offsets.get(group_id, {})}
    keys.update(k for offsets in data.pending.values() for k in offsets if k.group == group_id)
    return [OffsetCommitRecord(k, None) for k in sorted(keys)]


def delete_groups(data: ShardData, group_ids: list[str]) -> OpResult:
    """Empty groups go: their offsets' tombstones, then the group's. A group with members is
    NON_EMPTY_GROUP; an unknown or Dead one GROUP_ID_NOT_FOUND."""
    records: list[LiveRecord] = []
    results: list[tuple[str, ErrorCode]] = []
    for group_id in dict.fromkeys(group_ids):  # duplicates collapse, order kept
        group = data.groups.get(group_id)
        if group is None or group.is_in(GroupState.DEAD):
            results.append((group_id, ErrorCode.GROUP_ID_NOT_FOUND))
        elif not group.is_in(GroupState.EMPTY):
            results.append((group_id, ErrorCode.NON_EMPTY_GROUP))
        else:
            records.extend(_offset_tombstones(data, group_id))
            records.append(GroupMetadataRecord(group_id, None))
            results.append((group_id, ErrorCode.NONE))
    return OpResult(records, results)


TopicPartitionErrors = list[tuple[str, list[tuple[int, ErrorCode]]]]


def delete_offsets(data: ShardData, group_id: str, topics: list[tuple[str, list[int]]]) -> OpResult:
    """OffsetDelete (KIP-496): the group's offsets of topics it does not subscribe to are deleted; a
    subscribed topic's partitions answer GROUP_SUBSCRIBED_TO_TOPIC. The response is ``(group error,
    per-topic partition errors)``."""
    group = data.groups.get(group_id)
    if group is None or group.is_in(GroupState.DEAD):
        return OpResult([], (ErrorCode.GROUP_ID_NOT_FOUND, []))
    if not group.is_in(GroupState.EMPTY) and group.protocol_type != "consumer":
        return OpResult([], (ErrorCode.NON_EMPTY_GROUP, []))
    committed = data.offsets.get(group_id, {})
    records: list[LiveRecord] = []
    results: TopicPartitionErrors = []
    for topic, partitions in topics:
        subscribed = group.is_subscribed_to(topic)
        errors = []
        for p in partitions:
            # A partition that cannot exist is refused before the group is asked (Kafka's request
            # handler does so), subscribed topic or not.
            error = partition_error(topic, p) or (ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC if subscribed else ErrorCode.NONE)
            key = OffsetKey(group_id, topic, p)
            if not error and ((topic, p) in committed or data.has_pending(key)):
                records.append(OffsetCommitRecord(key, None))
            errors.append((p, error))
        results.append((topic, errors))
    return OpResult(records, (ErrorCode.NONE, results))

