"""The load generator: a raw pipelined Kafka client on asyncio + uvloop, no client library in the path.

C connections each keep D requests outstanding (closed loop: every response sends the next request,
and all requests one read completes go back in one write), or, paced, requests become due at a fixed
rate whatever happened to earlier ones (open loop, for latency at a given load). Requests come from a
ring of pre-encoded frames whose correlation id is their ring index, so every connection checks that
answers come back in order with the right id. Every answer is compared with the known-good bytes for
its request and anything else is decoded and checked (errors, partitions, offsets).
"""

import asyncio
import collections
import functools
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.wire import (
    RETRYABLE,
    SIZE,
    Template,
    Tolerance,
    Versions,
    commit_frame,
    commit_problems,
    fetch_frame,
    fetch_problems,
    with_correlation_id,
)

PACER_TICK = 0.001  # seconds between open-loop scheduling passes
DRAIN_TIMEOUT = 10.0  # seconds to wait for outstanding answers after the window before calling them lost


@dataclass(frozen=True)
class Slot:
    """One distinct request of a load: what it asks (commit or fetch) for which template."""

    kind: str  # "commit" or "fetch"
    template: Template


@dataclass(frozen=True)
class Load:
    """What a run sends: its distinct requests, and the order they go out in (one ring position each;
    the ring's length is ``len(order)``, so correlation ids are ring positions)."""

    slots: tuple[Slot, ...]
    order: tuple[int, ...]

    @property
    def templates(self) -> list[Template]:
        return list(dict.fromkeys(s.template for s in self.slots))

    @property
    def partitions_per_request(self) -> float:
        return sum(len(self.slots[i].template.partitions) for i in self.order) / len(self.order)


class Checker:
    """Checks one answer against the request of its slot; at the server's versions and tolerance."""

    def __init__(self, slots: Sequence[Slot], versions: Versions, tolerance: Tolerance) -> None:
        self.slots, self.versions, self.tolerance = slots, versions, tolerance

    def frame(self, index: int) -> bytes:
        slot = self.slots[index]
        if slot.kind == "commit":
            return commit_frame(slot.template, self.versions.commit)
        return fetch_frame(slot.template, self.versions.fetch)

    def problems(self, index: int, body: bytes) -> list[str]:
        slot = self.slots[index]
        if slot.kind == "commit":
            return commit_problems(body, slot.template, self.versions.commit)
        return fetch_problems(body, slot.template, self.versions.fetch, self.tolerance)


@dataclass
class Sample:
    """Counters of one run; rates and percentiles over the measured window only."""

    requests: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    responses: int = 0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    unanswered: int = 0
    client_cpu_s: float = 0.0
    server_cpu_s: float | None = None
    late: int = 0  # paced runs: measured requests sent more than ``late_after_s`` after they were due
    late_after_s: float = PACER_TICK * 2  # two pacing passes of the generator that ran (bench/pacer.c: 0.2 ms)
    held: int = 0  # of the measured requests, how many were due while D were already outstanding on their connection
    client: str = "asyncio"  # the load generator: this module's, or bench/cpacer.py's C program
    requests_by_route: list[int] = field(default_factory=list)  # measured requests per route (cluster node)


class Run:
    """The shared state of one run: the frame ring, the known-good answers, the counters."""

    def __init__(self, load: Load, checker: Checker, inflight: int, sample: Sample) -> None:
        self.inflight = inflight
        self.sample = sample
        self.checker = checker
        base = [checker.frame(i) for i in range(len(load.slots))]
        self.slot_of = list(load.order)
        self.ring = [with_correlation_id(base[s], i) for i, s in enumerate(self.slot_of)]
        self.ok_bodies: dict[int, bytes] = {}
        self.recording = False
        self.stopping = False
        self.paced = False
        self.counted = 0  # responses received while recording, this run's share of ``sample.requests``
        self.connections: list[Connection] = []

    def check(self, slot: int, body: bytes) -> None:
        """Slow path: an answer that differs from the cached good answer of its slot."""
        problems = self.checker.problems(slot, body)
        if problems:
            self.sample.errors.update(problems)
        else:
            self.ok_bodies[slot] = body

    @property
    def outstanding(self) -> int:
        return sum(c.sent - c.received for c in self.connections)


class Connection(asyncio.Protocol):
    """Keeps ``inflight`` requests outstanding (or sends paced ones as they fall due)."""

    def __init__(self, run: Run, start: int = 0) -> None:
        self.run = run
        self.transport: asyncio.Transport | None = None
        self.sent = start  # ring position of the next request (and correlation id, modulo the ring)
        self.received = start
        self.sent_at: collections.deque[float] = collections.deque()
        self.due: collections.deque[float] = collections.deque()  # paced: due times not sent yet
        self.buf = b""
        self.lost: Exception | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if not self.run.paced:
            self._send(self.run.inflight, time.perf_counter())

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc or ConnectionResetError("server closed the connection")

    def _send(self, n: int, now: float) -> None:
        ring, seq, size = self.run.ring, self.sent, len(self.run.ring)
        self.sent = seq + n
        self.sent_at.extend([now] * n)
        assert self.transport is not None
        self.transport.write(b"".join([ring[(seq + k) % size] for k in range(n)]))

    def pump(self, now: float) -> None:
        """Paced: sends due requests while fewer than ``inflight`` are outstanding. Their latency runs
        from when they were due, so a server that falls behind is not flattered by the wait."""
        n = min(len(self.due), self.run.inflight - (self.sent - self.received))
        if n <= 0 or self.run.stopping:
            return
        ring, seq, size = self.run.ring, self.sent, len(self.run.ring)
        self.sent = seq + n
        due = [self.due.popleft() for _ in range(n)]
        self.run.sample.late += sum(1 for d in due if now - d > PACER_TICK * 2)
        self.sent_at.extend(due)
        assert self.transport is not None
        self.transport.write(b"".join([ring[(seq + k) % size] for k in range(n)]))

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if self.buf:
            data = self.buf + data
        run = self.run
        sample = run.sample
        ok_bodies, slot_of, size_ring = run.ok_bodies, run.slot_of, len(run.ring)
        recording = run.recording
        lat = sample.latencies
        sent_at = self.sent_at
        pos, end, n = 0, len(data), 0
        seq = self.received
        while end - pos >= 4:
            size = int.from_bytes(data[pos : pos + 4], "big")
            if end - pos - 4 < size:
                break
            start = pos + 4
            pos = start + size
            ring_index = seq % size_ring
            seq += 1
            n += 1
            if int.from_bytes(data[start : start + 4], "big") != ring_index:
                sample.errors["correlation id out of order"] += 1
            body = data[start + 4 : pos]
            slot = slot_of[ring_index]
            if body != ok_bodies.get(slot):
                run.check(slot, body)
            sent = sent_at.popleft()
            if recording:
                lat.append(now - sent)
        self.buf = data[pos:]
        self.received = seq
        sample.responses += n
        if recording:
            sample.requests += n
            run.counted += n
        if n and not run.stopping:
            if run.paced:
                self.pump(now)
            else:
                self._send(n, now)


class Pacer:
    """Open-loop arrivals: request k is due at ``t0 + k / rate``, dealt round-robin to connections."""

    def __init__(self, run: Run, rate: float) -> None:
        self.run, self.rate = run, rate
        self.t0 = time.perf_counter()
        self.issued = 0
        self.handle: asyncio.TimerHandle | None = None

    def tick(self) -> None:
        if self.run.stopping:
            return
        now = time.perf_counter()
        due = int((now - self.t0) * self.rate) + 1 - self.issued  # requests 0..k with t0 + k / rate <= now
        conns = self.run.connections
        for k in range(self.issued, self.issued + due):
            conns[k % len(conns)].due.append(self.t0 + k / self.rate)
        self.issued += max(due, 0)
        for c in conns:
            c.pump(now)
        self.handle = asyncio.get_running_loop().call_later(PACER_TICK, self.tick)


async def prime(host: str, port: int, checker: Checker, commits: Sequence[int], timeout: float = 60.0,
                chunk: int = 1000) -> None:
    """Sends every commit slot once (pipelined, one connection) until each is answered without a
    retryable error, so shards are loaded, groups exist and fetches read known offsets."""
    deadline = time.monotonic() + timeout
    todo = list(commits)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while todo:
            retry = []
            for first in range(0, len(todo), chunk):
                part = todo[first : first + chunk]
                writer.write(b"".join(with_correlation_id(checker.frame(i), k) for k, i in enumerate(part)))
                for k, i in enumerate(part):
                    size = SIZE.unpack(await reader.readexactly(4))[0]
                    frame = await reader.readexactly(size)
                    if SIZE.unpack_from(frame)[0] != k:
                        raise RuntimeError(f"priming: correlation id {SIZE.unpack_from(frame)[0]}, expected {k}")
                    problems = checker.problems(i, frame[4:])
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


def stat_fields(stat: str | Path) -> list[str]:
    """The fields of a /proc/<pid>/stat (or task) file after the command name, from the state on: the
    name, in parentheses, may itself hold spaces and parentheses."""
    return Path(stat).read_text().rsplit(")", 1)[1].split()


def cpu_seconds(stat: str, *, reaped: bool = False) -> float:
    """utime + stime of a /proc/<pid>/stat or /proc/<pid>/task/<tid>/stat file; with ``reaped``, plus
    the cutime + cstime of the children the process has waited for."""
    fields = stat_fields(stat)
    ticks = int(fields[11]) + int(fields[12])
    if reaped:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def process_tree_cpu(pid: int) -> float:
    """CPU seconds of a process, of the children it has reaped, and of every live descendant: what a
    server costs, its helper processes included (kcoord's sync helper makes every commit's fdatasync,
    ~80 us of CPU per flush cycle on this VM, none of it in the server process's own figures).
    Raises FileNotFoundError (or ProcessLookupError) once ``pid`` is gone. A descendant reaped
    between the listing and the reading of its figures is missed for that one sample: harmless for a
    helper that lives as long as its server."""
    total = cpu_seconds(f"/proc/{pid}/stat", reaped=True)
    for child in _children(pid):
        try:
            total += process_tree_cpu(child)
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def _children(pid: int) -> list[int]:
    """Live children of ``pid``: from each of its threads' /proc children list, or, on a kernel without
    those lists (CONFIG_PROC_CHILDREN), from every process's parent pid."""
    if not Path(f"/proc/{pid}/task/{pid}/children").exists():
        return children_by_parent(pid)
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found.extend(int(c) for c in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def children_by_parent(pid: int) -> list[int]:
    """Live children of ``pid`` found by every process's parent pid (any Linux kernel)."""
    if not Path(f"/proc/{pid}/stat").exists():
        raise FileNotFoundError(f"/proc/{pid}")
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit() and _parent(entry) == pid]


def _parent(proc: Path) -> int:
    try:
        return int(stat_fields(proc / "stat")[1])
    except (FileNotFoundError, ProcessLookupError):
        return -1


def client_stat() -> str:
    """The load generator's own thread: servers running inside this process have other threads."""
    return f"/proc/self/task/{threading.get_native_id()}/stat"


@dataclass(frozen=True)
class Route:
    """Where part of a load goes: one server address, the ring positions meant for it and how many of
    the run's connections are its own. A server of one node gets the whole load; a cluster gets one
    route per node, each with the requests of the groups that node coordinates (bench/scenarios.py)."""

    host: str
    port: int
    load: Load
    connections: int


async def measure(host: str, port: int, load: Load, checker: Checker, *, connections: int, inflight: int,
                  warmup: float, duration: float, server_cpu: Callable[[], float | None],
                  rate: float | None = None) -> Sample:
    """Connects, warms up, measures ``duration`` seconds, stops sending and waits for every answer."""
    return await measure_routes([Route(host, port, load, connections)], checker, inflight=inflight, warmup=warmup,
                                duration=duration, server_cpu=server_cpu, rate=rate)


async def measure_routes(routes: Sequence[Route], checker: Checker, *, inflight: int, warmup: float,
                         duration: float, server_cpu: Callable[[], float | None],
                         rate: float | None = None) -> Sample:
    """``measure`` over several routes at once, in one window: each route has its own connections and
    its own ring (correlation ids are positions in it), all of them share the sample, so req/s and the
    latencies are the sum over the routes; ``Sample.requests_by_route`` keeps each one's count. Paced
    runs take one route only (their pacer deals to every connection of the run)."""
    if rate is not None and len(routes) != 1:
        raise ValueError("a paced run takes one route")
    sample = Sample()
    runs = [Run(r.load, checker, inflight, sample) for r in routes]
    loop = asyncio.get_running_loop()
    for route, run in zip(routes, runs, strict=True):
        run.paced = rate is not None
        for k in range(route.connections):
            # Each connection starts ``inflight`` ring positions after the one before, so the requests in
            # flight are for different groups, as many independent consumers' would be. Started together,
            # connections walked the same groups in step for a while, and how long depended on the run: a
            # durable server syncing a few partition logs per cycle instead of 20-25 measured up to 1.5x
            # faster in one run than in the next.
            _, conn = await loop.create_connection(functools.partial(Connection, run, k * inflight), route.host,
                                                   route.port)
            run.connections.append(conn)
    pacer = Pacer(runs[0], rate) if rate is not None else None
    if pacer:
        pacer.tick()
    await asyncio.sleep(warmup)
    stat = client_stat()
    server0, client0 = server_cpu(), cpu_seconds(stat)
    late0 = sample.late
    for run in runs:
        run.recording = True
    started = time.perf_counter()
    await asyncio.sleep(duration)
    for run in runs:
        run.recording = False
    sample.seconds = time.perf_counter() - started
    sample.client_cpu_s = cpu_seconds(stat) - client0
    server1 = server_cpu()
    if server0 is not None and server1 is not None:
        sample.server_cpu_s = server1 - server0
    sample.late -= late0
    sample.requests_by_route = [run.counted for run in runs]
    for run in runs:
        run.stopping = True
    if pacer and pacer.handle:
        pacer.handle.cancel()
    deadline = time.monotonic() + DRAIN_TIMEOUT

    def lost() -> bool:
        return any(c.lost for run in runs for c in run.connections)

    while any(run.outstanding for run in runs) and time.monotonic() < deadline and not lost():
        await asyncio.sleep(0.005)
    sample.unanswered = sum(run.outstanding for run in runs)
    for run in runs:
        for conn in run.connections:
            if conn.lost is not None:
                sample.errors[f"connection lost: {type(conn.lost).__name__}"] += 1
            elif conn.transport is not None:
                conn.transport.close()
    return sample
