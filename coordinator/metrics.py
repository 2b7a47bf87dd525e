"""The narrow seam through which the runtime reports what it does.

The runtime calls these methods and nothing else; the default keeps plain counters (enough for logs
and tests). A Prometheus exporter is another implementation of the same methods."""

from collections import Counter

from storage.cleaner import CleanStats


class Metrics:
    def __init__(self) -> None:
        self.counters: Counter[str] = Counter()
        self.load_seconds: dict[int, float] = {}

    def request(self, api_key: int, version: int) -> None:
        self.counters[f"requests.{api_key}"] += 1

    def offsets_committed(self, count: int) -> None:
        self.counters["offset_commits"] += count

    def offsets_expired(self, partition: int, count: int) -> None:
        self.counters["offsets_expired"] += count

    def batch_flushed(self, partition: int, records: int, nbytes: int, seconds: float) -> None:
        self.counters["batches"] += 1
        self.counters["batch_records"] += records
        self.counters["batch_bytes"] += nbytes

    def partition_loaded(self, partition: int, records: int, seconds: float) -> None:
        self.load_seconds[partition] = seconds
        self.counters["loaded_records"] += records

    def log_cleaned(self, partition: int, stats: CleanStats) -> None:
        self.counters["cleaner_runs"] += 1
        self.counters["cleaner_records_dropped"] += stats.records_dropped
        self.counters["cleaner_bytes_reclaimed"] += stats.bytes_before - stats.bytes_after

    def write_failed(self, partition: int) -> None:
        self.counters["write_failures"] += 1

    def shard_state(self, partition: int, state: str) -> None:
        self.counters[f"shard_state.{state}"] += 1

    def connection_closed_on_error(self) -> None:
        self.counters["bad_connections"] += 1
