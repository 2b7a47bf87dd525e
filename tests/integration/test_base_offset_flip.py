"""A flipped bit in a batch's base offset (which the batch CRC does not cover) in a synced tail past the
recovery point: the batch reads as valid at an offset far past where the log must reach, and the batch
after it then read as "below expected", which recovery took for a torn tail: cut aside with a WARNING,
the acknowledged commits in it lost, the partition served. A jump over what the log must reach (the
journal's run, the synced end its last checkpoint recorded, a failed partition's copies) is damage
(a fault campaign's find: only the journal's run was checked)."""

import time
from pathlib import Path

from protocol.errors import ErrorCode
from storage.journal import left_over
from storage.segments import list_segments
from tests.integration.test_journal_gap import batch_positions, commit, committed, synced_then_journaled
from tests.kcoord_process import KcoordProcess
from tests.rawclient import RawClient


def flip_base_offset(segment: Path, index: int) -> None:
    """Adds 2**36 to the base offset of the segment's ``index``th batch."""
    _, position, _ = batch_positions(segment)[index]
    raw = bytearray(segment.read_bytes())
    raw[position + 3] ^= 0x10
    segment.write_bytes(bytes(raw))


def test_a_base_offset_flipped_in_the_synced_tail_of_an_idle_partition_fails_it(tmp_path: Path) -> None:
    server = KcoordProcess(tmp_path / "data", "--offsets-partitions", "1").start()
    client = RawClient(server.port)
    for offset in range(1, 6):
        commit(client, offset)
    time.sleep(1.5)  # checkpoints every 250 ms: the journal lets go; a recovery point at most every 30 s
    server.kill()
    client.close()
    assert left_over(server.data_dir) == 0
    segment = list_segments(server.data_dir / "__consumer_offsets-0")[-1].path
    flip_base_offset(segment, 2)  # the commit of offset 3; those of 4 and 5 follow it
    server.start()
    try:
        error, offset = committed(server)
        said = server.log_since_start()
        assert error == ErrorCode.NOT_COORDINATOR, f"served offset {offset} (acknowledged: 5)\n{said}"
    finally:
        server.stop()


def test_a_base_offset_flipped_below_a_failed_partitions_journal_copy_keeps_it_failed(tmp_path: Path) -> None:
    server = synced_then_journaled(tmp_path)  # 1-5 synced, 6-8 in the journal
    segment = list_segments(server.data_dir / "__consumer_offsets-0")[-1].path
    flip_base_offset(segment, 2)
    server.start()
    try:
        assert committed(server)[0] == ErrorCode.NOT_COORDINATOR  # the journal's run catches it
        time.sleep(1.0)  # a checkpoint: the journal lets the failed partition go (its copy is kept)
    finally:
        assert server.stop() == 0
    assert [p.name for p in segment.parent.glob("journal-*.tr")] == ["journal-batches.0.tr"]
    server.start()
    try:
        error, offset = committed(server)
        said = server.log_since_start()
        assert error == ErrorCode.NOT_COORDINATOR, f"served offset {offset} (acknowledged: 8)\n{said}"
    finally:
        server.stop()
