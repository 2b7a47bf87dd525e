"""The narrow seam through which the runtime reports what it does.

The runtime calls these methods and nothing else. They only add to plain Python counters and bucket
lists on the thread that calls them (the event loop, except where noted), which costs a fraction of a
microsecond per request; a prometheus-client counter with labels costs several (measured: 0.5 us per
``inc``, 1.1 us per ``observe``, 2 us when the labelled child is looked up). The exporter
(coordinator/exporter.py) turns a ``snapshot`` of them into Prometheus metric families when it is
scraped, on its own thread: copying a dict or list of ints is atomic under the GIL, so no lock is
needed, and a scrape never waits for the event loop.

Per request (``request``) nothing is allocated and nothing is looked up by name: counts live in
lists indexed by API, version and error code, and the latency bucket is found by comparisons with
the bounds as constants.
The first version (a dict keyed by ``(api, version, error)``, ``bisect`` over the bounds) cost ~5,400
instructions per request under callgrind, ~10% of a 1-partition OffsetFetch: the tuple key, its
dict lookups, and the bounds, a tuple of floats that mypyc keeps unboxed, boxed again into a new
tuple of 16 floats for every ``bisect`` call.
"""

from collections import Counter
from dataclasses import dataclass, field
from typing import Final, Literal, get_args

from storage.cleaner import CleanStats

# Upper bounds (seconds): from a page-cache fsync (~0.2 ms here) to a stuck disk.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0, 10.0)
BATCH_RECORD_BUCKETS: Final = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384, 65536)
API_KEYS: Final = 128  # above every Kafka API key; per-API figures live in lists indexed by key
VERSIONS: Final = 32  # above every version of every API: counts by (api, version) live in one list
ERRORS: Final = 256  # error codes -1 (UNKNOWN_SERVER_ERROR) to 254 are counted in lists; others in a dict
# Why kcoord closes a connection at once (``connection_refused``): exported from the start at 0, each one,
# so that the first abort is an increase. A labelled counter series that first appears at 1 is no
# increase to Prometheus' increase() and rate(): the alert on server_error never fired for a single one.
# Every call that closes a connection names one of these (mypy checks it: ``AbortReason``), so none can
# first appear at 1.
ServerAbortReason = Literal["frame", "header", "unknown_api", "unsupported_version", "malformed", "too_slow",
                            "server_error", "stopping", "max_connections", "file_descriptors"]
GatewayAbortReason = Literal["upstream"]  # gateway mode only
AbortReason = ServerAbortReason | GatewayAbortReason
ABORT_REASONS: Final[tuple[str, ...]] = get_args(ServerAbortReason)
GATEWAY_ABORT_REASONS: Final[tuple[str, ...]] = get_args(GatewayAbortReason)


class Histogram:
    """Cumulative-at-export bucket counts: ``counts[i]`` holds observations <= ``bounds[i]`` and above
    the previous bound; the last slot is +Inf."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bucket(self.bounds, value)] += 1
        self.total += value

    def copy(self) -> "Histogram":
        out = Histogram(self.bounds)
        out.counts, out.total = self.counts.copy(), self.total
        return out


def bucket(bounds: tuple[float, ...], value: float) -> int:
    """The index of the first bound ``value`` does not exceed (``len(bounds)``: +Inf), as
    ``bisect_left``; a linear scan, as most values fall in the first buckets."""
    i = 0
    n = len(bounds)
    while i < n and value > bounds[i]:
        i += 1
    return i


def latency_bucket(seconds: float) -> int:
    """``bucket(LATENCY_BUCKETS, seconds)`` with the bounds as constants (compiled, comparisons of
    doubles: the loop reads each bound out of a tuple of boxed floats, ~900 instructions a commit)."""
    if seconds <= 0.001:
        if seconds <= 0.0001:
            return 0
        if seconds <= 0.00025:
            return 1
        return 2 if seconds <= 0.0005 else 3
    if seconds <= 0.05:
        if seconds <= 0.0025:
            return 4
        if seconds <= 0.005:
            return 5
        if seconds <= 0.01:
            return 6
        return 7 if seconds <= 0.025 else 8
    return bucket(LATENCY_BUCKETS, seconds)


@dataclass
class PartitionLoad:
    seconds: float
    records: int


@dataclass
class Metrics:
    """Everything counted since start. What the request path counts is indexed by small ints (an API
    key, a version, an error code), so counting allocates nothing."""

    # replies by API, version and first error code: [api * VERSIONS + version][error + 1] -> n, a row
    # made at its first reply; what falls outside those ranges in ``other_requests``. Read as ``requests``.
    request_counts: list[list[int] | None] = field(default_factory=lambda: [None] * (API_KEYS * VERSIONS))
    other_requests: dict[tuple[int, int, int], int] = field(default_factory=dict)  # (api, version, error) -> n
    request_seconds: list[Histogram] = field(
        default_factory=lambda: [Histogram(LATENCY_BUCKETS) for _ in range(API_KEYS)])  # by api key
    # by api key, what its replies did without error, in the API's own unit (coordinator.apis.Api.outcome):
    # partition-offsets committed (8), fetched (9), offsets deleted (47), groups deleted (42)
    done: list[int] = field(default_factory=lambda: [0] * API_KEYS)
    offsets_expired: int = 0
    rebalances_completed: int = 0
    flush_seconds: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    fsync_seconds: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    flush_records: Histogram = field(default_factory=lambda: Histogram(BATCH_RECORD_BUCKETS))
    sync_partitions: Histogram = field(default_factory=lambda: Histogram(BATCH_RECORD_BUCKETS))
    syncs_by: list[int] = field(default_factory=lambda: [0, 0])  # flush cycles synced by [writer thread, helper]
    bytes_appended: int = 0
    write_failures: Counter[int] = field(default_factory=Counter)  # partition -> n
    loads: dict[int, PartitionLoad] = field(default_factory=dict)  # partition -> its last load
    loading: dict[int, int] = field(default_factory=dict)  # partition -> records its load under way replayed so far
    records_replayed: int = 0
    state_changes: Counter[str] = field(default_factory=Counter)  # state entered -> n
    cleaner_runs: int = 0
    cleaner_bytes_reclaimed: int = 0
    cleaner_records_removed: int = 0
    connections_accepted: int = 0
    connections_refused: Counter[str] = field(default_factory=Counter)  # reason -> n (closed on bad input)

    # -- requests (event loop) -----------------------------------------------------------------

    def request(self, api_key: int, version: int, error: int, items: int, seconds: float) -> None:
        """One reply ready to send: ``error`` is its first non-zero error code (or 0), ``items`` what it
        did without error, ``seconds`` since its frame was taken up."""
        if 0 <= version < VERSIONS and -1 <= error < ERRORS - 1:
            at = api_key * VERSIONS + version
            row = self.request_counts[at]
            if row is None:
                row = self.request_counts[at] = [0] * ERRORS
            row[error + 1] += 1
        else:
            key = (api_key, version, error)
            self.other_requests[key] = self.other_requests.get(key, 0) + 1
        self.done[api_key] += items
        hist = self.request_seconds[api_key]
        hist.counts[latency_bucket(seconds)] += 1
        hist.total += seconds

    @property
    def requests(self) -> dict[tuple[int, int, int], int]:
        """Replies counted so far: ``(api, version, error) -> n`` (a new dict; the exporter's thread
        reads it while the loop counts: each list read is atomic under the GIL)."""
        out = self.other_requests.copy()
        for at, row in enumerate(self.request_counts.copy()):
            if row is not None:
                for i, n in enumerate(row.copy()):
                    if n:
                        out[(at // VERSIONS, at % VERSIONS, i - 1)] = n
        return out

    # -- groups ----------------------------------------------------------------------------------

    def expired(self, partition: int, count: int) -> None:
        self.offsets_expired += count

    def rebalance_completed(self) -> None:
        self.rebalances_completed += 1

    # -- storage ---------------------------------------------------------------------------------

    def batch_flushed(self, partition: int, records: int, nbytes: int, seconds: float) -> None:
        """A partition's batch became durable: ``seconds`` from hand-off to the writer until back on the loop."""
        self.flush_seconds.observe(seconds)
        self.flush_records.observe(records)
        self.bytes_appended += nbytes

    def synced(self, seconds: float, partitions: int, by_helper: bool) -> None:
        """One flush cycle's sync (an fsync per log, or one syncfs) made ``partitions`` logs durable,
        from the writer thread or the sync helper process."""
        self.fsync_seconds.observe(seconds)
        self.sync_partitions.observe(partitions)
        self.syncs_by[1 if by_helper else 0] += 1

    def write_failed(self, partition: int) -> None:
        self.write_failures[partition] += 1

    def load_progress(self, partition: int, records: int) -> None:
        """Loader thread: the load under way of ``partition`` has replayed ``records`` so far."""
        self.loading[partition] = records

    def partition_loaded(self, partition: int, records: int, seconds: float) -> None:
        self.loads[partition] = PartitionLoad(seconds, records)
        self.records_replayed += records

    def shard_state(self, partition: int, state: str) -> None:
        self.state_changes[state] += 1

    def log_cleaned(self, partition: int, stats: CleanStats) -> None:
        self.cleaner_runs += 1
        self.cleaner_records_removed += stats.records_dropped
        self.cleaner_bytes_reclaimed += max(0, stats.bytes_before - stats.bytes_after)

    # -- connections -----------------------------------------------------------------------------

    def connection_accepted(self) -> None:
        self.connections_accepted += 1

    def connection_refused(self, reason: AbortReason) -> None:
        """A connection closed because of what it sent (``reason``: a short fixed word, a label value)."""
        self.connections_refused[reason] += 1
