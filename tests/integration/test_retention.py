"""Offset retention on a real server: offsets committed with an explicit retention (OffsetCommit v2)
expire through the shard's retention timer, in steps when a shard holds more offsets than one step
looks at, and offsets without one stay. The steps themselves are checked in
tests/coordinator/groups/test_retention_steps.py."""

import io
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka.protocol.consumer.group import OffsetCommitRequest

from coordinator.cli import dump_log
from coordinator.groups.retention import STEP_OFFSETS
from protocol.partitioning import partition_for
from tests.integration.test_metrics import scrape, value
from tests.kcoord_process import KcoordProcess
from tests.rawclient import CommitPartition, CommitTopic, RawClient, commit_request, fetch_request

SHARD = 7
PARTITIONS = 1000
GROUPS = STEP_OFFSETS * 5 // 2 // PARTITIONS  # 2.5 steps' worth of offsets on one shard


@pytest.fixture
def server(tmp_path: Path) -> Iterator[KcoordProcess]:
    proc = KcoordProcess(tmp_path / "data", "--offsets-retention-check-interval-ms", "200").start()
    yield proc
    if proc.proc is not None and proc.proc.poll() is None:
        proc.kill()


def groups_on_shard(count: int, prefix: str) -> list[str]:
    found: list[str] = []
    n = 0
    while len(found) < count:
        name = f"{prefix}-{n}"
        if partition_for(name, 50) == SHARD:
            found.append(name)
        n += 1
    return found


def committed(client: RawClient, group: str, partitions: int = PARTITIONS) -> set[int]:
    resp = client.call(fetch_request(group, {"t": list(range(partitions))}), 5)
    assert resp.error_code == 0
    return {p.committed_offset for t in resp.topics for p in t.partitions}


def test_offsets_with_a_retention_expire_in_steps_and_others_stay(server: KcoordProcess) -> None:
    client = RawClient(server.port)
    expiring = groups_on_shard(GROUPS, "expiring")
    for group in expiring:
        parts = [CommitPartition(partition_index=p, committed_offset=100 + p, committed_metadata="")
                 for p in range(PARTITIONS)]
        request = OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=-1, member_id="",
                                      retention_time_ms=1500, topics=[CommitTopic(name="t", partitions=parts)])
        resp = client.call(request, 2)
        assert {p.error_code for t in resp.topics for p in t.partitions} == {0}
    [keeper] = groups_on_shard(1, "keeper")
    resp = client.call(commit_request(keeper, {("t", p): 7 for p in range(PARTITIONS)}), 8)
    assert {p.error_code for t in resp.topics for p in t.partitions} == {0}
    assert committed(client, expiring[0]) == {100 + p for p in range(PARTITIONS)}

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(committed(client, g) != {-1} for g in expiring):
        time.sleep(0.2)
    assert all(committed(client, g) == {-1} for g in expiring)
    assert committed(client, keeper) == {7}
    assert value(scrape(server), "kcoord_offsets_expired_total") == GROUPS * PARTITIONS
    client.close()

    # The tombstones are durable: after a restart the expired offsets stay gone, the kept ones stay.
    server.stop()
    server.start()
    client = RawClient(server.port)
    assert committed(client, expiring[-1]) == {-1} and committed(client, keeper) == {7}
    client.close()


def _records_of(data_dir: Path, prefix: str) -> int | None:
    """Records (values and tombstones) of groups named ``prefix...`` in shard SHARD's log as it is on
    disk now, read as ``kcoord dump-log`` reads it; None when the cleaner swapped a segment meanwhile."""
    out = io.StringIO()
    try:
        dump_log(data_dir / f"__consumer_offsets-{SHARD}", out)
    except OSError:
        return None
    return sum(line.startswith((f"[{prefix}", prefix)) for line in out.getvalue().splitlines())


def test_expired_offsets_stay_gone_once_compaction_removed_them_and_after_kill_9(tmp_path: Path) -> None:
    """Retention racing segment rolls and the cleaner: offsets expire while other groups' commits roll
    16 KiB segments under them, the cleaner removes the expired records and then, past
    --delete-retention-ms, the tombstones themselves; a kill -9 and a restart bring none back, and the
    other groups keep their last acknowledged offsets."""
    data_dir = tmp_path / "data"
    proc = KcoordProcess(data_dir, "--segment-bytes", "16384", "--offsets-retention-check-interval-ms", "100",
                         "--delete-retention-ms", "200", "--log-cleaner-backoff-ms", "50").start()
    try:
        client = RawClient(proc.port)
        gone, kept = groups_on_shard(12, "gone"), groups_on_shard(3, "kept")
        for group in gone:
            parts = [CommitPartition(partition_index=p, committed_offset=500 + p, committed_metadata="e" * 400)
                     for p in range(10)]
            resp = client.call(OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=-1, member_id="",
                                                   retention_time_ms=700,
                                                   topics=[CommitTopic(name="t", partitions=parts)]), 2)
            assert {p.error_code for t in resp.topics for p in t.partitions} == {0}
        rounds, expired_seen, cleaned = 0, False, False
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not cleaned:
            rounds += 1
            for group in kept:  # ~4.4 KB a commit: a segment rolls every few
                resp = client.call(commit_request(group, {("t", p): rounds for p in range(10)}, metadata="k" * 400), 8)
                assert {p.error_code for t in resp.topics for p in t.partitions} == {0}
            if not expired_seen:
                expired_seen = all(committed(client, g, 10) == {-1} for g in gone)
            elif rounds % 5 == 0:
                cleaned = _records_of(data_dir, "gone") == 0
        assert expired_seen, "the offsets never expired"
        assert cleaned, "the cleaner never removed the expired offsets' records and tombstones"
        assert len(list((data_dir / f"__consumer_offsets-{SHARD}").glob("*.log"))) > 1
        client.close()

        proc.kill()
        proc.start()
        client = RawClient(proc.port)
        assert all(committed(client, g, 10) == {-1} for g in gone)
        assert all(committed(client, g, 10) == {rounds} for g in kept)
        client.close()
        assert " ERROR " not in proc.log()
    finally:
        if proc.proc is not None and proc.proc.poll() is None:
            proc.kill()
