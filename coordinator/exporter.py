"""Prometheus metrics and health checks on their own HTTP listener (``--metrics-listen``).

``/metrics`` is prometheus-client's exposition (text or OpenMetrics, gzip when asked) of one collector
that reads the runtime's plain counters (coordinator/metrics.py) and the shards' state when scraped,
plus the process, platform and GC collectors. ``/healthz`` says the process is serving: the event loop
turned within the last ``STALLED_AFTER_S``. ``/readyz`` says that too, and that no partition is still
loading (the others are active, read-only on a full disk, or failed, each listed) and one at least
serves; otherwise 503. A failed partition does not make it unready: with the one replica deploy/ runs, an unready pod
leaves the Service with no endpoint, so one damaged partition turned away every group's clients (a
campaign's find); Kafka, too, keeps serving the rest with a partition offline. It pages instead
(KcoordPartitionFailed). The listener is a small threaded WSGI server, so a scrape never waits for the
event loop.
"""

import asyncio
import contextlib
import json
import logging
import platform
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from coordinator.admission import METRICS_MAX_CONNECTIONS
from coordinator.apis import APIS
from coordinator.groups.model import GroupState
from coordinator.logfmt import Repeated
from coordinator.metrics import ABORT_REASONS, GATEWAY_ABORT_REASONS, Histogram, Metrics
from coordinator.shardstate import ShardState
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from coordinator.runtime import Runtime
    from coordinator.server import Server

log = logging.getLogger(__name__)

BEAT_S = 1.0
SYNC_STUCK_S = 5.0  # a sync pending this long is logged (a healthy one takes milliseconds)
STALLED_AFTER_S = 10.0
METRICS_IDLE_S = 10.0  # a metrics connection idle this long is closed
LOADED = (ShardState.ACTIVE, ShardState.READ_ONLY)
# What an API's ``outcome`` counts, exported under a name of its own (coordinator.apis.outcome).
DONE_BY_API = {
    8: ("kcoord_offset_commits", "Partition offsets committed and acknowledged (OffsetCommit)."),
    9: ("kcoord_offset_fetches", "Partition offsets answered without error (OffsetFetch)."),
    42: ("kcoord_groups_deleted", "Groups deleted (DeleteGroups)."),
    47: ("kcoord_offset_deletions", "Partition offsets deleted through OffsetDelete."),
}
StartResponse = Callable[..., Any]


def _error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)


def _api_name(key: int) -> str:
    api = APIS.get(key)
    return api.spec.name if api is not None else str(key)


def _buckets(hist: Histogram) -> list[tuple[str, float]]:
    out, running = [], 0
    for bound, count in zip(hist.bounds, hist.counts, strict=False):
        running += count
        out.append((repr(float(bound)), float(running)))
    out.append(("+Inf", float(running + hist.counts[-1])))
    return out


class KcoordCollector(Collector):
    """Reads plain counters and shard state at scrape time (copies are atomic under the GIL)."""

    def __init__(self, runtime: "Runtime", server: "Server | None", health: "Health", version: str,
                 event_loop: str) -> None:
        self.runtime = runtime
        self.server = server
        self.health = health
        self.build = {"version": version, "python": platform.python_version(), "event_loop": event_loop}

    def collect(self) -> Iterator[Metric]:
        m: Metrics = self.runtime.metrics
        info = GaugeMetricFamily("kcoord_build_info", "kcoord build: always 1.", labels=list(self.build))
        info.add_metric(list(self.build.values()), 1)
        yield info
        config = self.runtime.config
        node = GaugeMetricFamily("kcoord_node_info", "This node's id and the cluster's node count (1 but in cluster "
                                 "mode) and the offsets partitions it coordinates: always 1.",
                                 labels=["node_id", "nodes", "partitions"])
        node.add_metric([str(config.node_id), str(len(config.nodes)), str(len(self.runtime.shards))], 1)
        yield node
        check = self.runtime.peer_check
        yield GaugeMetricFamily("kcoord_cluster_agreed", "1 while every peer that answers shares this node's view of "
                                "the cluster (always, but in cluster mode); 0: this node coordinates no group.",
                                value=1 if check is None or check.agreed else 0)
        yield from self._requests(m)
        yield from self._groups(m)
        yield from self._partitions(m)
        yield from self._storage(m)
        yield from self._connections(m)

    def _requests(self, m: Metrics) -> Iterator[Metric]:
        requests = CounterMetricFamily("kcoord_requests", "Requests answered, by API, version and the first "
                                       "error code in the reply (NONE when it has none).",
                                       labels=["api", "version", "error"])
        for (key, version, error), n in sorted(m.requests.copy().items()):
            requests.add_metric([_api_name(key), str(version), _error_name(error)], n)
        yield requests
        latency = HistogramMetricFamily("kcoord_request_duration_seconds", "From taking a request frame up to "
                                        "its reply being ready to send, by API (includes waiting for fsync).",
                                        labels=["api"])
        for key, hist in enumerate(m.request_seconds):
            snap = hist.copy()
            if any(snap.counts):
                latency.add_metric([_api_name(key)], _buckets(snap), snap.total)
        yield latency
        done = m.done.copy()
        for key, (name, text) in DONE_BY_API.items():
            yield CounterMetricFamily(name, text, value=done[key])

    def _groups(self, m: Metrics) -> Iterator[Metric]:
        yield CounterMetricFamily("kcoord_offsets_expired", "Offsets removed by retention (KIP-211).",
                                  value=m.offsets_expired)
        yield CounterMetricFamily("kcoord_group_rebalances_completed", "Classic group rebalances that reached "
                                  "Stable.", value=m.rebalances_completed)
        offsets = 0
        states = dict.fromkeys(GroupState, 0)
        for shard in self.runtime.shards:
            if shard.state not in LOADED:
                continue
            data = shard.data
            offsets += data.num_offsets
            # Kept as groups change (GroupCounts): read in O(states), not by walking every group. A group
            # with only committed offsets is a simple group, Empty, in ``groups`` like any other.
            for state, n in data.group_counts.by_state.copy().items():
                states[state] += n
        yield GaugeMetricFamily("kcoord_offsets", "Committed offsets cached (Kafka's NumOffsets).", value=offsets)
        groups = GaugeMetricFamily("kcoord_groups", "Groups by state; groups with only committed offsets "
                                   "count as Empty (Kafka's NumGroups*).", labels=["state"])
        for state, n in states.items():
            groups.add_metric([state.value], n)
        yield groups

    def _partitions(self, m: Metrics) -> Iterator[Metric]:
        state = GaugeMetricFamily("kcoord_partition_state", "1 for the state each offsets partition is in.",
                                  labels=["partition", "state"])
        loaded_s = GaugeMetricFamily("kcoord_partition_load_duration_seconds", "How long the last load of "
                                     "each offsets partition took.", labels=["partition"])
        loaded_n = GaugeMetricFamily("kcoord_partition_loaded_records", "Records replayed by the last load of "
                                     "each offsets partition, or so far by the one under way while it loads.",
                                     labels=["partition"])
        loads, loading = m.loads.copy(), m.loading.copy()
        for shard in self.runtime.shards:
            p = str(shard.partition)
            current = shard.state
            for s in ShardState:
                state.add_metric([p, s.value], 1 if s is current else 0)
            last = loads.get(shard.partition)
            if last is not None:
                loaded_s.add_metric([p], last.seconds)
            so_far = loading.get(shard.partition) if current is ShardState.LOADING else None
            if so_far is not None:
                loaded_n.add_metric([p], so_far)
            elif last is not None:
                loaded_n.add_metric([p], last.records)
        yield state
        yield loaded_s
        yield loaded_n
        yield CounterMetricFamily("kcoord_records_replayed", "Records replayed by partition loads.",
                                  value=m.records_replayed)
        yield GaugeMetricFamily("kcoord_ready", "1 when ready to serve (/readyz): no offsets partition still "
                                "loading, at least one serving, the event loop turning, not stopping, and in "
                                "gateway mode an upstream broker has answered.",
                                value=1 if self.health.ready()[0] else 0)

    def _storage(self, m: Metrics) -> Iterator[Metric]:
        size = GaugeMetricFamily("kcoord_log_size_bytes", "Bytes of each offsets partition's log.",
                                 labels=["partition"])
        segments = GaugeMetricFamily("kcoord_log_segments", "Segments of each offsets partition's log.",
                                     labels=["partition"])
        errors = CounterMetricFamily("kcoord_log_write_errors", "Appends or fsyncs that failed, by partition.",
                                     labels=["partition"])
        failures = m.write_failures.copy()
        for shard in self.runtime.shards:
            segs = list(shard.log.segments)
            p = str(shard.partition)
            size.add_metric([p], sum(s.size for s in segs))
            segments.add_metric([p], len(segs))
            errors.add_metric([p], failures.get(shard.partition, 0))
        yield size
        yield segments
        yield errors
        for name, text, hist in (
            ("kcoord_flush_duration_seconds", "From the start of its flush cycle (the append) until it is "
             "durable and back on the event loop: the durability part of a commit's latency.", m.flush_seconds),
            ("kcoord_fsync_duration_seconds", "The sync of each flush cycle: an fsync per partition log, or "
             "one syncfs for all of them (--sync-mode).", m.fsync_seconds),
            ("kcoord_flush_records", "Records per partition per flush (group commit).", m.flush_records),
            ("kcoord_sync_partitions", "Partition logs made durable per flush cycle.", m.sync_partitions),
        ):
            snap = hist.copy()
            yield HistogramMetricFamily(name, text, buckets=_buckets(snap), sum_value=snap.total)
        syncs = CounterMetricFamily("kcoord_flush_syncs", "Flush cycles made durable, by who made the sync: "
                                    "the sync helper process, or the writer thread (a cycle needing more than "
                                    "one fsync or syncfs, or every cycle once the helper is gone).", labels=["by"])
        by = m.syncs_by.copy()
        syncs.add_metric(["writer_thread"], by[0])
        syncs.add_metric(["helper"], by[1])
        yield syncs
        helper = self.runtime.flusher.helper
        yield GaugeMetricFamily("kcoord_sync_helper_up", "1 while the sync helper process makes flush cycles' "
                                "syncs; 0 when it is off (--sync-helper), could not start or has died (see the "
                                "log).", value=1 if helper is not None and helper.alive else 0)
        yield GaugeMetricFamily("kcoord_sync_helper_configured", "1 when --sync-helper is on.",
                                value=1 if self.runtime.config.sync_helper else 0)
        yield GaugeMetricFamily("kcoord_sync_pending_seconds", "How long the flush cycle in progress has been "
                                "under way, its appends and its sync (0 when none is): a stuck or frozen disk, or "
                                "a stopped sync helper.",
                                value=self.runtime.flusher.sync_pending_s())
        yield CounterMetricFamily("kcoord_log_appended_bytes", "Bytes appended to offsets logs.",
                                  value=m.bytes_appended)
        yield from self._journal_metrics()
        yield CounterMetricFamily("kcoord_cleaner_runs", "Log compactions done.", value=m.cleaner_runs)
        yield CounterMetricFamily("kcoord_cleaner_reclaimed_bytes", "Bytes compaction removed.",
                                  value=m.cleaner_bytes_reclaimed)
        yield CounterMetricFamily("kcoord_cleaner_removed_records", "Records compaction removed.",
                                  value=m.cleaner_records_removed)

    def _journal_metrics(self) -> Iterator[Metric]:
        """--sync-mode journal: the checkpoints that sync the logs behind the journal (coordinator.checkpointer)."""
        checkpointer, journal = self.runtime.checkpointer, self.runtime.journal
        if checkpointer is None or journal is None:
            return
        done = CounterMetricFamily("kcoord_checkpoints", "Checkpoints (the logs synced behind the journal), by "
                                   "outcome; a failed one reloads every partition from the journal.",
                                   labels=["outcome"])
        done.add_metric(["ok"], checkpointer.completed)
        done.add_metric(["failed"], checkpointer.failed)
        yield done
        snap = checkpointer.seconds.copy()
        yield HistogramMetricFamily("kcoord_checkpoint_duration_seconds", "Each checkpoint's syncfs of the logs "
                                    "and removal of the journal segments it made redundant.",
                                    buckets=_buckets(snap), sum_value=snap.total)
        yield GaugeMetricFamily("kcoord_checkpoint_age_seconds", "Seconds since the last checkpoint completed: "
                                "growing, the journal grows and a restart replays more.",
                                value=time.monotonic() - checkpointer.synced_at)
        yield GaugeMetricFamily("kcoord_journal_segments", "Journal segments a restart would replay (the live one "
                                "included; not the empty spare made ahead of the next roll).",
                                value=journal.retained)
        yield GaugeMetricFamily("kcoord_journal_damaged_segments", "Journal segments this start found damaged with "
                                "valid entries after the damage (kept as <segment>.damaged; see the WARNING): "
                                "acknowledged commits may have been rolled back.", value=journal.damaged_segments)

    def _connections(self, m: Metrics) -> Iterator[Metric]:
        server = self.server
        yield GaugeMetricFamily("kcoord_connections", "Open client connections.",
                                value=len(server.connections) if server is not None else 0)
        yield CounterMetricFamily("kcoord_connections_accepted", "Client connections accepted.",
                                  value=m.connections_accepted)
        aborted = CounterMetricFamily("kcoord_connections_aborted", "Connections kcoord closed at once, by "
                                      "reason: bad input (frame, header, unknown_api, unsupported_version, "
                                      "malformed), too_slow, server_error, stopping, in gateway mode upstream; or "
                                      "as soon as made: max_connections, file_descriptors. Each is exported from "
                                      "the start, at 0.", labels=["reason"])
        counted = m.connections_refused.copy()
        reasons = set(ABORT_REASONS).union(counted)
        if server is not None and server.gateway is not None:
            reasons.update(GATEWAY_ABORT_REASONS)
        for reason in sorted(reasons):
            aborted.add_metric([reason], counted.get(reason, 0))
        yield aborted
        if server is not None:
            yield GaugeMetricFamily("kcoord_buffered_request_bytes", "Bytes of requests over 256 KiB buffered "
                                    "across connections (bounded by --max-buffered-bytes; smaller ones are not "
                                    "counted).", value=server.memory.buffered)
        yield GaugeMetricFamily("kcoord_event_loop_lag_seconds", "How late the event loop's last 1 s heartbeat "
                                "ran, or how long ago it last ran if that is longer.", value=self.health.lag())


class Health:
    """Liveness from an event-loop heartbeat; readiness from the shards' states."""

    def __init__(self, runtime: "Runtime", server: "Server | None") -> None:
        self.runtime = runtime
        self.server = server
        self._beat = time.monotonic()
        self._late = 0.0
        self._task: asyncio.Task[None] | None = None
        self._sync_stuck = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._heartbeat())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _heartbeat(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(BEAT_S)
            self._beat = time.monotonic()
            self._late = max(0.0, self._beat - before - BEAT_S)
            self._watch_sync()

    def _watch_sync(self) -> None:
        """A sync that does not come back holds every commit without an error anywhere (a hung disk, or
        a stopped sync helper: a fault campaign saw 25 s of silence): say so once, and when it ends."""
        pending = self.runtime.flusher.sync_pending_s()
        if pending >= SYNC_STUCK_S and not self._sync_stuck:
            self._sync_stuck = True
            log.warning("a flush cycle's sync has been pending for %.0f s: every commit waits for it (a hung disk, "
                        "or a stopped sync helper process); kcoord_sync_pending_seconds shows how long", pending)
        elif pending < SYNC_STUCK_S and self._sync_stuck:
            self._sync_stuck = False
            log.warning("syncs complete again")

    def since_turn(self) -> float:
        """Seconds since the event loop last turned (its heartbeat): /healthz and /readyz both judge by it."""
        return time.monotonic() - self._beat

    def lag(self) -> float:
        return max(self._late, self.since_turn() - BEAT_S, 0.0)

    def alive(self) -> tuple[bool, dict[str, Any]]:
        stalled = self.since_turn()
        stopping = self.server is not None and self.server.stopping
        ok = stalled < STALLED_AFTER_S and not stopping
        return ok, {"status": "ok" if ok else ("stopping" if stopping else "event loop stalled"),
                    "event_loop_last_turn_s": round(stalled, 3)}

    def ready(self) -> tuple[bool, dict[str, Any]]:
        by_state: dict[str, list[int]] = {}
        for shard in self.runtime.shards:
            by_state.setdefault(shard.state.value, []).append(shard.partition)
        not_loaded = {s: ps for s, ps in by_state.items() if ShardState(s) not in (*LOADED, ShardState.FAILED)}
        stopping = self.server is not None and self.server.stopping
        gateway = self.server.gateway if self.server is not None else None
        no_upstream = gateway is not None and not gateway.ready  # clients would all be turned away
        serving = any(ShardState(s) in LOADED for s in by_state)  # not when every one failed
        check = self.runtime.peer_check
        withheld = check is not None and not check.agreed  # cluster mode: no group coordinated
        # As /healthz: a loop blocked (a frozen disk holds it in an append) answers no client, though
        # this thread still answers "ready" (a fault campaign's find: a Service kept routing to it).
        stalled = self.since_turn()
        ok = (serving and not not_loaded and not stopping and not no_upstream and not withheld
              and stalled < STALLED_AFTER_S)
        body: dict[str, Any] = {"status": "ready" if ok else ("stopping" if stopping else "not ready"),
                                "partitions": len(self.runtime.shards)}
        if stalled >= STALLED_AFTER_S:
            body["event_loop"] = f"stalled for {stalled:.0f} s"
        if no_upstream:
            body["upstream"] = "no broker has answered yet"
        if check is not None and withheld:
            # a copy first: the event loop changes it while this (metrics) thread reads (a review's find)
            body["cluster"] = {str(n): d for n, d in dict(check.disputes).items()} or "peers not checked yet"
        body.update({s: ps for s, ps in sorted(by_state.items()) if s != ShardState.ACTIVE.value})
        return ok, body


class _Handler(WSGIRequestHandler):
    # A connection that sends nothing (or half a request) for this long is closed: each one holds a
    # thread, and 200 half-sent requests held 200 threads for ever (a fault campaign's find).
    timeout = METRICS_IDLE_S

    def log_message(self, format: str, *args: Any) -> None:  # scrapes are not worth a log line each
        pass


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    """A thread per connection, at most METRICS_MAX_CONNECTIONS open: a new one past that closes the
    oldest (its thread's read ends), so a probe or scrape is still answered while something floods the
    port. Uncapped, 300 idle connections took the descriptors the logs needed and commits failed (a
    fault campaign's find); refusing the newcomers instead would have failed the health probes."""

    daemon_threads = True
    request_queue_size = 128  # the listen backlog (socketserver's 5 made a burst of connects wait 1 s each)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self._open: dict[Any, None] = {}  # the connections being served, oldest first
        self._evictions = Repeated(log, 60.0)  # called on the one accepting thread only

    def process_request(self, request: Any, client_address: Any) -> None:
        oldest = None
        with self._lock:
            if len(self._open) >= METRICS_MAX_CONNECTIONS:
                oldest = next(iter(self._open))
                del self._open[oldest]
            self._open[request] = None
        if oldest is not None:
            self._evictions.report(logging.WARNING, "metrics listener: %d connections open; closing the oldest "
                                   "for each new one", METRICS_MAX_CONNECTIONS)
            with contextlib.suppress(OSError):
                oldest.shutdown(socket.SHUT_RDWR)  # its thread reads the end and closes it
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._served(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._served(request)

    def _served(self, request: Any) -> None:
        with self._lock:
            self._open.pop(request, None)


class Exporter:
    """Binds the metrics listener at once (a port in use fails the start, like the client listener)
    and serves it on a daemon thread."""

    def __init__(self, runtime: "Runtime", server: "Server | None", version: str, event_loop: str) -> None:
        self.health = Health(runtime, server)
        self.registry = CollectorRegistry()
        self.registry.register(KcoordCollector(runtime, server, self.health, version, event_loop))
        for extra in (ProcessCollector, PlatformCollector, GCCollector):
            extra(registry=self.registry)
        self._metrics_app = make_wsgi_app(self.registry)
        self._httpd: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def bind(self, host: str, port: int) -> tuple[str, int]:
        try:
            self._httpd = make_server(host, port, self._app, _ThreadingServer, handler_class=_Handler)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot listen on {host}:{port} for metrics (--metrics-listen / "
                                     f"KCOORD_METRICS_LISTEN): {exc.strerror or exc}") from exc
        bound = self._httpd.server_address
        return str(bound[0]), int(bound[1])

    def start(self) -> None:
        """On the event loop: starts the heartbeat and the serving thread."""
        self.health.start()
        if self._httpd is not None:
            self._thread = threading.Thread(target=self._httpd.serve_forever, name="kcoord-metrics", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self.health.stop()
        if self._httpd is not None:
            if self._thread is not None:
                self._httpd.shutdown()
            self._httpd.server_close()

    def _app(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path in ("/healthz", "/readyz"):
            ok, body = self.health.alive() if path == "/healthz" else self.health.ready()
            data = (json.dumps(body, sort_keys=True) + "\n").encode()
            start_response("200 OK" if ok else "503 Service Unavailable",
                           [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
            return [data]
        if path in ("/metrics", "/"):
            return self._metrics_app(environ, start_response)  # type: ignore[no-any-return]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: try /metrics, /healthz or /readyz\n"]
