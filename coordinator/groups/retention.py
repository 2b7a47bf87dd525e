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
"""

from collections.abc import Callable

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


def expire_offsets(data: ShardData, now_ms: int, retention_ms: int) -> OpResult:
    """Tombstones for the expired offsets of every group of the shard, and for the groups that are then
    Empty with no offsets left. The response is the number of offsets expired."""
    records: list[LiveRecord] = []
    expired = 0
    for group_id in list(data.groups.keys() | data.offsets.keys()):
        group = data.groups.get(group_id)
        base = _base(group)
        offsets = data.offsets.get(group_id, {})
        gone = 0
        if base is not None:
            for (topic, partition), stored in offsets.items():
                key = OffsetKey(group_id, topic, partition)
                if data.has_pending(key):
                    continue
                value = offset_value(stored)
                if value.expire_timestamp != -1:
                    due = now_ms >= value.expire_timestamp
                else:
                    since = base(value, topic)
                    due = since is not None and now_ms - since >= retention_ms
                if due:
                    records.append(OffsetCommitRecord(key, None))
                    gone += 1
        expired += gone
        pending = any(k.group == group_id for offs in data.pending.values() for k in offs)
        if group is not None and group.is_in(GroupState.EMPTY) and gone == len(offsets) and not pending:
            records.append(GroupMetadataRecord(group_id, None))
    return OpResult(records, expired)
