"""A synchronous stand-in for a shard, to drive the real group code without I/O or sleeping.

``GroupShard`` runs operations exactly as the shard's contract says: an op's records are replayed (unless
``replay=False``) and appended to ``log``; a request waits until they are durable, which happens only
at ``flush()`` (or fails at ``fail()``); keyed timers run on a ManualClock that tests move with
``advance()``. The ``Client`` helpers call the membership entry points as the API modules do and capture
each reply when the server would send it."""

from collections.abc import Callable
from typing import Any

from coordinator.groups.membership import Membership
from coordinator.groups.messages import GroupConfig, JoinRequest, JoinResult, LeaveResult, SyncResult
from coordinator.groups.model import GroupState
from coordinator.request import PARKED, Request
from coordinator.shard import OpResult
from coordinator.state import ShardData
from coordinator.timers import Clock, ManualClock, Timers
from protocol.errors import ErrorCode
from protocol.records import LiveRecord
from tests.coordinator.harness import Holds, stand_in_api

T0 = 1_700_000_000_000


class Reply(Holds):
    """Where a request's response lands when it is released (None until then)."""

    def __init__(self) -> None:
        self.response: Any = None
        self.released = False

    def reply_ready(self, request: Request) -> None:
        self.response = request.response
        self.released = True


class GroupShard:
    def __init__(self, config: GroupConfig | None = None) -> None:
        self.manual_clock = ManualClock(T0)
        self.clock: Clock = self.manual_clock  # as ShardOps declares it; advance() moves it
        self.timers = Timers(self.clock)
        self.data = ShardData()
        self.log: list[LiveRecord] = []
        self.config = config or GroupConfig()
        self.membership = Membership(self, self.config)
        self._pending: list[tuple[list[Callable[[], None]], list[tuple[Request, Any]]]] = []

    # -- the shard contract ------------------------------------------------------------------------

    def write(self, req: Request | None, op: Callable[..., OpResult], *args: Any) -> Any:
        result = op(self.data, *args)
        if result.records:
            if result.replay:
                self.data.replay_records(len(self.log), result.records)
            self.log.extend(result.records)
            self._pending.append(([result.on_durable] if result.on_durable else [], []))
        elif result.on_durable is not None:
            if self._pending:
                self._pending[-1][0].append(result.on_durable)
            else:
                result.on_durable()
        if req is not None and self._pending:
            req.wait()
            self._pending[-1][1].append((req, result.fixup))
        return result.response

    def schedule(self, key: str, delay_ms: int, op: Callable[..., OpResult], *args: Any) -> None:
        self.timers.schedule(key, delay_ms, lambda: self.write(None, op, *args) and None)

    # -- driving it -----------------------------------------------------------------------------

    def flush(self) -> None:
        """Every pending write becomes durable: callbacks, then waiting requests, batch by batch."""
        while self._pending:
            callbacks, waiters = self._pending.pop(0)
            for callback in callbacks:
                callback()
            for req, _ in waiters:
                req.done()
        assert_tallies_exact(self.data)

    def fail(self) -> None:
        """Every pending write fails, and the shard unloads (parked requests answered NOT_COORDINATOR)."""
        pending, self._pending = self._pending, []
        for _, waiters in pending:
            for req, fixup in waiters:
                req.done(fixup, ErrorCode.NOT_COORDINATOR)
        self.timers.cancel_all()
        self.membership.disarm(self.data)
        assert_tallies_exact(self.data)

    def advance(self, ms: int) -> None:
        self.manual_clock.advance(ms)
        self.flush()

    def reloaded(self) -> ShardData:
        """What loading this shard's log would give."""
        data = ShardData()
        data.replay_records(0, self.log)
        return data

    def request(self, version: int = 9, client_id: str = "client") -> tuple[Request, Reply]:
        reply = Reply()
        return Request(reply, stand_in_api(), version, 0, client_id, "127.0.0.1:5555"), reply

    def call(self, fn: Callable[..., Any], *args: Any, version: int = 9, client_id: str = "client") -> Reply:
        """As the server calls a handler: a wait of its own around it, then what was written is made durable."""
        req, reply = self.request(version, client_id)
        req.wait()
        response = fn(req, *args)
        if response is not PARKED:
            req.response = response
        req.done()
        self.flush()
        return reply


class Client:
    """One group member's client side: joins (handling MEMBER_ID_REQUIRED), syncs, heartbeats, leaves."""

    def __init__(self, shard: GroupShard, group: str = "g", client_id: str = "c", protocols: list[tuple[str, bytes]]
                 | None = None, instance_id: str | None = None, session_ms: int = 10_000, rebalance_ms: int = 60_000,
                 protocol_type: str = "consumer") -> None:
        self.shard = shard
        self.group = group
        self.client_id = client_id
        self.protocols = protocols if protocols is not None else [("range", b"range-meta"), ("roundrobin", b"rr")]
        self.instance_id = instance_id
        self.session_ms = session_ms
        self.rebalance_ms = rebalance_ms
        self.protocol_type = protocol_type
        self.member_id = ""
        self.generation = -1

    def join_request(self, version: int = 9) -> JoinRequest:
        return JoinRequest(self.group, self.member_id, self.instance_id, self.protocol_type, self.protocols,
                           self.session_ms, self.rebalance_ms, self.client_id, "/127.0.0.1", version >= 4, version >= 9)

    def join(self, version: int = 9) -> Reply:
        """Sends JoinGroup; a MEMBER_ID_REQUIRED answer is followed by the rejoin, as clients do."""
        reply = self.shard.call(self.shard.membership.join, self.join_request(version), version=version,
                                client_id=self.client_id)
        if reply.released and reply.response.error is ErrorCode.MEMBER_ID_REQUIRED:
            self.member_id = reply.response.member_id
            reply = self.shard.call(self.shard.membership.join, self.join_request(version), version=version,
                                    client_id=self.client_id)
        return reply

    def joined(self, reply: Reply) -> JoinResult:
        assert reply.released, "the join is still parked"
        result: JoinResult = reply.response
        if result.error is ErrorCode.NONE:
            self.member_id, self.generation = result.member_id, result.generation
        return result

    def sync(self, assignments: dict[str, bytes] | None = None, generation: int | None = None) -> Reply:
        return self.shard.call(self.shard.membership.sync, self.group,
                               self.generation if generation is None else generation, self.member_id,
                               self.instance_id, None, None, assignments or {})

    def synced(self, reply: Reply) -> SyncResult:
        assert reply.released, "the sync is still parked"
        result: SyncResult = reply.response
        return result

    def heartbeat(self, generation: int | None = None) -> ErrorCode:
        reply = self.shard.call(self.shard.membership.heartbeat, self.group,
                                self.generation if generation is None else generation, self.member_id, self.instance_id)
        error: ErrorCode = reply.response
        return error

    def leave(self) -> LeaveResult:
        reply = self.shard.call(self.shard.membership.leave, self.group, [(self.member_id, self.instance_id)])
        result: LeaveResult = reply.response
        return result


def until_released(shard: GroupShard, *replies: Reply) -> None:
    """Moves time a delay at a time until every reply is out (the initial delay is extended while
    members keep arriving, up to the rebalance timeout)."""
    for _ in range(100):
        if all(r.released for r in replies):
            return
        shard.advance(shard.config.initial_rebalance_delay_ms)
    raise AssertionError("replies still parked")


def stable_group(shard: GroupShard, *clients: Client) -> None:
    """Brings ``clients`` into one Stable generation: all join (waiting out the initial delay), the
    leader syncs an assignment naming every member, followers sync."""
    replies = [c.join() for c in clients]
    until_released(shard, *replies)
    results = [c.joined(r) for c, r in zip(clients, replies, strict=True)]
    assert all(r.error is ErrorCode.NONE for r in results), results
    leader = next(c for c, r in zip(clients, results, strict=True) if r.leader == c.member_id)
    followers = [c for c in clients if c is not leader]
    parked = [f.sync() for f in followers]
    leader_reply = leader.sync({c.member_id: f"assigned-{c.client_id}".encode() for c in clients})
    assert leader.synced(leader_reply).error is ErrorCode.NONE
    assert all(f.synced(p).error is ErrorCode.NONE for f, p in zip(followers, parked, strict=True))


def walked_counts(data: ShardData) -> dict[GroupState, int]:
    """Groups by state as a walk of every group finds them: what the exporter computed at each scrape
    before the counts were kept as groups change (a group with only offsets counted as Empty too)."""
    counts = dict.fromkeys(GroupState, 0)
    for group in data.groups.values():
        counts[group.state] += 1
    counts[GroupState.EMPTY] += len(data.offsets.keys() - data.groups.keys())
    return counts


def assert_counts_exact(data: ShardData) -> None:
    """The kept counts equal a walk, and every group in the shard moves those counts (none detached)."""
    assert data.group_counts.by_state == walked_counts(data)
    assert data.offsets.keys() <= data.groups.keys()  # a group with offsets is always a group (simple, Empty)
    assert all(g.counts is data.group_counts for g in data.groups.values())


def assert_tallies_exact(data: ShardData) -> None:
    """Each group's kept tally (protocols listed, joins parked) equals a walk of its members: checked after
    every call and every move of the clock, so any path that changes a member behind it fails its test."""
    for group in data.groups.values():
        if group.tally is None:
            assert not group.members, group.group_id
            continue
        listed: dict[str, int] = {}
        for member in group.members.values():
            for name in {name for name, _ in member.protocols}:
                listed[name] = listed.get(name, 0) + 1
        assert group.tally.supported == listed, group.group_id
        assert group.tally.joining == sum(m.awaiting_join is not None for m in group.members.values()), group.group_id
