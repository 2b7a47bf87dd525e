"""A group that a timer empties (a session expiry, a rebalance or sync timeout) is the same group
afterwards, with its soft state, as when its last member leaves. Kafka's completeClassicGroupJoin
appends the Empty generation's GroupMetadata record without replaying it (``replayRecords`` false,
timers included: CoordinatorRuntime's timer task is a write event like any other), so its ClassicGroup
keeps the pending member ids (KIP-394) and the flag that extends an initial rebalance delay. Replayed,
the record built a fresh group without them; a reload still does, as a Kafka failover does."""

import pytest

from coordinator.groups.model import GroupState
from protocol.errors import ErrorCode
from protocol.records import GroupMetadataRecord
from tests.coordinator.groups.harness import Client, GroupShard, assert_counts_exact, stable_group
from tests.coordinator.groups.test_replay_property import assert_reload_matches

E = ErrorCode
DELAY = 3000


def _pending_id(shard: GroupShard, client: Client) -> str:
    """A JoinGroup v9 without a member id: MEMBER_ID_REQUIRED hands one out, the member is pending."""
    answer = shard.call(shard.membership.join, client.join_request(9), client_id=client.client_id).response
    assert answer.error is E.MEMBER_ID_REQUIRED
    member_id: str = answer.member_id
    return member_id


def _emptied_by_session_expiry(shard: GroupShard) -> tuple[Client, Client, str, str]:
    """A Stable group of ``a`` (10 s session); then two pending ids (30 s sessions), and ``a`` goes
    silent: its expiry prepares a rebalance that only the pending members would join, and the rebalance
    timeout (no member left, so 0) ends it Empty."""
    a = Client(shard, client_id="a", session_ms=10_000)
    stable_group(shard, a)
    b, c = Client(shard, client_id="b", session_ms=30_000), Client(shard, client_id="c", session_ms=30_000)
    pending_b, pending_c = _pending_id(shard, b), _pending_id(shard, c)
    shard.advance(10_000)
    group = shard.data.groups["g"]
    assert group.state is GroupState.EMPTY and group.generation == a.generation + 1
    record = shard.log[-1]
    assert isinstance(record, GroupMetadataRecord) and record.value == group.to_record()
    return b, c, pending_b, pending_c


def test_a_pending_member_joins_with_its_id_after_another_members_session_expiry_empties_the_group() -> None:
    """Kafka's classicGroupJoinExistingMember adds a pending member whatever the group's state; kcoord
    answered UNKNOWN_MEMBER_ID, its id gone with the replaced group, and the client had to start over."""
    shard = GroupShard()
    b, _, pending_b, _ = _emptied_by_session_expiry(shard)
    group = shard.data.groups["g"]
    b.member_id = pending_b
    reply = shard.call(shard.membership.join, b.join_request(9), client_id="b")
    assert not reply.released  # in the initial delay of the group's next generation
    shard.advance(DELAY)
    result = b.joined(reply)
    assert (result.error, result.member_id, result.leader, result.generation) == (E.NONE, pending_b, pending_b, 3)
    assert shard.data.groups["g"] is group
    assert_counts_exact(shard.data)


def test_a_pending_member_leaving_after_the_group_was_emptied_by_a_timer_leaves_cleanly() -> None:
    """Kafka's classicGroupLeaveToClassicGroup counts a pending id's leave as valid (NONE)."""
    shard = GroupShard()
    _, _, _, pending_c = _emptied_by_session_expiry(shard)
    reply = shard.call(shard.membership.leave, "g", [(pending_c, None)])
    assert reply.response.members == [(pending_c, None, E.NONE)]
    assert pending_c not in shard.data.groups["g"].pending_members


@pytest.mark.parametrize("emptied_by", ["leave", "sync timeout"])
def test_the_initial_delay_flag_survives_the_group_going_empty(emptied_by: str) -> None:
    """Kafka clears ``newMemberAdded`` only when it extends an initial delay: set by a member joining
    an initial rebalance whose delay then ends for want of rebalance time (none remaining), it stays,
    and the group's next initial rebalance is extended once. kcoord kept it when the last member left
    (the group object was kept) but lost it when a timer emptied the group: the next generation came
    one delay sooner."""
    shard = GroupShard()
    a = Client(shard, client_id="a", rebalance_ms=DELAY, session_ms=60_000)
    b = Client(shard, client_id="b", rebalance_ms=DELAY, session_ms=60_000)
    replies = [a.join(), b.join()]  # b joins a's initial delay: the flag is set; no rebalance time left
    shard.advance(DELAY)
    assert [a.joined(replies[0]).generation, b.joined(replies[1]).generation] == [1, 1]
    group = shard.data.groups["g"]
    assert group.new_member_added
    if emptied_by == "leave":
        a.leave()
        b.leave()
    else:
        shard.advance(DELAY)  # neither syncs: both are removed at the rebalance timeout
    assert (shard.data.groups["g"].state, shard.data.groups["g"].generation) == (GroupState.EMPTY, 2)
    c = Client(shard, client_id="c", rebalance_ms=60_000, session_ms=60_000)
    reply = c.join()
    shard.advance(DELAY)
    assert not reply.released  # the flag extends the delay once
    shard.advance(DELAY)
    assert c.joined(reply).generation == 3
    assert shard.data.groups["g"] is group


@pytest.mark.parametrize("timeout", ["session", "join", "sync"])
def test_a_group_a_timer_empties_is_still_what_a_reload_of_its_log_gives(timeout: str) -> None:
    """The Empty record is appended, not replayed: the log still says what the live group's persistent
    part is, and the group stays the one the shard counts. Emptied by a's session (b left, a is silent),
    by the rebalance timeout (b left, a never rejoins) or by the sync timeout (both rejoin, neither syncs)."""
    shard = GroupShard()
    a = Client(shard, client_id="a", session_ms=10_000 if timeout == "session" else 60_000, rebalance_ms=20_000)
    b = Client(shard, client_id="b", session_ms=60_000, rebalance_ms=20_000)
    stable_group(shard, a, b)
    group = shard.data.groups["g"]
    if timeout == "sync":
        rejoined = a.join()  # the leader rejoins: a rebalance
        b.joined(b.join())
        a.joined(rejoined)
    else:
        b.leave()
    shard.advance(20_000)
    assert (group.state, group.generation) == (GroupState.EMPTY, 3 if timeout == "sync" else 2)
    assert shard.data.groups["g"] is group
    assert_reload_matches(shard)
    assert_counts_exact(shard.data)
