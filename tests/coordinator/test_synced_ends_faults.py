"""The synced-ends entry (storage.journal ``write_synced_ends``) around failed partitions, clean stops and
the checkpointer's own failures: a failed partition's claim must not outlive its
``journal-synced-end.<n>.tr`` copy in the journal (removing the copy accepts the loss, as README says),
nor may a checkpoint or a stop lose the entry while it is the only record of a synced tail. A second
review of the entry found each; every test failed before its fix."""

import asyncio
import errno
import shutil
from pathlib import Path

import pytest

import storage.journal
from coordinator.compaction import _journal_holds
from coordinator.shard import Shard
from coordinator.shardstate import ShardState
from storage.journalentries import SYNCED_ENDS, read_entries, unpack_synced_ends
from storage.log import PartitionLog
from tests.coordinator.harness import OK, Faults, append, commit, stop, wait_state
from tests.coordinator.test_journal_mode import journal_config, started


def newest_entry(data: Path) -> dict[int, int]:
    """The synced ends a start would take: the newest entry of the newest segment holding one."""
    ends: dict[int, int] = {}
    for path in sorted((data / "journal").glob("*.journal")):
        for partition, body, _ in read_entries(path):
            if partition == SYNCED_ENDS:
                ends = unpack_synced_ends(body)
    return ends


async def wait_for(path: Path) -> None:
    for _ in range(500):
        if path.exists():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{path} never written")


async def partition_0_fails_and_1_goes_on(data: Path) -> tuple[ShardState, int, int]:
    """A start on ``data`` (two partitions), then three commits to partition 1, each checkpointed: partition
    0's state after it, how far partition 1's log counts as synced, and how many journal segments are kept."""
    runtime = await started(journal_config(data, partitions=2))
    assert runtime.checkpointer is not None and runtime.journal is not None
    failing, other = runtime.shards
    for offset in (1, 2, 3):
        assert await append(other, [commit("h", 1, offset)]) == OK
        assert await runtime.checkpointer.checkpoint()
    state, synced, retained = failing.state, other.log.synced_offset, runtime.journal.retained
    await stop(runtime)
    return state, synced, retained


async def test_a_partition_failing_on_an_idle_server_keeps_its_claim_in_the_journal(tmp_path: Path) -> None:
    """The periodic checkpoints (not the test) are all there is: on an idle server none is due after the
    partition fails (nothing journaled, one segment, no log behind), so the live segment's newest entry,
    written before the failure, keeps the failed partition's claim. A clean stop keeps the journal (a
    partition not recovered), and once the operator removes the copy the next start fails the partition
    again from the journal's claim, and writes the copy again."""
    faults = Faults()
    data = tmp_path / "d"
    runtime = await started(journal_config(data, partitions=2, checkpoint_interval_ms=50), faults)
    failing, other = runtime.shards
    for offset in (1, 2, 3):
        assert await append(failing, [commit("g", 0, offset)]) == OK
    assert await append(other, [commit("h", 0, 1)]) == OK
    await asyncio.sleep(0.5)  # the periodic checkpoints write the entry, then find nothing to do
    assert newest_entry(data) == {0: 3, 1: 1}
    directory = data / "__consumer_offsets-0"
    segment = directory / "00000000000000000000.log"
    raw = bytearray(segment.read_bytes())
    raw[-20] ^= 0xFF  # the disk damages the last (synced, acknowledged) batch
    segment.write_bytes(bytes(raw))
    faults.fail_next_append = True  # a write fails: the partition reloads and meets the damage
    assert await append(failing, [commit("g", 0, 4)]) != OK
    await wait_state(failing, ShardState.FAILED)
    copy = directory / "journal-synced-end.0.tr"
    await wait_for(copy)
    assert copy.read_text() == "3\n"
    completed = runtime.checkpointer.completed if runtime.checkpointer else -1
    await asyncio.sleep(0.5)  # idle: the periodic checkpoints would have left partition 0 out by now
    ran = (runtime.checkpointer.completed if runtime.checkpointer else -1) - completed
    claimed = newest_entry(data)
    await stop(runtime)  # a clean stop
    copy.unlink()  # the operator accepts the loss of offset 3 (README: "remove the file")
    again = await started(journal_config(data, partitions=2))
    state = again.shards[0].state
    await stop(again)
    assert state is ShardState.ACTIVE, f"still {state}: {ran} checkpoints ran after the failure, and the " \
        f"journal's newest entry claims {claimed}; files: {sorted(p.name for p in directory.iterdir())}"


async def test_a_partition_failing_in_its_read_only_reload_keeps_its_claim_in_every_entry(tmp_path: Path) -> None:
    """A write fails and the log cannot be cut back (EROFS): the shard reloads ``durable_only``
    (coordinator.shardlifecycle ``_recover``), on the same PartitionLog, still ``recovered``. Its read finds
    damage below the durable end: FAILED, abandoned. The checkpointer takes every ``recovered`` log's end,
    and ``write_synced_ends`` adds those over the entry it filters (``... | ends``): every later entry
    claims the failed partition again, however busy the server. After a crash, the operator's removal of
    the copy does not accept the loss."""
    faults = Faults()
    data = tmp_path / "d"
    runtime = await started(journal_config(data, partitions=2), faults)
    assert runtime.checkpointer is not None
    failing, other = runtime.shards
    for offset in (1, 2, 3):
        assert await append(failing, [commit("g", 0, offset)]) == OK
    assert await runtime.checkpointer.checkpoint()
    directory = data / "__consumer_offsets-0"
    segment = directory / "00000000000000000000.log"
    raw = bytearray(segment.read_bytes())
    raw[-20] ^= 0xFF  # the disk damages the last (synced, acknowledged) batch
    segment.write_bytes(bytes(raw))
    faults.read_only = True  # the file system went read-only: the log cannot be cut back
    faults.fail_next_append = True
    assert await append(failing, [commit("g", 0, 4)]) != OK
    await wait_state(failing, ShardState.FAILED)
    copy = directory / "journal-synced-end.0.tr"
    await wait_for(copy)
    faults.read_only = False
    for offset in (1, 2):  # the other partition goes on: checkpoints with it
        assert await append(other, [commit("h", 0, offset)]) == OK
        assert await runtime.checkpointer.checkpoint()
    claimed = newest_entry(data)
    crashed = tmp_path / "crashed"
    shutil.copytree(data, crashed)  # kill -9
    await stop(runtime)
    (crashed / "__consumer_offsets-0" / copy.name).unlink()  # the operator accepts the loss
    again = await started(journal_config(crashed, partitions=2))
    state = again.shards[0].state
    await stop(again)
    assert (0 in claimed, state) == (False, ShardState.ACTIVE), \
        f"the newest entry, written after partition 0 failed, claims {claimed}; the start after the crash: {state}"


async def test_a_damaged_synced_end_copy_fails_its_partition_without_holding_every_other(tmp_path: Path) -> None:
    """A bit the disk flips in ``journal-synced-end.0.tr`` ("3\\n" -> b"\\xb3\\n"): ``kept_journal_end`` now
    reads the text outside its ``except ValueError`` (the UnicodeDecodeError it caught before escapes), so
    the load fails as an unexpected error: FAILED without ``abandon``, the partition stays ``recovering``
    in the journal for good, no segment is deleted again and no other log counts as synced (the cleaner
    compacts nothing) for the rest of the run."""
    data = tmp_path / "d"
    runtime = await started(journal_config(data, partitions=2))
    await stop(runtime)
    (data / "__consumer_offsets-0" / "journal-synced-end.0.tr").write_bytes(b"\xb3\n")
    state, synced, retained = await partition_0_fails_and_1_goes_on(data)
    assert state is ShardState.FAILED  # loud, as it should be
    assert (synced, retained) == (3, 1), f"partition 1 synced to {synced}, {retained} journal segments kept"


async def test_a_rotation_that_cannot_create_its_segment_does_not_end_the_checkpoints(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Checkpointer.checkpoint`` calls ``journal.rotate()`` outside its ``try``: an OSError there (no spare
    made ahead, and EMFILE or ENOSPC creating the next segment; since 35b0cea ``rotate`` also rotates a
    live segment a failed synced-ends write broke) ends ``Checkpointer.run``'s task, unobserved: no
    checkpoint runs again for the rest of the process, the journal grows without bound and no log counts
    as synced (the cleaner compacts nothing)."""
    runtime = await started(journal_config(tmp_path / "d", checkpoint_interval_ms=50))
    checkpointer, journal = runtime.checkpointer, runtime.journal
    assert checkpointer is not None and journal is not None
    shard = runtime.shards[0]
    await asyncio.sleep(0.2)
    spare = journal._spare  # what a failed ``make_spare`` leaves: none ready
    if spare is not None:
        storage.journal._discard_segment(spare)
        journal._spare = None
    real = storage.journal.Journal._create
    left = {"n": 1}

    def create(self: storage.journal.Journal, seq: int) -> storage.journal.JournalSegment:
        if left["n"]:
            left["n"] -= 1
            raise OSError(errno.EMFILE, "Too many open files (injected)")
        return real(self, seq)

    monkeypatch.setattr(storage.journal.Journal, "_create", create)
    assert await append(shard, [commit("g", 0, 1)]) == OK
    await asyncio.sleep(0.3)  # the next periodic checkpoint meets EMFILE once
    before = checkpointer.completed
    for offset in (2, 3, 4):
        assert await append(shard, [commit("g", 0, offset)]) == OK
        await asyncio.sleep(0.2)
    done, synced = checkpointer.completed - before, shard.log.synced_offset
    await stop(runtime)
    assert left["n"] == 0
    assert done > 0 and synced == 4, f"{done} checkpoints after the failed rotation, log synced to {synced}"


async def test_a_clean_stop_that_cannot_record_a_recovery_point_keeps_the_synced_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A clean stop removes the journal, synced-ends entry included, once every log is synced
    (coordinator.runtime ``stop``), relying on the recovery points its close records. When that record
    fails (a full disk: its temporary file needs a block), ``Shard.close`` only logs it and the journal
    still goes: the log's recovery point is whatever a checkpoint last recorded (at most every 30 s; here
    none), and damage the disk then does to the synced tail reads as a torn write at the next start: cut
    aside, acknowledged commits served older with a WARNING, the gap the entry was made to close."""
    data = tmp_path / "d"
    runtime = await started(journal_config(data))
    assert runtime.checkpointer is not None
    shard = runtime.shards[0]
    for offset in (1, 2, 3):
        assert await append(shard, [commit("g", 0, offset)]) == OK
    assert await runtime.checkpointer.checkpoint()

    def full(self: PartitionLog) -> None:
        raise OSError(errno.ENOSPC, "No space left on device (injected: the recovery point's temporary file)")

    monkeypatch.setattr(PartitionLog, "checkpoint", full)
    await stop(runtime)  # a clean stop on a full disk
    monkeypatch.undo()
    journal_left = sorted(p.name for p in (data / "journal").iterdir())
    segment = data / "__consumer_offsets-0" / "00000000000000000000.log"
    raw = bytearray(segment.read_bytes())
    raw[-20] ^= 0xFF  # the disk damages the last (synced, acknowledged) batch while kcoord is stopped
    segment.write_bytes(bytes(raw))
    again = await started(journal_config(data))
    state, got = again.shards[0].state, again.shards[0].data.committed("g", "t", 0)
    await stop(again)
    assert state is ShardState.FAILED, f"{state}, serving offset {got} for the acknowledged 3; the journal " \
        f"left: {journal_left}"


class _ReopenedBetweenReads:
    """A shard as the checkpointer sees it while the writer thread's ``_reopen_log`` replaces its log
    between the two reads of ``shard.log`` in ``logs = [shard.log for shard in ... if shard.log.recovered]``
    (coordinator/checkpointer.py:92): the condition reads the old, recovered log, the element the fresh one."""

    def __init__(self, shard: Shard, fresh: PartitionLog) -> None:
        self._shard, self._fresh, self._reads = shard, fresh, 0

    def __getattr__(self, name: str) -> object:
        if name == "log":
            self._reads += 1
            return self._shard.log if self._reads == 1 else self._fresh
        return getattr(self._shard, name)


async def test_a_log_reopened_between_the_checkpointers_two_reads_lowers_its_synced_end_to_zero(
        tmp_path: Path) -> None:
    """The interleaving above puts a fresh, unrecovered log in ``logs``: its ``acknowledged_end`` is offset 0,
    which the entry then claims (and ``checkpointed`` makes the journal's synced end for the reload that is
    starting): damage the disk did to the synced tail reads as a torn write at that reload."""
    data = tmp_path / "d"
    runtime = await started(journal_config(data))
    checkpointer, journal = runtime.checkpointer, runtime.journal
    assert checkpointer is not None and journal is not None
    shard = runtime.shards[0]
    for offset in (1, 2, 3):
        assert await append(shard, [commit("g", 0, offset)]) == OK
    assert await checkpointer.checkpoint()
    before = journal.synced_end(0)
    fresh = runtime._open_log(shard.log.directory, shard.log.segment_bytes)
    checkpointer._shards = [_ReopenedBetweenReads(shard, fresh)]  # type: ignore[list-item]
    assert await append(shard, [commit("g", 0, 4)]) == OK
    assert await checkpointer.checkpoint()
    checkpointer._shards = runtime.shards
    after, claimed = journal.synced_end(0), newest_entry(data)
    fresh.close()
    await stop(runtime)
    assert after >= before, f"synced end {before} -> {after}; the newest entry claims {claimed}"


async def test_a_load_that_fails_unexpectedly_lets_the_journal_go(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A load ending in an unexpected error (a bug) FAILED the partition without abandoning its journal:
    left recovering, it kept every segment from deletion and every other log from counting as synced
    (the cleaner compacted nothing) for the rest of the run. It is abandoned now, as a corrupt log is."""
    data = tmp_path / "d"
    runtime = await started(journal_config(data, partitions=2))
    await stop(runtime)
    journal_run = PartitionLog._journal_run

    def broken_for_partition_0(self: PartitionLog) -> list[bytes]:
        if self.partition == 0:
            raise RuntimeError("injected: a bug in partition 0's load")
        return journal_run(self)

    monkeypatch.setattr(PartitionLog, "_journal_run", broken_for_partition_0)
    state, synced, retained = await partition_0_fails_and_1_goes_on(data)
    assert state is ShardState.FAILED
    assert (synced, retained) == (3, 1), f"partition 1 synced to {synced}, {retained} journal segments kept"


async def test_no_compaction_while_an_earlier_processs_segments_are_kept(tmp_path: Path) -> None:
    """After a crash every partition recovers from the journal's segments, which stay until the next
    checkpoint: a crash before it replays them whole again, into logs the cleaner must not have compacted
    meanwhile (a review's find: the replay then met a compacted log and failed the partition)."""
    data = tmp_path / "d"
    runtime = await started(journal_config(data))
    for offset in (1, 2, 3):
        assert await append(runtime.shards[0], [commit("g", 0, offset)]) == OK
    crashed = tmp_path / "crashed"
    shutil.copytree(data, crashed)  # kill -9: the journal holds the commits
    await stop(runtime)
    runtime = await started(journal_config(crashed))
    assert runtime.checkpointer is not None
    plog = runtime.shards[0].log
    held_before = _journal_holds(plog)
    assert await runtime.checkpointer.checkpoint()
    held_after = _journal_holds(plog)
    await stop(runtime)
    assert (held_before, held_after) == (True, False)
