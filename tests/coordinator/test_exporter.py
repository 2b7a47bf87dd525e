"""The metrics collector over a real Runtime: ``kcoord_groups`` reads the per-state counts the shards keep
(never walking the groups: at 200k groups a walk held the GIL for 120-600 ms per scrape beside the event
loop) and still equals a walk of the serving partitions' groups, across a partition failing and reloading."""

from collections import Counter
from pathlib import Path
from typing import Any

from prometheus_client.core import Metric

from coordinator.exporter import LOADED, Health, KcoordCollector
from coordinator.groups.model import GroupState
from coordinator.runtime import Runtime
from coordinator.shardstate import ShardState
from coordinator.state import ShardData
from protocol.errors import ErrorCode
from protocol.records import GroupMetadata, GroupMetadataRecord, LiveRecord, MemberMetadata
from tests.coordinator.harness import OK, Faults, append, commit, config, started, stop, wait_state

MEMBER = MemberMetadata("m", None, "c", "/127.0.0.1", 1000, 1000, b"", b"")


def scraped_groups(runtime: Runtime) -> dict[str, float]:
    collector = KcoordCollector(runtime, None, Health(runtime, None), "test", "asyncio")
    family: Metric = next(f for f in collector.collect() if f.name == "kcoord_groups")
    return {s.labels["state"]: s.value for s in family.samples}


def walked(runtime: Runtime) -> dict[str, float]:
    """What the collector computed before the counts were kept: a walk of every serving shard's groups."""
    counts = Counter({s.value: 0.0 for s in GroupState})
    for shard in runtime.shards:
        if shard.state in LOADED:
            counts.update(g.state.value for g in shard.data.groups.values())
    return dict(counts)


def stable(group: str) -> GroupMetadataRecord:
    """A group with a member, as replay (live here, or loading) brings it: Stable."""
    return GroupMetadataRecord(group, GroupMetadata("consumer", 1, "range", "m", 1, (MEMBER,)))


async def test_scraped_group_states_equal_a_walk_across_a_failed_partition_and_its_reload(tmp_path: Path) -> None:
    faults = Faults()
    runtime = await started(config(tmp_path, partitions=2), faults.factory)
    first, second = runtime.shards
    assert await append(first, [commit("simple", 0, 1), stable("busy"), stable("quiet")]) == OK
    assert await append(second, [commit("other", 0, 1)]) == OK
    first.data.groups["busy"].transition(GroupState.PREPARING_REBALANCE, 1)  # membership's soft state
    assert scraped_groups(runtime) == walked(runtime)
    assert scraped_groups(runtime) == {"Empty": 2, "PreparingRebalance": 1, "CompletingRebalance": 0, "Stable": 1,
                                       "Dead": 0}
    assert await append(first, [GroupMetadataRecord("quiet", None)]) == OK  # deleted
    faults.fail_next_sync = True  # a group created, then lost with the write: the partition fails and reloads
    assert await append(first, [commit("lost", 0, 1)]) == ErrorCode.NOT_COORDINATOR
    assert scraped_groups(runtime) == walked(runtime)  # failed or loading: its groups are not counted
    await wait_state(first, ShardState.ACTIVE)
    # Reloaded from the log: "lost" was cut, "busy" is Stable again (its rebalance was soft state).
    assert scraped_groups(runtime) == walked(runtime)
    assert scraped_groups(runtime) == {"Empty": 2, "PreparingRebalance": 0, "CompletingRebalance": 0, "Stable": 1,
                                       "Dead": 0}
    await stop(runtime)
    restarted = await started(config(tmp_path, partitions=2))
    assert scraped_groups(restarted) == walked(restarted)
    assert scraped_groups(restarted)["Empty"] == 2 and scraped_groups(restarted)["Stable"] == 1
    await stop(restarted)


class NoWalk(dict[str, Any]):
    """A shard's groups that fail any walk (a lookup by id is fine)."""

    def _walked(self, *args: Any) -> Any:
        raise AssertionError("a scrape walked the groups")

    __iter__ = values = keys = items = _walked


async def test_a_scrape_reads_kept_counts_without_walking_the_groups(tmp_path: Path) -> None:
    runtime = await started(config(tmp_path))
    shard = runtime.shards[0]
    records: list[LiveRecord] = [commit(f"g{i}", 0, 1) for i in range(3)]
    assert await append(shard, [*records, stable("s")]) == OK
    data: ShardData = shard.data
    groups, data.groups = data.groups, NoWalk(data.groups)
    assert scraped_groups(runtime) == {"Empty": 3, "PreparingRebalance": 0, "CompletingRebalance": 0, "Stable": 1,
                                       "Dead": 0}
    data.groups = groups
    await stop(runtime)
