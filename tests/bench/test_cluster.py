"""The harness's kcoord-x2: two kcoord processes as one cluster, each group's requests sent to the node
FindCoordinator names, the load split over the nodes, and every answer still checked exactly (a
request sent to a node that does not coordinate its group is an error, not a retry)."""

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import cpacer
from bench.client import Checker, Load, Route, Slot, measure_routes
from bench.harness import main
from bench.kcoord_api import offsets_partition
from bench.peers import KcoordCluster, Peer
from bench.scenarios import SCENARIOS, build_load, routes_for, run_scenario, split_connections
from bench.wire import Broker, Tolerance, Versions

VERSIONS = Versions(commit=8, fetch=9)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[KcoordCluster]:
    peer = KcoordCluster(tmp_path, 2)
    yield peer
    assert peer.close() == []  # stopped cleanly, no WARNING or ERROR in either node's log


def test_connections_are_split_over_the_nodes() -> None:
    assert split_connections(4, 2) == [2, 2]
    assert split_connections(5, 2) == [3, 2]
    assert split_connections(2, 2) == [1, 1]
    with pytest.raises(ValueError, match="--connections 2"):
        split_connections(1, 2)


def test_a_group_belongs_to_the_node_at_its_partition_modulo_the_nodes() -> None:
    peer = Peer()
    peer.brokers = (Broker(3, "h", 1), Broker(7, "h", 2))  # node ids ascending: index 0 is node 3
    for g in range(200):
        group = f"g{g}"
        assert peer.owner(group).node_id == (3 if offsets_partition(group, 50) % 2 == 0 else 7)


def test_commit_1_is_routed_to_each_groups_coordinator(cluster: KcoordCluster) -> None:
    s = SCENARIOS["commit-1"]
    m = asyncio.run(run_scenario(cluster, VERSIONS, s, groups=64, connections=4, inflight=16, warmup=0.2,
                                 duration=1.0))
    assert not m.sample.errors and m.sample.unanswered == 0
    assert m.by_node is not None and [n["node_id"] for n in m.by_node] == [0, 1]
    assert [n["connections"] for n in m.by_node] == [2, 2]  # 4 x 16 in all, as a server of one node gets
    assert all(n["requests"] > 0 for n in m.by_node)  # both nodes answered commits
    assert sum(n["requests"] for n in m.by_node) == m.sample.requests
    assert m.records_per_fsync is not None  # read from both nodes' logs
    assert m.sample.server_cpu_s is not None and m.sample.server_cpu_s > 0
    # and the fetches read back exactly what was committed, from each group's coordinator
    f = asyncio.run(run_scenario(cluster, VERSIONS, SCENARIOS["fetch-1"], groups=64, connections=4, inflight=16,
                                 warmup=0.2, duration=0.5))
    assert not f.sample.errors and f.sample.unanswered == 0 and f.by_node is not None
    assert all(n["requests"] > 0 for n in f.by_node)


def test_a_paced_run_paces_each_node_at_its_share_of_the_rate(cluster: KcoordCluster) -> None:
    """commit-1-half against the cluster: one C pacer per node, each with that node's groups, at the
    node's share of the rate, so the cluster as a whole gets the rate a server of one node gets."""
    if cpacer.binary() is None:
        pytest.skip("no C compiler: a cluster is paced by bench/pacer.c only")
    rate = 2000.0
    m = asyncio.run(run_scenario(cluster, VERSIONS, SCENARIOS["commit-1-half"], groups=64, connections=4,
                                 inflight=16, warmup=0.2, duration=1.0, rate=rate))
    sample = m.sample
    assert not sample.errors and sample.unanswered == 0 and sample.client == cpacer.NAME
    assert m.by_node is not None and [n["node_id"] for n in m.by_node] == [0, 1]
    assert [n["connections"] for n in m.by_node] == [2, 2]
    load = build_load(SCENARIOS["commit-1-half"], 64)
    shares = [len(r.load.order) / len(load.order) for _, r in asyncio.run(routes_for(cluster, load, 4))]
    due = [rate * share * (0.2 + sample.seconds) for share in shares]  # by the window's end, warm-up included
    for node, share, most in zip(m.by_node, shares, due, strict=True):  # each node at its share, not the rate
        assert rate * share * sample.seconds * 0.5 <= node["requests"] <= most + 1
    assert sum(n["requests"] for n in m.by_node) == sample.requests == len(sample.latencies)
    assert sample.server_cpu_s is not None and sample.server_cpu_s > 0  # both nodes' CPU over the windows


def test_requests_sent_to_the_other_node_are_counted_as_errors(cluster: KcoordCluster) -> None:
    """What the routing protects: each node answers NOT_COORDINATOR (16) for the other's groups, and
    the checker counts every such answer during the window."""
    load = build_load(SCENARIOS["commit-1"], 64)
    routes = asyncio.run(routes_for(cluster, load, 2))
    assert [b.node_id for b, _ in routes if b is not None] == [0, 1]
    swapped = [Route(b.host, b.port, r.load, r.connections)
               for b, (_, r) in zip(reversed(cluster.brokers), routes, strict=True)]
    sample = asyncio.run(measure_routes(swapped, Checker(load.slots, VERSIONS, Tolerance()), inflight=4,
                                        warmup=0.1, duration=0.3, server_cpu=cluster.cpu_seconds))
    assert sample.responses > 0 and sample.errors["error 16"] == sample.responses


def test_a_node_without_groups_of_the_load_gets_no_connection(cluster: KcoordCluster) -> None:
    group = "bench-group-0"
    load = Load(tuple(Slot("commit", t) for t in build_load(SCENARIOS["commit-1"], 1).templates), (0,))
    assert {t.group for t in load.templates} == {group}
    routes = asyncio.run(routes_for(cluster, load, 4))
    assert [(b, r.connections) for b, r in routes] == [(cluster.owner(group), 4)]


def test_the_harness_reports_the_cluster_beside_the_mock(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "results.json"
    code = main(["--quick", "--only", "kcoord-x2,mock", "--scenarios", "commit-1", "--duration", "1", "--warmup",
                 "0.2", "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    doc = json.loads(out.read_text())
    row = next(r for r in doc["measurements"] if r["server"] == "kcoord-x2")
    assert row["errors"] == 0 and row["unanswered"] == 0 and row["connections"] == 4
    assert [n["connections"] for n in row["by_node"]] == [2, 2] and all(n["requests"] for n in row["by_node"])
    assert "kcoord-x2/mock" in doc["ratios"]["commit-1"]
    assert [n["node_id"] for n in doc["servers"]["kcoord-x2"]["nodes"]] == [0, 1]
    assert any(t["name"] == "durable 1-partition commits, kcoord-x2" for t in doc["targets"])
    assert "commit-1 kcoord-x2: node 0" in printed
