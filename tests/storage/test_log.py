import logging
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage.batchwriter import Entry, build_batch
from storage.log import RECOVERY_POINT, LogCorruptError, PartitionLog
from storage.recoverypoint import run_reaches
from storage.segments import ASIDE_KEPT, aside_files, list_segments, segment_name

T = 1700000000000


def write(plog: PartitionLog, count: int, per_batch: int = 1, value: bytes = b"v" * 50) -> None:
    for _ in range(count):
        base = plog.next_offset
        entries: list[Entry] = [(b"\x00\x01key-%d" % (base + i), value) for i in range(per_batch)]
        plog.append(build_batch(base, entries, T), base + per_batch - 1)
    plog.sync()


def crash_before_checkpoint(directory: Path) -> None:
    """As if the process died before recording how far the log is durable."""
    (directory / RECOVERY_POINT).unlink(missing_ok=True)


def offsets(directory: Path, segment_bytes: int = 1 << 20) -> list[int]:
    plog = PartitionLog(directory, segment_bytes)
    return [r.offset for b in plog.recover() for r in b.records]


def test_append_sync_recover(tmp_path: Path) -> None:
    plog = PartitionLog(tmp_path)
    write(plog, 5, per_batch=3)
    assert plog.durable_offset == 15
    plog.close()
    assert offsets(tmp_path) == list(range(15))


def test_short_writes_are_continued_and_every_byte_written_is_counted(tmp_path: Path, monkeypatch: Any) -> None:
    """os.write may write less than asked (then ENOSPC, on a filling disk): the rest is written, and
    the active segment's size counts what really went to the file, which the cut after a failed
    append relies on."""
    import errno
    import os

    plog = PartitionLog(tmp_path)
    list(plog.recover())
    real_write = os.write
    calls: list[int] = []

    def dribble(fd: int, data: Any) -> int:
        calls.append(len(data))
        return real_write(fd, bytes(data[:7]))

    monkeypatch.setattr(os, "write", dribble)
    batch = build_batch(0, [(b"\x00\x01key", b"v" * 50)], T)
    plog.append(batch, 0)
    assert len(calls) == -(-len(batch) // 7)  # seven bytes a call, to the end
    assert plog.segments[-1].size == len(batch) == (tmp_path / segment_name(0)).stat().st_size

    def then_full(fd: int, data: Any) -> int:
        if calls:
            raise OSError(errno.ENOSPC, "No space left on device")
        calls.append(len(data))
        return real_write(fd, bytes(data[:10]))

    calls.clear()
    monkeypatch.setattr(os, "write", then_full)
    with pytest.raises(OSError):
        plog.append(build_batch(1, [(b"\x00\x01key", b"w" * 50)], T), 1)
    assert plog.segments[-1].size == len(batch) + 10  # the ten bytes that did go in are counted
    monkeypatch.setattr(os, "write", real_write)
    plog.close()


def test_segments_roll_at_segment_bytes(tmp_path: Path) -> None:
    plog = PartitionLog(tmp_path, segment_bytes=1024)
    write(plog, 40)
    plog.close()
    segs = list_segments(tmp_path)
    assert len(segs) > 3
    assert segs[0].path.name == segment_name(0) == "00000000000000000000.log"
    assert all(s.size <= 1024 for s in segs)
    assert offsets(tmp_path, 1024) == list(range(40))
    reopened = PartitionLog(tmp_path, 1024)
    list(reopened.recover())
    write(reopened, 1)
    assert offsets(tmp_path, 1024) == list(range(41))


def test_incomplete_last_batch_is_cut_and_kept_aside(tmp_path: Path) -> None:
    plog = PartitionLog(tmp_path)
    write(plog, 3)
    plog.close()
    crash_before_checkpoint(tmp_path)
    seg = tmp_path / segment_name(0)
    whole = seg.read_bytes()
    seg.write_bytes(whole[:-10])
    assert offsets(tmp_path) == [0, 1]
    aside = list(tmp_path.glob("*.tr"))
    assert len(aside) == 1
    assert seg.read_bytes() + aside[0].read_bytes() == whole[:-10]


def test_corrupt_last_batch_is_a_torn_tail(tmp_path: Path) -> None:
    plog = PartitionLog(tmp_path)
    write(plog, 3)
    plog.close()
    crash_before_checkpoint(tmp_path)
    seg = tmp_path / segment_name(0)
    data = bytearray(seg.read_bytes())
    data[-5] ^= 0xFF
    seg.write_bytes(bytes(data))
    recovered = PartitionLog(tmp_path)
    assert [r.offset for b in recovered.recover() for r in b.records] == [0, 1]
    assert recovered.next_offset == 2
    write(recovered, 1)  # appends continue at offset 2 after the cut
    assert offsets(tmp_path) == [0, 1, 2]


def test_zero_filled_tail_is_torn(tmp_path: Path) -> None:
    plog = PartitionLog(tmp_path)
    write(plog, 2)
    plog.close()
    crash_before_checkpoint(tmp_path)
    with open(tmp_path / segment_name(0), "ab") as f:
        f.write(b"\x00" * 4096)
    assert offsets(tmp_path) == [0, 1]


def test_corruption_in_the_middle_fails_loudly(tmp_path: Path) -> None:
    plog = PartitionLog(tmp_path)
    write(plog, 5)
    plog.close()
    seg = tmp_path / segment_name(0)
    data = bytearray(seg.read_bytes())
    data[70] ^= 0xFF  # inside the first batch's records
    seg.write_bytes(bytes(data))
    with pytest.raises(LogCorruptError):
        offsets(tmp_path)
    assert seg.read_bytes() == bytes(data)  # nothing was cut


def test_corruption_in_a_known_durable_closed_segment_fails_loudly(tmp_path: Path) -> None:
    plog = PartitionLog(tmp_path, segment_bytes=512)
    write(plog, 20)
    plog.checkpoint()
    plog.close()
    first = list_segments(tmp_path)[0].path
    first.write_bytes(first.read_bytes()[:-4])  # looks torn, but it was recorded durable
    with pytest.raises(LogCorruptError):
        offsets(tmp_path, 512)


def test_torn_write_before_a_roll_cuts_the_newer_segments_too(tmp_path: Path) -> None:
    plog = PartitionLog(tmp_path, segment_bytes=512)
    write(plog, 2)
    plog.checkpoint()  # the recovery point is in segment 0
    for _ in range(12):  # one unsynced burst that rolls into new segments, then a crash
        base = plog.next_offset
        plog.append(build_batch(base, [(b"\x00\x01k", b"v" * 50)], T), base)
    plog.close()
    segs = list_segments(tmp_path)
    assert len(segs) > 1
    segs[0].path.write_bytes(segs[0].path.read_bytes()[:-7])  # segment 0's last append was torn
    recovered = offsets(tmp_path, 512)
    assert recovered == list(range(len(recovered))) and 2 <= len(recovered) < 14
    assert len(list_segments(tmp_path)) == 1
    assert len(list(tmp_path.glob("*.tr"))) == len(segs)  # every cut byte kept aside


def test_recovery_fsyncs_and_checkpoints_what_it_read(tmp_path: Path) -> None:
    plog = PartitionLog(tmp_path)
    write(plog, 3)
    plog.close()
    crash_before_checkpoint(tmp_path)
    reopened = PartitionLog(tmp_path)
    list(reopened.recover())
    assert (tmp_path / RECOVERY_POINT).read_text().split() == ["0", str(reopened.segments[0].size)]


def test_cuts_at_the_same_place_never_overwrite_each_other(tmp_path: Path) -> None:
    for _ in range(2):
        plog = PartitionLog(tmp_path)
        list(plog.recover())
        write(plog, 1)
        plog.close()
        crash_before_checkpoint(tmp_path)
        seg = tmp_path / segment_name(0)
        seg.write_bytes(seg.read_bytes()[:-5])
        assert offsets(tmp_path) == []
    assert len(list(tmp_path.glob("*.tr"))) == 2


def test_truncate_to_durable_undoes_unsynced_appends(tmp_path: Path) -> None:
    plog = PartitionLog(tmp_path, segment_bytes=1024)
    list(plog.recover())
    write(plog, 3)
    durable = plog.durable_offset
    for _ in range(30):  # enough to roll into new segments, never synced
        base = plog.next_offset
        plog.append(build_batch(base, [(b"\x00\x01x", b"y" * 50)], T), base)
    plog.truncate_to_durable()
    assert plog.next_offset == durable
    assert offsets(tmp_path, 1024) == list(range(durable))
    assert not list(tmp_path.glob("*.tr"))  # this process's own unacknowledged bytes: dropped, not kept
    assert len(list(tmp_path.glob("*.log"))) == 1  # the segments rolled after the durable end are gone
    write(plog, 1)
    assert offsets(tmp_path, 1024) == list(range(durable + 1))


def test_damage_below_the_recovery_point_is_corruption_not_a_torn_tail(tmp_path: Path) -> None:
    plog = PartitionLog(tmp_path)
    write(plog, 3)
    plog.checkpoint()  # as on a clean stop
    plog.close()
    seg = tmp_path / segment_name(0)
    data = bytearray(seg.read_bytes())
    data[-5] ^= 0xFF  # the last batch, but known durable: this is bit rot, not a torn write
    seg.write_bytes(bytes(data))
    with pytest.raises(LogCorruptError):
        offsets(tmp_path)
    assert not list(tmp_path.glob("*.tr"))


def test_damage_past_the_recovery_point_is_a_torn_tail(tmp_path: Path) -> None:
    plog = PartitionLog(tmp_path)
    write(plog, 2)
    plog.checkpoint()
    write(plog, 1)  # after the checkpoint: its durability is not recorded yet
    plog.close()
    seg = tmp_path / segment_name(0)
    seg.write_bytes(seg.read_bytes()[:-3])
    assert offsets(tmp_path) == [0, 1]


def clean_stop(directory: Path, count: int = 3) -> bytes:
    """A log written and closed cleanly (checkpointed at its end); returns the segment's bytes."""
    plog = PartitionLog(directory)
    write(plog, count)
    plog.checkpoint()
    plog.close()
    return (directory / segment_name(0)).read_bytes()


@pytest.mark.parametrize("tail", [
    bytes.fromhex("000000000000000080000000"),  # the fault campaign's: batch length -2147483648
    bytes.fromhex("00000000000000000000000a") + b"\x01" * 10,  # a length too short for a batch header
    b"\x00" * 7,  # shorter than a batch header
    b"\xff" * 100,
])
def test_any_tail_appended_after_a_clean_stop_is_cut_aside(tmp_path: Path, tail: bytes) -> None:
    original = clean_stop(tmp_path)
    seg = tmp_path / segment_name(0)
    seg.write_bytes(original + tail)
    assert offsets(tmp_path) == [0, 1, 2]
    assert seg.read_bytes() == original
    kept = list(tmp_path.glob("*.tr"))
    assert len(kept) == 1 and kept[0].read_bytes() == tail


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tail=st.binary(min_size=1, max_size=300))
def test_random_tails_past_the_recovery_point_never_fail_the_partition(tmp_path_factory: Any, tail: bytes) -> None:
    directory = tmp_path_factory.mktemp("tail")
    original = clean_stop(directory)
    (directory / segment_name(0)).write_bytes(original + tail)
    assert offsets(directory) == [0, 1, 2]


def test_the_recovery_point_file_is_written_atomically_and_fsynced(tmp_path: Path, monkeypatch: Any) -> None:
    import os

    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    clean_stop(tmp_path)
    assert any(p.endswith(RECOVERY_POINT + ".tmp") for p in synced)
    assert (tmp_path / RECOVERY_POINT).read_text().split() == ["0", str((tmp_path / segment_name(0)).stat().st_size)]
    assert not (tmp_path / (RECOVERY_POINT + ".tmp")).exists()


def test_a_repeated_batch_past_the_recovery_point_is_cut_aside_not_corruption(tmp_path: Path) -> None:
    """Fault campaign D6: a valid copy of the last batch appended after a clean stop went backwards in
    offsets and failed the partition for good."""
    original = clean_stop(tmp_path)
    seg = tmp_path / segment_name(0)
    last = original[-len(original) // 3:]  # the 3 batches are the same size: the last one
    seg.write_bytes(original + last)
    assert offsets(tmp_path) == [0, 1, 2]
    assert [p.read_bytes() for p in tmp_path.glob("*.tr")] == [last]


def test_a_failed_copy_of_a_damaged_tail_leaves_nothing_behind_and_says_so(tmp_path: Path, monkeypatch: Any) -> None:
    """Fault campaign D4: with no room to keep a torn tail aside, recovery stops before it (TailNotCut)
    after reading everything valid, and no empty .tr files pile up."""
    import errno
    import os

    from storage.log import TailNotCut

    original = clean_stop(tmp_path)
    (tmp_path / segment_name(0)).write_bytes(original + b"\xff" * 50)
    real_fsync = os.fsync

    def full(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".tr"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full)
    plog = PartitionLog(tmp_path)
    read: list[int] = []
    with pytest.raises(TailNotCut):
        for batch in plog.recover():
            read.extend(r.offset for r in batch.records)
    assert read == [0, 1, 2]
    assert not list(tmp_path.glob("*.tr"))
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert offsets(tmp_path) == [0, 1, 2]  # space is back: cut and kept


def test_a_checkpoint_that_cannot_be_written_does_not_fail_a_durable_sync(tmp_path: Path, monkeypatch: Any) -> None:
    """Fault campaign D5: out of file descriptors, the recovery-point write failed and took the
    already-fsynced batch down with it."""
    import errno

    import storage.log

    plog = PartitionLog(tmp_path)
    list(plog.recover())

    def no_fds(self: PartitionLog) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(storage.log, "CHECKPOINT_INTERVAL_S", 0.0)
    monkeypatch.setattr(PartitionLog, "checkpoint", no_fds)
    write(plog, 2)  # sync() must not raise
    assert plog.durable_offset == 2


def segments_of(directory: Path, count: int, segment_bytes: int = 300) -> list[Path]:
    """``count`` one-record batches in segments of ~2 batches, closed cleanly (checkpointed at the end)."""
    plog = PartitionLog(directory, segment_bytes)
    write(plog, count)
    plog.checkpoint()
    plog.close()
    paths = sorted(directory.glob("*.log"))
    assert len(paths) > 2
    return paths


def test_a_removed_newest_segment_is_corruption_not_a_shorter_log(tmp_path: Path) -> None:
    """A fault campaign deleted the newest segment of a cleanly stopped log: it loaded without a word,
    served older offsets for acknowledged commits, and recorded a recovery point further back."""
    segments_of(tmp_path, 7)[-1].unlink()
    claim = (tmp_path / RECOVERY_POINT).read_text()
    with pytest.raises(LogCorruptError, match="segments were removed"):
        offsets(tmp_path, 300)
    assert (tmp_path / RECOVERY_POINT).read_text() == claim


def test_an_active_segment_cut_at_a_batch_boundary_below_the_recovery_point_is_corruption(tmp_path: Path) -> None:
    newest = segments_of(tmp_path, 8)[-1]
    data = newest.read_bytes()
    first = 12 + int.from_bytes(data[8:12], "big")
    assert first < len(data)
    newest.write_bytes(data[:first])  # a clean end, one batch short
    with pytest.raises(LogCorruptError, match="acknowledged batches were removed"):
        offsets(tmp_path, 300)


def test_a_claim_in_a_closed_segment_that_compaction_shortened_still_loads(tmp_path: Path) -> None:
    """The cleaner rewrites closed segments smaller; a claim recorded in one of them (its durable end
    was there when it was recorded) is older than the log's end, not past it."""
    paths = segments_of(tmp_path, 7)
    closed = paths[-2]
    data = closed.read_bytes()
    (tmp_path / RECOVERY_POINT).write_text(f"{int(closed.name[:20])} {len(data)}\n")
    first = 12 + int.from_bytes(data[8:12], "big")
    closed.write_bytes(data[:first])  # as if compacted to its first batch
    assert len(offsets(tmp_path, 300)) == 6


def test_an_unreadable_recovery_point_is_logged(tmp_path: Path, caplog: Any) -> None:
    segments_of(tmp_path, 5)
    (tmp_path / RECOVERY_POINT).write_text("not a claim\n")
    assert offsets(tmp_path, 300) == list(range(5))
    assert "recovery-point is unreadable" in caplog.text


def test_the_probe_fails_while_the_active_segment_cannot_be_opened(tmp_path: Path) -> None:
    """The directory takes new files, the active segment refuses appends (immutable here; owned by
    another user in a container): the partition must stay read-only, not reload on every commit."""
    import shutil
    import subprocess

    plog = PartitionLog(tmp_path)
    write(plog, 2)
    plog.close()
    active = tmp_path / segment_name(0)
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(active)],
                                                        capture_output=True).returncode != 0:
        pytest.skip("no chattr +i here")
    try:
        with pytest.raises(PermissionError):
            plog.probe()
    finally:
        subprocess.run(["chattr", "-i", str(active)], check=True)
    plog.probe()


def test_a_segment_whose_file_cannot_be_created_is_not_listed(tmp_path: Path, monkeypatch: Any) -> None:
    """Fault campaign: a first segment whose open failed (EMFILE) stayed listed without a file; a clean
    stop synced it and recorded (0, 0) as the recovery point, and the next start failed the partition,
    "segments were removed", though nothing had been written."""
    import errno
    import os

    plog = PartitionLog(tmp_path)
    list(plog.recover())
    real_open = os.open

    def no_descriptor(path: Any, flags: int, mode: int = 0o777) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(os, "open", no_descriptor)
    with pytest.raises(OSError):
        plog.append(build_batch(0, [(b"\x00\x01key", b"v")], T), 0)
    monkeypatch.setattr(os, "open", real_open)
    assert plog.segments == []
    plog.truncate_to_durable()  # what a failed write leads to
    plog.sync()
    plog.checkpoint()
    plog.close()
    assert offsets(tmp_path) == []  # no "segments were removed"
    reopened = PartitionLog(tmp_path)
    list(reopened.recover())
    write(reopened, 2)
    reopened.close()
    assert offsets(tmp_path) == [0, 1]


def test_a_recovery_point_claiming_nothing_needs_no_segment(tmp_path: Path) -> None:
    """(0, 0), which the defect above recorded, claims no byte: a log without segments passes it."""
    (tmp_path / RECOVERY_POINT).write_text("0 0")
    assert offsets(tmp_path) == []
    assert run_reaches([], (0, 0), None, [b"batch"])  # a journal run written back passes it too (a review's find)
    (tmp_path / RECOVERY_POINT).write_text("0 1")
    with pytest.raises(LogCorruptError, match="segments were removed"):
        offsets(tmp_path)


def _earlier_asides(directory: Path, count: int) -> list[Path]:
    """``count`` files of bytes set aside by earlier recoveries, an hour apart, oldest first."""
    made = []
    for i in range(count):
        path = directory / f"{segment_name(i)}.{i}.tr"
        path.write_bytes(b"x" * (i + 1))
        os.utime(path, ns=(0, (T - (count - i) * 3_600_000) * 1_000_000))
        made.append(path)
    return made


def test_a_recovery_keeps_the_newest_files_set_aside_and_says_what_it_removed(tmp_path: Path, caplog: Any) -> None:
    """Every kill -9 that leaves unacknowledged batches in a log, and every reload after a failed
    journal write, sets some aside; nothing removed them, and a crash loop or a flapping disk piled them
    up without bound. A recovery keeps the newest ASIDE_KEPT, its own always, and names what it removes.
    A failed partition's journal copy (for its repair) and other files are not counted or touched."""
    plog = PartitionLog(tmp_path)
    write(plog, 3)
    plog.close()
    crash_before_checkpoint(tmp_path)
    seg = tmp_path / segment_name(0)
    seg.write_bytes(seg.read_bytes()[:-10])  # a torn tail: this recovery sets it aside
    earlier = _earlier_asides(tmp_path, ASIDE_KEPT + 2)
    journal_copy = tmp_path / "journal-batches.0.tr"
    journal_copy.write_bytes(b"kept for a repair")
    os.utime(journal_copy, ns=(0, 0))
    with caplog.at_level(logging.WARNING, logger="storage.segments"):
        assert offsets(tmp_path) == [0, 1]
    left = [p for p, _ in aside_files(tmp_path)]
    assert left == [*earlier[3:], tmp_path / f"{segment_name(0)}.{seg.stat().st_size}.tr"]  # 9 older + its own
    assert journal_copy.exists() and len(left) == ASIDE_KEPT
    removed = [r.getMessage() for r in caplog.records if "removed the" in r.getMessage()]
    assert removed == [f"{tmp_path}: removed the 3 oldest files of bytes set aside (6 bytes; the newest "
                       f"{ASIDE_KEPT} are kept): {', '.join(p.name for p in earlier[:3])}"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="storage.segments"):
        assert offsets(tmp_path) == [0, 1]  # nothing more set aside, nothing more removed
    assert [p for p, _ in aside_files(tmp_path)] == left and not caplog.records


def test_a_recovery_keeps_all_it_set_aside_itself(tmp_path: Path) -> None:
    """More than ASIDE_KEPT segments after a torn write: every one is kept (only earlier ones go), and
    a segment set aside whole counts from when it was, not from its last write."""
    plog = PartitionLog(tmp_path, segment_bytes=200)
    write(plog, ASIDE_KEPT + 3)
    plog.close()
    crash_before_checkpoint(tmp_path)
    segs = list_segments(tmp_path)
    assert len(segs) == ASIDE_KEPT + 3
    os.utime(segs[-1].path, ns=(0, 0))  # written long ago
    earlier = _earlier_asides(tmp_path, 2)
    segs[0].path.write_bytes(segs[0].path.read_bytes()[:-10])  # the first segment's only batch, torn
    assert offsets(tmp_path, 200) == []
    left = [p.name for p, _ in aside_files(tmp_path)]
    assert len(left) == ASIDE_KEPT + 3 and not any(p.exists() for p in earlier)
    assert left[-1] == f"{segs[-1].path.name}.0.tr"  # set aside last, so the newest


def test_a_removal_that_fails_midway_still_names_what_was_removed(tmp_path: Path, caplog: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The removals go one by one: when one fails (EACCES, EIO), those before it are gone already and
    are named in the WARNING as any removal is; the rest stay for a later recovery, which says so."""
    plog = PartitionLog(tmp_path)
    write(plog, 3)
    plog.close()
    earlier = _earlier_asides(tmp_path, ASIDE_KEPT + 3)
    unlink = Path.unlink

    def refuse_the_second(path: Path, missing_ok: bool = False) -> None:
        if path == earlier[1]:
            raise PermissionError(13, "Permission denied", str(path))
        unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", refuse_the_second)
    with caplog.at_level(logging.WARNING, logger="storage"):
        assert offsets(tmp_path) == [0, 1, 2]
    assert not earlier[0].exists() and all(p.exists() for p in earlier[1:])
    messages = [r.getMessage() for r in caplog.records]
    assert f"{tmp_path}: removed the 1 oldest files of bytes set aside (1 bytes; the newest {ASIDE_KEPT} are " \
           f"kept): {earlier[0].name}" in messages, messages
    assert any("could not remove old files of bytes set aside (Permission denied)" in m for m in messages), messages
    monkeypatch.setattr(Path, "unlink", unlink)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="storage"):
        assert offsets(tmp_path) == [0, 1, 2]
    assert [p for p, _ in aside_files(tmp_path)] == earlier[3:]


def test_a_segment_whose_time_cannot_be_set_is_set_aside_all_the_same(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A segment set aside whole is renamed, then given the time it was set aside (for pruning's order).
    The rename needs only the directory; the time, ownership or write access of the file: one another user
    owns (copied in as root, say) could be renamed but not touched. The failure came after the rename and
    failed the recovery, whose retry found the segments after it still there and served them, past a
    torn write. The time is only an order: the move stands, and the later segments go aside too."""
    plog = PartitionLog(tmp_path, segment_bytes=200)
    write(plog, 4)
    plog.close()
    crash_before_checkpoint(tmp_path)
    segs = list_segments(tmp_path)
    assert len(segs) == 4
    segs[0].path.write_bytes(segs[0].path.read_bytes()[:-10])  # the first segment's only batch, torn

    def not_permitted(*args: Any, **kwargs: Any) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "utime", not_permitted)
    assert offsets(tmp_path, 200) == []
    assert [s.path.name for s in list_segments(tmp_path)] == [segs[0].path.name]
    assert sorted(p.name for p, _ in aside_files(tmp_path)) == sorted(
        [f"{segs[0].path.name}.0.tr", *(f"{s.path.name}.0.tr" for s in segs[1:])])
