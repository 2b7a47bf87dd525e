"""A classic consumer group: its persistent part (what a GroupMetadata record holds) and its soft state.

Kafka's classic groups (``ClassicGroup`` in the new coordinator) keep membership in memory and write a
GroupMetadata record only at generation boundaries; the record is *not* replayed on the live path (the
in-memory group already is what the record says, and more), only when a partition is loaded. Replay of
a record therefore builds a group here (Empty without members, Stable with them), and membership
handlers mutate the group directly: joins parked until the rebalance completes, syncs waiting for the
leader, session deadlines. Everything soft is lost on reload, as on a Kafka failover; members rejoin.
"""

from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from protocol.codec import DecodeError, MessageCodec
from protocol.partitioning import java_string_hash
from protocol.records import GroupMetadata, MemberMetadata
from protocol.schema import load_message

if TYPE_CHECKING:
    from coordinator.request import Request

CONSUMER_PROTOCOL = "consumer"


class IllegalTransition(RuntimeError):
    """A group state change the state machine does not allow: a bug, never a client's doing."""


class GroupState(Enum):
    """Classic group states (``ClassicGroupState``).

    EMPTY: no members; offsets may be committed by anyone with generation -1 ("simple" commits); a
    JoinGroup from a new member starts a rebalance. -> PREPARING_REBALANCE, DEAD.
    PREPARING_REBALANCE: joins are parked until every known member rejoined or the rebalance timeout;
    heartbeats and syncs answer REBALANCE_IN_PROGRESS. -> COMPLETING_REBALANCE, EMPTY, DEAD.
    COMPLETING_REBALANCE: waiting for the leader's SyncGroup; followers' syncs are parked; commits get
    REBALANCE_IN_PROGRESS. -> STABLE, PREPARING_REBALANCE, DEAD.
    STABLE: assignments handed out; syncs return them. -> PREPARING_REBALANCE, DEAD.
    DEAD: the group is being removed; nothing is accepted.
    A loaded group is EMPTY without members, else STABLE (reference 7.5).
    """

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


_FROM: dict[GroupState, frozenset[GroupState]] = {
    GroupState.EMPTY: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.PREPARING_REBALANCE: frozenset({GroupState.EMPTY, GroupState.STABLE,
                                               GroupState.COMPLETING_REBALANCE}),
    GroupState.COMPLETING_REBALANCE: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.STABLE: frozenset({GroupState.COMPLETING_REBALANCE}),
    GroupState.DEAD: frozenset(GroupState),
}


class GroupCounts:
    """One shard's groups by state, moved as groups come, change state and go, so that a metrics scrape
    reads a few numbers instead of walking every group: at 200k groups that walk took 120-600 ms on the
    metrics thread, holding the GIL beside the event loop (an operations audit's find). Kafka keeps its
    classic-group gauges the same way (GroupCoordinatorMetricsShard.onClassicGroupStateTransition, called
    by ClassicGroup.transitionTo and as groups are created and removed). A group is counted while it is
    in its shard's ``ShardData.groups`` (``ShardData.put_group`` attaches it, removal detaches it), and
    every state change goes through ``ClassicGroup.transition``."""

    __slots__ = ("by_state",)

    def __init__(self) -> None:
        self.by_state: dict[GroupState, int] = dict.fromkeys(GroupState, 0)

    def moved(self, old: GroupState | None, new: GroupState | None) -> None:
        """A group left ``old`` (None: it is new here) for ``new`` (None: it is gone)."""
        if new is not None:  # first (as Kafka does): a scrape in between counts the group twice, never not at all
            self.by_state[new] += 1
        if old is not None:
            self.by_state[old] -= 1


class MemberTally:
    """What a join asks of all a group's members, kept as they change instead of walking them: how many
    list each protocol name (Kafka's ClassicGroup.supportedProtocols) and how many have a JoinGroup
    parked (its numMembersAwaitingJoinResponse). Walked per join, a rebalance of N members took O(N^2):
    1,000 members joining took 1.5 s of the event loop, 4,000 took 24 s (a review's find). Made with a
    group's first member, so that the many member-less groups of commits pay one empty slot."""

    __slots__ = ("joining", "supported")

    def __init__(self) -> None:
        self.supported: dict[str, int] = {}
        self.joining = 0

    def count(self, protocols: list[tuple[str, bytes]], by: int) -> None:
        for name in {name for name, _ in protocols}:  # a name a member lists twice counts once
            left = self.supported.get(name, 0) + by
            if left:
                self.supported[name] = left
            else:
                del self.supported[name]


@dataclass(slots=True, eq=False)
class GroupMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]  # (name, metadata) in the member's order of preference
    assignment: bytes = b""
    awaiting_join: "Request | None" = None
    awaiting_sync: "Request | None" = None
    is_new: bool = False  # joined but not yet through a completed join phase (new-member timeout)

    def metadata(self, protocol: str | None) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""

    def vote(self, candidates: set[str]) -> str:
        """The member's most preferred protocol among those every member supports."""
        return next(name for name, _ in self.protocols if name in candidates)

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return self.protocols == protocols


@dataclass(slots=True, eq=False)
class ClassicGroup:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    current_state_timestamp: int = -1
    members: dict[str, GroupMember] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # group instance id -> member id
    # Member ids as dict keys (values None), not sets: an empty dict takes 64 bytes, an empty set 216, and
    # most groups have neither (a commit's simple group: 783 bytes an empty group with two sets, 479 now).
    pending_members: dict[str, None] = field(default_factory=dict)  # KIP-394: ids handed out, rejoin awaited
    pending_sync: dict[str, None] = field(default_factory=dict)  # joined this generation, no SyncGroup yet
    new_member_added: bool = False  # extends the initial rebalance delay
    # The topics the members subscribe to as of this generation (Kafka's subscribedTopics): taken when a
    # generation starts and when the group is loaded, not as members rejoin with other subscriptions.
    # None when unknown (not a consumer group, no protocol, a subscription that does not parse).
    subscribed: frozenset[str] | None = None
    previous_state: GroupState = GroupState.EMPTY
    tally: MemberTally | None = field(default=None, repr=False)  # None until a member joins
    # The counts of the shard whose ``groups`` holds it (ShardData.put_group); None once it is removed or
    # replaced, so that code still holding the old object (a callback waiting for a write) cannot move them.
    counts: GroupCounts | None = field(default=None, repr=False)

    # -- state ---------------------------------------------------------------------------------

    def transition(self, to: GroupState, now_ms: int) -> None:
        """The only place the state changes; a transition Kafka does not allow is a bug here."""
        if self.state not in _FROM[to]:
            raise IllegalTransition(f"group {self.group_id}: {self.state.value} -> {to.value}")
        self.previous_state = self.state
        self.state = to
        self.current_state_timestamp = now_ms
        if self.counts is not None:
            self.counts.moved(self.previous_state, to)

    def is_in(self, *states: GroupState) -> bool:
        return self.state in states

    # -- members -------------------------------------------------------------------------------

    def add(self, member: GroupMember) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if self.tally is None:
            self.tally = MemberTally()
        self.tally.count(member.protocols, 1)
        if member.awaiting_join is not None:
            self.tally.joining += 1
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if self.leader is None:
            self.leader = member.member_id

    def remove(self, member_id: str) -> GroupMember | None:
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        if self.tally is not None:
            self.tally.count(member.protocols, -1)
            if member.awaiting_join is not None:
                self.tally.joining -= 1
        if member.group_instance_id is not None and self.static_members.get(member.group_instance_id) == member_id:
            del self.static_members[member.group_instance_id]
        self.pending_sync.pop(member_id, None)
        if self.leader == member_id:
            self.leader = next(iter(self.members), None)
        return member

    def replace_static(self, instance_id: str, old_id: str, new_id: str) -> GroupMember:
        """A restarted static member takes over its old entry (assignment included) under a new id."""
        member = self.members.pop(old_id)
        member.member_id = new_id
        self.members[new_id] = member
        self.static_members[instance_id] = new_id
        if self.leader == old_id:
            self.leader = new_id
        if old_id in self.pending_sync:
            del self.pending_sync[old_id]
            self.pending_sync[new_id] = None
        return member

    def set_protocols(self, member: GroupMember, protocols: list[tuple[str, bytes]]) -> None:
        """A member's protocols change (it rejoined with others): the only way they change after ``add``."""
        if self.tally is not None:
            self.tally.count(member.protocols, -1)
            self.tally.count(protocols, 1)
        member.protocols = protocols

    def park_join(self, member: GroupMember, req: "Request") -> None:
        """``req`` waits for the join phase to complete (a member's earlier parked join answered first)."""
        if member.awaiting_join is None and self.tally is not None:
            self.tally.joining += 1
        member.awaiting_join = req

    def take_join(self, member: GroupMember) -> "Request | None":
        """The member's parked JoinGroup, no longer parked: the caller answers it."""
        parked, member.awaiting_join = member.awaiting_join, None
        if parked is not None and self.tally is not None:
            self.tally.joining -= 1
        return parked

    @property
    def awaiting_join(self) -> int:
        return self.tally.joining if self.tally is not None else 0

    def all_joined(self) -> bool:
        return self.awaiting_join == len(self.members) and not self.pending_members

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    # -- protocols -----------------------------------------------------------------------------

    def candidate_protocols(self) -> set[str]:
        if self.tally is None:
            return set()
        return {name for name, n in self.tally.supported.items() if n == len(self.members)}

    def supports(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        """Whether a joining member can be in this group: same protocol type, and a protocol every
        current member also supports (any, for an Empty group; in a rebalance every member has left,
        any of the group's protocol type, as Kafka's supportsProtocols)."""
        if self.is_in(GroupState.EMPTY):
            return bool(protocol_type) and bool(protocols)
        if not self.members:
            return protocol_type == self.protocol_type and bool(protocols)
        candidates = self.candidate_protocols()
        return protocol_type == self.protocol_type and any(name in candidates for name, _ in protocols)

    def select_protocol(self) -> str:
        """The protocol most members vote for among those all support. A tie goes to the name a
        ``java.util.HashMap`` of the votes iterates first, as in Kafka's ``ClassicGroup.selectProtocol``
        (``Stream.max`` keeps the first of equal counts): a range/roundrobin tie is range there, whichever
        member leads (kcoord took the leader's preference, so a 1:1 group could get another assignor)."""
        candidates = self.candidate_protocols()
        votes = Counter(m.vote(candidates) for m in self.members.values())  # keys in first-vote order
        best = max(votes.values())
        return next(name for name in java_hashmap_order(list(votes)) if votes[name] == best)

    def compute_subscribed(self) -> frozenset[str] | None:
        """Topics the members of a ``consumer`` group subscribe to now, decoded from their subscriptions
        with Kafka's ConsumerProtocolSubscription schema (none without members); None when unknown
        (another protocol type, no protocol chosen, a subscription that does not parse)."""
        if self.protocol_type != CONSUMER_PROTOCOL:
            return None
        if not self.members:
            return frozenset()
        if self.protocol is None:
            return None
        topics: set[str] = set()
        for member in self.members.values():
            decoded = decode_subscription(member.metadata(self.protocol))
            if decoded is None:
                return None
            topics.update(decoded)
        return frozenset(topics)

    def is_subscribed_to(self, topic: str) -> bool:
        """As of this generation; when that is unknown, a consumer group counts as subscribed to every
        topic (Kafka's isSubscribedToTopic), another kind to none."""
        if self.subscribed is None:
            return self.protocol_type == CONSUMER_PROTOCOL
        return topic in self.subscribed

    # -- persistence ---------------------------------------------------------------------------

    def to_record(self, assignments: dict[str, bytes] | None = None) -> GroupMetadata:
        """The GroupMetadata value for the group as it is now, with its members' assignments (or the
        given ones: a leader's SyncGroup stores them before they are handed out)."""
        members = tuple(
            MemberMetadata(m.member_id, m.group_instance_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
                           m.session_timeout_ms, m.metadata(self.protocol),
                           m.assignment if assignments is None else assignments.get(m.member_id, b""))
            for m in self.members.values()
        )
        return GroupMetadata(self.protocol_type or "", self.generation, self.protocol, self.leader,
                             self.current_state_timestamp, members)

    @classmethod
    def from_record(cls, group_id: str, value: GroupMetadata) -> "ClassicGroup":
        """A group as loading brings it back: Empty without members, Stable with them."""
        group = cls(group_id=group_id, state=GroupState.STABLE if value.members else GroupState.EMPTY,
                    generation=value.generation, protocol_type=value.protocol_type or None, protocol=value.protocol,
                    leader=value.leader, current_state_timestamp=value.current_state_timestamp)
        for m in value.members:
            rebalance = m.rebalance_timeout if m.rebalance_timeout >= 0 else m.session_timeout
            protocols = [(value.protocol, m.subscription)] if value.protocol is not None else []
            group.add(GroupMember(m.member_id, m.group_instance_id, m.client_id, m.client_host, rebalance,
                                  m.session_timeout, value.protocol_type, protocols, m.assignment))
        group.protocol_type, group.leader = value.protocol_type or None, value.leader  # as stored, not as added
        group.subscribed = group.compute_subscribed()
        return group


def java_hashmap_order(keys: list[str]) -> list[str]:
    """The order a default ``java.util.HashMap<String, ?>`` holding ``keys`` (given in insertion order)
    iterates them: by bucket, ``(h ^ h >>> 16) & (capacity - 1)`` of ``String.hashCode``, the capacity
    16 doubled while the keys exceed three quarters of it; within a bucket, as inserted (a resize keeps
    that order). Bins of 8+ colliding keys, which Java turns into trees, are not modelled."""
    capacity = 16
    while len(keys) > capacity * 3 // 4:
        capacity *= 2

    def bucket(key: str) -> int:
        h = java_string_hash(key) & 0xFFFFFFFF
        return (h ^ (h >> 16)) & (capacity - 1)

    return sorted(keys, key=bucket)  # stable: insertion order within a bucket


_SUBSCRIPTION = MessageCodec(load_message("ConsumerProtocolSubscription"))


def decode_subscription(metadata: bytes) -> list[str] | None:
    """The topics of a consumer-protocol subscription (int16 version + struct); None if it does not parse.
    Only the v0 prefix (topics, user data) is read, whatever the version says (a negative one too), as
    Kafka's computeSubscribedTopics does: every version starts with it, and a client's own layout after
    it (KafkaJS sends version 1 without owned partitions) must not make the topics unknown."""
    if len(metadata) < 2:
        return None
    try:
        sub, _ = _SUBSCRIPTION.decode(metadata, 0, 2)
    except DecodeError:
        return None
    return list(sub.topics or [])
