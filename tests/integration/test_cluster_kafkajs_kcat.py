"""kafkajs and kcat against cluster mode (two kcoord nodes): kafkajs' admin client, bootstrapped at one
node, describes the cluster, lists every node's groups, fetches, describes and deletes groups each node
coordinates, and reads the acknowledged offsets of a node killed -9 and started again; kcat's metadata
names both nodes and each offsets partition's leader. kafkajs and kcat join groups only for topics Metadata lists
and then need the topic's data (ListOffsets, Fetch), which standalone and cluster mode do not serve (see
README, Limits), so their group membership is tested in gateway mode (tests/gateway/test_kafkajs_kcat.py)."""

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_kafkajs
from tests.integration.test_cluster import Cluster, groups_of, owner, raw_offset
from tests.kcoord_process import KcoordProcess
from tests.rawclient import RawClient, commit_request

SCRIPT = Path(__file__).resolve().parent / "kafkajs_cluster.js"


def wait_ready(node: KcoordProcess, timeout: float = 30.0) -> None:
    """Until the node's /readyz says 200: loaded, and its peers known to agree (before that it coordinates
    nothing, NOT_COORDINATOR, which kafkajs' admin fetchOffsets does not retry, nor COORDINATOR_LOAD_IN_PROGRESS)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(node.metrics_url + "/readyz", timeout=5):
                return
        except (urllib.error.URLError, ConnectionError):
            assert time.monotonic() < deadline, node.log_since_start()
            time.sleep(0.05)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path).start()
    for node in c.nodes:
        wait_ready(node)
    yield c
    for node in c.nodes:
        if node.proc is not None and node.proc.poll() is None:
            node.kill()


def seed(cluster: Cluster, groups: list[str]) -> dict[str, dict[int, int]]:
    """Offsets committed to each group at its coordinator: group -> partition of topic "t" -> offset."""
    committed = {}
    for i, group in enumerate(groups):
        offsets = {0: 100 + i, 3: 300 + i}
        with RawClient(cluster.nodes[owner(group)].port) as client:
            answer = client.call(commit_request(group, {("t", p): o for p, o in offsets.items()}, metadata="js"), 8)
        assert all(p.error_code == 0 for t in answer.topics for p in t.partitions)
        committed[group] = offsets
    return committed


def kafkajs_json(kafkajs: Path, *args: str) -> Any:
    done = run_kafkajs(kafkajs, SCRIPT, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def fetched(answer: list[dict[str, Any]]) -> dict[int, tuple[int, str | None]]:
    [topic] = answer
    assert topic["topic"] == "t"
    return {int(p["partition"]): (int(p["offset"]), p["metadata"]) for p in topic["partitions"]}


def test_kafkajs_admin_sees_and_administers_every_nodes_groups(kafkajs: Path, cluster: Cluster) -> None:
    groups = groups_of(0, 2, "js") + groups_of(1, 2, "js")
    committed = seed(cluster, groups)
    node0, node1 = cluster.nodes
    out = kafkajs_json(kafkajs, "admin", node0.bootstrap, *groups)
    assert sorted((b["nodeId"], b["host"], b["port"]) for b in out["cluster"]["brokers"]) == [
        (0, "127.0.0.1", node0.port), (1, "127.0.0.1", node1.port)]
    assert set(groups) <= {g["groupId"] for g in out["listed"]}  # listGroups asks every broker
    for group in groups:
        assert fetched(out["offsets"][group]) == {p: (o, "js") for p, o in committed[group].items()}
    assert sorted((d["groupId"], d["errorCode"], d["state"]) for d in out["described"]) == sorted(
        (g, 0, "Empty") for g in groups)

    deleted = kafkajs_json(kafkajs, "delete", node1.bootstrap, *groups)
    assert sorted((d["groupId"], d["errorCode"]) for d in deleted) == sorted((g, 0) for g in groups)
    for group in groups:
        assert raw_offset(cluster.nodes[owner(group)], group, "t", 0) == (0, -1)


def test_kafkajs_reads_the_acknowledged_offsets_of_a_node_killed_and_started_again(
        kafkajs: Path, cluster: Cluster) -> None:
    """Offsets acknowledged by node 1, which is then killed -9 and started again, read through kafkajs
    bootstrapped at node 0 (and the groups of node 0, which served on, too)."""
    node0, node1 = cluster.nodes
    groups = groups_of(0, 1, "jsk") + groups_of(1, 2, "jsk")
    committed = seed(cluster, groups)
    node1.kill()
    node1.start()
    wait_ready(node1)
    out = kafkajs_json(kafkajs, "fetch", node0.bootstrap, *groups)
    assert {g: fetched(out[g]) for g in groups} == {
        g: {p: (o, "js") for p, o in committed[g].items()} for g in groups}


def test_kcat_metadata_names_both_nodes_and_each_partitions_leader(kcat: str, cluster: Cluster) -> None:
    node0, node1 = cluster.nodes
    for node in cluster.nodes:
        done = subprocess.run([kcat, "-L", "-J", "-b", node.bootstrap, "-t", "__consumer_offsets"],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
        meta = json.loads(done.stdout)
        assert sorted((b["id"], b["name"]) for b in meta["brokers"]) == [
            (0, node0.bootstrap), (1, node1.bootstrap)]
        [topic] = meta["topics"]
        assert {p["partition"]: p["leader"] for p in topic["partitions"]} == {p: p % 2 for p in range(50)}
