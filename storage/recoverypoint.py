"""A log's recovery point (``<log dir>/recovery-point``, Kafka's recovery-point-offset-checkpoint): the
segment and byte up to which the log is known on disk, read back at recovery, and the checks recovery
makes of a log against it (storage.log ``recover``). A claim is ``(segment base offset, byte)``;
``(-1, 0)`` is none."""

import threading
from pathlib import Path

from storage.segments import Segment, segment_name

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
