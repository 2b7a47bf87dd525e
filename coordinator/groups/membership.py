"""Classic group membership of one shard: JoinGroup, SyncGroup, Heartbeat, LeaveGroup and their timers,
each an operation run through the shard (reference section 12; Kafka's classic-group paths in
``GroupMetadataManager``).

Responses are version-independent results (``JoinResult``, ``SyncResult``, an error code, ``LeaveResult``);
the API modules render them per version. A JoinGroup or follower SyncGroup that has to wait is parked on
the member (``req.wait()``) and completed when the rebalance gets there. GroupMetadata records written at
generation boundaries are not replayed on the live path (``replay=False``), whichever request or timer
ends the generation: the group already is what they say, and replay would build a new one without its
soft state (pending member ids, the initial-delay flag). A leader's assignments are handed out only once
their record is durable, and only if the group is still in the same state and generation by then.

Timers, keyed per group: ``heartbeat:<group>:<member>`` (session, or the 5-minute new-member join timeout),
``join:<group>`` (initial delay / rebalance timeout), ``sync:<group>`` (members that never sync); what
their expiry does, and the rebalance steps the requests share with it: coordinator.groups.rebalance.
"""

import logging
import uuid

from coordinator.groups.messages import JoinRequest, JoinResult, LeaveResult, SyncResult
from coordinator.groups.model import ClassicGroup, GroupMember, GroupState
from coordinator.groups.rebalance import Rebalance, heartbeat_key, sync_key
from coordinator.request import PARKED, Request
from coordinator.shard import OpResult
from coordinator.state import ShardData
from protocol.errors import ErrorCode
from protocol.records import GroupMetadataRecord, LiveRecord

log = logging.getLogger(__name__)

MEMBER_ID_MAX_BYTES = 32767  # an int16-length string: JoinGroup v0-v5 and the group's records carry it
NEW_MEMBER_JOIN_TIMEOUT_MS = 300_000  # Kafka's classicGroupNewMemberJoinTimeoutMs (KAFKA-7610)


def validate_member(group: ClassicGroup, member_id: str, instance_id: str | None) -> ErrorCode:
    """Kafka's ``validateMember``: a static instance must map to this member id; the member must exist."""
    if instance_id is not None:
        owner = group.static_members.get(instance_id)
        if owner is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if owner != member_id:
            return ErrorCode.FENCED_INSTANCE_ID
    if member_id not in group.members:
        return ErrorCode.UNKNOWN_MEMBER_ID
    return ErrorCode.NONE


class Membership(Rebalance):
    """Membership operations of one shard, on the rebalance steps they share with the timers
    (coordinator.groups.rebalance). Stateless itself: groups live in the shard's data, so a reload (new
    data) leaves nothing stale here; timers are the shard's and are cancelled on unload."""

    # -- entry points (called by the API modules) ------------------------------------------------

    def join(self, req: Request, join: JoinRequest) -> object:
        return self.shard.write(req, self._join, req, join)

    def sync(self, req: Request, group_id: str, generation: int, member_id: str, instance_id: str | None,
             protocol_type: str | None, protocol: str | None, assignments: dict[str, bytes]) -> object:
        return self.shard.write(req, self._sync, req, group_id, generation, member_id, instance_id, protocol_type,
                                protocol, assignments)

    def heartbeat(self, req: Request, group_id: str, generation: int, member_id: str,
                  instance_id: str | None) -> object:
        return self.shard.write(req, self._heartbeat, group_id, generation, member_id, instance_id)

    def leave(self, req: Request, group_id: str, members: list[tuple[str, str | None]]) -> object:
        return self.shard.write(req, self._leave, group_id, members)

    def touch(self, group: ClassicGroup, member_id: str) -> None:
        """A valid member commit counts as a heartbeat (Stable and PreparingRebalance groups)."""
        member = group.members.get(member_id)
        if member is not None and group.is_in(GroupState.STABLE, GroupState.PREPARING_REBALANCE):
            self._reschedule_heartbeat(group, member)

    # -- JoinGroup ---------------------------------------------------------------------------------

    def _join(self, data: ShardData, req: Request, j: JoinRequest) -> OpResult:
        records: list[LiveRecord] = []
        group = data.groups.get(j.group_id)
        if group is None:
            if j.member_id:
                return OpResult([], JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, j.member_id))
            group = ClassicGroup(j.group_id, current_state_timestamp=self.shard.clock.now_ms())
            data.put_group(group)
            # Kafka writes an empty-group record for a group a JoinGroup creates.
            records.append(GroupMetadataRecord(group.group_id, group.to_record()))
        if not self._accepts(group, j.member_id):
            over = group.members.get(j.member_id)
            if over is not None:  # the group shrank below its members (a lower group.max.size)
                self._drop_member(group, over)
            group.pending_members.pop(j.member_id, None)  # as Kafka's group.remove: its id is spent
            return OpResult(records, JoinResult(ErrorCode.GROUP_MAX_SIZE_REACHED), replay=False)
        if not j.member_id:
            result = self._join_new(data, req, group, j)
        else:
            result = self._join_existing(data, req, group, j)
        return OpResult(records + result.records, result.response, on_durable=result.on_durable, replay=False)

    def _accepts(self, group: ClassicGroup, member_id: str) -> bool:
        """``group.max.size``: a new member is refused once the group is full (counting the members
        awaiting join while a rebalance gathers them). A pending member (KIP-394: given an id, not yet
        joined with it) is a new member here, as in Kafka: many instances starting at once all get
        pending ids while the group is Empty, and their second joins must not all be let in."""
        if group.is_in(GroupState.EMPTY, GroupState.DEAD):
            return True
        member = group.members.get(member_id)
        if group.is_in(GroupState.PREPARING_REBALANCE):
            if member is not None and member.awaiting_join is not None:
                return True
            return group.awaiting_join < self.config.max_size
        return member is not None or len(group.members) < self.config.max_size

    def _join_new(self, data: ShardData, req: Request, group: ClassicGroup, j: JoinRequest) -> OpResult:
        if group.is_in(GroupState.DEAD):
            return OpResult([], JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE))
        if not group.supports(j.protocol_type, j.protocols):
            return OpResult([], JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL))
        if j.group_instance_id is not None:
            new_id = new_member_id(j.group_instance_id)
            previous = group.static_members.get(j.group_instance_id)
            if previous is None:
                return self._add_member_and_rebalance(data, req, group, j, new_id)
            return self._replace_static_member(data, req, group, j, previous, new_id)
        new_id = new_member_id(j.client_id)
        if j.require_known_member_id:
            # KIP-394: hand out an id and wait for the member to rejoin with it; an id never used
            # again is dropped after the session timeout.
            group.pending_members[new_id] = None
            self.shard.schedule(heartbeat_key(group.group_id, new_id), j.session_timeout_ms, self._expire_heartbeat,
                                group.group_id, new_id)
            return OpResult([], JoinResult(ErrorCode.MEMBER_ID_REQUIRED, new_id))
        return self._add_member_and_rebalance(data, req, group, j, new_id)

    def _join_existing(self, data: ShardData, req: Request, group: ClassicGroup, j: JoinRequest) -> OpResult:
        if group.is_in(GroupState.DEAD):
            return OpResult([], JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, j.member_id))
        if not group.supports(j.protocol_type, j.protocols):
            return OpResult([], JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, j.member_id))
        if j.member_id in group.pending_members:
            return self._add_member_and_rebalance(data, req, group, j, j.member_id)
        error = validate_member(group, j.member_id, j.group_instance_id)
        if error:
            return OpResult([], JoinResult(error, j.member_id))
        member = group.members[j.member_id]
        if group.is_in(GroupState.PREPARING_REBALANCE):
            return self._update_member_and_rebalance(data, req, group, member, j)
        if group.is_in(GroupState.COMPLETING_REBALANCE):
            if member.matches(j.protocols):
                # The same join again (its first answer was lost): the current generation, as it was.
                return OpResult([], self._join_answer(group, member, group.leader == member.member_id))
            return self._update_member_and_rebalance(data, req, group, member, j)
        if group.is_in(GroupState.STABLE):
            if group.leader == member.member_id or not member.matches(j.protocols):
                # A rejoining leader may have seen metadata change that members' metadata does not show.
                return self._update_member_and_rebalance(data, req, group, member, j)
            return OpResult([], self._join_answer(group, member, False))
        return OpResult([], JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, j.member_id))  # Empty: reset and rejoin

    def _park_join(self, group: ClassicGroup, member: GroupMember, req: Request) -> None:
        if member.awaiting_join is not None:
            # A retried JoinGroup replaces the parked one; answer that one so its connection is not stuck.
            member.awaiting_join.complete(JoinResult(ErrorCode.REBALANCE_IN_PROGRESS, member.member_id))
        req.wait()
        group.park_join(member, req)

    def _add_member_and_rebalance(self, data: ShardData, req: Request, group: ClassicGroup, j: JoinRequest,
                                  member_id: str) -> OpResult:
        member = GroupMember(member_id, j.group_instance_id, j.client_id, j.client_host, j.rebalance_timeout_ms,
                             j.session_timeout_ms, j.protocol_type, j.protocols, is_new=True)
        if group.is_in(GroupState.PREPARING_REBALANCE) and group.previous_state is GroupState.EMPTY:
            group.new_member_added = True  # extends the initial delay
        group.pending_members.pop(member_id, None)
        group.add(member)
        self._park_join(group, member, req)
        # A new member cannot heartbeat (no id yet on its side) and a parked join hides disconnects: it is
        # dropped after the new-member timeout instead, so retried joins cannot grow the group forever.
        self._reschedule_heartbeat(group, member, NEW_MEMBER_JOIN_TIMEOUT_MS)
        result = self._rebalance_or_complete_join(data, group, f"adding new member {member_id} with group instance "
                                                               f"id {j.group_instance_id}")
        return OpResult(result.records, PARKED, on_durable=result.on_durable)

    def _update_member_and_rebalance(self, data: ShardData, req: Request, group: ClassicGroup, member: GroupMember,
                                     j: JoinRequest) -> OpResult:
        group.set_protocols(member, j.protocols)
        member.rebalance_timeout_ms = j.rebalance_timeout_ms
        member.session_timeout_ms = j.session_timeout_ms
        self._park_join(group, member, req)
        result = self._rebalance_or_complete_join(data, group, f"member {member.member_id} is joining group during "
                                                               f"{group.state.value}")
        return OpResult(result.records, PARKED, on_durable=result.on_durable)

    def _replace_static_member(self, data: ShardData, req: Request, group: ClassicGroup, j: JoinRequest,
                               old_id: str, new_id: str) -> OpResult:
        """KIP-345: a static member restarting (member id "") takes over its old entry. In a Stable group
        whose protocol would not change, no rebalance: the group is stored with the new id and the member
        gets the current generation (its old assignment comes back with SyncGroup)."""
        leader_before = group.leader
        old = group.members[old_id]
        if (fenced := group.take_join(old)) is not None:  # the old incarnation's parked join is fenced
            fenced.complete(JoinResult(ErrorCode.FENCED_INSTANCE_ID, old_id))
        if old.awaiting_sync is not None:
            old.awaiting_sync.complete(SyncResult(ErrorCode.FENCED_INSTANCE_ID))
            old.awaiting_sync = None
        self.shard.timers.cancel(heartbeat_key(group.group_id, old_id))
        # The entry keeps its client id and host (Kafka's replaceStaticMember copies them), and is a
        # member through a join phase already: its session timeout does not apply while it waits in one.
        member = group.replace_static(j.group_instance_id or "", old_id, new_id)
        member.is_new = False
        # The new id's session starts on the old entry's timeout, as Kafka reschedules it before taking the
        # join's: a restart that changed session.timeout.ms has the new one from its first heartbeat.
        self._reschedule_heartbeat(group, member)
        group.set_protocols(member, j.protocols)
        member.rebalance_timeout_ms, member.session_timeout_ms = j.rebalance_timeout_ms, j.session_timeout_ms
        if group.is_in(GroupState.STABLE):
            if group.select_protocol() == group.protocol:
                is_leader = group.leader == new_id
                if j.skip_assignment_supported:
                    answer = self._join_answer(group, member, is_leader, skip_assignment=is_leader)
                else:
                    # The old leader id is returned: a replaced leader must not compute an assignment
                    # that a Stable group would never hand out.
                    answer = self._join_answer(group, member, False)
                    answer.leader = leader_before or ""
                # Answered once the new member id is durable; if that write fails the shard reloads
                # the group as it was, which reverts the replacement.
                return OpResult([GroupMetadataRecord(group.group_id, group.to_record())], answer, replay=False)
            self._park_join(group, member, req)
            result = self._prepare_rebalance(data, group, f"group's selected protocol will change because static "
                                                          f"member {new_id} rejoined with changed protocols")
            return OpResult(result.records, PARKED, on_durable=result.on_durable)
        self._park_join(group, member, req)
        if group.is_in(GroupState.COMPLETING_REBALANCE):
            # Its old id may already be in the leader's hands: only a new rebalance keeps them apart.
            result = self._prepare_rebalance(data, group, f"updating metadata for static member {new_id}")
        else:
            result = self._maybe_complete_join(data, group)
        return OpResult(result.records, PARKED, on_durable=result.on_durable)

    # -- SyncGroup ---------------------------------------------------------------------------------

    def _sync(self, data: ShardData, req: Request, group_id: str, generation: int, member_id: str,
              instance_id: str | None, protocol_type: str | None, protocol: str | None,
              assignments: dict[str, bytes]) -> OpResult:
        group = data.groups.get(group_id)
        if group is None:
            return OpResult([], SyncResult(ErrorCode.UNKNOWN_MEMBER_ID))
        if group.is_in(GroupState.DEAD):
            return OpResult([], SyncResult(ErrorCode.COORDINATOR_NOT_AVAILABLE))
        error = validate_member(group, member_id, instance_id)
        if error:
            return OpResult([], SyncResult(error))
        if generation != group.generation:
            return OpResult([], SyncResult(ErrorCode.ILLEGAL_GENERATION))
        if _inconsistent(protocol_type, group.protocol_type) or _inconsistent(protocol, group.protocol):
            return OpResult([], SyncResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL))
        if group.is_in(GroupState.PREPARING_REBALANCE):
            return OpResult([], SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
        member = group.members[member_id]
        if group.is_in(GroupState.STABLE):
            self._synced(group, member_id)
            return OpResult([], SyncResult(ErrorCode.NONE, member.assignment, group.protocol_type, group.protocol))
        # CompletingRebalance: followers wait; the leader's assignments are stored, then handed out.
        if member.awaiting_sync is not None:
            member.awaiting_sync.complete(SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
        req.wait()
        member.awaiting_sync = req
        self._synced(group, member_id)
        if group.leader != member_id:
            return OpResult([], PARKED)
        assigned = {mid: assignments.get(mid, b"") for mid in group.members}  # missing ones: empty
        stored = group.to_record(assigned)

        def durable() -> None:
            # Another member may have joined meanwhile: hand out only what this generation decided.
            if group.is_in(GroupState.COMPLETING_REBALANCE) and group.generation == generation:
                for mid, m in group.members.items():
                    m.assignment = assigned.get(mid, b"")
                self._propagate(group, ErrorCode.NONE)
                group.transition(GroupState.STABLE, self.shard.clock.now_ms())
                self.metrics.rebalance_completed()
                log.info("Stabilized group %s generation %d with %d members", group_id, generation,
                         len(group.members))

        return OpResult([GroupMetadataRecord(group_id, stored)], PARKED, on_durable=durable, replay=False)

    def _synced(self, group: ClassicGroup, member_id: str) -> None:
        group.pending_sync.pop(member_id, None)
        if not group.pending_sync or not group.is_in(GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            self.shard.timers.cancel(sync_key(group.group_id))

    # -- Heartbeat ---------------------------------------------------------------------------------

    def _heartbeat(self, data: ShardData, group_id: str, generation: int, member_id: str,
                   instance_id: str | None) -> OpResult:
        group = data.groups.get(group_id)
        if group is None:
            return OpResult([], ErrorCode.UNKNOWN_MEMBER_ID)
        if group.is_in(GroupState.DEAD):
            return OpResult([], ErrorCode.COORDINATOR_NOT_AVAILABLE)
        error = validate_member(group, member_id, instance_id)
        if error:
            return OpResult([], error)
        if generation != group.generation:
            return OpResult([], ErrorCode.ILLEGAL_GENERATION)
        if group.is_in(GroupState.EMPTY):
            return OpResult([], ErrorCode.UNKNOWN_MEMBER_ID)
        self._reschedule_heartbeat(group, group.members[member_id])
        if group.is_in(GroupState.PREPARING_REBALANCE):
            return OpResult([], ErrorCode.REBALANCE_IN_PROGRESS)
        return OpResult([], ErrorCode.NONE)

    # -- LeaveGroup --------------------------------------------------------------------------------

    def _leave(self, data: ShardData, group_id: str, members: list[tuple[str, str | None]]) -> OpResult:
        group = data.groups.get(group_id)
        if group is None:
            return OpResult([], LeaveResult(ErrorCode.NONE, [(m, i, ErrorCode.UNKNOWN_MEMBER_ID) for m, i in members]))
        if group.is_in(GroupState.DEAD):
            return OpResult([], LeaveResult(ErrorCode.COORDINATOR_NOT_AVAILABLE))
        results: list[tuple[str, str | None, ErrorCode]] = []
        gone: list[str] = []  # the ids of the members that left (a removal by instance id names none)
        for member_id, instance_id in members:
            if not member_id:
                # Administrative removal by instance id: whoever holds it now.
                holder = group.static_members.get(instance_id) if instance_id is not None else None
                if holder is None:
                    results.append((member_id, instance_id, ErrorCode.UNKNOWN_MEMBER_ID))
                    continue
                self._drop_member(group, group.members[holder])
                gone.append(holder)
            elif member_id in group.pending_members:  # a valid leave too: a Stable group rebalances (Kafka 4)
                group.pending_members.pop(member_id, None)
                self.shard.timers.cancel(heartbeat_key(group_id, member_id))
                gone.append(member_id)
            else:
                error = validate_member(group, member_id, instance_id)
                if error:
                    results.append((member_id, instance_id, error))
                    continue
                self._drop_member(group, group.members[member_id])
                gone.append(member_id)
            results.append((member_id, instance_id, ErrorCode.NONE))
        result = OpResult([], None)
        if gone:
            log.info("Members %s have left group %s", gone, group_id)
            if group.is_in(GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
                result = self._rebalance_or_complete_join(data, group, f"explicit LeaveGroup request for {gone}")
            elif group.is_in(GroupState.PREPARING_REBALANCE):
                result = self._maybe_complete_join(data, group)
        return OpResult(result.records, LeaveResult(ErrorCode.NONE, results), on_durable=result.on_durable,
                        replay=False)

    def _drop_member(self, group: ClassicGroup, member: GroupMember) -> None:
        self.shard.timers.cancel(heartbeat_key(group.group_id, member.member_id))
        if (parked := group.take_join(member)) is not None:
            parked.complete(JoinResult(ErrorCode.UNKNOWN_MEMBER_ID))
        group.remove(member.member_id)

    # -- the shard's lifecycle ---------------------------------------------------------------------

    def arm(self, data: ShardData) -> None:
        """The shard serves writes again: every loaded member gets a fresh session timer, and a group
        larger than ``group.max.size`` is made to rebalance (the extra members are then refused)."""
        for group in data.groups.values():
            for member in group.members.values():
                self._reschedule_heartbeat(group, member)
            if len(group.members) > self.config.max_size and group.is_in(GroupState.STABLE):
                self._prepare_rebalance(data, group, f"group has {len(group.members)} members, more than "
                                                     f"group.max.size {self.config.max_size}")

    def disarm(self, data: ShardData, stopping: bool = False) -> None:
        """The shard stopped serving: parked requests are answered NOT_COORDINATOR, as Kafka does. When
        kcoord stops, they are left unanswered instead (the connection closes after the replies before
        them), as at a crash: KafkaJS, told NOT_COORDINATOR by its only coordinator, gives up for good
        (a client sweep's find)."""
        for group in data.groups.values():
            for member in group.members.values():
                if (parked := group.take_join(member)) is not None and not (stopping and _dropped(parked)):
                    parked.complete(JoinResult(ErrorCode.NOT_COORDINATOR, member.member_id))
                if member.awaiting_sync is not None:
                    if not (stopping and _dropped(member.awaiting_sync)):
                        member.awaiting_sync.complete(SyncResult(ErrorCode.NOT_COORDINATOR))
                    member.awaiting_sync = None


def _dropped(req: Request) -> bool:
    """Leaves a parked request unanswered at a stop. Nothing starts behind a parked request on its
    connection (coordinator.connection), so it is the last there; were one behind it, it would be
    answered instead, as replies go in order and a durable commit behind it must still be answered."""
    if req.sink is None or not req.sink.forget(req):
        return False
    log.info("%s: kcoord is stopping: a parked %s is left unanswered, its connection closes", req.client_host,
             req.api.spec.name)
    return True


def _inconsistent(requested: str | None, current: str | None) -> bool:
    return requested is not None and current is not None and requested != current


def new_member_id(prefix: str) -> str:
    """Kafka's ``<client or instance id>-<uuid>``, with the prefix cut (at a character) so the id fits an
    int16-length string: a 32767-byte client id would otherwise make an id that no JoinGroup v0-v5 or
    DescribeGroups answer can carry, and that v6+ decoders (ours too) refuse when the member sends it back."""
    suffix = f"-{uuid.uuid4()}"
    raw = prefix.encode()
    room = MEMBER_ID_MAX_BYTES - len(suffix)
    if len(raw) > room:
        prefix = raw[:room].decode(errors="ignore")
    return prefix + suffix
