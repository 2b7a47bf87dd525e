"""Replaying a partition's log into fresh state: the loader thread's half of a shard's load
(coordinator.shardlifecycle starts it, serves the result and handles its failures).

It is the same ``replay`` as the live write path, for every record read back, with the collector paused
and what has been loaded frozen as it grows (coordinator/gcpause.py says why)."""

import logging
from collections.abc import Callable
from typing import Final

from coordinator.gcpause import freeze_loaded, gc_paused
from coordinator.state import NO_PRODUCER, ShardData
from protocol.records import RecordError
from storage.batch import COMMIT, decode_runs
from storage.log import PartitionLog

log = logging.getLogger(__name__)

GC_FREEZE_EVERY: Final = 50_000  # records loaded between gc.freeze() calls


class LoadCancelled(Exception):
    """The shard is closing: the load stops between two batches."""


def replay_log(partition: int, partition_log: PartitionLog, data: ShardData, durable_only: bool,
               cancelled: Callable[[], bool], progress: Callable[[int], None] | None = None) -> int:
    """Replays the log (after recovering it, or only up to its durable end, touching nothing on disk)
    into ``data``; returns the records replayed. Raises LoadCancelled once ``cancelled()`` says so.
    ``progress`` is told the records replayed so far every GC_FREEZE_EVERY, so that a long load shows
    it moves (kcoord_partition_loaded_records)."""
    records = unknown = 0
    frozen_at = 0
    batches = partition_log.read_durable(True) if durable_only else partition_log.recover(True)
    with gc_paused():
        for batch in batches:
            if cancelled():
                raise LoadCancelled()
            if records - frozen_at >= GC_FREEZE_EVERY:
                freeze_loaded()
                frozen_at = records
                if progress is not None:
                    progress(records)
            if batch.control_type is not None:
                data.replay_end_transaction(batch.producer_id, batch.control_type == COMMIT)
                continue
            producer = batch.producer_id if batch.is_transactional else NO_PRODUCER
            if batch.runs is not None:
                runs, skipped = batch.runs, batch.unknown
            else:
                try:
                    runs, skipped = decode_runs(batch.records)
                except RecordError as unreadable:  # fails the partition (coordinator.shardlifecycle), as Kafka's does
                    raise RecordError(f"batch at offsets [{batch.base_offset}, {batch.last_offset}]: "
                                      f"{unreadable}") from unreadable
            for start, run in runs:
                data.replay_records(start, run, producer)
                records += len(run)
            unknown += skipped
    if unknown:
        log.warning("partition %d: skipped %d records of types kcoord does not model", partition, unknown)
    return records
