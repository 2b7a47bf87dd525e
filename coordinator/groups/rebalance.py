"""The classic rebalance of one shard's groups, as its timers and requests drive it (reference section
12; Kafka's ``prepareRebalance``, ``completeClassicGroupJoin`` and the expiry paths in
``GroupMetadataManager``): a rebalance prepared, the join phase ended (every member rejoined, the
initial delay or the rebalance timeout over) with a new generation and its answers, the sync phase's
answers and its timeout, and a member's session expiring. Apart from coordinator.groups.membership
(what each request does) because these are reached from every request and from the timers alike.
"""

import logging

from coordinator.groups.messages import GroupConfig, JoinResult, ShardOps, SyncResult
from coordinator.groups.model import ClassicGroup, GroupMember, GroupState
from coordinator.metrics import Metrics
from coordinator.shard import OpResult
from coordinator.state import ShardData
from protocol.errors import ErrorCode
from protocol.records import GroupMetadataRecord

log = logging.getLogger(__name__)


def heartbeat_key(group_id: str, member_id: str) -> str:
    return f"heartbeat:{group_id}:{member_id}"


def join_key(group_id: str) -> str:
    return f"join:{group_id}"


def sync_key(group_id: str) -> str:
    return f"sync:{group_id}"


class Rebalance:
    """The rebalance steps of one shard's groups, shared by the membership operations (its subclass,
    coordinator.groups.membership ``Membership``) and the timers they arm. Stateless itself, as they are."""

    def __init__(self, shard: ShardOps, config: GroupConfig, metrics: Metrics | None = None) -> None:
        self.shard = shard
        self.config = config
        self.metrics = metrics or Metrics()

    # -- join and sync phases ----------------------------------------------------------------------

    def _join_answer(self, group: ClassicGroup, member: GroupMember, with_members: bool,
                     skip_assignment: bool = False) -> JoinResult:
        members = [(m.member_id, m.group_instance_id, m.metadata(group.protocol)) for m in group.members.values()] \
            if with_members else []
        return JoinResult(ErrorCode.NONE, member.member_id, group.generation, group.protocol_type, group.protocol,
                          group.leader or "", members, skip_assignment)

    def _rebalance_or_complete_join(self, data: ShardData, group: ClassicGroup, reason: str) -> OpResult:
        if group.is_in(GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY):
            return self._prepare_rebalance(data, group, reason)
        return self._maybe_complete_join(data, group)

    def _prepare_rebalance(self, data: ShardData, group: ClassicGroup, reason: str) -> OpResult:
        log.info("Preparing to rebalance group %s in state %s with old generation %d (reason: %s)", group.group_id,
                 group.state.value, group.generation, reason)
        if group.is_in(GroupState.COMPLETING_REBALANCE):
            self._reset_and_propagate(group, ErrorCode.REBALANCE_IN_PROGRESS)
        self.shard.timers.cancel(sync_key(group.group_id))
        initial = group.is_in(GroupState.EMPTY)
        group.transition(GroupState.PREPARING_REBALANCE, self.shard.clock.now_ms())
        if initial:
            delay = self.config.initial_rebalance_delay_ms
            remaining = max(group.rebalance_timeout_ms() - delay, 0)
            self.shard.schedule(join_key(group.group_id), delay, self._initial_delay_expired, group.group_id, delay,
                                remaining)
            return OpResult([], None)
        if group.all_joined():
            return self._complete_join(data, group)
        self.shard.schedule(join_key(group.group_id), group.rebalance_timeout_ms(), self._join_expired, group.group_id)
        return OpResult([], None)

    def _maybe_complete_join(self, data: ShardData, group: ClassicGroup) -> OpResult:
        """Completes the join phase once every known member rejoined, except in an initial rebalance,
        which waits out its delay so that more members can come."""
        if (group.is_in(GroupState.PREPARING_REBALANCE) and group.all_joined()
                and group.previous_state is not GroupState.EMPTY):
            return self._complete_join(data, group)
        return OpResult([], None)

    def _initial_delay_expired(self, data: ShardData, group_id: str, delay: int, remaining: int) -> OpResult:
        group = data.groups.get(group_id)
        if group is None or not group.is_in(GroupState.PREPARING_REBALANCE):
            return OpResult([], None)
        if group.new_member_added and remaining > 0:
            group.new_member_added = False
            next_delay = min(self.config.initial_rebalance_delay_ms, remaining)
            self.shard.schedule(join_key(group_id), next_delay, self._initial_delay_expired, group_id, next_delay,
                                max(remaining - delay, 0))
            return OpResult([], None)
        return self._complete_join(data, group)

    def _join_expired(self, data: ShardData, group_id: str) -> OpResult:
        group = data.groups.get(group_id)
        if group is None or not group.is_in(GroupState.PREPARING_REBALANCE):
            return OpResult([], None)
        return self._complete_join(data, group)

    def _complete_join(self, data: ShardData, group: ClassicGroup) -> OpResult:
        """Ends the join phase: dynamic members that did not rejoin are dropped, a leader among the joined
        is chosen, the generation advances and every waiting member gets its answer (the leader with
        the member list); or the group becomes Empty, which is recorded."""
        self.shard.timers.cancel(join_key(group.group_id))
        for member in [m for m in group.members.values() if m.awaiting_join is None and m.group_instance_id is None]:
            log.info("Member %s did not rejoin group %s in time, removing it", member.member_id, group.group_id)
            group.remove(member.member_id)
            self.shard.timers.cancel(heartbeat_key(group.group_id, member.member_id))
        if group.members and not self._elect_joined_leader(group):
            # Only static members that have not rejoined are left: wait for them, or for their sessions.
            self.shard.schedule(join_key(group.group_id), group.rebalance_timeout_ms(), self._join_expired,
                                group.group_id)
            return OpResult([], None)
        now = self.shard.clock.now_ms()
        group.generation += 1
        group.pending_sync.clear()
        if not group.members:
            group.protocol = None
            group.leader = None
            group.subscribed = group.compute_subscribed()
            group.transition(GroupState.EMPTY, now)
            log.info("Group %s with generation %d is now empty", group.group_id, group.generation)
            return OpResult([GroupMetadataRecord(group.group_id, group.to_record())], None, replay=False)
        group.protocol = group.select_protocol()
        group.subscribed = group.compute_subscribed()
        group.transition(GroupState.COMPLETING_REBALANCE, now)
        log.info("Group %s generation %d: %d members joined (leader %s, protocol %s)", group.group_id,
                 group.generation, len(group.members), group.leader, group.protocol)
        for member in group.members.values():
            if (parked := group.take_join(member)) is not None:
                parked.complete(self._join_answer(group, member, group.leader == member.member_id))
            self._reschedule_heartbeat(group, member)
            member.is_new = False
            group.pending_sync[member.member_id] = None
        self.shard.schedule(sync_key(group.group_id), group.rebalance_timeout_ms(), self._sync_expired, group.group_id,
                            group.generation)
        return OpResult([], None)

    @staticmethod
    def _elect_joined_leader(group: ClassicGroup) -> bool:
        leader = group.members.get(group.leader or "")
        if leader is not None and leader.awaiting_join is not None:
            return True
        joined = next((m for m in group.members.values() if m.awaiting_join is not None), None)
        if joined is None:
            return False
        group.leader = joined.member_id
        return True

    def _reset_and_propagate(self, group: ClassicGroup, error: ErrorCode) -> None:
        for member in group.members.values():
            member.assignment = b""
        self._propagate(group, error)

    def _propagate(self, group: ClassicGroup, error: ErrorCode) -> None:
        ok = error is ErrorCode.NONE
        for member in group.members.values():
            parked, member.awaiting_sync = member.awaiting_sync, None
            if parked is not None:
                parked.complete(SyncResult(error, member.assignment, group.protocol_type if ok else None,
                                           group.protocol if ok else None))
                self._reschedule_heartbeat(group, member)

    def _sync_expired(self, data: ShardData, group_id: str, generation: int) -> OpResult:
        """Members that joined but never synced within the rebalance timeout are removed."""
        group = data.groups.get(group_id)
        if (group is None or group.generation != generation
                or not group.is_in(GroupState.COMPLETING_REBALANCE, GroupState.STABLE) or not group.pending_sync):
            return OpResult([], None)
        missing = sorted(group.pending_sync)
        for member_id in missing:
            group.remove(member_id)
            self.shard.timers.cancel(heartbeat_key(group_id, member_id))
        return self._prepare_rebalance(data, group, f"removing {missing} on pending sync request expiration")

    # -- sessions ----------------------------------------------------------------------------------

    def _reschedule_heartbeat(self, group: ClassicGroup, member: GroupMember, timeout_ms: int | None = None) -> None:
        self.shard.schedule(heartbeat_key(group.group_id, member.member_id),
                            member.session_timeout_ms if timeout_ms is None else timeout_ms,
                            self._expire_heartbeat, group.group_id, member.member_id)

    def _expire_heartbeat(self, data: ShardData, group_id: str, member_id: str) -> OpResult:
        group = data.groups.get(group_id)
        if group is None or group.is_in(GroupState.DEAD):
            return OpResult([], None)
        if member_id in group.pending_members:
            group.pending_members.pop(member_id, None)
            if group.is_in(GroupState.PREPARING_REBALANCE) and group.all_joined():
                return self._complete_join(data, group)
            return OpResult([], None)
        member = group.members.get(member_id)
        if member is None:
            return OpResult([], None)
        if not member.is_new and (member.awaiting_join is not None or member.awaiting_sync is not None):
            return OpResult([], None)  # waiting in a rebalance counts as alive; its timeouts apply instead
        return self._remove_member(data, group, member)

    def _remove_member(self, data: ShardData, group: ClassicGroup, member: GroupMember) -> OpResult:
        log.info("Member %s in group %s has failed (session timeout), removing it from the group",
                 member.member_id, group.group_id)
        self.shard.timers.cancel(heartbeat_key(group.group_id, member.member_id))
        if (parked := group.take_join(member)) is not None:
            parked.complete(JoinResult(ErrorCode.UNKNOWN_MEMBER_ID))
        group.remove(member.member_id)
        if group.is_in(GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            return self._rebalance_or_complete_join(data, group, f"removing member {member.member_id} on heartbeat "
                                                                 "expiration")
        if group.is_in(GroupState.PREPARING_REBALANCE) and group.all_joined():
            return self._complete_join(data, group)
        return OpResult([], None)
