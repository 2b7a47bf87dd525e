"""Raw pipelined OffsetCommit / OffsetFetch load against kcoord and the librdkafka mock cluster.

Both servers get the same load in the same run, one after the other: C connections, each keeping D
requests in flight, for a warm-up and then a measured window. Requests are pre-encoded once with
kafka-python (OffsetCommit v8, OffsetFetch v6: the highest OffsetFetch the mock serves) and only
their correlation id is patched: frame ``i`` of a ring of 4096 carries correlation id ``i``, so
every connection can check that responses come back in request order with the right id.

Every response is checked: its bytes are compared with a known-good answer for the same request
template; anything else is decoded with kafka-python and every non-zero error code (and, for fetches,
every wrong offset) is counted. Commits are "simple" commits (generation -1, member ""), which any
coordinator accepts for a group without members.

kcoord runs as a real subprocess (tests/kcoord_process.py) on a temporary data directory and fsyncs
every commit batch before answering (group commit). The mock cluster runs inside this process, in
memory, with no durability: it is a ceiling, not a like-for-like peer.

Run from the repository root: ``python -m bench.commit_bench --help``.
"""

import argparse
import asyncio
import collections
import ctypes
import os
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka.protocol.consumer.group import (
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)

from protocol.partitioning import partition_for
from storage.batch import BATCH_HEADER_BYTES, read_head
from tests.kcoord_process import KcoordProcess

TOPIC = "bench-topic"
TOPIC_PARTITIONS = 128  # the mock topic's size: bounds --partitions-per-request
COMMIT_VERSION = 8
FETCH_VERSION = 6
RING = 4096  # pre-encoded frames per workload; correlation id == ring index
SLICES_PER_GROUP = 16  # distinct partition sets per group (1-partition requests: 16 partitions each)
CLIENT_ID = "kcoord-bench"
KCOORD_OFFSETS_PARTITIONS = 50  # kcoord's default, only used to report how the groups spread
RETRYABLE = {14, 15, 16}  # load in progress, coordinator not available, not coordinator
_SIZE = struct.Struct(">i")

CommitTopic = OffsetCommitRequest[COMMIT_VERSION].OffsetCommitRequestTopic
CommitPartition = CommitTopic.OffsetCommitRequestPartition
FetchTopic = OffsetFetchRequest[FETCH_VERSION].OffsetFetchRequestTopic


# -- workload ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    api: str  # "commit" or "fetch"
    groups: int
    partitions_per_request: int

    @property
    def label(self) -> str:
        group = "1 group" if self.groups == 1 else f"{self.groups} groups"
        return f"{self.api} {self.partitions_per_request}p x {group}"


@dataclass(frozen=True)
class Template:
    group: str
    partitions: tuple[int, ...]

    def committed(self, index: int) -> int:
        """The offset the priming commit writes for every partition of template ``index``."""
        return 1000 + index


def templates(w: Workload) -> list[Template]:
    """Groups x partition slices; a template is one (group, partition set) request shape."""
    ppr = w.partitions_per_request
    slices = max(1, min(SLICES_PER_GROUP, TOPIC_PARTITIONS // ppr))
    out = []
    for s in range(slices):
        parts = tuple((s * ppr + j) % TOPIC_PARTITIONS for j in range(ppr))
        for g in range(w.groups):
            out.append(Template(f"bench-group-{g}", parts))
    return out


def commit_frame(t: Template, offset: int, correlation_id: int = 0) -> bytes:
    parts = [
        CommitPartition(partition_index=p, committed_offset=offset, committed_leader_epoch=-1, committed_metadata="")
        for p in t.partitions
    ]
    req = OffsetCommitRequest[COMMIT_VERSION](
        group_id=t.group,
        generation_id_or_member_epoch=-1,
        member_id="",
        group_instance_id=None,
        topics=[CommitTopic(name=TOPIC, partitions=parts)],
    )
    req.with_header(correlation_id=correlation_id, client_id=CLIENT_ID)
    return bytes(req.encode(header=True, framed=True))


def fetch_frame(t: Template, correlation_id: int = 0) -> bytes:
    req = OffsetFetchRequest[FETCH_VERSION](
        group_id=t.group,
        topics=[FetchTopic(name=TOPIC, partition_indexes=list(t.partitions))],
        require_stable=False,
    )
    req.with_header(correlation_id=correlation_id, client_id=CLIENT_ID)
    return bytes(req.encode(header=True, framed=True))


def with_correlation_id(frame: bytes, correlation_id: int) -> bytes:
    """Frame layout: size int32 | api key int16 | api version int16 | correlation id int32 | ..."""
    return frame[:8] + _SIZE.pack(correlation_id) + frame[12:]


def response_errors(api: str, body: bytes, t: Template, index: int) -> list[str]:
    """Decodes one response body (after the correlation id) and lists what is wrong with it."""
    if not body or body[0] != 0:
        return ["response header has tagged fields"] if body else ["empty response"]
    try:
        if api == "commit":
            resp: Any = OffsetCommitResponse[COMMIT_VERSION].decode(body[1:], version=COMMIT_VERSION)
        else:
            resp = OffsetFetchResponse[FETCH_VERSION].decode(body[1:], version=FETCH_VERSION)
    except Exception as exc:
        return [f"undecodable response: {exc!r}"]
    problems = []
    if api == "fetch" and resp.error_code:
        problems.append(f"error {resp.error_code}")
    seen = []
    for topic in resp.topics:
        for p in topic.partitions:
            seen.append(p.partition_index)
            if p.error_code:
                problems.append(f"error {p.error_code}")
            elif api == "fetch" and p.committed_offset != t.committed(index):
                problems.append(f"wrong offset {p.committed_offset} (expected {t.committed(index)})")
    if not problems and sorted(seen) != sorted(t.partitions):
        problems.append(f"answered partitions {sorted(seen)} for {sorted(t.partitions)}")
    return problems


# -- the load generator -----------------------------------------------------------------------------


@dataclass
class Result:
    server: str
    workload: Workload
    requests: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    responses: int = 0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    unanswered: int = 0
    server_cpu: float | None = None  # share of one core, kcoord only
    server_sys: float = 0.0  # ... of which in the kernel
    client_cpu: float = 0.0  # share of one core used by the load generator's thread
    records_per_batch: float | None = None  # kcoord commits: records written per fsync

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())


class Run:
    """The shared state of one measured run: the frame ring, the known-good answers, the counters."""

    def __init__(self, workload: Workload, inflight: int, result: Result) -> None:
        self.workload = workload
        self.inflight = inflight
        self.result = result
        self.templates = templates(workload)
        n = len(self.templates)
        self.template_of = [i % n for i in range(RING)]
        if workload.api == "commit":
            base = [commit_frame(t, t.committed(i)) for i, t in enumerate(self.templates)]
        else:
            base = [fetch_frame(t) for t in self.templates]
        self.ring = [with_correlation_id(base[self.template_of[i]], i) for i in range(RING)]
        self.ok_bodies: dict[int, bytes] = {}
        self.recording = False
        self.stopping = False
        self.connections: list[Connection] = []

    def check(self, index: int, body: bytes) -> None:
        """Slow path: a response that differs from the cached good answer for its template."""
        problems = response_errors(self.workload.api, body, self.templates[index], index)
        if problems:
            self.result.errors.update(problems)
        else:
            self.ok_bodies[index] = body

    @property
    def outstanding(self) -> int:
        return sum(c.sent - c.received for c in self.connections)


class Connection(asyncio.Protocol):
    """Keeps ``inflight`` requests outstanding; one write per batch of responses received."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.transport: asyncio.Transport | None = None
        self.sent = 0
        self.received = 0
        self.sent_at: collections.deque[float] = collections.deque()
        self.buf = b""
        self.lost: Exception | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._send(self.run.inflight, time.perf_counter())

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc or ConnectionResetError("server closed the connection")

    def _send(self, n: int, now: float) -> None:
        ring, seq = self.run.ring, self.sent
        self.sent = seq + n
        self.sent_at.extend([now] * n)
        assert self.transport is not None
        self.transport.write(b"".join([ring[(seq + k) % RING] for k in range(n)]))

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if self.buf:
            data = self.buf + data
        run = self.run
        result = run.result
        ok_bodies, template_of = run.ok_bodies, run.template_of
        recording = run.recording
        lat = result.latencies
        sent_at = self.sent_at
        pos, end, n = 0, len(data), 0
        seq = self.received
        while end - pos >= 4:
            size = int.from_bytes(data[pos : pos + 4], "big")
            if end - pos - 4 < size:
                break
            start = pos + 4
            pos = start + size
            ring_index = seq % RING
            seq += 1
            n += 1
            if int.from_bytes(data[start : start + 4], "big") != ring_index:
                result.errors["correlation id out of order"] += 1
            body = data[start + 4 : pos]
            index = template_of[ring_index]
            if body != ok_bodies.get(index):
                run.check(index, body)
            sent = sent_at.popleft()
            if recording:
                lat.append(now - sent)
        self.buf = data[pos:]
        self.received = seq
        result.responses += n
        if recording:
            result.requests += n
        if n and not run.stopping:
            self._send(n, now)


async def prime(host: str, port: int, frames: Sequence[bytes], check: Callable[[int, bytes], list[str]],
                timeout: float = 30.0) -> None:
    """Sends every frame (pipelined, one connection) until each is answered without a retryable
    error: the shards are loaded, the groups exist and, for fetches, the offsets are there."""
    deadline = time.monotonic() + timeout
    todo = list(range(len(frames)))
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while todo:
            writer.write(b"".join(with_correlation_id(frames[i], k) for k, i in enumerate(todo)))
            retry = []
            for k, i in enumerate(todo):
                size = _SIZE.unpack(await reader.readexactly(4))[0]
                frame = await reader.readexactly(size)
                if _SIZE.unpack_from(frame)[0] != k:
                    raise RuntimeError(f"priming: correlation id {_SIZE.unpack_from(frame)[0]}, expected {k}")
                problems = check(i, frame[4:])
                if problems and all(p in {f"error {c}" for c in RETRYABLE} for p in problems):
                    retry.append(i)
                elif problems:
                    raise RuntimeError(f"priming request {i} failed: {sorted(set(problems))}")
            todo = retry
            if todo:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{len(todo)} priming requests still answered with a retryable error")
                await asyncio.sleep(0.05)
    finally:
        writer.close()


def cpu_seconds(stat: str) -> tuple[float, float]:
    """(utime + stime, stime) of a /proc/<pid>/stat or /proc/<pid>/task/<tid>/stat file."""
    fields = Path(stat).read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, int(fields[12]) / tick


def log_totals(data_dir: Path) -> tuple[int, int]:
    """(batches, records) in every complete batch of kcoord's offsets logs, from the batch headers
    alone (recordsCount is the int32 at byte 57 of a v2 batch). kcoord fsyncs once per shard flush
    and a flush writes one batch unless it exceeds ~1 MiB, so records/batch = commits per fsync."""
    batches = records = 0
    for seg in data_dir.glob("__consumer_offsets-*/*.log"):
        data = seg.read_bytes()
        pos = 0
        while pos + BATCH_HEADER_BYTES <= len(data):
            _, size = read_head(data, pos)
            if size < BATCH_HEADER_BYTES or pos + size > len(data):
                break
            records += int.from_bytes(data[pos + 57 : pos + 61], "big")
            batches += 1
            pos += size
    return batches, records


@dataclass(frozen=True)
class Target:
    name: str
    host: str
    port: int
    pid: int | None = None  # a kcoord we started: its CPU is measured
    data_dir: Path | None = None  # ... and its log is inspected


async def run_workload(target: Target, w: Workload, args: argparse.Namespace) -> Result:
    result = Result(target.name, w)
    run = Run(w, args.inflight, result)
    host, port = target.host, target.port
    commit_frames = [commit_frame(t, t.committed(i)) for i, t in enumerate(run.templates)]
    await prime(host, port, commit_frames, lambda i, body: response_errors("commit", body, run.templates[i], i))
    logged = log_totals(target.data_dir) if target.data_dir else (0, 0)
    loop = asyncio.get_running_loop()
    for _ in range(args.connections):
        _, conn = await loop.create_connection(lambda: Connection(run), host, port)
        run.connections.append(conn)
    await asyncio.sleep(args.warmup)
    server_stat = f"/proc/{target.pid}/stat"
    client_stat = f"/proc/self/task/{os.getpid()}/stat"  # the main thread only: not the mock's threads
    server0 = cpu_seconds(server_stat) if target.pid else (0.0, 0.0)
    client0 = cpu_seconds(client_stat)[0]
    run.recording = True
    started = time.perf_counter()
    await asyncio.sleep(args.duration)
    run.recording = False
    result.seconds = time.perf_counter() - started
    result.client_cpu = (cpu_seconds(client_stat)[0] - client0) / result.seconds
    if target.pid:
        total, system = cpu_seconds(server_stat)
        result.server_cpu = (total - server0[0]) / result.seconds
        result.server_sys = (system - server0[1]) / result.seconds
    run.stopping = True
    deadline = time.monotonic() + 10.0
    while run.outstanding and time.monotonic() < deadline and not any(c.lost for c in run.connections):
        await asyncio.sleep(0.005)
    result.unanswered = run.outstanding
    if target.data_dir and w.api == "commit":
        batches, records = log_totals(target.data_dir)
        if batches > logged[0]:
            result.records_per_batch = (records - logged[1]) / (batches - logged[0])
    for conn in run.connections:
        if conn.lost is not None:
            result.errors[f"connection lost: {conn.lost!r}"] += 1
        elif conn.transport is not None:
            conn.transport.close()
    return result


# -- the servers ------------------------------------------------------------------------------------


class MockCluster:
    """librdkafka's in-process mock cluster, the one ``{'test.mock.num.brokers': 1}`` creates inside a
    confluent-kafka client. It is created here through the C API of the librdkafka bundled in the
    confluent-kafka wheel because the mock answers UNKNOWN_TOPIC_OR_PARTITION for commits to topics it
    does not have, auto-creates topics with only 4 partitions and serves no CreateTopics; only
    ``rd_kafka_mock_topic_create`` makes a topic of ``TOPIC_PARTITIONS`` partitions."""

    def __init__(self) -> None:
        import confluent_kafka

        libs = Path(confluent_kafka.__file__).resolve().parent.parent / "confluent_kafka.libs"
        found = sorted(libs.glob("librdkafka*.so*"))
        if not found:
            raise RuntimeError(f"no librdkafka in {libs}")
        lib = ctypes.CDLL(str(found[0]))
        vp, cp = ctypes.c_void_p, ctypes.c_char_p
        lib.rd_kafka_conf_new.restype = vp
        lib.rd_kafka_conf_new.argtypes = []
        lib.rd_kafka_conf_set.restype = ctypes.c_int
        lib.rd_kafka_conf_set.argtypes = [vp, cp, cp, cp, ctypes.c_size_t]
        lib.rd_kafka_new.restype = vp
        lib.rd_kafka_new.argtypes = [ctypes.c_int, vp, cp, ctypes.c_size_t]
        lib.rd_kafka_mock_cluster_new.restype = vp
        lib.rd_kafka_mock_cluster_new.argtypes = [vp, ctypes.c_int]
        lib.rd_kafka_mock_cluster_bootstraps.restype = cp
        lib.rd_kafka_mock_cluster_bootstraps.argtypes = [vp]
        lib.rd_kafka_mock_topic_create.restype = ctypes.c_int
        lib.rd_kafka_mock_topic_create.argtypes = [vp, cp, ctypes.c_int, ctypes.c_int]
        lib.rd_kafka_mock_cluster_destroy.argtypes = [vp]
        lib.rd_kafka_destroy.argtypes = [vp]
        self._lib = lib
        errstr = ctypes.create_string_buffer(512)
        conf = lib.rd_kafka_conf_new()
        lib.rd_kafka_conf_set(conf, b"log_level", b"3", errstr, len(errstr))  # no notice about bootstrap.servers
        self._rk = lib.rd_kafka_new(0, conf, errstr, len(errstr))  # 0: a producer handle; it owns conf now
        if not self._rk:
            raise RuntimeError(f"rd_kafka_new: {errstr.value.decode()}")
        self._mc = lib.rd_kafka_mock_cluster_new(self._rk, 1)
        if not self._mc:
            raise RuntimeError("rd_kafka_mock_cluster_new failed")
        err = lib.rd_kafka_mock_topic_create(self._mc, TOPIC.encode(), TOPIC_PARTITIONS, 1)
        if err:
            raise RuntimeError(f"rd_kafka_mock_topic_create: error {err}")
        host, _, port = lib.rd_kafka_mock_cluster_bootstraps(self._mc).decode().split(",")[0].rpartition(":")
        self.host, self.port = host, int(port)

    def close(self) -> None:
        self._lib.rd_kafka_mock_cluster_destroy(self._mc)
        self._lib.rd_kafka_destroy(self._rk)


# -- reporting --------------------------------------------------------------------------------------


def print_table(results: list[Result]) -> None:
    head = f"{'server':<7} {'workload':<24} {'req/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'errors':>6} " \
           f"{'unanswered':>10} {'server CPU (sys)':>16} {'client CPU':>10} {'recs/fsync':>10}"
    print(head)
    print("-" * len(head))
    for r in results:
        if r.server_cpu is not None:
            cpu = f"{r.server_cpu * 100:.0f}% ({r.server_sys * 100:.0f}%)"
        else:
            cpu = "in-proc" if r.server == "mock" else "n/a"
        per_fsync = f"{r.records_per_batch:.1f}" if r.records_per_batch is not None else "-"
        print(f"{r.server:<7} {r.workload.label:<24} {r.rate:>9,.0f} {r.percentile(0.5):>7.2f} "
              f"{r.percentile(0.99):>7.2f} {r.error_count:>6} {r.unanswered:>10} {cpu:>16} "
              f"{r.client_cpu * 100:>9.0f}% {per_fsync:>10}")
    by_workload: dict[Workload, dict[str, Result]] = collections.defaultdict(dict)
    for r in results:
        by_workload[r.workload][r.server] = r
    for w, rs in by_workload.items():
        if "kcoord" in rs and "mock" in rs and rs["mock"].rate:
            print(f"ratio kcoord/mock, {w.label}: {rs['kcoord'].rate / rs['mock'].rate:.3f}")
    for r in results:
        for what, count in r.errors.most_common():
            print(f"  {r.server} {r.workload.label}: {count} x {what}")


def spread(groups: int) -> int:
    return len({partition_for(f"bench-group-{g}", KCOORD_OFFSETS_PARTITIONS) for g in range(groups)})


# -- main -------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.commit_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per run (default 5)")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each run (default 1)")
    p.add_argument("--connections", type=int, default=4, help="connections (default 4)")
    p.add_argument("--inflight", type=int, default=16, help="requests in flight per connection (default 16)")
    p.add_argument("--partitions-per-request", type=int, default=1,
                   help=f"partitions per request, 1..{TOPIC_PARTITIONS} (default 1)")
    p.add_argument("--groups", type=int, default=64, help="groups the requests rotate over (default 64; 1: one group)")
    p.add_argument("--api", choices=("commit", "fetch"), default="commit", help="OffsetCommit v8 or OffsetFetch v6")
    p.add_argument("--only", choices=("kcoord", "mock"), help="run against one server only")
    p.add_argument("--kcoord-at", metavar="HOST:PORT",
                   help="use an already running kcoord (e.g. one under a profiler) instead of starting one")
    p.add_argument("--matrix", action="store_true",
                   help="run commit 1p/100p x 64 groups/1 group and fetch 1p/100p x 64 groups on both servers "
                        "(12 runs: about 50 s at --duration 3, 75 s at the default 5)")
    args = p.parse_args(argv)
    if not 1 <= args.partitions_per_request <= TOPIC_PARTITIONS:
        p.error(f"--partitions-per-request must be in 1..{TOPIC_PARTITIONS}")
    if args.connections < 1 or args.inflight < 1 or args.groups < 1:
        p.error("--connections, --inflight and --groups must be at least 1")
    return args


def workloads(args: argparse.Namespace) -> list[Workload]:
    if not args.matrix:
        return [Workload(args.api, args.groups, args.partitions_per_request)]
    return [
        Workload("commit", 64, 1),
        Workload("commit", 1, 1),
        Workload("commit", 64, 100),
        Workload("commit", 1, 100),
        Workload("fetch", 64, 1),
        Workload("fetch", 64, 100),
    ]


async def bench(args: argparse.Namespace) -> list[Result]:
    results: list[Result] = []
    servers = [s for s in ("kcoord", "mock") if args.only in (None, s)]
    work = workloads(args)
    with tempfile.TemporaryDirectory(prefix="kcoord-bench-") as tmp:
        for server in servers:
            if server == "kcoord" and args.kcoord_at:
                host, _, port = args.kcoord_at.rpartition(":")
                for w in work:
                    results.append(await run_workload(Target("kcoord", host, int(port)), w, args))
            elif server == "kcoord":
                kcoord = KcoordProcess(Path(tmp) / "data").start()
                try:
                    assert kcoord.proc is not None
                    target = Target("kcoord", "127.0.0.1", kcoord.port, kcoord.proc.pid, kcoord.data_dir)
                    for w in work:
                        results.append(await run_workload(target, w, args))
                        print(f"  done: kcoord {w.label}: {results[-1].rate:,.0f} req/s", file=sys.stderr)
                finally:
                    code = kcoord.stop()
                    problems = [line for line in kcoord.log().splitlines() if " WARNING " in line or " ERROR " in line]
                    if code != 0 or problems:
                        print(f"kcoord exited with {code}; warnings/errors in its log:", file=sys.stderr)
                        print("\n".join(problems[:20]), file=sys.stderr)
            else:
                mock = MockCluster()
                try:
                    for w in work:
                        results.append(await run_workload(Target("mock", mock.host, mock.port), w, args))
                        print(f"  done: mock {w.label}: {results[-1].rate:,.0f} req/s", file=sys.stderr)
                finally:
                    mock.close()
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        loop_kind = "uvloop"
    except ImportError:
        loop_kind = "asyncio"
    print(f"load: {args.connections} connections x {args.inflight} in flight, {args.warmup:g} s warm-up + "
          f"{args.duration:g} s measured per run; client on {loop_kind}; groups spread over "
          f"{spread(args.groups)} of kcoord's {KCOORD_OFFSETS_PARTITIONS} offsets partitions; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} before the run", flush=True)
    results = asyncio.run(bench(args))
    print()
    print_table(results)
    print()
    print("NOTE: kcoord answers a commit only after its batch is fsynced (durable, group commit, one fsync per")
    print("offsets partition per batch); the librdkafka mock cluster keeps offsets in memory and never touches the")
    print("disk. The mock runs inside this benchmark process (its threads are not in 'client CPU', which is the")
    print("load generator's thread alone); near 100% client CPU means a figure is client-bound.")
    print("latency: from the write of a request to the read of its response, measured window only.")
    print("recs/fsync: records per batch kcoord wrote during the run (warm-up included) = commits per fsync.")
    return 1 if any(r.error_count or r.unanswered for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
