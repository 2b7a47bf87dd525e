"""Durability over the wire: no acknowledged commit is lost to ``kill -9``, and a big partition answers
COORDINATOR_LOAD_IN_PROGRESS while it loads, then the right offsets, while small ones already serve."""

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin import ListGroupsRequest

from protocol.errors import ErrorCode
from protocol.partitioning import partition_for
from protocol.records import OffsetAndMetadata, OffsetCommitRecord, OffsetKey, encode_record
from storage.batchwriter import build_batch
from storage.log import PartitionLog
from tests.kcoord_process import KcoordProcess
from tests.rawclient import RawClient, commit_request, fetch_request

GROUPS = [f"durable-{i}" for i in range(8)]


def pipelined_commits_then_kill(kcoord: KcoordProcess, total: int) -> dict[str, int]:
    """Pipelines ``total`` commits over GROUPS (partition 0 of topic t), kills the server once a third
    of them are answered (answers must come in request order); returns the highest acknowledged
    offset of each group."""
    client = RawClient(kcoord.port)
    frames = []
    expected: dict[int, tuple[str, int]] = {}  # correlation id -> (group, offset)
    for i in range(total):
        group = GROUPS[i % len(GROUPS)]
        correlation, frame = client.encode(commit_request(group, {("t", 0): i}), 8)
        frames.append(frame)
        expected[correlation] = (group, i)

    def send_all() -> None:
        for f in frames:
            client.sock.sendall(f)

    sender = threading.Thread(target=send_all, daemon=True)
    sender.start()
    acked: dict[str, int] = {}
    last_correlation = 0
    try:
        while last_correlation < total // 3:
            correlation, response = client.receive(8, 8)
            assert correlation == last_correlation + 1, "responses out of request order"
            last_correlation = correlation
            if response.topics[0].partitions[0].error_code == 0:
                group, offset = expected[correlation]
                acked[group] = max(acked.get(group, -1), offset)
    finally:
        kcoord.kill()
        client.close()
    assert last_correlation < total, "the kill came too late to interrupt the pipeline"
    return acked


def test_kill_9_during_pipelined_commits_loses_no_acknowledged_commit(kcoord: KcoordProcess) -> None:
    acked = pipelined_commits_then_kill(kcoord, 3000)
    kcoord.start()
    reader = RawClient(kcoord.port)
    for group, offset in acked.items():
        response = _fetch_when_loaded(reader, group)
        got = response.topics[0].partitions[0].committed_offset
        assert got >= offset, f"{group}: acknowledged offset {offset} lost, log has {got}"
    reader.close()


def _fetch_when_loaded(client: RawClient, group: str, partitions: dict[str, list[int]] | None = None) -> Any:
    deadline = time.monotonic() + 120
    while True:
        response = client.call(fetch_request(group, partitions or {"t": [0]}), 7)
        if response.error_code != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
            assert response.error_code == 0
            return response
        assert time.monotonic() < deadline, "partition never finished loading"
        time.sleep(0.05)


def _write_big_partition(data_dir: Path, group: str, keys: int) -> int:
    """Writes ``keys`` distinct offsets for ``group`` straight into its partition's log, as a
    previous kcoord (or Kafka) would have; returns the partition."""
    partition = partition_for(group, 50)
    plog = PartitionLog(data_dir / f"__consumer_offsets-{partition}")
    offset = 0
    per_batch = 2000
    for start in range(0, keys, per_batch):
        entries = []
        for i in range(start, min(start + per_batch, keys)):
            key = OffsetKey(group, f"topic-{i // 1000}", i % 1000)
            entries.append(encode_record(OffsetCommitRecord(key, OffsetAndMetadata(i * 7, -1, "", 1))))
        plog.append(build_batch(offset, entries, 1_700_000_000_000), offset + len(entries) - 1)
        offset += len(entries)
    plog.sync()
    plog.checkpoint()
    plog.close()
    return partition


@pytest.mark.slow
def test_big_partition_loads_while_others_serve(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    big, small = "big-group", "small-group"
    assert partition_for(big, 50) != partition_for(small, 50)
    _write_big_partition(data_dir, big, 1_000_000)
    server = KcoordProcess(data_dir).start(loaded=False)
    try:
        client = RawClient(server.port, timeout=60)  # the fetch-all below builds a 1M-partition answer
        first = client.call(fetch_request(big, {"topic-0": [0]}), 7)
        assert first.error_code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        # Another partition serves while the big one loads. Like a client, retry 14 until the small
        # partition (loaded before the big one: smallest logs load first) is ready; no sleep-based timing.
        while True:
            small_commit = client.call(commit_request(small, {("t", 0): 5}), 8)
            if small_commit.topics[0].partitions[0].error_code != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
                break
        assert small_commit.topics[0].partitions[0].error_code == 0
        still_loading = client.call(fetch_request(big, {"topic-0": [0]}), 7)
        assert still_loading.error_code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        # ListGroups while a partition loads: the error and no group, as Kafka's coordinator answers (it
        # listed the small partition's group with the error, as the old coordinator did).
        listed = client.call(ListGroupsRequest(states_filter=[]), 4)
        answer = (listed.error_code, sorted(g.group_id for g in listed.groups))
        assert answer in ((ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, []), (ErrorCode.NONE, sorted([small, big])))
        # v1 has no group error field: every requested partition carries it.
        v1 = client.call(fetch_request(big, {"topic-0": [0, 1]}), 1)
        assert [p.error_code for p in v1.topics[0].partitions] in ([14, 14], [0, 0])

        loaded = _fetch_when_loaded(client, big, {"topic-0": [0, 1], "topic-999": [999], "topic-7": [1000]})
        got = {(t.name, p.partition_index): p.committed_offset for t in loaded.topics for p in t.partitions}
        assert got == {("topic-0", 0): 0, ("topic-0", 1): 7, ("topic-999", 999): 999_999 * 7, ("topic-7", 1000): -1}
        everything = client.call(fetch_request(big, None), 7)
        assert sum(len(t.partitions) for t in everything.topics) == 1_000_000
        client.close()
    finally:
        server.kill()
    assert "loaded 1000000 records" in server.log()
