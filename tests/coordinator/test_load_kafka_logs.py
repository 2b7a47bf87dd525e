"""Logs shaped the way a Kafka broker writes them load through the same path: compressed batches,
a leader epoch and baseSequence 0 (as the new coordinator runtime writes), transactional offset
commits and COMMIT/ABORT control markers (reference 8.1-8.3, 9.3 and behaviour vector 20)."""

import struct
from pathlib import Path

import crc32c
import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from coordinator.shardstate import ShardState
from protocol.partitioning import partition_for
from protocol.records import OffsetAndMetadata, OffsetCommitRecord, OffsetKey, encode_record
from storage.log import PartitionLog
from tests.coordinator.harness import OK, append, config, started, stop

T = 1_700_000_000_000
GZIP, TRANSACTIONAL, CONTROL = 1, 0x10, 0x20

# every test loads both ways: compiled loadcodec and pure Python (tests/coordinator/conftest.py)
pytestmark = pytest.mark.usefixtures("both_loader_paths")


def kafka_batch(base: int, entries: list[tuple[bytes, bytes | None]], compression: int = 0,
                producer: tuple[int, int] = (-1, -1), transactional: bool = False, control: bool = False) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=compression, is_transactional=transactional,
                                        producer_id=producer[0], producer_epoch=producer[1], base_sequence=0,
                                        batch_size=1 << 30)
    for delta, (key, value) in enumerate(entries):
        builder.append(delta, T, key, value, [])
    buf = builder.build()
    struct.pack_into(">qii", buf, 0, base, len(buf) - 12, 7)  # base offset, length, leader epoch 7
    if control:  # brokers write control batches; set the bit and re-sign the batch
        attributes = struct.unpack_from(">h", buf, 21)[0] | CONTROL
        struct.pack_into(">h", buf, 21, attributes)
        struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    return bytes(buf)


def marker(commit: bool) -> tuple[bytes, bytes]:
    return struct.pack(">hh", 0, 1 if commit else 0), struct.pack(">hi", 0, 5)


def offset(group: str, partition: int, value: int) -> tuple[bytes, bytes | None]:
    return encode_record(OffsetCommitRecord(OffsetKey(group, "t", partition), OffsetAndMetadata(value, -1, "", T)))


async def test_compressed_transactional_and_control_batches(tmp_path: Path) -> None:
    group = "kafka-written"
    p = partition_for(group, 1)
    plog = PartitionLog(tmp_path / f"__consumer_offsets-{p}")
    batches = [
        kafka_batch(0, [offset(group, 0, 5), offset(group, 1, 50)], compression=GZIP),
        kafka_batch(2, [offset(group, 0, 7), (encode_record(OffsetCommitRecord(OffsetKey(group, "t", 1), None)))]),
        kafka_batch(4, [offset(group, 0, 9)], producer=(9, 0), transactional=True),
        kafka_batch(5, [marker(commit=False)], producer=(9, 0), transactional=True, control=True),
        kafka_batch(6, [offset(group, 2, 11)], producer=(10, 0), transactional=True),
        kafka_batch(7, [marker(commit=True)], producer=(10, 0), transactional=True, control=True),
        kafka_batch(8, [offset(group, 3, 13)], producer=(11, 0), transactional=True),  # still open
    ]
    for b in batches:
        plog.append(b, struct.unpack_from(">q", b, 0)[0] + struct.unpack_from(">i", b, 23)[0])
    plog.sync()
    plog.close()

    runtime = await started(config(tmp_path))
    shard = runtime.shards[0]
    assert shard.state is ShardState.ACTIVE
    data = shard.data
    assert data.committed(group, "t", 0) == OffsetAndMetadata(7, -1, "", T)  # the aborted 9 never shows
    assert data.committed(group, "t", 1) is None  # tombstoned
    assert data.committed(group, "t", 2) == OffsetAndMetadata(11, -1, "", T)  # committed transaction
    assert data.committed(group, "t", 3) is None and data.has_pending(OffsetKey(group, "t", 3))
    # new writes continue after the last offset Kafka wrote
    assert await append(shard, [OffsetCommitRecord(OffsetKey(group, "t", 0), OffsetAndMetadata(20, -1, "", T))]) == OK
    await stop(runtime)
    offsets = [r.offset for b in PartitionLog(tmp_path / f"__consumer_offsets-{p}").recover() for r in b.records]
    assert offsets == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
