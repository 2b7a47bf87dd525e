"""The write-ahead journal (storage.journal) and a log's recovery from it (storage.log ``recover``):
the journal holds every acknowledged batch the log may have lost, and recovery writes exactly those
back, whatever state the log's own file was left in."""

import logging
import os
from pathlib import Path

import pytest

from storage.batchwriter import Entry, build_batch
from storage.journal import Journal
from storage.journalentries import ENTRY_HEADER, JournalError, read_entries, resolve
from storage.log import RECOVERY_POINT, LogCorruptError, PartitionLog

T = 1700000000000
P = 3


def batch(base: int, count: int = 1, tag: bytes = b"v") -> bytes:
    entries: list[Entry] = [(b"\x00\x01key-%d" % (base + i), tag * 20) for i in range(count)]
    return build_batch(base, entries, T)


def opened(data_dir: Path, segment_bytes: int = 1 << 20, recover: bool = True) -> tuple[Journal, PartitionLog]:
    journal = Journal(data_dir)
    plog = PartitionLog(data_dir / f"__consumer_offsets-{P}", segment_bytes)
    plog.journal = journal
    plog.partition = P
    if recover:
        list(plog.recover())
    return journal, plog


def acknowledged(journal: Journal, plog: PartitionLog, batches: list[bytes]) -> None:
    """Appends as a flush cycle does, and makes the journal (only) durable."""
    for b in batches:
        plog.append(b, b_last(b))
    seg, size = journal.write()
    journal.sync(seg)
    journal.synced(seg, size, None)
    plog.journaled(plog.end())


def b_last(b: bytes) -> int:
    return int.from_bytes(b[:8], "big") + int.from_bytes(b[23:27], "big")


def recovered(data_dir: Path, segment_bytes: int = 1 << 20) -> tuple[Journal, PartitionLog, list[int]]:
    journal, plog = opened(data_dir, segment_bytes, recover=False)
    offsets = [r.offset for b in plog.recover() for r in b.records]
    return journal, plog, offsets


def log_file(data_dir: Path) -> Path:
    return data_dir / f"__consumer_offsets-{P}" / "00000000000000000000.log"


def test_entries_read_back_in_order_and_a_torn_tail_is_ignored(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    plog = PartitionLog(tmp_path / "x")
    journal.add(plog, 1, batch(0), (1, 0, 0))
    journal.add(plog, 2, batch(5, 2), (7, 0, 0))
    seg, _ = journal.write()
    os.write(seg.fd or -1, ENTRY_HEADER.pack(500, 1, 0) + b"partial")  # a write torn by a crash
    assert [(p, b) for p, b, _ in read_entries(seg.path)] == [(1, batch(0)), (2, batch(5, 2))]
    assert plog.journaled_end == (7, 0, 0)
    journal.close(remove=False)


def test_a_damaged_entry_ends_the_segment(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    plog = PartitionLog(tmp_path / "x")
    for i in range(3):
        journal.add(plog, 1, batch(i), (i + 1, 0, 0))
    seg, _ = journal.write()
    raw = bytearray(seg.path.read_bytes())
    second = ENTRY_HEADER.size + len(batch(0))
    raw[second + ENTRY_HEADER.size + 30] ^= 0xFF
    seg.path.write_bytes(bytes(raw))
    assert [b for _, b, _ in read_entries(seg.path)] == [batch(0)]
    journal.close(remove=False)


def _left_by_a_crash(data_dir: Path, entries: list[tuple[int, bytes]]) -> Path:
    """A segment holding ``entries`` (partition, batch), as a process killed after its sync leaves it."""
    journal = Journal(data_dir)
    plog = PartitionLog(data_dir / "x")
    for i, (partition, b) in enumerate(entries):
        journal.add(plog, partition, b, (i + 1, 0, 0))
    seg, size = journal.write()
    journal.sync(seg)
    journal.synced(seg, size, None)
    journal.close(remove=False)
    return seg.path


def _startup_batches(journal: Journal) -> list[bytes]:
    return [b for p in sorted(journal.unapplied) for b in journal.entries_for(p)]


def test_valid_entries_after_a_damaged_one_are_reported_and_kept_aside(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _left_by_a_crash(tmp_path, [(1, batch(0)), (1, batch(1)), (2, batch(7, 2)), (1, batch(2))])
    raw = bytearray(path.read_bytes())
    raw[ENTRY_HEADER.size + len(batch(0)) + ENTRY_HEADER.size + 30] ^= 0xFF  # a flipped bit in the 2nd entry
    path.write_bytes(bytes(raw))
    journal = Journal(tmp_path)
    assert _startup_batches(journal) == [batch(0)]  # what follows the damage is not applied
    errors = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(errors) == 1, errors
    assert f"{path.name} is damaged at byte {ENTRY_HEADER.size + len(batch(0))}" in errors[0]
    assert "(partition 1: 1 batch, offsets 2-2; partition 2: 1 batch, offsets 7-8)" in errors[0]
    copy = path.with_name(path.name + ".damaged")
    assert copy.read_bytes() == bytes(raw) and str(copy) in errors[0]
    journal.close(remove=False)


@pytest.mark.parametrize("damage", ["a zeroed 4 KiB block", "a length's bit", "a partition's sign bit"])
def test_valid_entries_after_a_damaged_header_are_found_too(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str) -> None:
    """A review's find: walking the entries' lengths stopped at a damaged header, so the most usual
    damage (a block of zeros) read as a torn tail, and the entries after it went unreported."""
    path = _left_by_a_crash(tmp_path, [(i % 3, batch(i)) for i in range(200)])
    raw = bytearray(path.read_bytes())
    at = [end for _, _, end in read_entries(path)][99]  # where entry 100 starts
    if damage == "a zeroed 4 KiB block":
        at = 8192
        raw[8192:12288] = bytes(4096)
    elif damage == "a length's bit":
        raw[at + 2] ^= 0x01
    else:
        raw[at + 4] ^= 0x80
    path.write_bytes(bytes(raw))
    journal = Journal(tmp_path)
    assert all(end <= at for _, _, end in read_entries(path))
    errors = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(errors) == 1 and "offsets" in errors[0] and "-199" in errors[0], errors
    assert path.with_name(path.name + ".damaged").read_bytes() == bytes(raw)
    journal.close(remove=False)


def test_a_damaged_segments_copy_never_stands_for_another(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Sequence numbers start again after a clean stop: a second incident's segment 1 must not be
    said kept in the first one's copy."""
    for tag in (b"A", b"B"):
        path = _left_by_a_crash(tmp_path, [(1, batch(i, tag=tag)) for i in range(3)])
        raw = bytearray(path.read_bytes())
        raw[ENTRY_HEADER.size + 40] ^= 0xFF
        path.write_bytes(bytes(raw))
        caplog.clear()
        Journal(tmp_path).close(remove=False)
        (error,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        kept = Path(error.rsplit("kept as ", 1)[1].rstrip("."))
        assert kept.read_bytes() == bytes(raw)
        for p in tmp_path.glob("journal/*.journal"):
            p.unlink()  # applied and checkpointed, then a clean stop
    assert len(list(tmp_path.glob("journal/*.damaged"))) == 2


@pytest.mark.parametrize("tail", ["torn", "zeros", "earlier use"])
def test_a_segments_usual_tails_are_reported_without_an_error(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, tail: str) -> None:
    path = _left_by_a_crash(tmp_path, [(1, batch(0)), (1, batch(1))])
    whole = path.read_bytes()
    if tail == "torn":
        path.write_bytes(whole[:-20])
    elif tail == "zeros":
        path.write_bytes(whole + bytes(4096))
    else:  # the file's earlier use: entries of an older number left past where the new ones end
        path.write_bytes(whole + whole)
        path.rename(path.with_name(f"{int(path.name[:20]) + 1:020d}.journal"))
    caplog.set_level("INFO", logger="storage.journal")
    journal = Journal(tmp_path)
    kept = [batch(0)] if tail == "torn" else [batch(0), batch(1)]
    assert _startup_batches(journal) == (kept if tail != "earlier use" else [])
    assert not [r for r in caplog.records if r.levelno >= 30]
    assert any("journal: " in r.getMessage() and "byte" in r.getMessage() for r in caplog.records)
    assert not list(tmp_path.glob("journal/*.damaged"))
    journal.close(remove=True)


def test_resolve_lets_a_later_batch_replace_the_run_from_its_offset() -> None:
    # 0, 1-2, then a failed write at 3 that the log was cut back from, and 3 written again
    assert resolve([batch(0), batch(1, 2), batch(3, tag=b"x"), batch(3, tag=b"y"), batch(4)]) == \
        [batch(0), batch(1, 2), batch(3, tag=b"y"), batch(4)]
    assert resolve([batch(0), batch(1, 2), batch(1, tag=b"z")]) == [batch(0), batch(1, tag=b"z")]
    with pytest.raises(JournalError):
        resolve([batch(0), batch(2)])  # offset 1 is missing
    with pytest.raises(JournalError):
        resolve([batch(0, 3), batch(1)])  # starts inside the batch before


def test_acknowledged_batches_survive_the_loss_of_everything_the_log_had_not_synced(tmp_path: Path) -> None:
    journal, plog = opened(tmp_path)
    synced = [batch(0, 2), batch(2)]
    for b in synced:
        plog.append(b, b_last(b))
    plog.sync()
    on_disk = log_file(tmp_path).stat().st_size
    acknowledged(journal, plog, [batch(3), batch(4, 3)])
    acknowledged(journal, plog, [batch(7)])
    plog.close()
    journal.close(remove=False)
    # power lost: the log's unsynced pages never reached the disk, a torn page of them did
    with open(log_file(tmp_path), "r+b") as f:
        f.truncate(on_disk + 17)
    journal, plog, offsets = recovered(tmp_path)
    assert offsets == list(range(8))
    assert plog.durable_offset == plog.synced_offset == 8
    assert [p.name for p in log_file(tmp_path).parent.iterdir() if p.name.endswith(".tr")] == []
    assert journal.unapplied == set()
    journal.close(remove=False)
    # and the rewritten log needs no journal any more
    plog.close()
    for seg in (tmp_path / "journal").iterdir():
        seg.unlink()
    assert [r.offset for b in PartitionLog(log_file(tmp_path).parent).recover() for r in b.records] == list(range(8))


def test_a_log_ahead_of_the_journal_keeps_only_what_the_journal_holds(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """What a kill -9 usually leaves: batches appended after the partition's last journal write. They are
    kept aside as said at INFO, not WARNING (a kill -9 campaign: every restart warned of them)."""
    journal, plog = opened(tmp_path)
    acknowledged(journal, plog, [batch(0), batch(1)])
    plog.append(batch(2, count=3), 4)  # appended, the process died before the journal write
    plog.append(batch(5), 5)
    plog.close()
    journal.close(remove=False)
    with caplog.at_level(logging.INFO, logger="storage.log"):
        journal, plog, offsets = recovered(tmp_path)
    assert offsets == [0, 1]
    kept_aside = [p for p in log_file(tmp_path).parent.iterdir() if p.name.endswith(".tr")]
    assert len(kept_aside) == 1 and kept_aside[0].read_bytes() == batch(2, count=3) + batch(5)
    said = [r for r in caplog.records if "kept in" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.INFO], said
    assert "appended after the journal's last for this partition" in said[0].getMessage()
    journal.close(remove=False)


def test_a_log_whose_partition_the_journal_holds_nothing_of_keeps_its_valid_tail(tmp_path: Path) -> None:
    """Nothing of the partition journaled since the last checkpoint: its log is read as Kafka reads one,
    valid batches kept (never acknowledged, so serving them is allowed; README, Limits)."""
    journal, plog = opened(tmp_path)
    plog.append(batch(0), 0)  # appended, the process died before the journal write
    plog.close()
    journal.close(remove=False)
    journal, plog, offsets = recovered(tmp_path)
    assert offsets == [0] and not list(log_file(tmp_path).parent.glob("*.tr"))
    journal.close(remove=False)


@pytest.mark.parametrize("later", ["continuing", "after a gap"])
def test_appends_past_the_journal_into_a_later_segment(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                       later: str) -> None:
    """Unjournaled appends that rolled the log to a new segment continue the run there too (INFO); a later
    segment whose batches do not follow on (a gap, or not the offset its name says) warns (a review's
    find: it was said at INFO)."""
    journal, plog = opened(tmp_path, segment_bytes=3 * len(batch(0)))
    acknowledged(journal, plog, [batch(0), batch(1)])
    plog.append(batch(2), 2)  # unjournaled; fills segment 0
    if later == "continuing":
        plog.append(batch(3), 3)  # rolls to segment 3
    plog.close()
    journal.close(remove=False)
    if later == "after a gap":
        (log_file(tmp_path).parent / "00000000000000000003.log").write_bytes(batch(500) + batch(501))
    with caplog.at_level(logging.INFO, logger="storage.log"):
        journal, plog, offsets = recovered(tmp_path, segment_bytes=3 * len(batch(0)))
    assert offsets == [0, 1]
    said = [r.levelno for r in caplog.records if "kept in" in r.getMessage()]
    assert said == ([logging.INFO, logging.INFO] if later == "continuing" else [logging.INFO, logging.WARNING])
    journal.close(remove=False)


@pytest.mark.parametrize("tail", ["an older version", "a torn batch", "a gap"])
def test_what_the_journal_replaces_otherwise_is_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                          tail: str) -> None:
    """Bytes past the journal's run that are not whole batches continuing it (an older version of offsets it
    writes again, damage, a gap in the offsets) still say WARNING."""
    journal, plog = opened(tmp_path)
    acknowledged(journal, plog, [batch(0), batch(1)])
    plog.close()
    journal.close(remove=False)
    extra = {"an older version": batch(1, tag=b"o"), "a torn batch": batch(2)[:-5], "a gap": batch(4)}[tail]
    if tail == "an older version":  # the log holds an older offset 1 where the journal has the newer one
        log_file(tmp_path).write_bytes(batch(0) + extra)
    else:
        with log_file(tmp_path).open("ab") as f:
            f.write(extra)
    with caplog.at_level(logging.INFO, logger="storage.log"):
        journal, plog, offsets = recovered(tmp_path)
    assert offsets == [0, 1]
    said = [r for r in caplog.records if "kept in" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING], said
    journal.close(remove=False)


def test_offsets_written_again_after_a_failed_write_replace_the_old_ones(tmp_path: Path) -> None:
    journal, plog = opened(tmp_path)
    acknowledged(journal, plog, [batch(0)])
    plog.append(batch(1, tag=b"x"), 1)
    journal.write()  # written, but its sync failed: the log is cut back, the offset written again
    plog.truncate_to_durable()
    acknowledged(journal, plog, [batch(1, tag=b"y")])
    plog.close()
    journal.close(remove=False)
    journal, plog, _ = recovered(tmp_path)
    assert log_file(tmp_path).read_bytes() == batch(0) + batch(1, tag=b"y")
    journal.close(remove=False)


def test_a_log_missing_batches_the_journal_does_not_hold_is_corrupt(tmp_path: Path) -> None:
    journal, plog = opened(tmp_path)
    acknowledged(journal, plog, [batch(0), batch(1)])
    plog.sync()  # a checkpoint: the log synced, the journal cut back behind it
    drop = journal.droppable(journal.rotate())
    journal.delete([seg.path for seg in drop])
    journal.deleted(drop)
    acknowledged(journal, plog, [batch(2)])
    plog.close()
    journal.close(remove=False)
    with open(log_file(tmp_path), "r+b") as f:
        f.truncate(len(batch(0)))  # the synced batch at 1 is gone: the journal cannot bring it back
    (log_file(tmp_path).parent / RECOVERY_POINT).unlink()  # (with it, the log's own check says so first)
    with pytest.raises(LogCorruptError, match="acknowledged batches are missing"):
        recovered(tmp_path)


def test_segments_are_kept_until_every_partition_applied_them(tmp_path: Path) -> None:
    journal, plog = opened(tmp_path)
    acknowledged(journal, plog, [batch(0)])
    plog.close()
    journal.close(remove=False)
    journal = Journal(tmp_path)
    assert journal.unapplied == {P}
    boundary = journal.rotate()
    assert journal.droppable(boundary) == []  # partition 3 has not recovered yet
    journal.applied(P)
    dropped = journal.droppable(boundary)
    assert [s.seq for s in dropped] == [1]
    journal.delete([seg.path for seg in dropped])
    journal.deleted(dropped)
    assert journal.entries_for(P) == []
    journal.hold({1, 2})
    assert journal.droppable(journal.rotate()) == []
    journal.close(remove=True)
    assert list((tmp_path / "journal").iterdir())  # held: not removed on close either


def test_batches_of_a_refused_log_not_yet_journaled_never_come_back(tmp_path: Path) -> None:
    journal, plog = opened(tmp_path)
    acknowledged(journal, plog, [batch(0)])
    other = PartitionLog(tmp_path / "__consumer_offsets-4")
    list(other.recover())
    other.journal, other.partition = journal, 4
    plog.append(batch(1, tag=b"x"), 1)  # appended, then its cycle failed before the journal write
    other.append(batch(0), 0)
    plog.refused = True  # as Shard.fail_write marks it, on the event loop
    seg, _ = journal.write()
    assert [(p, b) for p, b, _ in read_entries(seg.path)] == [(P, batch(0)), (4, batch(0))]
    other.close()
    plog.close()
    journal.close(remove=False)


def test_a_recovery_only_rewrites_what_its_log_may_lack(tmp_path: Path) -> None:
    """A partition that recovered, or that a checkpoint synced since, never gets older batches back:
    they could lie in segments the cleaner has compacted since (a rewrite there would fail the
    partition), and once segments are deleted they would leave a gap."""
    journal, plog = opened(tmp_path)
    acknowledged(journal, plog, [batch(0)])
    other = PartitionLog(tmp_path / "__consumer_offsets-4")
    other.journal, other.partition = journal, 4
    list(other.recover())
    other.append(batch(0), 0)
    journal.write()
    plog.close()
    other.close()
    journal.close(remove=False)  # a crash: both partitions have batches to apply at the next start

    journal, plog, _ = recovered(tmp_path)  # partition 3 recovers; partition 4 has not yet
    assert journal.unapplied == {4}
    assert journal.entries_for(P) == []
    acknowledged(journal, plog, [batch(1)])
    assert journal.entries_for(P) == [batch(1)]
    boundary = journal.rotate()
    assert journal.droppable(boundary) == []  # partition 4 still needs the first process's segment
    plog.sync()
    journal.checkpointed(boundary)
    assert journal.entries_for(P) == []
    acknowledged(journal, plog, [batch(2)])
    assert journal.entries_for(P) == [batch(2)]
    assert journal.entries_for(4) == [batch(0)]
    journal.hold({P, 4})  # a failed checkpoint: back to the last good one for both
    assert journal.entries_for(P) == [batch(2)]
    assert journal.entries_for(4) == [batch(0)]
    plog.close()
    journal.close(remove=False)


def test_a_recycled_segment_reads_back_only_what_was_written_under_its_new_number(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    plog = PartitionLog(tmp_path / "x")
    for i in range(5):
        journal.add(plog, 1, batch(i, 3), (i + 1, 0, 0))
    old, _ = journal.write()
    journal.rotate()
    spare = journal.make_spare(journal.reserve_spare(), old.path)
    assert not old.path.exists() and spare.path.stat().st_size > 0
    assert list(read_entries(spare.path)) == []  # the old entries fail the new number's CRC
    journal.adopt_spare(spare)
    journal.add(plog, 1, batch(7), (8, 0, 0))
    journal.write()
    assert journal.rotate() == spare.seq  # the spare is live now, overwritten from its start
    journal.add(plog, 2, batch(9), (10, 0, 0))
    journal.write()
    assert [(p, b) for p, b, _ in read_entries(spare.path)] == [(2, batch(9))]
    assert spare.path.stat().st_size > len(batch(9)) * 3  # older bytes follow, and are not read
    journal.close(remove=False)
    again = Journal(tmp_path)
    assert again.entries_for(2) == [batch(9)]  # and not at a restart either
    again.close(remove=False)


def test_damage_where_the_journals_run_starts_is_replaced_by_it(tmp_path: Path) -> None:
    """A rewrite torn by a crash or cut short by a full disk: the run is written again over it, not
    cut aside (impossible on a full disk, which then served the log before it, read-only: acknowledged
    commits missing, as a fault campaign found)."""
    journal, plog = opened(tmp_path)
    acknowledged(journal, plog, [batch(0), batch(1), batch(2)])
    plog.close()
    journal.close(remove=False)
    with open(log_file(tmp_path), "r+b") as f:  # the rewrite of 0..2 stopped inside the first batch
        f.truncate(len(batch(0)) // 2)
    journal, plog, offsets = recovered(tmp_path)
    assert offsets == [0, 1, 2]
    assert [p.name for p in log_file(tmp_path).parent.iterdir() if p.name.endswith(".tr")] == []
    journal.close(remove=False)


@pytest.mark.parametrize("later", ["empty", "its first batch"])
def test_a_segment_rolled_to_after_batches_a_power_cut_took_is_replaced_by_the_run(tmp_path: Path, later: str) -> None:
    """A fault campaign's find: a segment created after the last checkpoint survives a power cut (its
    directory entry made durable by the journal's sync) empty, or with only its first batch, while the
    segment before it loses the batches the journal's run starts with. The run's place is the end of
    that earlier segment: the empty segment failed the partition ("acknowledged batches are missing"),
    and the other was rewritten from offsets below its own base (failing the next start)."""
    size = len(batch(0))
    journal, plog = opened(tmp_path, segment_bytes=3 * size)
    acknowledged(journal, plog, [batch(0)])
    plog.sync()  # a checkpoint: the log holds batch 0 on disk, and the journal segment goes
    boundary = journal.rotate()
    dropped = journal.droppable(boundary)
    journal.delete([seg.path for seg in dropped])
    journal.deleted(dropped)
    journal.checkpointed(boundary)
    acknowledged(journal, plog, [batch(1), batch(2), batch(3)])  # batch 3 rolls to segment 3
    assert [seg.base_offset for seg in plog.segments] == [0, 3]
    plog.close()
    journal.close(remove=False)
    with open(log_file(tmp_path), "r+b") as f:  # the power cut: what the checkpoint synced is left
        f.truncate(size)
    if later == "empty":
        (log_file(tmp_path).parent / "00000000000000000003.log").write_bytes(b"")
    for _ in range(2):  # the start after the power cut, and one after it (what it wrote is read back)
        journal, plog, offsets = recovered(tmp_path, 3 * size)
        assert offsets == [0, 1, 2, 3]
        assert [seg.base_offset for seg in plog.segments] == [0, 3]
        assert not list(log_file(tmp_path).parent.glob("*.tr"))  # batch 3 in segment 3 is the run's own
        plog.close()
        journal.close(remove=False)


@pytest.mark.parametrize("claimed", [True, False])
def test_a_gap_in_a_partitions_journal_entries_fails_it_even_where_its_log_seems_to_hold_them(
        tmp_path: Path, claimed: bool) -> None:
    """A start applies what an earlier process left and keeps those segments until its first
    checkpoint; should one be damaged before the start after that, the partition's entries have a gap.
    Filling it from the log where the log holds it within its recovery point was tried and reverted:
    a recovery killed inside its rewrite leaves the log cut within that point (next test)."""
    journal, plog = opened(tmp_path)
    acknowledged(journal, plog, [batch(0), batch(1), batch(2)])
    first = journal.live
    if claimed:
        plog.sync()  # the earlier start's recovery: written into the log, fsynced, claimed
        plog.checkpoint()
    journal.rotate()
    acknowledged(journal, plog, [batch(3), batch(4)])
    plog.close()
    journal.close(remove=False)
    raw = bytearray(first.path.read_bytes())
    raw[ENTRY_HEADER.size + len(batch(0)) + ENTRY_HEADER.size + 30] ^= 0xFF  # entry 1 damaged: 0, then 3-4
    first.path.write_bytes(bytes(raw))
    with pytest.raises(LogCorruptError, match="does not follow"):
        recovered(tmp_path)


class _Killed(BaseException):
    """The process dies here: nothing after this point runs."""


def test_a_gap_after_a_recovery_killed_inside_its_rewrite_fails_the_partition(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A review's counterexample to filling a gap from the log within its recovery point: the start
    before was killed after cutting the log inside that point to rewrite it, so acknowledged offsets
    1 and 2 would have been missing, silently (the log's next segment starts at 3)."""
    size = len(batch(0))
    journal, plog = opened(tmp_path, 3 * size)
    acknowledged(journal, plog, [batch(0)])
    plog.sync()
    plog.checkpoint()
    journal.rotate()
    acknowledged(journal, plog, [batch(1), batch(2), batch(3), batch(4)])  # process A: 1-4 in J1 only
    j1 = journal.live.path
    for p in (tmp_path / "journal").iterdir():
        if p.name.endswith(".journal") and p != j1:
            p.unlink()  # the checkpoint's deletion of the segment before
    plog.close()
    journal.close(remove=False)
    journal, plog, offsets = recovered(tmp_path, 3 * size)  # process B applies J1, claims (3, 2 batches)
    assert offsets == [0, 1, 2, 3, 4]
    acknowledged(journal, plog, [batch(5)])  # and acknowledges 5 in J2
    plog.close()
    journal.close(remove=False)
    real_unlink = Path.unlink

    def killed_at_unlink(self: Path, missing_ok: bool = False) -> None:
        if self.suffix == ".log":
            raise _Killed()
        real_unlink(self, missing_ok)

    monkeypatch.setattr(Path, "unlink", killed_at_unlink)
    with pytest.raises(_Killed):  # process C cut segment 0 after offset 0 to rewrite 1-5, and died
        recovered(tmp_path, 3 * size)
    monkeypatch.setattr(Path, "unlink", real_unlink)
    assert log_file(tmp_path).stat().st_size == size
    raw = bytearray(j1.read_bytes())
    raw[2 * ENTRY_HEADER.size + size + 30] ^= 0xFF  # J1's entry for offset 2: J1 reads [1], J2 [5]
    j1.write_bytes(bytes(raw))
    with pytest.raises(LogCorruptError, match="does not follow"):
        recovered(tmp_path, 3 * size)
