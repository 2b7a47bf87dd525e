"""DescribeGroups, ListGroups, DeleteGroups, OffsetDelete per group state (reference 12.6-12.9, vectors
19.5.14-15), and offset retention at its exact boundaries (reference 11, vector 19.5.16)."""

import struct

import pytest

from coordinator.groups.admin import delete_groups, delete_offsets, describe_group, list_filter, list_groups
from coordinator.groups.model import GroupState
from coordinator.groups.retention import expire_offsets
from coordinator.offsets import commit_offsets
from coordinator.shard import OpResult
from coordinator.state import ShardData
from protocol.commit import PartitionCommit
from protocol.errors import ErrorCode
from protocol.records import GroupMetadataRecord, LiveRecord, OffsetAndMetadata, OffsetCommitRecord, OffsetKey
from tests.coordinator.groups.harness import T0, Client, GroupShard, stable_group, until_released
from tests.coordinator.test_offsets import request

E = ErrorCode
WEEK = 7 * 24 * 3600 * 1000


def subscription(*topics: str) -> bytes:
    """A consumer-protocol subscription (v0: topics, user data), as clients encode it."""
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


def simple_commit(shard: GroupShard, group: str, partitions: list[int], at: int | None = None) -> None:
    parts: list[PartitionCommit] = [(p, 10 + p, -1, -1, "") for p in partitions]
    records, _ = commit_offsets(shard.data, request(group=group, parts=parts), at or shard.clock.now_ms(), 4096)
    shard.data.replay_records(len(shard.log), records)
    shard.log.extend(records)


def consumer_group(shard: GroupShard, *topics: str) -> list[Client]:
    clients = [Client(shard, client_id=f"c{i}", protocols=[("range", subscription(*topics))]) for i in range(2)]
    stable_group(shard, *clients)
    return clients


# -- describe and list ---------------------------------------------------------------------------------

def test_describe_shows_protocol_and_metadata_when_stable_and_the_last_assignments_in_any_state() -> None:
    """As Kafka's GroupMetadataManager.describeGroups: a rebalance hides the protocol and the members'
    metadata, but each member's last assignment stays shown until a sync replaces or clears it."""
    shard = GroupShard()
    clients = consumer_group(shard, "orders")
    d = describe_group(shard.data, "g")
    assert (d.error, d.state, d.protocol_type, d.protocol) == (E.NONE, "Stable", "consumer", "range")
    assert {m.client_id: (m.client_host, m.assignment) for m in d.members} == {
        "c0": ("/127.0.0.1", b"assigned-c0"), "c1": ("/127.0.0.1", b"assigned-c1")}
    assert all(m.metadata == subscription("orders") for m in d.members)
    last = {"c0": b"assigned-c0", "c1": b"assigned-c1"}
    replies = [clients[0].join()]  # PreparingRebalance: no protocol or metadata; the last assignments
    d = describe_group(shard.data, "g")
    assert (d.state, d.protocol) == ("PreparingRebalance", "")
    assert all(m.metadata == b"" for m in d.members) and {m.client_id: m.assignment for m in d.members} == last
    replies.append(clients[1].join())
    until_released(shard, *replies)  # CompletingRebalance: the same until the leader's sync
    d = describe_group(shard.data, "g")
    assert d.state == "CompletingRebalance" and {m.client_id: m.assignment for m in d.members} == last
    clients[1].leave()  # a member leaving now clears every assignment, as Kafka's reset does
    d = describe_group(shard.data, "g")
    assert d.state == "PreparingRebalance" and [m.assignment for m in d.members] == [b""]


def test_describe_an_unknown_group_is_dead_without_error() -> None:
    d = describe_group(ShardData(), "nobody")
    assert (d.error, d.state, d.members) == (E.NONE, "Dead", [])


def test_list_filters_by_state_case_insensitively_and_by_type() -> None:
    shard = GroupShard()
    consumer_group(shard, "t")
    simple_commit(shard, "simple", [0])
    assert sorted(list_groups(shard.data, list_filter(set(), set()))) == [
        ("g", "consumer", "Stable", "classic"), ("simple", "", "Empty", "classic")]
    assert list_groups(shard.data, list_filter({"stable"}, set())) == [("g", "consumer", "Stable", "classic")]
    assert list_groups(shard.data, list_filter({" EMPTY "}, set())) == [("simple", "", "Empty", "classic")]
    assert list_groups(shard.data, list_filter(set(), {"consumer"})) == []  # KIP-848 groups: kcoord hosts none
    assert len(list_groups(shard.data, list_filter(set(), {"Classic"}))) == 2


def test_list_filters_trim_and_parse_as_kafka_does() -> None:
    """States are trimmed as Java's String.trim (every char up to U+0020, not Python's whitespace); types
    only lower-cased, as GroupType.parse: " classic" names no type, so nothing passes it."""
    shard = GroupShard()
    consumer_group(shard, "t")
    assert list_groups(shard.data, list_filter({"\x01stable\x1f"}, set())) == [("g", "consumer", "Stable", "classic")]
    assert list_groups(shard.data, list_filter({"\u00a0stable"}, set())) == []  # not trimmed by Java either
    assert list_groups(shard.data, list_filter(set(), {" classic"})) == []
    assert list_groups(shard.data, list_filter(set(), {"CLASSIC"})) == [("g", "consumer", "Stable", "classic")]


# -- delete groups ---------------------------------------------------------------------------------------

def test_delete_groups_per_state() -> None:
    shard = GroupShard()
    consumer_group(shard, "t")
    simple_commit(shard, "simple", [0, 1])
    result = delete_groups(shard.data, ["g", "simple", "missing", "simple"])
    assert result.response == [("g", E.NON_EMPTY_GROUP), ("simple", E.NONE), ("missing", E.GROUP_ID_NOT_FOUND)]
    # Vector 19.5.14: an Empty group with 2 offsets -> 2 offset tombstones + 1 group tombstone.
    assert result.records == [OffsetCommitRecord(OffsetKey("simple", "t", 0), None),
                              OffsetCommitRecord(OffsetKey("simple", "t", 1), None),
                              GroupMetadataRecord("simple", None)]
    shard.data.replay_records(0, result.records)
    assert "simple" not in shard.data.groups and "simple" not in shard.data.offsets


# -- delete offsets --------------------------------------------------------------------------------------

def test_offset_delete_refuses_subscribed_topics_and_deletes_the_others() -> None:
    shard = GroupShard()
    consumer_group(shard, "t")
    simple = ShardData()  # the same group's offsets, committed by its members
    for p in (0, 1):
        shard.data.offsets.setdefault("g", {})[("t", p)] = simple_offset(p)
        shard.data.offsets["g"][("u", p)] = simple_offset(p)
    result = delete_offsets(shard.data, "g", [("t", [0, 1]), ("u", [0, 5])])
    assert result.response == (E.NONE, [("t", [(0, E.GROUP_SUBSCRIBED_TO_TOPIC), (1, E.GROUP_SUBSCRIBED_TO_TOPIC)]),
                                        ("u", [(0, E.NONE), (5, E.NONE)])])
    assert result.records == [OffsetCommitRecord(OffsetKey("g", "u", 0), None)]  # partition 5 had none
    assert simple.offsets == {}


def test_offset_delete_refuses_a_partition_that_cannot_exist_before_asking_the_group() -> None:
    """Kafka's request handler answers UNKNOWN_TOPIC_OR_PARTITION for such a partition before the
    coordinator sees it, in a subscribed topic too (it answered GROUP_SUBSCRIBED_TO_TOPIC)."""
    shard = GroupShard()
    consumer_group(shard, "t")
    result = delete_offsets(shard.data, "g", [("t", [-1, 0]), ("x" * 250, [0]), ("u", [-1])])
    assert result.response == (E.NONE, [("t", [(-1, E.UNKNOWN_TOPIC_OR_PARTITION), (0, E.GROUP_SUBSCRIBED_TO_TOPIC)]),
                                        ("x" * 250, [(0, E.UNKNOWN_TOPIC_OR_PARTITION)]),
                                        ("u", [(-1, E.UNKNOWN_TOPIC_OR_PARTITION)])])
    assert result.records == []


def test_offset_delete_goes_by_the_subscriptions_of_the_generation_not_a_pending_rejoin() -> None:
    """Group campaign D4: Kafka takes a group's subscribed topics when a generation starts (and at load),
    so a member rejoining with another subscription changes nothing until the next generation."""
    shard = GroupShard()
    a, b = consumer_group(shard, "t")
    for topic in ("t", "u"):
        shard.data.offsets.setdefault("g", {})[(topic, 0)] = simple_offset(0)
    a.protocols = [("range", subscription("u"))]
    rejoin = a.join()  # the group now waits for b
    assert not rejoin.released and shard.data.groups["g"].state is GroupState.PREPARING_REBALANCE
    result = delete_offsets(shard.data, "g", [("t", [0]), ("u", [0])])
    assert result.response == (E.NONE, [("t", [(0, E.GROUP_SUBSCRIBED_TO_TOPIC)]), ("u", [(0, E.NONE)])])
    b.join()  # the next generation: a subscribes to u, b to t
    assert delete_offsets(shard.data, "g", [("t", [0]), ("u", [0])]).response == \
        (E.NONE, [("t", [(0, E.GROUP_SUBSCRIBED_TO_TOPIC)]), ("u", [(0, E.GROUP_SUBSCRIBED_TO_TOPIC)])])


def test_a_consumer_group_whose_subscriptions_do_not_parse_counts_as_subscribed_to_every_topic() -> None:
    """Kafka's isSubscribedToTopic: unknown subscriptions of a consumer group keep OffsetDelete away."""
    shard = GroupShard()
    stable_group(shard, Client(shard, client_id="odd", protocols=[("range", b"\x00")]))
    shard.data.offsets.setdefault("g", {})[("t", 0)] = simple_offset(0)
    result = delete_offsets(shard.data, "g", [("t", [0])])
    assert result.response == (E.NONE, [("t", [(0, E.GROUP_SUBSCRIBED_TO_TOPIC)])])


@pytest.mark.parametrize("version", [b"\x00\x01", b"\xff\xfe"], ids=["kafkajs-v1", "negative"])
def test_a_subscription_is_read_by_its_v0_prefix_whatever_its_version(version: bytes) -> None:
    """KafkaJS's round-robin assigner sends version 1 with topics and user data but no owned partitions;
    Kafka reads every subscription's v0 prefix, so its topics are known (a review of the change above:
    they read as unknown, and so as subscribed to every topic). Kafka's computeSubscribedTopics does so
    for a negative version too (kcoord counted such a group as subscribed to every topic)."""
    shard = GroupShard()
    metadata = version + subscription("t")[2:]
    stable_group(shard, Client(shard, client_id="odd", protocols=[("RoundRobinAssigner", metadata)]))
    for topic in ("t", "u"):
        shard.data.offsets.setdefault("g", {})[(topic, 0)] = simple_offset(0)
    result = delete_offsets(shard.data, "g", [("t", [0]), ("u", [0])])
    assert result.response == (E.NONE, [("t", [(0, E.GROUP_SUBSCRIBED_TO_TOPIC)]), ("u", [(0, E.NONE)])])


def simple_offset(p: int) -> OffsetAndMetadata:
    return OffsetAndMetadata(p, -1, "", T0)


def test_offset_delete_group_errors() -> None:
    shard = GroupShard()
    assert delete_offsets(shard.data, "missing", [("t", [0])]).response == (E.GROUP_ID_NOT_FOUND, [])
    other = [Client(shard, group="connect", protocol_type="connect", protocols=[("v1", b"")])]
    stable_group(shard, *other)
    assert delete_offsets(shard.data, "connect", [("t", [0])]).response == (E.NON_EMPTY_GROUP, [])
    simple_commit(shard, "simple", [3])
    result = delete_offsets(shard.data, "simple", [("t", [3]), ("bad name!", [0])])
    assert result.response == (E.NONE, [("t", [(3, E.NONE)]), ("bad name!", [(0, E.UNKNOWN_TOPIC_OR_PARTITION)])])


# -- retention (KIP-211) ---------------------------------------------------------------------------------

def test_a_simple_groups_offset_lives_exactly_the_retention_from_its_commit() -> None:
    shard = GroupShard()
    simple_commit(shard, "s", [0], at=T0)
    assert expire_offsets(shard.data, T0 + WEEK - 1, WEEK).records == []
    result = expire_offsets(shard.data, T0 + WEEK, WEEK)
    # Vector 19.5.16: tombstoned at the first check >= T + 7d; the group, now without offsets, goes too.
    assert result.records == [OffsetCommitRecord(OffsetKey("s", "t", 0), None), GroupMetadataRecord("s", None)]
    assert result.response == 1


def test_an_empty_consumer_groups_offsets_expire_counted_from_when_it_became_empty() -> None:
    shard = GroupShard()
    clients = consumer_group(shard, "t")
    shard.data.offsets["g"] = {("t", 0): simple_offset(0)}  # committed at T0, before the group emptied
    shard.advance(5000)
    for c in clients:
        c.leave()
    empty_since = shard.clock.now_ms()
    assert shard.data.groups["g"].state is GroupState.EMPTY and empty_since > T0
    # Counted from the commit it would be gone at T0 + 7d; counted from Empty it stays a little longer.
    assert expire_offsets(shard.data, empty_since + WEEK - 1, WEEK).records == []
    assert len(expire_offsets(shard.data, empty_since + WEEK, WEEK).records) == 2  # offset + group


def test_a_stable_consumer_group_keeps_subscribed_offsets_forever_and_expires_the_rest() -> None:
    shard = GroupShard()
    consumer_group(shard, "t")
    shard.data.offsets["g"] = {("t", 0): simple_offset(0), ("old", 0): simple_offset(0)}
    result = expire_offsets(shard.data, T0 + 10 * WEEK, WEEK)
    assert result.records == [OffsetCommitRecord(OffsetKey("g", "old", 0), None)]  # the group stays


def offset_keys(records: list[LiveRecord]) -> list[OffsetKey]:
    """The keys of records that are all OffsetCommitRecords."""
    keys = []
    for r in records:
        assert isinstance(r, OffsetCommitRecord), r
        keys.append(r.key)
    return keys


def test_loaded_offsets_expire_as_live_ones_do() -> None:
    """A loaded offset is cached as its value's bytes (storage.loadcodec): retention reads its commit
    time, and a v1 value's own expire timestamp, from them."""
    from protocol.records import OffsetAndMetadata, encode_offset_value

    shard = GroupShard()
    simple_commit(shard, "s", [0], at=T0)
    shard.data.offsets["s"][("t", 1)] = encode_offset_value(OffsetAndMetadata(1, -1, "", T0 + 10))
    shard.data.offsets["s"][("t", 2)] = encode_offset_value(OffsetAndMetadata(2, -1, "", T0, T0 + 5))
    assert offset_keys(expire_offsets(shard.data, T0 + 5, WEEK).records) == [OffsetKey("s", "t", 2)]
    assert offset_keys(expire_offsets(shard.data, T0 + WEEK, WEEK).records) == [
        OffsetKey("s", "t", 0), OffsetKey("s", "t", 2)]
    result = expire_offsets(shard.data, T0 + WEEK + 10, WEEK)
    assert result.response == 3 and result.records[-1] == GroupMetadataRecord("s", None)


def test_an_explicit_expire_timestamp_wins() -> None:
    shard = GroupShard()
    records, _ = commit_offsets(shard.data, request(version=2, retention=1000, group="r",
                                                    parts=[(0, 1, -1, -1, "")]), T0, 4096)
    shard.data.replay_records(0, records)
    assert expire_offsets(shard.data, T0 + 999, WEEK).records == []
    assert len(expire_offsets(shard.data, T0 + 1000, WEEK).records) == 2


def test_an_explicit_expire_timestamp_does_not_expire_a_subscribed_topic_of_a_stable_group() -> None:
    """Fault campaign: a live group's v2-v4 commit with a retention time (Sarama's Offsets.Retention) lost
    its offset when that time ran out, though the group still consumed the topic; Kafka keeps it."""
    shard = GroupShard()
    consumer_group(shard, "t")
    expiring = OffsetAndMetadata(1, -1, "", T0, T0 + 1000)  # as a v2 commit with a 1 s retention stores it
    shard.data.offsets["g"] = {("t", 0): expiring, ("old", 0): expiring}
    assert offset_keys(expire_offsets(shard.data, T0 + 1000, WEEK).records) == [OffsetKey("g", "old", 0)]


def test_a_group_in_a_rebalance_expires_nothing() -> None:
    shard = GroupShard()
    clients = consumer_group(shard, "t")
    shard.data.offsets["g"] = {("old", 0): simple_offset(0)}
    clients[0].join()
    assert shard.data.groups["g"].state is GroupState.PREPARING_REBALANCE
    assert expire_offsets(shard.data, T0 + 10 * WEEK, WEEK).records == []


def test_pending_transactional_offsets_never_expire() -> None:
    shard = GroupShard()
    simple_commit(shard, "s", [0], at=T0)
    from protocol.records import OffsetAndMetadata

    shard.data.replay(5, OffsetCommitRecord(OffsetKey("s", "t", 0), OffsetAndMetadata(9, -1, "", T0)), 77)
    assert expire_offsets(shard.data, T0 + 10 * WEEK, WEEK).records == []


def test_retention_runs_as_a_timer_through_the_shard() -> None:
    """End to end on the shard stand-in: hooks arm the retention timer; the tombstones are replayed."""
    from coordinator.groups.messages import GroupConfig

    shard = GroupShard(GroupConfig(offsets_retention_ms=WEEK, offsets_retention_check_interval_ms=600_000))
    simple_commit(shard, "s", [0], at=T0)

    def run(data: ShardData) -> OpResult:
        result = expire_offsets(data, shard.clock.now_ms(), WEEK)
        shard.schedule("retention", 600_000, run)
        return result

    shard.schedule("retention", 600_000, run)
    shard.advance(WEEK - 600_000)
    assert "s" in shard.data.offsets
    shard.advance(600_000)
    assert "s" not in shard.data.offsets and "s" not in shard.data.groups
