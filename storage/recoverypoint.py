"""A log's recovery point (``<log dir>/recovery-point``, Kafka's recovery-point-offset-checkpoint): the
segment and byte up to which the log is known on disk, how a log records it (``RecoveryPointOwner``), and
how recovery reads it back and checks the log against it (storage.log ``recover``). A claim is
``(segment base offset, byte)``; ``(-1, 0)`` is none."""

import os
import threading
import time
from pathlib import Path

from storage.segments import Segment, fsync_path, segment_name

RECOVERY_POINT = "recovery-point"

Claim = tuple[int, int]
Place = tuple[int, int]  # a segment's index in the log's list, and a byte in it

_CLAIM_LOCKS: dict[str, threading.RLock] = {}
_CLAIM_LOCKS_GUARD = threading.Lock()


def claim_lock(directory: Path) -> threading.RLock:
    """One lock per log directory, shared by every PartitionLog opened on it (a reload opens a new
    one): recovery points are installed from the writer thread and from storage.sync's recorder."""
    with _CLAIM_LOCKS_GUARD:
        return _CLAIM_LOCKS.setdefault(str(directory), threading.RLock())


def read_claim(directory: Path) -> Claim:
    """The claim on disk, (-1, 0) if none is readable."""
    try:
        base, position = (directory / RECOVERY_POINT).read_text().split()
        return int(base), int(position)
    except (OSError, ValueError):
        return -1, 0


def _claims_nothing(claim: Claim) -> bool:
    """No recovery point, or (0, 0): no byte claimed (an older kcoord recorded that for a first segment
    whose file could not be created)."""
    return claim[0] < 0 or claim == (0, 0)


def short_of(segments: list[Segment], claim: Claim) -> str | None:
    """Why the log ends before its recovery point, or None: its newest segments removed, or the active
    one cut short at a batch boundary (which reads as a clean end). Served, acknowledged commits would
    silently go back to older offsets, and the next claim recorded would hide it. A closed segment
    that a compaction has since merged is shorter than a claim recorded in it and is not checked (a
    cut of the active segment is: no compaction touches it)."""
    known_base, known_position = claim
    if _claims_nothing(claim):
        return None
    last = segments[-1] if segments else None
    if last is None or last.base_offset < known_base:
        return f"no segment at or after the recovery point's {segment_name(known_base)}: segments were removed"
    if last.base_offset == known_base and last.size < known_position:
        return (f"{last.path.name} ends at byte {last.size}, before the recovery point's byte {known_position}: "
                f"acknowledged batches were removed")
    return None


def run_reaches(segments: list[Segment], claim: Claim, at: Place | None, run: list[bytes]) -> bool:
    """Whether the log, with the journal's ``run`` written at ``at`` (None: at its end), would pass
    ``short_of``. False where that depends on where the run's appends roll to a new segment (the
    recovery point in a segment past ``at``, which the rewrite removes)."""
    known_base, known_position = claim
    if _claims_nothing(claim):
        return True
    if at is None:
        if not segments:
            return False
        at = (len(segments) - 1, segments[-1].size)
    base = segments[at[0]].base_offset
    if base != known_base:
        return base > known_base
    return at[1] + sum(len(b) for b in run) >= known_position


class RecoveryPointOwner:
    """How a PartitionLog (storage.log) records its recovery point: the claim taken from its synced end,
    written durably and installed under the directory's claim lock, and read back. When one is due
    (``checkpoint_due``) stays with the log, which keeps the synced end and the lock these read."""

    directory: Path
    _synced_base: int  # the synced end: base offset of the segment it lies in, -1 before anything is
    _synced_size: int  # and that segment's synced size
    _checkpointed_at: float  # time.monotonic() of the last claim recorded (or handed to the recorder)
    _claim_lock: threading.RLock  # claim_lock(directory)

    def take_claim(self) -> tuple[int, int] | None:
        """The current claim, handed to storage.sync's recorder: it counts as recorded from now, so
        the next one is due an interval later whether or not the recorder is done with this one."""
        self._checkpointed_at = time.monotonic()
        return self.claim()

    def checkpoint(self) -> None:
        """Records how far the log is known durable: written to a temporary file, fsynced, renamed
        into place and the directory fsynced, so after a crash the file holds the old or the new claim
        (both true, since the data was fsynced first), never a torn one."""
        if self._synced_base < 0:
            return
        with self._claim_lock:  # the claim written is the current one: it replaces whatever is in place
            tmp = self.write_checkpoint()
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            self.install_checkpoint(tmp)
        fsync_path(self.directory)

    def claim_recorded(self) -> bool:
        """The recovery point on disk is the current claim (a clean close recorded it), or there is none
        to record: what lets a clean stop remove the journal, whose synced ends it replaces."""
        claim = self.claim()
        return claim is None or read_claim(self.directory) == claim

    def claim(self) -> tuple[int, int] | None:
        """How far the log is durable now, as a recovery point records it; None before anything is."""
        return (self._synced_base, self._synced_size) if self._synced_base >= 0 else None

    def write_checkpoint(self, claim: tuple[int, int] | None = None, name: str = RECOVERY_POINT + ".tmp") -> Path:
        """A claim (by default the current one) in a temporary file, not yet fsynced (``checkpoint``,
        or storage.sync's recorder, which writes claims taken earlier under a name of its own)."""
        base, position = claim or (self._synced_base, self._synced_size)
        tmp = self.directory / name
        with open(tmp, "w") as f:
            f.write(f"{base} {position}\n")
        return tmp

    def install_checkpoint(self, tmp: Path, taken: tuple[int, int] | None = None) -> bool:
        """Renames a durable temporary claim into place (the directory still needs syncing). A claim
        ``taken`` earlier (storage.sync's recorder) is dropped instead if the claim in place is newer:
        claims only move forward, and an old one put back over a newer one would let a compaction
        that merged segments since make durable bytes look like a torn tail. False if dropped."""
        with self._claim_lock:
            if taken is not None and taken < self.recorded_claim():
                tmp.unlink(missing_ok=True)
                return False
            os.replace(tmp, self.directory / RECOVERY_POINT)
        self._checkpointed_at = time.monotonic()
        return True

    def recorded_claim(self) -> tuple[int, int]:
        """The claim on disk, (-1, 0) if none is readable."""
        return read_claim(self.directory)
