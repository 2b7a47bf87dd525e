"""Small offsets logs written with the service's own storage code, for the pipeline's tests."""

import struct
from pathlib import Path

from protocol.records import (
    GroupMetadata,
    GroupMetadataRecord,
    MemberMetadata,
    OffsetAndMetadata,
    OffsetCommitRecord,
    OffsetKey,
    encode_record,
)
from storage.batchwriter import build_batch
from storage.log import RECOVERY_POINT, PartitionLog

T = 1_700_000_000_000
Entry = tuple[bytes, bytes | None]


def commit(group: str, topic: str, partition: int, offset: int, metadata: str = "", ts: int = T) -> Entry:
    return encode_record(OffsetCommitRecord(OffsetKey(group, topic, partition), OffsetAndMetadata(offset, -1, metadata,
                                                                                                 ts)))


def tombstone(group: str, topic: str, partition: int) -> Entry:
    return encode_record(OffsetCommitRecord(OffsetKey(group, topic, partition), None))


def group_record(group: str, generation: int, members: tuple[str, ...]) -> Entry:
    value = GroupMetadata("consumer", generation, "range", members[0] if members else None, T,
                          tuple(MemberMetadata(m, None, "client", "/127.0.0.1", 30000, 10000, b"sub", b"asg")
                                for m in members))
    return encode_record(GroupMetadataRecord(group, value))


def last_offset(batch: bytes) -> int:
    return int(struct.unpack_from(">q", batch, 0)[0] + struct.unpack_from(">i", batch, 23)[0])


def write_partition(directory: Path, batches: list[bytes], checkpoint: bool = True,
                    segment_bytes: int | None = None) -> list[int]:
    """Appends ready-made batches as one partition's log; returns each batch's byte position. Without
    ``checkpoint`` no recovery point is left (as in a Kafka broker's directory)."""
    plog = PartitionLog(directory) if segment_bytes is None else PartitionLog(directory, segment_bytes)
    positions, pos = [], 0
    for batch in batches:
        positions.append(pos)
        plog.append(batch, last_offset(batch))
        pos += len(batch)
    plog.sync()
    plog.checkpoint()
    plog.close()
    if not checkpoint:
        (directory / RECOVERY_POINT).unlink()
    return positions


def plain_batches(entries: list[list[Entry]], first_offset: int = 0, ts: int = T) -> list[bytes]:
    """One batch per list of entries, at consecutive offsets."""
    out, offset = [], first_offset
    for chunk in entries:
        out.append(build_batch(offset, chunk, ts))
        offset += len(chunk)
    return out
