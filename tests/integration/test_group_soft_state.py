"""A group that a timer empties keeps its soft state, as Kafka's ClassicGroup does (its Empty record is
appended without being replayed): pending member ids (KIP-394) and the initial-delay extension flag.
Scripted members over raw connections to a real kcoord (conftest's server: 300 ms initial delay, 1 s
shortest session)."""

import time
from typing import Any

from kafka.protocol.admin.groups import DescribeGroupsRequest
from kafka.protocol.consumer.group import JoinGroupRequest, LeaveGroupRequest, SyncGroupRequest

from tests.kcoord_process import KcoordProcess
from tests.rawclient import RawClient

DELAY_S = 0.3  # conftest's --group-initial-rebalance-delay-ms
MEMBER_ID_REQUIRED = 79


def _join(group: str, member_id: str, session_ms: int, rebalance_ms: int = 5000) -> Any:
    return JoinGroupRequest(group_id=group, session_timeout_ms=session_ms, rebalance_timeout_ms=rebalance_ms,
                            member_id=member_id, group_instance_id=None, protocol_type="consumer",
                            protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"m")],
                            reason=None)


def _state(server: KcoordProcess, group: str) -> str:
    client = RawClient(server.port)
    try:
        described = client.call(DescribeGroupsRequest(groups=[group], include_authorized_operations=False), 4)
    finally:
        client.close()
    state: str = described.groups[0].group_state
    return state


def _until_empty(server: KcoordProcess, group: str) -> None:
    deadline = time.monotonic() + 20
    while _state(server, group) != "Empty":
        assert time.monotonic() < deadline, "the group did not go Empty"
        time.sleep(0.05)


def test_pending_member_ids_outlive_the_session_expiry_that_empties_the_group(server: KcoordProcess) -> None:
    """a's session ends while b and c hold pending ids: the group goes Empty (a join phase nobody
    joins). Kafka keeps the ids: b joins with its id and leads the next generation, c's LeaveGroup is
    valid. kcoord answered both UNKNOWN_MEMBER_ID (25): the replayed Empty record had replaced the group."""
    group = "pending-after-expiry"
    a = RawClient(server.port)
    a_id = a.call(_join(group, "", 1000), 5).member_id
    first = a.call(_join(group, a_id, 1000), 5)
    assert (first.error_code, first.leader) == (0, a_id)
    synced = a.call(SyncGroupRequest(group_id=group, generation_id=first.generation_id, member_id=a_id,
                                     group_instance_id=None, protocol_type="consumer", protocol_name="range",
                                     assignments=[SyncGroupRequest.SyncGroupRequestAssignment(member_id=a_id,
                                                                                              assignment=b"")]), 3)
    assert synced.error_code == 0
    b, c = RawClient(server.port), RawClient(server.port)
    pending_b, pending_c = (client.call(_join(group, "", 30_000), 5) for client in (b, c))
    assert pending_b.error_code == pending_c.error_code == MEMBER_ID_REQUIRED
    _until_empty(server, group)  # a sends no heartbeat: its 1 s session ends

    left = c.call(LeaveGroupRequest(group_id=group, members=[LeaveGroupRequest.MemberIdentity(
        member_id=pending_c.member_id, group_instance_id=None, reason=None)]), 3)
    assert (left.error_code, [m.error_code for m in left.members]) == (0, [0])
    joined = b.call(_join(group, pending_b.member_id, 30_000), 5)
    assert (joined.error_code, joined.member_id, joined.leader) == (0, pending_b.member_id, pending_b.member_id)
    assert joined.generation_id == first.generation_id + 2  # the Empty generation, then b's
    assert "Traceback" not in server.log()
    for client in (a, b, c):
        client.close()


def test_the_initial_delay_extension_flag_outlives_a_sync_timeout_that_empties_the_group(
        server: KcoordProcess) -> None:
    """b joins during a's initial delay, which then ends for want of rebalance time (their rebalance
    timeout is the delay itself): Kafka's newMemberAdded flag stays set, as it is cleared only when it
    extends a delay. Neither syncs; the sync timeout empties the group. c's initial rebalance is then
    extended once: answered after two delays, not one. kcoord answered after one (the flag went with
    the replaced group), though it already kept the flag when members left by LeaveGroup."""
    group = "delay-flag-after-expiry"
    rebalance_ms = int(DELAY_S * 1000)
    a, b, c = RawClient(server.port), RawClient(server.port), RawClient(server.port)
    a_id = a.call(_join(group, "", 30_000, rebalance_ms), 5).member_id
    b_id = b.call(_join(group, "", 30_000, rebalance_ms), 5).member_id
    waiting = a.send(_join(group, a_id, 30_000, rebalance_ms), 5)
    second = b.call(_join(group, b_id, 30_000, rebalance_ms), 5)
    got, first = a.receive(11, 5)
    assert got == waiting and first.error_code == second.error_code == 0
    assert first.generation_id == second.generation_id
    _until_empty(server, group)  # neither syncs within the rebalance timeout

    c_id = c.call(_join(group, "", 30_000, 30_000), 5).member_id
    started = time.monotonic()
    joined = c.call(_join(group, c_id, 30_000, 30_000), 5)
    waited = time.monotonic() - started
    assert (joined.error_code, joined.generation_id) == (0, first.generation_id + 2)
    assert waited >= 1.5 * DELAY_S, f"answered after {waited:.3f} s: the initial delay was not extended"
    for client in (a, b, c):
        client.close()
