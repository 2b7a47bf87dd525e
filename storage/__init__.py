"""Files only: Kafka v2 record batches, segmented partition logs, loading and the log cleaner."""

from protocol.compiled import prefer_source

prefer_source()
