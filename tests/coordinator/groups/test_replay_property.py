"""Live state against a reload of the log, with membership in the mix. Group metadata is written at
generation boundaries and not replayed on the live path, so the property is: offsets always equal a
reload; every group that exists live exists after a reload; and a group at a boundary (Stable or Empty)
is exactly what loading brings back (state, generation, protocol, leader, members and assignments).
Checked after every operation: a later rebalance could otherwise hide a boundary that was not written.
The per-state group counts a metrics scrape reads are checked against a walk of the groups, live and
reloaded, at the same points."""

from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from coordinator.groups.admin import delete_groups
from coordinator.groups.model import ClassicGroup, GroupState
from coordinator.groups.retention import expire_offsets
from coordinator.offsets import commit_offsets
from coordinator.shard import OpResult
from coordinator.state import ShardData
from protocol.errors import ErrorCode
from tests.coordinator.groups.harness import Client, GroupShard, Reply, assert_counts_exact
from tests.coordinator.harness import offsets_of
from tests.coordinator.test_offsets import request

CLIENTS = 3  # client 2 is a static member
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("join"), st.integers(0, CLIENTS - 1), st.sampled_from([3, 4, 9])),
        st.tuples(st.just("sync"), st.integers(0, CLIENTS - 1)),
        st.tuples(st.just("heartbeat"), st.integers(0, CLIENTS - 1)),
        st.tuples(st.just("leave"), st.integers(0, CLIENTS - 1)),
        st.tuples(st.just("restart"), st.integers(0, CLIENTS - 1)),
        st.tuples(st.just("commit"), st.integers(-1, CLIENTS - 1), st.integers(0, 2)),
        st.tuples(st.just("advance"), st.sampled_from([500, 3000, 11_000, 70_000])),
        st.tuples(st.just("delete")),
        st.tuples(st.just("expire")),
        st.tuples(st.just("settle")),
        st.tuples(st.just("settle")),  # twice the weight: most interesting paths start from a Stable group
    ),
    max_size=40,
)


def settle(shard: GroupShard, clients: list[Client]) -> None:
    """Every client (re)joins and syncs, the leader with an assignment for all: a Stable group."""
    for c in clients:
        reply = c.join()
        if reply.released and reply.response.error is ErrorCode.UNKNOWN_MEMBER_ID:
            c.member_id = ""
            reply = c.join()
        c.pending = reply  # type: ignore[attr-defined]
    for _ in range(60):
        if all(c.pending.released for c in clients):  # type: ignore[attr-defined]
            break
        shard.advance(3000)
    results = [c.joined(c.pending) for c in clients]  # type: ignore[attr-defined]
    if not all(r.error is ErrorCode.NONE for r in results):
        return
    group = shard.data.groups["g"]
    leader = next((c for c in clients if c.member_id == group.leader), None)
    if leader is None:
        return
    for c in clients:
        if c is not leader:
            c.sync()
    leader.sync({m: m.encode() for m in group.members})


def projection(group: ClassicGroup) -> tuple[Any, ...]:
    record = group.to_record()
    # The state timestamp of a Stable group is when it became Stable live, but the record was written a
    # moment before (CompletingRebalance); Kafka keeps the record's, so only Empty groups compare it.
    stamp = record.current_state_timestamp if group.state is GroupState.EMPTY else None
    return (group.state, record.generation, record.protocol_type, record.protocol, record.leader, stamp,
            sorted(record.members, key=lambda m: m.member_id), sorted(group.static_members.items()))


def _commit(data: ShardData, client: Client | None, partition: int, now: int) -> OpResult:
    generation, member = (client.generation, client.member_id) if client else (-1, "")
    records, _ = commit_offsets(data, request(generation=generation, member=member,
                                              parts=[(partition, now % 1000, -1, -1, "")]), now, 4096)
    return OpResult(records, None)


def _delete(data: ShardData) -> OpResult:
    return delete_groups(data, ["g"])


def _expire(data: ShardData, now: int) -> OpResult:
    return expire_offsets(data, now, 60_000)


@settings(max_examples=300, deadline=None)
@given(ops=OPS)
@example(ops=[("settle",), ("restart", 2), ("join", 2, 9)])  # a static member restarts into a Stable group
@example(ops=[("settle",), ("restart", 2), ("join", 2, 3)])
@example(ops=[("settle",), ("leave", 0), ("leave", 1), ("leave", 2)])  # left Empty
@example(ops=[("settle",), ("advance", 11_000)])  # every session expires
@example(ops=[("settle",), ("join", 0, 9), ("advance", 70_000)])  # rebalance timeout
@example(ops=[("join", 0, 9), ("advance", 11_000), ("expire",)])  # a pending member id expires
@example(ops=[("settle",), ("commit", 0, 1), ("settle",), ("leave", 0), ("leave", 1), ("leave", 2), ("delete",)])
def test_live_state_equals_a_reload_of_the_log(ops: list[tuple[Any, ...]]) -> None:
    shard = GroupShard()
    clients = [Client(shard, client_id=f"c{i}", instance_id="static" if i == 2 else None) for i in range(CLIENTS)]
    parked: dict[int, Reply] = {}  # client index -> its join still waiting for the rebalance
    for op in ops:
        kind = op[0]
        if kind == "join":
            reply = clients[op[1]].join(version=op[2])
            parked[op[1]] = reply
        elif kind == "sync":
            client = clients[op[1]]
            members = list(shard.data.groups["g"].members) if "g" in shard.data.groups else []
            client.sync({m: m.encode() for m in members})
        elif kind == "heartbeat":
            clients[op[1]].heartbeat()
        elif kind == "leave":
            clients[op[1]].leave()
        elif kind == "restart":
            old = clients[op[1]]
            clients[op[1]] = Client(shard, client_id=old.client_id, instance_id=old.instance_id)
        elif kind == "commit":
            shard.write(None, _commit, clients[op[1]] if op[1] >= 0 else None, op[2], shard.clock.now_ms())
        elif kind == "advance":
            shard.advance(op[1])
        elif kind == "delete":
            shard.write(None, _delete)
        elif kind == "expire":
            shard.write(None, _expire, shard.clock.now_ms())
        elif kind == "settle":
            parked.clear()
            settle(shard, clients)
        shard.flush()
        for index, reply in list(parked.items()):  # joins answered meanwhile give their client its generation
            if reply.released:
                clients[index].joined(reply)
                del parked[index]
        assert_reload_matches(shard)


def assert_reload_matches(shard: GroupShard) -> None:
    live, reloaded = shard.data, shard.reloaded()
    assert_counts_exact(live)  # the per-state group counts a scrape reads, live and as loading makes them
    assert_counts_exact(reloaded)
    assert offsets_of(live) == offsets_of(reloaded)
    assert set(live.groups) == set(reloaded.groups)
    for group_id, group in live.groups.items():
        if group.state in (GroupState.STABLE, GroupState.EMPTY):
            assert projection(group) == projection(reloaded.groups[group_id]), group_id
