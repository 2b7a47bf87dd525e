"""Compaction against the journal's synced ends (storage.cleaner ``compaction_horizon``): recovery takes a
gap before a batch reaching a log's synced end for damage (storage.log ``recover``), and the journal's
synced end can lag the log's (a synced-ends entry that could not be written, a start before its first
checkpoint); a compaction past it made a healthy partition FAILED, for good once its end was kept aside.
Also what a failed partition's journal copy holds its log to. A review found each; every test failed
before its fix."""

import errno
from pathlib import Path

import pytest

import storage.journal
from storage.batchwriter import build_batch
from storage.cleaner import clean
from storage.journal import Journal
from storage.log import PartitionLog
from storage.segments import kept_journal_end
from tests.storage.test_cleaner import DAY, T, commit
from tests.storage.test_journal import P, acknowledged, batch

SEGMENT_BYTES = 450


def kbatch(base: int, partition: int, offset: int) -> bytes:
    return build_batch(base, [commit("g", partition, offset)], T + base)


def checkpoint(journal: Journal, logs: list[PartitionLog], entry_fails: bool = False,
               monkeypatch: pytest.MonkeyPatch | None = None) -> None:
    """coordinator.checkpointer ``checkpoint`` around its syncfs (the bytes reach the disk anyway),
    with the synced-ends entry's write failing (ENOSPC) when ``entry_fails``: the checkpoint goes on."""
    ends = [plog.acknowledged_end() for plog in logs]
    boundary = journal.rotate()
    if entry_fails:
        assert monkeypatch is not None

        def no_room(seg: storage.journal.JournalSegment, data: bytes) -> None:
            seg.broken = True
            raise OSError(errno.ENOSPC, "No space left on device")
        with monkeypatch.context() as m:
            m.setattr(storage.journal, "_append", no_room)
            journal.write_synced_ends({plog.partition: end[0] for plog, end in zip(logs, ends, strict=True)})
    else:
        journal.write_synced_ends({plog.partition: end[0] for plog, end in zip(logs, ends, strict=True)})
    drop = journal.droppable(boundary)
    assert journal.drop([seg.path for seg in drop])
    journal.checkpointed(boundary)
    journal.deleted(drop)
    for plog, end in zip(logs, ends, strict=True):
        plog.disk_synced(end)


def log_on(journal: Journal, tmp_path: Path, partition: int = P) -> PartitionLog:
    """``partition``'s log in ``tmp_path``, journaled in ``journal``, not yet recovered."""
    plog = PartitionLog(tmp_path / f"__consumer_offsets-{partition}", SEGMENT_BYTES)
    plog.journal, plog.partition = journal, partition
    return plog


def compacted_past_a_stale_synced_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Journal:
    """Offsets 0, 1 checkpointed (the entry: the log reaches 2); 2, 3 supersede them and 4 rolls a
    segment; a checkpoint whose entry cannot be written (a full disk) marks the log synced to 5 while the
    journal's synced end stays 2; the cleaner compacts segment 0. Returns the journal, the log closed."""
    journal = Journal(tmp_path)
    plog = log_on(journal, tmp_path)
    list(plog.recover())
    # offsets 0, 1: commits of partitions 0 and 1; checkpointed: the entry says the log reaches 2
    acknowledged(journal, plog, [kbatch(0, 0, 10), kbatch(1, 1, 10)])
    checkpoint(journal, [plog])
    assert journal.synced_end(P) == 2
    # offsets 2, 3 commit the same partitions again (0 and 1 are superseded); 4 rolls a segment
    acknowledged(journal, plog, [kbatch(2, 0, 11), kbatch(3, 1, 11)])
    acknowledged(journal, plog, [kbatch(4, 2, 10)])
    assert [s.base_offset for s in plog.segments] == [0, 4], plog.segments
    # a full disk: this checkpoint's entry cannot be written; it goes on (as designed), the log counts
    # as synced to 5, and the journal's synced end for P stays 2
    checkpoint(journal, [plog], entry_fails=True, monkeypatch=monkeypatch)
    assert plog.synced_offset == 5 and journal.synced_end(P) == 2
    # the cleaner compacts segment 0 (segment 4 starts below the synced end): offsets 0 and 1 go
    clean(plog, T + DAY, DAY)  # before the fix: offsets 0 and 1 dropped
    plog.close()
    return journal


def test_a_compaction_gap_below_a_stale_synced_end_fails_a_healthy_partition_at_its_reload(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    journal = compacted_past_a_stale_synced_end(tmp_path, monkeypatch)
    # a reload of the partition (what a write failing on the full disk does: coordinator.shard
    # fail_write -> _recover -> _load) reads a healthy, compacted log
    again = log_on(journal, tmp_path)
    offsets = [r.offset for b in again.recover() for r in b.records]  # raised LogCorruptError before the fix
    assert offsets[-3:] == [2, 3, 4]
    again.close()
    journal.close(remove=False)


def test_the_false_failure_then_outlives_every_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Failed, the partition is abandoned (coordinator.shardlifecycle ``_abandon_journal``): the stale synced end is
    kept beside the log, and every later start fails the healthy log again, the journal long gone."""
    from storage.log import LogCorruptError
    journal = compacted_past_a_stale_synced_end(tmp_path, monkeypatch)
    again = log_on(journal, tmp_path)
    try:
        list(again.recover())
    except LogCorruptError:  # before the fix (the first test): the partition failed and was abandoned
        kept = again.abandon_journal()
        assert kept is not None and kept.synced_end is not None
    again.close()
    journal.close(remove=True)  # a clean stop: no journal left at all
    fresh = PartitionLog(tmp_path / f"__consumer_offsets-{P}", SEGMENT_BYTES)
    offsets = [r.offset for b in fresh.recover() for r in b.records]  # raises: kept_journal_end says 2
    assert offsets[-3:] == [2, 3, 4]


def test_the_close_time_entry_writes_the_stale_synced_end_back_and_the_restart_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Journal.close's entry (entry_due after a failed one) is the last *completed* checkpoint's ends: after
    a failed entry, the segment holding them went, and the close writes them back, stale, for a start to
    hold the compacted log to (a journal kept at the stop: a claim a full disk kept from being recorded)."""
    journal = Journal(tmp_path)
    plog, other = log_on(journal, tmp_path), log_on(journal, tmp_path, 4)
    list(plog.recover())
    list(other.recover())
    acknowledged(journal, plog, [kbatch(0, 0, 10), kbatch(1, 1, 10)])
    checkpoint(journal, [plog, other])
    acknowledged(journal, plog, [kbatch(2, 0, 11), kbatch(3, 1, 11)])
    acknowledged(journal, plog, [kbatch(4, 2, 10)])
    checkpoint(journal, [plog, other], entry_fails=True, monkeypatch=monkeypatch)
    assert journal.entry_due
    clean(plog, T + DAY, DAY)
    acknowledged(journal, other, [kbatch(0, 0, 1)])  # another partition's commit: a fresh live segment
    assert not journal.live.broken
    plog.close()
    other.close()
    journal.close(remove=False)
    journal = Journal(tmp_path)  # the next start
    assert journal.synced_end(P) == 2  # stale: the log was synced (and compacted) past it
    fresh = log_on(journal, tmp_path)
    offsets = [r.offset for b in fresh.recover() for r in b.records]  # raised LogCorruptError before the fix
    assert offsets[-3:] == [2, 3, 4]


def test_a_journal_batches_copy_ends_where_its_resolved_run_ends(tmp_path: Path) -> None:
    """A failed partition's copy holds its journal batches in journal order, an older version of offsets
    (journaled by an earlier process, never acknowledged) before the one that replaced it lower (storage.
    journalentries ``resolve``). kept_journal_end takes the furthest batch, not the run's end: a log
    holding every acknowledged offset (0-12, as repaired) still fails to load, said short of offset 19."""
    directory = tmp_path / f"__consumer_offsets-{P}"
    plog = PartitionLog(directory, 1 << 20)
    list(plog.recover())
    for b in (batch(0, 10), batch(10, 3)):
        plog.append(b, int.from_bytes(b[:8], "big") + int.from_bytes(b[23:27], "big"))
    plog.sync()
    plog.close()
    (directory / "journal-batches.0.tr").write_bytes(batch(10, 10, tag=b"o") + batch(10, 3))
    assert kept_journal_end(directory)[0] == 13  # 20 before the fix


def restarted_after_a_run(tmp_path: Path) -> tuple[Journal, PartitionLog]:
    """Offset 0 checkpointed; then a run the journal holds when the process is killed: 1 (partition 0's
    key again), 2, 3 (partition 0's again: 1 is superseded), 4 (rolls a segment). Then the next start,
    which applies the run and marks the log synced to 5."""
    journal = Journal(tmp_path)
    plog = log_on(journal, tmp_path)
    list(plog.recover())
    acknowledged(journal, plog, [kbatch(0, 0, 10)])
    checkpoint(journal, [plog])
    acknowledged(journal, plog, [kbatch(1, 0, 11), kbatch(2, 1, 10), kbatch(3, 0, 12), kbatch(4, 2, 10)])
    plog.close()
    journal.close(remove=False)  # kill -9
    journal = Journal(tmp_path)
    plog = log_on(journal, tmp_path)
    list(plog.recover())
    return journal, plog


def test_compaction_between_a_recovery_and_the_first_checkpoint_fails_the_next_start(tmp_path: Path) -> None:
    """Pre-existing (not the synced-ends rule): recover() marks the log synced through the journal's run
    while the segments an earlier process left are kept until the first checkpoint; once every partition
    has applied them (``holding`` False) the cleaner may compact into the run. A crash then (before the
    first checkpoint, 250 ms) leaves the run to be replayed into a log whose run start was compacted away:
    the jump over the journal's first offset is damage below the recovery point the recovery recorded."""
    journal, plog = restarted_after_a_run(tmp_path)
    assert not journal.holding and plog.synced_offset == 5
    clean(plog, T + DAY, DAY)  # before the fix: offsets 0 and 1 dropped
    plog.close()
    journal.close(remove=False)  # kill -9 before the first checkpoint
    journal = Journal(tmp_path)  # start 3
    plog = log_on(journal, tmp_path)
    offsets = [r.offset for b in plog.recover() for r in b.records]  # raised LogCorruptError before the fix
    assert offsets[-3:] == [2, 3, 4]


def test_a_reload_before_the_first_checkpoint_holds_a_compacted_log_to_the_start_s_synced_end(tmp_path: Path) -> None:
    """The synced-ends rule without a full disk: after a start, the journal's synced end is the earlier
    process's (1) while recover() marked the log synced through the run it wrote (5); the cleaner compacts
    segment 0 (offsets 0, 1 superseded); a reload of the partition before the first checkpoint (a write
    failure) has no run left (``applied`` covered it) and holds the healthy log to offset 1: FAILED."""
    journal, plog = restarted_after_a_run(tmp_path)
    assert journal.synced_end(P) == 1 and plog.synced_offset == 5
    clean(plog, T + DAY, DAY)
    plog.close()
    again = log_on(journal, tmp_path)
    offsets = [r.offset for b in again.recover() for r in b.records]  # raised LogCorruptError before the fix
    assert offsets[-3:] == [2, 3, 4]
