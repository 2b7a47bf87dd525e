"""The request scenarios, run the same way against every server, and the fsync probe.

A scenario is a Load (bench/client.py): distinct requests and the order they go out in. Commits are
simple commits (generation -1, member ""), which any coordinator accepts for a group without members;
every request of a given shape commits the same offsets every time, so fetches can be checked exactly.
"""

import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import cpacer
from bench.client import Checker, Load, Sample, Slot, measure, prime
from bench.kcoord_api import log_totals
from bench.peers import Peer
from bench.wire import TOPIC_PARTITIONS, Template, Versions, create_topic

RING = 4096  # ring positions of the uniform scenarios (correlation ids 0..4095)
SLICES_PER_GROUP = 16  # 1-partition requests: each group rotates over 16 partitions
MIXED_GROUPS = 10_000
MIXED_FETCH_EVERY = 5  # 1 fetch in 5 requests: 80% commits, 20% fetches


@dataclass(frozen=True)
class Scenario:
    """A request scenario. ``paced`` runs only against kcoord, at half its measured peak rate."""

    name: str
    title: str
    kind: str  # "commit", "fetch" or "mixed"
    partitions: int = 1
    groups: int = 64
    paced: bool = False


SCENARIOS = {s.name: s for s in (
    Scenario("commit-1", "OffsetCommit, 1 partition", "commit", 1),
    Scenario("commit-100", "OffsetCommit, 100 partitions", "commit", 100),
    Scenario("fetch-1", "OffsetFetch, 1 partition", "fetch", 1),
    Scenario("fetch-100", "OffsetFetch, 100 partitions", "fetch", 100),
    Scenario("mixed", f"80% commit / 20% fetch, {MIXED_GROUPS:,} groups", "mixed", 1, MIXED_GROUPS),
    Scenario("commit-1-half", "OffsetCommit, 1 partition, paced at half kcoord's commit-1 rate", "commit", 1,
             paced=True),
)}


def templates(s: Scenario, groups: int) -> list[Template]:
    """Groups x partition slices; template ``i`` commits offset ``1000 + i`` to each of its partitions."""
    slices = max(1, min(SLICES_PER_GROUP, TOPIC_PARTITIONS // s.partitions))
    out: list[Template] = []
    for sl in range(slices):
        parts = tuple((sl * s.partitions + j) % TOPIC_PARTITIONS for j in range(s.partitions))
        for g in range(groups):
            out.append(Template(f"bench-group-{g}", parts, 1000 + len(out)))
    return out


def build_load(s: Scenario, groups: int) -> Load:
    """Uniform scenarios: commit or fetch every template in turn over a ring of ``RING``. Mixed: one
    template per group (partition ``g % 128``), and over a ring of 5 x groups positions each group is
    sent 4 commits and 1 fetch, the fetch at a different round for different groups."""
    if s.kind != "mixed":
        ts = templates(s, groups)
        return Load(tuple(Slot(s.kind, t) for t in ts), tuple(i % len(ts) for i in range(RING)))
    n = s.groups
    slots = []
    for g in range(n):
        t = Template(f"bench-mixed-{g}", (g % TOPIC_PARTITIONS,), 1000 + g)
        slots += [Slot("commit", t), Slot("fetch", t)]
    order = []
    for i in range(MIXED_FETCH_EVERY * n):
        g, rnd = i % n, i // n
        order.append(2 * g + (1 if rnd == g % MIXED_FETCH_EVERY else 0))
    return Load(tuple(slots), tuple(order))


@dataclass
class Measurement:
    """One scenario against one server."""

    scenario: Scenario
    server: str
    versions: Versions
    connections: int
    inflight: int
    partitions_per_request: float
    sample: Sample
    rate_target: float | None = None  # paced runs: the requests/s asked for
    records_per_fsync: float | None = None  # kcoord commits: records per batch written = commits per fsync
    loadavg: tuple[float, float, float] = field(default_factory=os.getloadavg)


async def run_scenario(peer: Peer, versions: Versions, s: Scenario, *, groups: int, connections: int, inflight: int,
                       warmup: float, duration: float, rate: float | None = None) -> Measurement:
    """Primes (every template committed once, retrying load-in-progress), then measures."""
    load = build_load(s, groups if s.kind != "mixed" else s.groups)
    checker = Checker(load.slots, versions, peer.tolerance)
    if peer.needs_topic:
        await create_topic(peer.host, peer.port)
    commit_checker = Checker([Slot("commit", t) for t in load.templates], versions, peer.tolerance)
    await prime(peer.host, peer.port, commit_checker, range(len(load.templates)))
    logged = log_totals(peer.data_dir) if peer.data_dir else (0, 0)
    program = cpacer.binary() if rate is not None else None
    if program is not None and rate is not None:
        sample = await cpacer.measure(program, peer.host, peer.port, load, checker, connections=connections,
                                      inflight=inflight, warmup=warmup, duration=duration,
                                      server_cpu=peer.cpu_seconds, rate=rate)
    else:
        sample = await measure(peer.host, peer.port, load, checker, connections=connections, inflight=inflight,
                               warmup=warmup, duration=duration, server_cpu=peer.cpu_seconds, rate=rate)
    m = Measurement(s, peer.name, versions, connections, inflight, load.partitions_per_request, sample, rate)
    if peer.data_dir and s.kind != "fetch":
        batches, records = log_totals(peer.data_dir)
        if batches > logged[0]:
            m.records_per_fsync = (records - logged[1]) / (batches - logged[0])
    return m


@dataclass
class FsyncProbe:
    """write(200 B) + fsync latency on the disk of kcoord's data dir: the floor of a durable commit."""

    path: str
    count: int
    p50_ms: float
    p99_ms: float
    p999_ms: float
    mean_ms: float


def fsync_probe(directory: Path, seconds: float = 1.0, max_count: int = 5000) -> FsyncProbe:
    """Appends 200-byte records to one file, fsync after each, for ``seconds`` or ``max_count``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "fsync-probe.bin"
    record = b"x" * 200
    times: list[float] = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        end = time.perf_counter() + seconds
        while len(times) < max_count and time.perf_counter() < end:
            t0 = time.perf_counter()
            os.write(fd, record)
            os.fsync(fd)
            times.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink()
    times.sort()

    def q(p: float) -> float:
        return times[min(len(times) - 1, int(p * len(times)))] * 1000

    return FsyncProbe(str(directory), len(times), q(0.5), q(0.99), q(0.999), statistics.fmean(times) * 1000)
