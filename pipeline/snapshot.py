"""``snapshot``: the latest committed offset of every group, topic and partition, as OffsetFetch answers.

Each task keeps only the last plain commit per key of its ranges (a map-side combine) before Spark
aggregates across tasks, so the shuffle carries about one row per key and task, not one per record."""

import argparse
from typing import TextIO

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipeline.output import StagedOutput, say, settle, skipped
from pipeline.reader import LogRead, cut_note, read_offsets_log, report_damages
from pipeline.semantics import KEY, LOG_ORDER, TRANSACTION_COLUMNS, counted, latest_offsets

COLUMNS = (*KEY, "offset", "leader_epoch", "metadata", "commit_timestamp", "expire_timestamp", *LOG_ORDER)
READ_COLUMNS = tuple(dict.fromkeys((*COLUMNS, *TRANSACTION_COLUMNS, "tombstone")))


def snapshot(read: LogRead) -> DataFrame:
    """One row per live (group, topic, partition), sorted, with ``COLUMNS``."""
    return latest_offsets(counted(read.df), COLUMNS).orderBy(*KEY)


def run(spark: SparkSession, args: argparse.Namespace, err: TextIO) -> int:
    read = read_offsets_log(spark, args.data_dir, READ_COLUMNS, args.split_bytes, latest_only=True)
    say(f"snapshot of {read.summary()}", err)
    while True:
        out = StagedOutput(spark, args.out)
        result = snapshot(read).withColumn("commit_time", F.timestamp_millis("commit_timestamp"))
        try:
            out.write(result, "", args.format)
            again = read.cut_read()
        except BaseException:  # Ctrl-C or a failed job: no staging directory left behind
            out.discard()
            raise
        if again is None:
            break
        out.discard()
        say(cut_note(again, read), err)
        read = again
    corrupt = report_damages(read, err)
    if not settle(out, corrupt, args.skip_corrupt, err):
        return 1
    rows = out.count(spark, args.format, args.out)
    say(f"wrote {rows:,} offsets from {read.records_read:,} records to {args.out} ({args.format})"
        + skipped(corrupt), err)
    return 0
