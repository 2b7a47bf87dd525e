"""Damage in acknowledged batches a checkpoint synced into the log and deleted from the journal, but past
the recovery point (recorded at most every 30 s): the journal's run for the partition starts after
them, so the log lacks acknowledged batches and the partition fails loudly. A fault campaign found
that recovery first cut the damage aside (the log then ended short), and that the failure did not
outlast the journal: once its segments were gone (a checkpoint, a clean stop), a restart served the
short log, offsets older than acknowledged, with no error."""

import struct
import time
from pathlib import Path

import pytest

from protocol.errors import ErrorCode
from storage.journal import left_over
from storage.segments import list_segments
from tests.kcoord_process import KcoordProcess
from tests.rawclient import RawClient, commit_request, fetch_request


def committed(server: KcoordProcess) -> tuple[int, int]:
    client = RawClient(server.port)
    reply = client.call(fetch_request("g", {"t": [0]}), 5)
    client.close()
    offset = reply.topics[0].partitions[0].committed_offset if reply.topics else -1
    return reply.error_code, offset


def commit(client: RawClient, offset: int) -> None:
    assert client.call(commit_request("g", {("t", 0): offset}), 8).topics[0].partitions[0].error_code == 0


def batch_positions(segment: Path) -> list[tuple[int, int, int]]:
    """(base offset, byte position, size) of each batch."""
    data = segment.read_bytes()
    out, pos = [], 0
    while pos + 12 <= len(data):
        base, length = struct.unpack(">qi", data[pos:pos + 12])
        out.append((base, pos, 12 + length))
        pos += 12 + length
    return out


def synced_then_journaled(tmp_path: Path) -> KcoordProcess:
    """Offsets 1-5 committed, one batch each, and checkpointed (in the log only); 6-8 committed and
    still in the journal when kcoord is killed. Nothing past the recovery point its start recorded."""
    for attempt in range(5):
        server = KcoordProcess(tmp_path / f"data{attempt}", "--offsets-partitions", "1").start()
        client = RawClient(server.port)
        for offset in range(1, 6):
            commit(client, offset)
        time.sleep(1.5)  # checkpoints every 250 ms; a recovery point at most every 30 s
        for offset in range(6, 9):
            commit(client, offset)
        server.kill()
        client.close()
        if left_over(server.data_dir):  # else a checkpoint came between the last commit and the kill
            return server
    raise AssertionError("no kill -9 left the last commits in the journal")


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_acknowledged_batches_the_journal_no_longer_holds_fail_the_partition_at_every_start(
        tmp_path: Path, damage: str) -> None:
    server = synced_then_journaled(tmp_path)
    directory = server.data_dir / "__consumer_offsets-0"
    segment = list_segments(directory)[-1].path
    batches = batch_positions(segment)
    _, position, size = next(b for b in batches if b[0] == 2)  # commit of offset 3 (log offsets from 0)
    raw = bytearray(segment.read_bytes())
    if damage == "flip":
        raw[position + size // 2] ^= 0xFF
    else:
        del raw[position + size // 2:]
    segment.write_bytes(bytes(raw))
    server.start()
    try:
        assert committed(server)[0] == ErrorCode.NOT_COORDINATOR
        assert "partition 0: FAILED to load" in server.log_since_start()
    finally:
        assert server.stop() == 0
    # the failing recovery left the log as it found it: the damaged batch and those after it
    assert segment.read_bytes() == bytes(raw)
    # Once its journal no longer holds the batches (a checkpoint deletes them: the partition is abandoned),
    # the failure must outlast it: no start serves offset 2 for offset 8.
    starts_without_journal = 0
    for _ in range(4):
        starts_without_journal += left_over(server.data_dir) == 0
        server.start()
        try:
            time.sleep(0.6)  # a few checkpoints
            assert committed(server)[0] == ErrorCode.NOT_COORDINATOR
            assert "journal-batches.0.tr" in server.log_since_start()
        finally:
            server.kill()
    assert starts_without_journal >= 2


def test_a_base_offset_changed_below_the_recovery_point_fails_the_partition_instead_of_taking_the_journals_run(
        tmp_path: Path) -> None:
    """A batch's base offset is not under its CRC: one changed (here to ~2^40) below the recovery point
    read as a valid batch past the journal's first offset, so recovery took it for the place of the
    journal's run and replaced it and every batch after it (acknowledged, below the recovery point) by
    the run, with warnings only: group a's offsets were gone. A fault campaign's find (pure Python)."""
    server = KcoordProcess(tmp_path / "data", "--offsets-partitions", "1").start()
    client = RawClient(server.port)
    for offset in range(1, 6):
        assert client.call(commit_request("a", {("t", 0): offset}), 8).topics[0].partitions[0].error_code == 0
    client.close()
    assert server.stop() == 0  # the recovery point covers all of a's commits
    server.extra += ["--checkpoint-interval-ms", "60000"]  # b's commits stay in the journal: a run longer
    server.start()                                            # than the log the recovery point claims
    client = RawClient(server.port)
    for offset in range(1, 10):
        assert client.call(commit_request("b", {("t", 0): offset}), 8).topics[0].partitions[0].error_code == 0
    server.kill()
    client.close()
    assert left_over(server.data_dir)
    directory = server.data_dir / "__consumer_offsets-0"
    segment = list_segments(directory)[-1].path
    _, position, _ = batch_positions(segment)[1]
    raw = bytearray(segment.read_bytes())
    raw[position + 3] ^= 0xFF  # base offset + 0xFF << 32
    segment.write_bytes(bytes(raw))
    server.start()
    try:
        client = RawClient(server.port)
        reply = client.call(fetch_request("a", {"t": [0]}), 5)
        client.close()
        assert reply.error_code == ErrorCode.NOT_COORDINATOR, reply
        assert "partition 0: FAILED to load" in server.log_since_start()
    finally:
        server.stop()
    assert segment.read_bytes() == bytes(raw) and list(directory.glob("*.log.*.tr")) == []


def test_damage_in_a_synced_tail_of_a_partition_idle_since_its_last_checkpoint_fails_it_at_every_start(
        tmp_path: Path) -> None:
    """Acknowledged commits a checkpoint synced into the log and deleted from the journal, the partition
    idle since: nothing of it is left in the journal to start a run, and its recovery point (recorded at
    most every 30 s) is older. A fault campaign flipped a byte there: the restart cut the batch aside as a
    torn tail and served the commit before it, with a WARNING. The journal's synced-ends entry holds the
    log to them, and so does the file kept beside the log once the partition fails (a clean stop removes
    the journal)."""
    server = KcoordProcess(tmp_path / "data", "--offsets-partitions", "1").start()
    client = RawClient(server.port)
    for offset in range(1, 6):
        commit(client, offset)
    time.sleep(1.5)  # checkpoints every 250 ms; a recovery point at most every 30 s
    server.kill()
    client.close()
    assert left_over(server.data_dir) == 0
    segment = list_segments(server.data_dir / "__consumer_offsets-0")[-1].path
    _, position, size = batch_positions(segment)[-1]  # the commit of offset 5
    raw = bytearray(segment.read_bytes())
    raw[position + size // 2] ^= 0xFF
    segment.write_bytes(bytes(raw))
    for start in range(3):
        server.start()
        try:
            assert committed(server)[0] == ErrorCode.NOT_COORDINATOR
            said = server.log_since_start()
            assert "partition 0: FAILED to load" in said and "acknowledged" in said
            if start:
                assert "journal-synced-end.0.tr" in said
        finally:
            assert server.stop() == 0
    assert segment.read_bytes() == bytes(raw)
    assert [p.name for p in segment.parent.glob("journal-*.tr")] == ["journal-synced-end.0.tr"]


def test_removing_the_synced_end_copy_accepts_the_loss_even_after_a_start_that_stopped_at_once(
        tmp_path: Path) -> None:
    """A start that fails the partition and stops before its first checkpoint kept the crash's journal
    (a failed partition keeps it at a clean stop) and its synced-ends entry: removing the copy beside
    the log did not let the next start load it, which failed it again from the journal and wrote the
    copy again (a fault campaign's find). The stop now writes an entry without the failed partition."""
    server = KcoordProcess(tmp_path / "data", "--offsets-partitions", "1").start()
    client = RawClient(server.port)
    for offset in range(1, 6):
        commit(client, offset)
    time.sleep(1.5)
    server.kill()
    client.close()
    segment = list_segments(server.data_dir / "__consumer_offsets-0")[-1].path
    _, position, size = batch_positions(segment)[-1]
    raw = bytearray(segment.read_bytes())
    raw[position + size // 2] ^= 0xFF
    segment.write_bytes(bytes(raw))
    server.extra += ["--checkpoint-interval-ms", "60000"]  # no checkpoint before the stop
    server.start()
    try:
        assert committed(server)[0] == ErrorCode.NOT_COORDINATOR
    finally:
        assert server.stop() == 0
    copy = segment.parent / "journal-synced-end.0.tr"
    copy.unlink()  # the operator accepts the loss of offset 5
    server.start()
    try:
        assert committed(server) == (ErrorCode.NONE, 4)
    finally:
        assert server.stop() == 0
