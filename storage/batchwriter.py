"""Writing Kafka v2 record batches: aiokafka's C builder driven from compiled code (setup.py).

Split from storage/batch.py (which reads batches too, and stays interpreted) because the loop that
feeds the builder runs once per record of every flush cycle: interpreted, with the per-entry size
estimate the flush used to split cycles into ~1 MiB batches, it was ~20% of the event loop's time for
100-partition commits (py-spy on ``bench.request_path``). The builder's own size limit now does the
splitting.
"""

import struct
from typing import Final

from aiokafka.record.default_records import DefaultRecordBatchBuilder

MAGIC: Final = 2
LOG_OVERHEAD: Final = 12  # baseOffset + batchLength
_BASE_OFFSET_AND_EPOCH: Final = struct.Struct(">qii")
_NO_HEADERS: Final[list[tuple[str, bytes]]] = []  # passed to every append; the builder only reads it
UNLIMITED: Final = 1 << 62

Entry = tuple[bytes, bytes | None]


def _builder(batch_size: int) -> DefaultRecordBatchBuilder:
    # Positional (magic, compression_type, is_transactional, producer_id, producer_epoch, base_sequence,
    # batch_size): the C builder parses keyword arguments through a dict, 1.1 against 0.3 us a batch,
    # and a 1-partition commit is a batch of its own in most flush cycles.
    return DefaultRecordBatchBuilder(MAGIC, 0, False, -1, -1, -1, batch_size)


def _finish(builder: DefaultRecordBatchBuilder, base_offset: int, leader_epoch: int) -> bytes:
    buf = builder.build()
    _BASE_OFFSET_AND_EPOCH.pack_into(buf, 0, base_offset, len(buf) - LOG_OVERHEAD, leader_epoch)
    return bytes(buf)


def build_batch(base_offset: int, entries: list[Entry], timestamp: int, leader_epoch: int = 0) -> bytes:
    """One uncompressed, non-transactional batch with CREATE_TIME ``timestamp`` for every record. Built
    in C: a writer thread building a large batch in Python held the GIL for the event loop's time."""
    if not entries:
        raise ValueError("a batch needs at least one record")
    return build_batches(base_offset, entries, timestamp, UNLIMITED, leader_epoch)[0][0]  # never refused: one


def build_batches(base_offset: int, entries: list[Entry], timestamp: int, max_bytes: int,
                  leader_epoch: int = 0) -> list[tuple[bytes, int]]:
    """``entries`` at consecutive offsets from ``base_offset`` as batches of at most ~``max_bytes`` each
    (a record that alone exceeds it gets a batch of its own), in order, each with its record count:
    ``build_batch``'s bytes for each run of entries."""
    batches: list[tuple[bytes, int]] = []
    builder = _builder(max_bytes)
    append = builder.append  # bound once: compiled, ``builder.append(...)`` looks it up every record
    ts: object = timestamp  # boxed once, not per record
    first = base_offset
    delta = 0
    for key, value in entries:
        if append(delta, ts, key, value, _NO_HEADERS) is None:  # full: it refuses the record
            batches.append((_finish(builder, first, leader_epoch), delta))
            first += delta
            builder = _builder(max_bytes)
            append = builder.append
            delta = 0
            append(0, ts, key, value, _NO_HEADERS)
        delta += 1
    if delta:
        batches.append((_finish(builder, first, leader_epoch), delta))
    return batches
