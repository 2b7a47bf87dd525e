"""``--sync-mode journal`` in a real Runtime (real files, threads and syncs): commits are acknowledged
once the journal is synced, the logs catch up at checkpoints, and every failure of the journal or of a
checkpoint fails what it must and loses nothing acknowledged."""

import asyncio
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

import coordinator.checkpointer
from coordinator.config import Config
from coordinator.runtime import ConfigMismatch, Runtime
from coordinator.shardstate import ShardState
from protocol.errors import ErrorCode
from protocol.records import OffsetAndMetadata
from storage.log import RECOVERY_POINT
from tests.coordinator.harness import OK, Faults, append, commit, config, stop, wait_state

HOUR_MS = 3_600_000  # no checkpoint unless the test runs one


def journal_config(data_dir: Path, partitions: int = 1, **kw: Any) -> Config:
    kw.setdefault("checkpoint_interval_ms", HOUR_MS)
    return config(data_dir, partitions, sync_mode="journal", **kw)


async def started(cfg: Config, faults: Faults | None = None) -> Runtime:
    runtime = Runtime(cfg, log_factory=faults.factory, journal_factory=faults.journal) if faults else Runtime(cfg)
    runtime.start()
    await runtime.wait_loaded()
    return runtime


def segments(data_dir: Path) -> list[str]:
    return sorted(p.name for p in (data_dir / "journal").glob("*.journal"))


def committed(runtime: Runtime, group: str = "g", partition: int = 0) -> OffsetAndMetadata | None:
    return runtime.shard_for(group).data.committed(group, "t", partition)


async def committed_at_a_start(cfg: Config) -> OffsetAndMetadata | None:
    """What a fresh start on ``cfg`` serves (``committed``), stopped again before it returns."""
    runtime = await started(cfg)
    try:
        return committed(runtime)
    finally:
        await stop(runtime)


async def test_commits_are_acknowledged_from_the_journal_and_the_logs_catch_up_at_a_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coordinator.checkpointer, "CLAIM_INTERVAL_S", 0.0)
    runtime = await started(journal_config(tmp_path))
    shard = runtime.shards[0]
    for i in range(5):
        assert await append(shard, [commit("g", 0, i)]) == OK
    plog = shard.log
    assert plog.durable_offset == 5 and plog.synced_offset == 0  # acknowledged: in the journal only
    assert runtime.journal is not None and runtime.journal.live_size > 0
    assert runtime.checkpointer is not None and await runtime.checkpointer.checkpoint()
    assert plog.synced_offset == 5
    assert runtime.journal.live_size == 0 and runtime.journal.retained == 1  # the older segment is gone
    assert len(segments(tmp_path)) == 2  # the live one, and the next one made ahead
    runtime.checkpointer._sync.wait_recorded(5)
    assert (plog.directory / RECOVERY_POINT).read_text().split() == ["0", str(plog.end()[2])]
    await stop(runtime)


async def test_a_clean_stop_leaves_nothing_to_replay(tmp_path: Path) -> None:
    runtime = await started(journal_config(tmp_path))
    assert await append(runtime.shards[0], [commit("g", 0, 7)]) == OK
    await stop(runtime)
    assert segments(tmp_path) == []  # every log synced at close: the journal held nothing they lack
    again = await started(journal_config(tmp_path))
    assert again.journal is not None and again.journal.unapplied == set()
    assert committed(again) == OffsetAndMetadata(7, -1, "m", 1)
    await stop(again)


async def test_another_sync_mode_refuses_a_journal_left_by_a_crash(tmp_path: Path) -> None:
    """A fault campaign's find: after a crash in journal mode, a start in syncfs mode ignored the journal
    (a power cut could have left acknowledged commits only there), and a later start in journal mode
    wrote those old batches over the logs, taking back every commit made in between."""
    data = tmp_path / "d"
    runtime = await started(journal_config(data))
    assert await append(runtime.shards[0], [commit("g", 0, 7)]) == OK
    crashed = tmp_path / "crashed"
    shutil.copytree(data, crashed)  # kill -9: the journal holds commit 7
    await stop(runtime)
    for mode in ("syncfs", "fsync"):
        other = Runtime(config(crashed, sync_mode=mode))
        with pytest.raises(ConfigMismatch, match="start once with --sync-mode journal"):
            other.open()
    again = await started(journal_config(crashed))  # applied, and a clean stop leaves no journal
    await stop(again)
    switched = await started(config(crashed))
    assert committed(switched) == OffsetAndMetadata(7, -1, "m", 1)
    assert await append(switched.shards[0], [commit("g", 0, 8)]) == OK
    await stop(switched)
    assert await committed_at_a_start(journal_config(crashed)) == OffsetAndMetadata(8, -1, "m", 1)


async def test_a_failed_journal_sync_fails_the_commit_and_it_is_not_replayed(tmp_path: Path) -> None:
    faults = Faults()
    runtime = await started(journal_config(tmp_path, sync_helper=False), faults)
    shard = runtime.shards[0]
    assert await append(shard, [commit("g", 0, 1)]) == OK
    faults.fail_next_sync = True
    assert await append(shard, [commit("g", 0, 2)]) == ErrorCode.NOT_COORDINATOR
    await wait_state(shard, ShardState.ACTIVE)
    assert committed(runtime) == OffsetAndMetadata(1, -1, "m", 1)  # reloaded without it
    assert await append(shard, [commit("g", 0, 3)]) == OK
    assert len(segments(tmp_path)) == 2  # the segment whose sync failed is never written again
    await stop(runtime)
    assert await committed_at_a_start(journal_config(tmp_path)) == OffsetAndMetadata(3, -1, "m", 1)


async def test_a_failed_journal_write_fails_the_commit_and_the_next_one_succeeds(tmp_path: Path) -> None:
    faults = Faults()
    runtime = await started(journal_config(tmp_path, partitions=2), faults)
    assert await append(runtime.shards[0], [commit("a", 0, 1)]) == OK
    faults.fail_next_journal_write = True
    results = [append(runtime.shards[p], [commit(f"g{p}", 0, 2)]) for p in range(2)]
    assert [await r for r in results] == [ErrorCode.NOT_COORDINATOR] * 2  # one write, one cycle: both fail
    for shard in runtime.shards:
        await wait_state(shard, ShardState.ACTIVE)
        assert await append(shard, [commit("b", 0, 3)]) == OK
    await stop(runtime)
    again = await started(journal_config(tmp_path, partitions=2))
    assert again.shards[0].data.committed("a", "t", 0) == OffsetAndMetadata(1, -1, "m", 1)
    assert all(s.data.committed("b", "t", 0) == OffsetAndMetadata(3, -1, "m", 1) for s in again.shards)
    await stop(again)


async def test_a_failed_checkpoint_reloads_every_partition_and_keeps_the_journal_until_they_have(
        tmp_path: Path) -> None:
    faults = Faults()
    runtime = await started(journal_config(tmp_path, partitions=2), faults)
    for p in range(2):
        assert await append(runtime.shards[p], [commit(f"g{p}", 0, 10 + p)]) == OK
    faults.fail_next_checkpoint = True
    assert runtime.checkpointer is not None and not await runtime.checkpointer.checkpoint()
    for p, shard in enumerate(runtime.shards):
        await wait_state(shard, ShardState.ACTIVE)
        assert shard.data.committed(f"g{p}", "t", 0) == OffsetAndMetadata(10 + p, -1, "m", 1)
        assert shard.log.synced_offset == shard.log.durable_offset  # rewritten from the journal and fsynced
    assert runtime.journal is not None and runtime.journal.retained == 2  # kept: the checkpoint deleted nothing
    assert await runtime.checkpointer.checkpoint()
    assert runtime.journal.retained == 1  # every partition has recovered from them since
    await stop(runtime)


async def test_compaction_only_touches_what_a_checkpoint_synced(tmp_path: Path) -> None:
    runtime = await started(journal_config(tmp_path, segment_bytes=1024))
    shard = runtime.shards[0]
    for i in range(60):
        assert await append(shard, [commit("g", 0, i)]) == OK
    compactor = runtime.compactors[0]
    assert len(shard.log.segments) > 3
    assert await compactor.compact(0) is None  # nothing is synced in the log itself yet
    assert runtime.checkpointer is not None and await runtime.checkpointer.checkpoint()
    after = await compactor.compact(0)
    assert after is not None and after.segments_after < after.segments_before
    assert committed(runtime) == OffsetAndMetadata(59, -1, "m", 1)
    await stop(runtime)
    assert await committed_at_a_start(journal_config(tmp_path, segment_bytes=1024)) == OffsetAndMetadata(59, -1, "m", 1)


async def test_an_idle_server_reports_its_checkpoints_as_current(tmp_path: Path) -> None:
    """Nothing journaled since the last checkpoint: the logs hold everything, and
    kcoord_checkpoint_age_seconds (KcoordCheckpointsStalled) must not grow on an idle server."""
    runtime = await started(journal_config(tmp_path, checkpoint_interval_ms=20))
    assert runtime.checkpointer is not None
    await asyncio.sleep(0.5)
    assert time.monotonic() - runtime.checkpointer.synced_at < 0.3
    assert runtime.checkpointer.completed == 0  # and it made none: there was nothing to sync
    await stop(runtime)
