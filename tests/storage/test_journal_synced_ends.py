"""The synced-ends entry a checkpoint writes to the journal (storage.journal ``write_synced_ends``): how
far each log was on disk once the checkpoint's syncfs completed, which recovery holds the log to. A
fault campaign found the gap it closes: a partition idle since a checkpoint deleted its journal
batches, and before its recovery point was next recorded (at most every 30 s), had acknowledged,
synced bytes past that point and nothing in the journal; a byte flipped there read as a torn tail,
cut aside with the acknowledged commits in it and a WARNING."""

from pathlib import Path

import pytest

from storage.journal import Journal, left_over
from storage.journalentries import ENTRY_HEADER, SYNCED_ENDS, entry_crc, read_entries, segment_name, unpack_synced_ends
from storage.log import LogCorruptError, PartitionLog
from storage.segments import kept_journal_end
from tests.storage.test_journal import P, acknowledged, batch, log_file, opened, recovered


def checkpoint(journal: Journal, logs: list[PartitionLog], complete: bool = True) -> None:
    """What coordinator.checkpointer does around its syncfs (the logs' bytes reach the disk here anyway:
    nothing below cuts a page); ``complete``: False stops where a crash before the syncfs ends would."""
    ends = [plog.acknowledged_end() for plog in logs]
    boundary = journal.rotate()
    journal.write_synced_ends({plog.partition: end[0] for plog, end in zip(logs, ends, strict=True)})
    if not complete:
        return
    drop = journal.droppable(boundary)
    journal.delete([seg.path for seg in drop])
    journal.checkpointed(boundary)
    journal.deleted(drop)
    for plog, end in zip(logs, ends, strict=True):
        plog.disk_synced(end)


def crashed(journal: Journal, plog: PartitionLog) -> None:
    plog.close()
    journal.close(remove=False)


def synced_then_idle(tmp_path: Path) -> None:
    """Offsets 0-2 acknowledged, then checkpointed twice (the second as a later checkpoint for other
    partitions' commits would: the journal then holds none of this one's batches); the process dies."""
    journal, plog = opened(tmp_path)
    acknowledged(journal, plog, [batch(0), batch(1)])
    acknowledged(journal, plog, [batch(2)])
    checkpoint(journal, [plog])
    checkpoint(journal, [plog])
    assert journal.entries_for(P) == [] and left_over(tmp_path) == 0
    crashed(journal, plog)


def flip_in_last_batch(tmp_path: Path) -> bytes:
    raw = bytearray(log_file(tmp_path).read_bytes())
    raw[len(raw) - len(batch(2)) // 2] ^= 0xFF
    log_file(tmp_path).write_bytes(bytes(raw))
    return bytes(raw)


@pytest.mark.parametrize("damage", ["flip", "cut at a batch boundary"])
def test_damage_in_a_synced_tail_the_journal_no_longer_holds_fails_the_partition(tmp_path: Path, damage: str) -> None:
    synced_then_idle(tmp_path)
    if damage == "flip":
        raw = flip_in_last_batch(tmp_path)
    else:
        raw = log_file(tmp_path).read_bytes()[: -len(batch(2))]
        log_file(tmp_path).write_bytes(raw)
    journal, plog = opened(tmp_path, recover=False)
    with pytest.raises(LogCorruptError, match="acknowledged"):
        list(plog.recover())
    assert log_file(tmp_path).read_bytes() == raw  # nothing cut: the log as found, for the repair
    assert not list(log_file(tmp_path).parent.glob("*.tr"))
    crashed(journal, plog)


def test_a_failed_partitions_synced_end_outlasts_the_journal_until_the_operator_removes_it(tmp_path: Path) -> None:
    synced_then_idle(tmp_path)
    flip_in_last_batch(tmp_path)
    journal, plog = opened(tmp_path, recover=False)
    with pytest.raises(LogCorruptError):
        list(plog.recover())
    kept = plog.abandon_journal()
    assert kept is not None and kept.batches is None  # the journal holds no batch of it: only its synced end
    copy = kept.synced_end
    assert copy is not None
    assert copy.name == "journal-synced-end.0.tr" and copy.read_text() == "3\n"
    assert kept_journal_end(copy.parent) == (3, copy.name)
    plog.close()
    journal.close(remove=True)  # a clean stop: the journal and its synced-ends entries are gone
    assert not list((tmp_path / "journal").iterdir())
    journal, plog = opened(tmp_path, recover=False)
    with pytest.raises(LogCorruptError, match=r"journal-synced-end\.0\.tr"):
        list(plog.recover())
    crashed(journal, plog)
    copy.unlink()  # the operator accepts the loss: the damaged tail is cut aside as a torn one
    journal, plog, offsets = recovered(tmp_path)
    assert offsets == [0, 1] and len(list(log_file(tmp_path).parent.glob("*.log.*.tr"))) == 1
    crashed(journal, plog)


def test_a_checkpoint_that_never_completed_claims_nothing_its_kept_segments_do_not_bring_back(tmp_path: Path) -> None:
    """The synced-ends entry is written before the syncfs, and may reach the disk without it (the next
    journal sync): the segments it would have deleted are still there, and their batches are written
    over whatever the log lost."""
    journal, plog = opened(tmp_path)
    acknowledged(journal, plog, [batch(0)])
    checkpoint(journal, [plog])
    synced_size = log_file(tmp_path).stat().st_size
    acknowledged(journal, plog, [batch(1), batch(2)])
    checkpoint(journal, [plog], complete=False)
    crashed(journal, plog)
    with open(log_file(tmp_path), "r+b") as f:  # the syncfs never ran: the log lost its unsynced pages
        f.truncate(synced_size)
    journal, plog, offsets = recovered(tmp_path)
    assert offsets == [0, 1, 2]
    crashed(journal, plog)


def test_synced_ends_are_read_back_at_a_start_and_are_not_batches(tmp_path: Path) -> None:
    journal, plog = opened(tmp_path)
    other = PartitionLog(tmp_path / "__consumer_offsets-4")
    other.journal, other.partition = journal, 4
    list(other.recover())
    acknowledged(journal, plog, [batch(0), batch(1, 4)])
    checkpoint(journal, [plog, other])
    assert journal.synced_end(P) == 5 and journal.synced_end(4) == 0 and journal.synced_end(7) == -1
    # a live segment holding only them is not something to checkpoint, nor to rotate away from, nor to
    # write again unchanged
    assert journal.live_size == 0 and journal.live.size > 0
    live = journal.live.seq
    checkpoint(journal, [plog, other])
    assert journal.live.seq == live and journal.retained == 1
    assert [p for p, _, _ in read_entries(journal.live.path)] == [SYNCED_ENDS]
    # each entry is complete: one for a checkpoint while partition 4 reloads still names it
    other.recovered = False
    checkpoint(journal, [plog])
    assert [p for p, _, _ in read_entries(journal.live.path)] == [SYNCED_ENDS]
    acknowledged(journal, plog, [batch(5)])
    checkpoint(journal, [plog])
    assert journal.live.seq != live and journal.synced_end(P) == 6 and journal.synced_end(4) == 0
    crashed(journal, plog)
    other.close()
    assert left_over(tmp_path) == 0
    journal = Journal(tmp_path)
    assert journal.synced_end(P) == 6 and journal.synced_end(4) == 0
    assert journal.unapplied == set() and journal.entries_for(P) == []
    journal.close(remove=False)


def test_batches_after_a_synced_ends_entry_for_no_log_are_read_back(tmp_path: Path) -> None:
    """A checkpoint while every partition loads for the first time (a start) marks no log: an empty
    entry, which must not end its segment, or the acknowledged batches journaled after it would be lost
    at the next start (it did, the first day)."""
    journal, plog = opened(tmp_path)
    journal.rotate()
    journal.write_synced_ends({})
    [(partition, body, _)] = read_entries(journal.live.path)
    assert partition == SYNCED_ENDS and unpack_synced_ends(body) == {}
    acknowledged(journal, plog, [batch(0), batch(1)])
    crashed(journal, plog)
    assert left_over(tmp_path) == 2
    journal, plog, offsets = recovered(tmp_path)
    assert offsets == [0, 1]
    crashed(journal, plog)


Q = 4


def other_log(data_dir: Path, journal: Journal) -> PartitionLog:
    plog = PartitionLog(data_dir / f"__consumer_offsets-{Q}")
    plog.journal, plog.partition = journal, Q
    list(plog.recover())
    return plog


def test_a_partition_still_loading_keeps_its_synced_end_through_a_checkpoint_that_drops_the_old_segments(
        tmp_path: Path) -> None:
    """A start after a crash: the idle partition P (a big log: the loader takes the smallest first) has not
    begun its recovery when the first checkpoint runs; nothing is held (no batch was left over), so the
    checkpoint drops the segment with P's synced end, and its own entry names only the logs recovered so
    far. Another crash, and the next start knows no synced end for P: the disk's damage to P's synced tail
    is cut as a torn one, with the acknowledged commit in it: the gap eec520d closes, open again."""
    journal, plog = opened(tmp_path)
    other = other_log(tmp_path, journal)
    acknowledged(journal, plog, [batch(0), batch(1), batch(2)])
    acknowledged(journal, other, [batch(0)])
    checkpoint(journal, [plog, other])
    checkpoint(journal, [plog, other])
    crashed(journal, plog)
    other.close()
    assert left_over(tmp_path) == 0
    journal = Journal(tmp_path)  # the next start: P is still queued for its load
    assert journal.synced_end(P) == 3
    other = other_log(tmp_path, journal)
    checkpoint(journal, [other])
    other.close()
    journal.close(remove=False)  # a crash before P's recovery
    flip_in_last_batch(tmp_path)  # the disk damages P's synced, acknowledged tail
    journal, plog = opened(tmp_path, recover=False)
    try:
        with pytest.raises(LogCorruptError, match="acknowledged"):
            list(plog.recover())
    finally:
        crashed(journal, plog)


def test_a_kcoord_from_before_synced_ends_entries_skips_them_and_reads_the_batches_after(tmp_path: Path) -> None:
    """Rolled back after a crash, a kcoord that predates these entries reads the journal by its own rules
    (an entry: a length of 61 or more, a partition of 0 or more, the CRC over the segment's number,
    partition and bytes; the first that is not ends the segment), and replays each partition's entries
    into that partition: the entry must pass as one of a partition it does not have, or every batch
    after it in the segment was lost (its first form, partition -1, ended the segment there)."""
    journal, plog = opened(tmp_path)
    acknowledged(journal, plog, [batch(0)])
    checkpoint(journal, [plog])
    acknowledged(journal, plog, [batch(1), batch(2)])
    raw, pos, older = journal.live.path.read_bytes(), 0, []
    while pos + ENTRY_HEADER.size <= len(raw):
        length, partition, crc = ENTRY_HEADER.unpack_from(raw, pos)
        body = raw[pos + ENTRY_HEADER.size : pos + ENTRY_HEADER.size + length]
        if not (61 <= length <= 1 << 30 and partition >= 0 and entry_crc(journal.live.seq, partition, body) == crc):
            break
        older.append(partition)
        pos += ENTRY_HEADER.size + length
    assert older == [SYNCED_ENDS, P, P] and SYNCED_ENDS == (1 << 31) - 1  # above any partition an int32 count has
    crashed(journal, plog)


def test_a_segment_written_with_the_first_form_of_the_entry_is_read_past_it(tmp_path: Path) -> None:
    """The entry's first form (partition -1, unpadded), which a kcoord of a few hours left in journals:
    read as synced ends, not as the end of its segment (the batches after it were dropped)."""
    directory = tmp_path / "journal"
    directory.mkdir()
    seq = 2
    old_body = (P).to_bytes(4, "big", signed=True) + (1).to_bytes(8, "big", signed=True)  # (partition, next offset)
    entry = ENTRY_HEADER.pack(len(old_body), -1, entry_crc(seq, -1, old_body)) + old_body
    acknowledged = [batch(1), batch(2)]
    data = entry + b"".join(ENTRY_HEADER.pack(len(b), P, entry_crc(seq, P, b)) + b for b in acknowledged)
    (directory / segment_name(seq)).write_bytes(data)
    read = [partition for partition, _, _ in read_entries(directory / segment_name(seq))]
    journal = Journal(tmp_path)
    replayed, synced = journal.entries_for(P), journal.synced_end(P)
    journal.close(remove=False)
    assert (left_over(tmp_path), replayed, synced) == (2, acknowledged, 1), f"entries read: {read}"



def test_the_stops_entry_in_a_segment_created_since_the_last_sync_makes_its_directory_entry_durable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stop's entry (one without a partition failed since) is the only thing that keeps that claim
    from failing the partition again after its repair: in a segment whose directory entry was never
    fsynced, a power cut could take the segment, entry and all (a review's find)."""
    journal, plog = opened(tmp_path)
    acknowledged(journal, plog, [batch(0)])
    checkpoint(journal, [plog])  # an entry names P
    (tmp_path / "aside").mkdir()
    journal.abandon(P, tmp_path / "aside")
    assert journal.entry_due
    live = journal.rotate_live()  # as a failed write rotates: a new segment, its directory entry not synced
    assert not live.dir_durable
    synced_dirs: list[Path] = []
    monkeypatch.setattr("storage.journal.fsync_path", lambda path: synced_dirs.append(Path(path)))
    plog.close()
    journal.close(remove=False)
    assert journal.directory in synced_dirs
    assert unpack_synced_ends(next(b for p, b, _ in read_entries(live.path) if p == SYNCED_ENDS)) == {}
