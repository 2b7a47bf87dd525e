"""The group side of one shard: its membership operations, and the timers armed while it serves writes
(members' sessions, offset retention: a pass runs a step per flush cycle). Registered as the shard's
hooks, so a shard that fails answers its parked JoinGroup/SyncGroup requests NOT_COORDINATOR (at a stop
their connections are closed instead: coordinator.groups.membership ``disarm``) and forgets its timers."""

import functools

from coordinator.groups.membership import Membership
from coordinator.groups.messages import GroupConfig
from coordinator.groups.retention import RETENTION_KEY, RetentionPass
from coordinator.metrics import Metrics
from coordinator.shard import OpResult, Shard
from coordinator.shardlifecycle import ShardHooks
from coordinator.state import ShardData


class GroupHooks(ShardHooks):
    def __init__(self, shard: Shard, config: GroupConfig, metrics: Metrics) -> None:
        self.shard = shard
        self.config = config
        self.metrics = metrics
        self.membership = Membership(shard, config, metrics)
        self.retention = RetentionPass()

    def on_loaded(self, shard: Shard) -> None:
        self.membership.arm(shard.data)
        self.retention.reset()
        shard.schedule(RETENTION_KEY, self.config.offsets_retention_check_interval_ms, self._expire)

    def on_unloaded(self, shard: Shard) -> None:
        self.membership.disarm(shard.data, stopping=shard.closing)

    def _expire(self, data: ShardData) -> OpResult:
        """One step of a retention pass; the next step once this one's tombstones are durable (so steps
        never run ahead of the writer), or the next pass after the check interval. A step that fails
        abandons the pass, not retention: the next pass is still scheduled."""
        interval = self.config.offsets_retention_check_interval_ms
        try:
            result = self.retention.step(data, self.shard.clock.now_ms(), self.config.offsets_retention_ms)
        except Exception:
            self.retention.reset()
            self.shard.schedule(RETENTION_KEY, interval, self._expire)
            raise
        under_way = self.retention.under_way
        if not under_way:
            self.shard.schedule(RETENTION_KEY, interval, self._expire)
            if not result.response:
                return result
        # Counted once the tombstones are durable: counted before, a write that failed counted the same
        # offsets again at the next pass (an operator audit's find).
        return result._replace(on_durable=functools.partial(self._step_durable, result.response, under_way))

    def _step_durable(self, expired: int, under_way: bool) -> None:
        if expired:
            self.metrics.expired(self.shard.partition, expired)
        if under_way:
            # Keyed: should the shard have stopped serving meanwhile, its next load arms the timer afresh
            # (and a timer that fires on a shard that is not serving does nothing).
            self.shard.schedule(RETENTION_KEY, 0, self._expire)
