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
from bench.client import Checker, Load, Route, Sample, Slot, measure, measure_routes, prime
from bench.kcoord_api import log_totals
from bench.peers import Peer
from bench.wire import (
    TOPIC_PARTITIONS,
    Broker,
    Template,
    Versions,
    api_versions,
    create_topic,
    find_coordinator_version,
    find_coordinators,
)

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
    # A cluster: per node, its id, the connections it was given and the requests it answered in the window
    by_node: list[dict[str, int]] | None = None
    loadavg: tuple[float, float, float] = field(default_factory=os.getloadavg)


async def coordinators(peer: Peer, groups: list[str]) -> dict[str, Broker]:
    """Every group's coordinator, asked of every node of a cluster by FindCoordinator (the newest
    version both speak, v4's batched keys on kcoord), as a client bootstrapped from any node would ask.
    Fails unless every node gives the same answer and it is the node that owns the group's offsets
    partition (p % N of the node ids in ascending order, ``Peer.owner``)."""
    found: dict[str, Broker] | None = None
    for b in peer.brokers:
        version = find_coordinator_version(await api_versions(b.host, b.port))
        answer = await find_coordinators(b.host, b.port, groups, version)
        if found is not None and answer != found:
            differ = sorted(g for g in groups if answer[g] != found[g])
            raise RuntimeError(f"{peer.name}: node {b.node_id} names other coordinators than node "
                               f"{peer.brokers[0].node_id} for {len(differ)} groups, e.g. {differ[0]!r}: "
                               f"{answer[differ[0]]} against {found[differ[0]]}")
        found = answer
    assert found is not None
    wrong = [g for g in groups if found[g] != peer.owner(g)]
    if wrong:
        raise RuntimeError(f"{peer.name}: FindCoordinator names another coordinator than the owner of the offsets "
                           f"partition for {len(wrong)} of {len(groups)} groups, e.g. {wrong[0]!r}: "
                           f"{found[wrong[0]]}, expected {peer.owner(wrong[0])}")
    return found


def split_connections(connections: int, routes: int) -> list[int]:
    """The run's connections dealt over a cluster's nodes: as even as can be, the first nodes one more
    where they do not divide. Each keeps the run's in-flight depth, so the cluster as a whole has what a
    server of one node has (4 x 16 over two nodes: 2 x 16 each)."""
    if connections < routes:
        raise ValueError(f"{connections} connections cannot reach {routes} nodes: give --connections {routes} or more")
    return [connections // routes + (1 if k < connections % routes else 0) for k in range(routes)]


async def routes_for(peer: Peer, load: Load, connections: int) -> list[tuple[Broker | None, Route]]:
    """Where each request of ``load`` goes. A server of one node: all of it to host:port. A cluster:
    each node gets the ring positions of the groups it coordinates (in the load's order) and its share
    of the connections; a node that coordinates none of the load's groups gets none."""
    if not peer.brokers:
        return [(None, Route(peer.host, peer.port, load, connections))]
    owner = await coordinators(peer, sorted({t.group for t in load.templates}))
    orders = {b: tuple(i for i in load.order if owner[load.slots[i].template.group] == b) for b in peer.brokers}
    used = [b for b in peer.brokers if orders[b]]
    return [(b, Route(b.host, b.port, Load(load.slots, orders[b]), n))
            for b, n in zip(used, split_connections(connections, len(used)), strict=True)]


async def run_scenario(peer: Peer, versions: Versions, s: Scenario, *, groups: int, connections: int, inflight: int,
                       warmup: float, duration: float, rate: float | None = None) -> Measurement:
    """Primes (every template committed once, retrying load-in-progress), then measures. A cluster is
    primed and driven node by node: each group's requests go to its coordinator only, so an answer
    NOT_COORDINATOR during the window is counted as the error it is."""
    load = build_load(s, groups if s.kind != "mixed" else s.groups)
    checker = Checker(load.slots, versions, peer.tolerance)
    if peer.needs_topic:
        await create_topic(peer.host, peer.port)
    program = cpacer.binary() if rate is not None else None
    if rate is not None and peer.brokers and program is None:
        raise ValueError(f"{peer.name}: a cluster is paced by the C load generator only (bench/pacer.c: no C compiler)")
    routes = await routes_for(peer, load, connections)
    templates_ = load.templates
    commit_checker = Checker([Slot("commit", t) for t in templates_], versions, peer.tolerance)
    for broker, route in routes:
        if broker is None:
            await prime(route.host, route.port, commit_checker, range(len(templates_)))
        else:  # a node is primed with its own groups only (any other would answer NOT_COORDINATOR)
            mine = {load.slots[i].template for i in route.load.order}
            await prime(route.host, route.port, commit_checker, [i for i, t in enumerate(templates_) if t in mine])
    logged = logs_written(peer)
    if program is not None and rate is not None and routes[0][0] is not None:
        sample = await cpacer.measure_routes(program, [r for _, r in routes], checker, inflight=inflight,
                                             warmup=warmup, duration=duration, server_cpu=peer.cpu_seconds,
                                             rate=rate)
    elif program is not None and rate is not None:
        sample = await cpacer.measure(program, peer.host, peer.port, load, checker, connections=connections,
                                      inflight=inflight, warmup=warmup, duration=duration,
                                      server_cpu=peer.cpu_seconds, rate=rate)
    elif routes[0][0] is None:
        sample = await measure(peer.host, peer.port, load, checker, connections=connections, inflight=inflight,
                               warmup=warmup, duration=duration, server_cpu=peer.cpu_seconds, rate=rate)
    else:
        sample = await measure_routes([r for _, r in routes], checker, inflight=inflight, warmup=warmup,
                                      duration=duration, server_cpu=peer.cpu_seconds, rate=rate)
    m = Measurement(s, peer.name, versions, connections, inflight, load.partitions_per_request, sample, rate)
    if peer.brokers:
        m.by_node = [{"node_id": b.node_id, "connections": r.connections, "requests": n}
                     for (b, r), n in zip(routes, sample.requests_by_route, strict=True) if b is not None]
    if peer.data_dirs and s.kind != "fetch":
        batches, records = logs_written(peer)
        if batches > logged[0]:
            m.records_per_fsync = (records - logged[1]) / (batches - logged[0])
    return m


def logs_written(peer: Peer) -> tuple[int, int]:
    """(batches, records) in the server's offsets logs so far, over every node of a cluster."""
    totals = [log_totals(d) for d in peer.data_dirs]
    return sum(b for b, _ in totals), sum(r for _, r in totals)


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
