"""Offset retention (KIP-211, reference section 11): a timer operation per shard, every
``offsets.retention.check.interval.ms``, writing tombstones through the normal durable pipeline.

Which offsets may expire depends on the group:
* a group without a protocol type ("simple", created by commits): every offset, counted from its commit;
* a classic group with a protocol, Empty: every offset, counted from when the group became Empty (or
  from the commit when that time is unknown, as in old records);
* a ``consumer`` group that is Stable and whose subscriptions are known: offsets of topics it no longer
  subscribes to, counted from their commit;
* any other group: none.
An offset with an explicit expire timestamp (OffsetCommit v2-v4 retention) expires at that time instead.
Pending transactional offsets never expire. A group left Empty without offsets is deleted.

A pass runs in steps (``RetentionPass``): each step is one operation over whole groups holding about
``STEP_OFFSETS`` offsets, and the next step is the next loop pass, so a shard holding a million
offsets no longer stops answering for as long as one operation over all of them takes (measured in
one process: 0.14 s to find nothing due among 1M live offsets, 2.5 s to find them all due; a real
server's bystander saw a worst round trip of 333 ms per pass before, 11.5 ms in steps). Groups created
during a pass are looked at by the next pass; a step reads each of its groups as it is then.
"""

from collections.abc import Callable, Iterable

from coordinator.groups.model import CONSUMER_PROTOCOL, ClassicGroup, GroupState
from coordinator.shard import OpResult
from coordinator.state import ShardData, offset_value
from protocol.records import GroupMetadataRecord, LiveRecord, OffsetAndMetadata, OffsetCommitRecord, OffsetKey

RETENTION_KEY = "retention"

# (offset value, topic) -> the timestamp its retention is counted from, or None if it never expires
Base = Callable[[OffsetAndMetadata, str], int | None]


def _base(group: ClassicGroup | None) -> Base | None:
    if group is None or group.protocol_type is None:
        return lambda value, topic: value.commit_timestamp
    if group.is_in(GroupState.EMPTY):
        since = group.current_state_timestamp
        return lambda value, topic: since if since != -1 else value.commit_timestamp
    if group.protocol_type == CONSUMER_PROTOCOL and group.is_in(GroupState.STABLE):
        subscribed = group.subscribed_topics()
        if subscribed is not None:
            return lambda value, topic: None if topic in subscribed else value.commit_timestamp
    return None


def expire_offsets(data: ShardData, now_ms: int, retention_ms: int,
                   group_ids: Iterable[str] | None = None) -> OpResult:
    """Tombstones for the expired offsets of ``group_ids`` (default: every group of the shard), and for
    the groups that are then Empty with no offsets left. The response is the number of offsets expired."""
    records: list[LiveRecord] = []
    expired = 0
    has_pending = bool(data.pending_count)
    for group_id in list(data.groups.keys() | data.offsets.keys()) if group_ids is None else group_ids:
        group = data.groups.get(group_id)
        base = _base(group)
        offsets = data.offsets.get(group_id, {})
        gone = 0
        if base is not None:
            for (topic, partition), stored in offsets.items():
                if has_pending and data.has_pending(OffsetKey(group_id, topic, partition)):
                    continue
                value = offset_value(stored)
                if value.expire_timestamp != -1:
                    due = now_ms >= value.expire_timestamp
                else:
                    since = base(value, topic)
                    due = since is not None and now_ms - since >= retention_ms
                if due:
                    records.append(OffsetCommitRecord(OffsetKey(group_id, topic, partition), None))
                    gone += 1
        expired += gone
        pending = has_pending and any(k.group == group_id for offs in data.pending.values() for k in offs)
        if group is not None and group.is_in(GroupState.EMPTY) and gone == len(offsets) and not pending:
            records.append(GroupMetadataRecord(group_id, None))
    return OpResult(records, expired)


STEP_OFFSETS = 10_000  # offsets looked at per step: ~1.5 ms when none is due, ~25 ms when all are


class RetentionPass:
    """The groups a retention pass has still to look at, taken a step at a time."""

    def __init__(self, step_offsets: int = STEP_OFFSETS) -> None:
        self.step_offsets = step_offsets
        self._left: list[str] = []  # in reverse, so each step pops from the end

    @property
    def under_way(self) -> bool:
        return bool(self._left)

    def reset(self) -> None:
        self._left = []

    def step(self, data: ShardData, now_ms: int, retention_ms: int) -> OpResult:
        """The next step's tombstones: starts a pass if none is under way, then takes whole groups until
        they hold ``step_offsets`` offsets (a bigger group alone)."""
        if not self._left:
            self._left = sorted(data.groups.keys() | data.offsets.keys(), reverse=True)
        chunk: list[str] = []
        counted = 0
        while self._left and (not chunk or counted < self.step_offsets):
            group_id = self._left.pop()
            chunk.append(group_id)
            counted += len(data.offsets.get(group_id, ())) + 1
        return expire_offsets(data, now_ms, retention_ms, chunk)
