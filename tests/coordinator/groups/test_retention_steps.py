"""A retention pass runs in steps of about ``step_offsets`` offsets and at most ``step_records`` records
(so the shard appends each as one operation), the next once the previous one is durable, so a shard
holding a million offsets keeps answering while it is checked; together the steps expire exactly what
one operation over the whole shard would, and a partition found due is written only if it still is."""

from typing import cast

import pytest

from coordinator.groups.hooks import GroupHooks
from coordinator.groups.messages import GroupConfig
from coordinator.groups.retention import RetentionPass, expire_offsets
from coordinator.metrics import Metrics
from coordinator.shard import APPEND_SLICE, OpResult, Shard
from coordinator.state import ShardData
from protocol.records import GroupMetadataRecord, LiveRecord, OffsetAndMetadata, OffsetCommitRecord, OffsetKey
from tests.coordinator.groups.harness import T0, GroupShard
from tests.coordinator.groups.test_admin_and_retention import WEEK, simple_commit

INTERVAL = 600_000


class PartitionedShard(GroupShard):
    partition = 3


class CountedPass(RetentionPass):
    """Records each step's count of expired offsets."""

    def __init__(self, step_offsets: int) -> None:
        super().__init__(step_offsets)
        self.steps: list[int] = []

    def step(self, data: ShardData, now_ms: int, retention_ms: int) -> OpResult:
        result = super().step(data, now_ms, retention_ms)
        self.steps.append(cast(int, result.response))
        return result


def shard_with(groups: dict[str, int]) -> PartitionedShard:
    shard = PartitionedShard(GroupConfig(offsets_retention_ms=WEEK, offsets_retention_check_interval_ms=INTERVAL))
    for group, partitions in groups.items():
        simple_commit(shard, group, list(range(partitions)), at=T0)
    return shard


def keys(records: list[LiveRecord]) -> set[object]:
    return {r.key if isinstance(r, OffsetCommitRecord) else ("group", r.group) for r in records
            if isinstance(r, OffsetCommitRecord | GroupMetadataRecord)}


def apply(shard: GroupShard, result: OpResult) -> None:
    """As the shard does with a step's records: replayed and logged."""
    shard.data.replay_records(len(shard.log), result.records)
    shard.log.extend(result.records)


def run_pass(shard: GroupShard, retention: RetentionPass, now: int) -> list[OpResult]:
    steps = []
    while True:
        result = retention.step(shard.data, now, WEEK)
        apply(shard, result)
        steps.append(result)
        if not retention.under_way:
            return steps


def test_steps_take_whole_groups_up_to_the_budget_and_together_expire_what_one_pass_would() -> None:
    shard = shard_with({f"g{i:02d}": 100 for i in range(30)})
    whole = expire_offsets(shard.data, T0 + WEEK, WEEK)  # not applied
    steps = run_pass(shard, RetentionPass(step_offsets=500), T0 + WEEK)
    assert len(steps) == 6  # 5 groups of 100 offsets (+1 for the group) reach 500
    assert all(len(s.records) == 5 * 101 for s in steps)  # 5 x (100 offsets + the emptied group)
    merged = [r for s in steps for r in s.records]
    assert len(merged) == len(whole.records) == 30 * 101
    assert keys(merged) == keys(whole.records)
    assert sum(cast(int, s.response) for s in steps) == whole.response == 3000


def test_a_group_with_more_due_offsets_than_a_step_writes_is_finished_by_the_next_steps() -> None:
    shard = shard_with({"a": 10, "big": 2000, "c": 10})
    whole = expire_offsets(shard.data, T0 + WEEK, WEEK)  # not applied
    steps = run_pass(shard, RetentionPass(step_offsets=500), T0 + WEEK)
    # "a" (10 offsets and its group), then as much of "big" as fits in 1024 records; then the rest of
    # "big" with its group, and "c"
    assert [s.response for s in steps] == [10 + 1013, 987 + 10]
    assert [len(s.records) for s in steps] == [APPEND_SLICE, 988 + 11]
    merged = [r for s in steps for r in s.records]
    assert len(merged) == len(whole.records) and keys(merged) == keys(whole.records)
    assert shard.data.offsets == {} and shard.data.groups == {}


def test_an_offset_committed_between_steps_is_kept() -> None:
    """A step decides again whether each partition it had found due still is: a commit that lands
    between two steps is acknowledged, and no tombstone of the pass may take it back."""
    shard = shard_with({"big": 2000})
    retention = RetentionPass(step_offsets=500)
    first = retention.step(shard.data, T0 + WEEK, WEEK)
    apply(shard, first)
    assert first.response == APPEND_SLICE and retention.under_way
    simple_commit(shard, "big", [1999, 0], at=T0 + WEEK)  # 1999 was found due; 0 has just expired
    rest = run_pass(shard, retention, T0 + WEEK)
    assert sum(cast(int, s.response) for s in rest) == 2000 - APPEND_SLICE - 1
    for data in (shard.data, shard.reloaded()):
        assert data.committed("big", "t", 1999) == OffsetAndMetadata(2009, -1, "", T0 + WEEK, -1)
        assert data.committed("big", "t", 0) == OffsetAndMetadata(10, -1, "", T0 + WEEK, -1)
        assert "big" in data.groups and len(data.offsets["big"]) == 2


def test_a_step_that_fails_leaves_retention_scheduled() -> None:
    shard = shard_with({"g": 10})
    hooks = GroupHooks(cast(Shard, shard), shard.config, Metrics())

    class Failing(RetentionPass):
        def step(self, data: ShardData, now_ms: int, retention_ms: int) -> OpResult:
            raise RuntimeError("a bug")

    hooks.retention = Failing()
    hooks.on_loaded(cast(Shard, shard))
    with pytest.raises(RuntimeError):
        shard.advance(INTERVAL)  # the test shard runs timer operations without the shard's logging guard
    hooks.retention = RetentionPass()
    shard.advance(WEEK)
    assert shard.data.offsets == {}


def test_nothing_due_is_still_looked_at_in_steps_and_expires_nothing() -> None:
    shard = shard_with({f"g{i}": 100 for i in range(10)})
    steps = run_pass(shard, RetentionPass(step_offsets=300), T0 + WEEK - 1)
    assert len(steps) == 4 and all(s.records == [] and s.response == 0 for s in steps)


def test_a_group_deleted_during_a_pass_is_skipped_and_one_created_waits_for_the_next() -> None:
    shard = shard_with({f"g{i}": 100 for i in range(4)})
    retention = RetentionPass(step_offsets=150)
    first = retention.step(shard.data, T0 + WEEK, WEEK)
    apply(shard, first)
    assert first.response == 200 and retention.under_way  # g0, g1
    del shard.data.offsets["g2"]
    del shard.data.groups["g2"]
    simple_commit(shard, "g9", [0], at=T0)
    rest = run_pass(shard, retention, T0 + WEEK)
    assert [s.response for s in rest] == [100]  # g3 only
    assert OffsetKey("g9", "t", 0) not in keys([r for s in rest for r in s.records])
    assert [s.response for s in run_pass(shard, retention, T0 + WEEK)] == [1]  # the next pass: g9


def test_the_hooks_run_a_step_when_the_last_is_durable_then_wait_the_interval() -> None:
    shard = shard_with({f"g{i:02d}": 100 for i in range(25)})
    metrics = Metrics()
    hooks = GroupHooks(cast(Shard, shard), shard.config, metrics)
    counted = hooks.retention = CountedPass(step_offsets=1000)
    hooks.on_loaded(cast(Shard, shard))
    shard.advance(WEEK - INTERVAL // 2)  # the passes so far found nothing due, each in 3 steps
    passes = (WEEK - INTERVAL // 2) // INTERVAL
    assert counted.steps == [0, 0, 0] * passes and len(shard.data.offsets) == 25
    counted.steps.clear()
    shard.manual_clock.advance(INTERVAL)  # the next pass's first step...
    shard.manual_clock.advance(0)
    assert counted.steps == [1000]  # ...and no other until its tombstones are durable
    for _ in range(3):
        shard.flush()
        shard.manual_clock.advance(0)
    assert counted.steps == [1000, 1000, 500] and metrics.offsets_expired == 2500
    shard.flush()
    assert shard.data.offsets == {} and shard.data.groups == {}
    assert shard.reloaded().offsets == {}  # the tombstones went through the log
    shard.advance(INTERVAL)
    assert counted.steps == [1000, 1000, 500, 0]  # an empty shard: one step finds nothing


def test_expired_offsets_are_counted_once_their_tombstones_are_durable() -> None:
    """An operator audit's find: a step counted its offsets before its tombstones were written, so a write
    that failed counted them, and the pass after the reload (which finds them again) counted them twice."""
    metrics = Metrics()
    for outcome in ("failed", "durable"):
        shard = shard_with({"g": 10})
        hooks = GroupHooks(cast(Shard, shard), shard.config, metrics)
        hooks.on_loaded(cast(Shard, shard))
        shard.manual_clock.advance(WEEK)  # due: the step's tombstones are written, not yet durable
        assert len(shard.log) > 10 and metrics.offsets_expired == 0
        if outcome == "failed":
            shard.fail()
            assert metrics.offsets_expired == 0
        else:
            shard.flush()
            assert metrics.offsets_expired == 10


def test_a_reload_starts_a_fresh_pass() -> None:
    shard = shard_with({f"g{i}": 100 for i in range(5)})
    hooks = GroupHooks(cast(Shard, shard), shard.config, Metrics())
    hooks.retention.step_offsets = 150
    assert hooks.retention.step(shard.data, T0, WEEK).response == 0 and hooks.retention.under_way
    hooks.on_loaded(cast(Shard, shard))
    assert not hooks.retention.under_way
    data: ShardData = shard.data
    assert len(data.offsets) == 5
