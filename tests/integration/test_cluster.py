"""Cluster mode (coordinator.cluster) with real processes and stock clients: two kcoord nodes, each
coordinating half of the offsets partitions; clients bootstrapped at either node find each group's
coordinator and commit, fetch, join and administer there, as against a Kafka cluster."""

import asyncio
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka as ck
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition as AioTP
from kafka import KafkaConsumer, TopicPartition
from kafka.protocol.admin.groups import ListGroupsRequest
from kafka.protocol.consumer.group import JoinGroupRequest, OffsetFetchRequest
from kafka.protocol.metadata import FindCoordinatorRequest, MetadataRequest
from kafka.structs import OffsetAndMetadata

from protocol.partitioning import partition_for
from tests.integration.test_groups import Member, settled
from tests.kcoord_process import REPO, KcoordProcess, free_port
from tests.rawclient import RawClient, commit_request, fetch_request

TIMEOUT = 10.0
NOT_COORDINATOR = 16


def owner(group: str) -> int:
    return partition_for(group, 50) % 2


def groups_of(node: int, count: int, prefix: str = "g") -> list[str]:
    """``count`` group ids whose coordinator is ``node``."""
    found: list[str] = []
    i = 0
    while len(found) < count:
        if owner(name := f"{prefix}{i}") == node:
            found.append(name)
        i += 1
    return found


class Cluster:
    def __init__(self, root: Path, *extra: str) -> None:
        ports = [free_port(), free_port()]
        listed = ",".join(f"{i}@127.0.0.1:{p}" for i, p in enumerate(ports))
        self.nodes = [KcoordProcess(root / f"node{i}", "--node-id", str(i), "--cluster", listed, *extra, port=port)
                      for i, port in enumerate(ports)]

    def start(self) -> "Cluster":
        for node in self.nodes:
            node.start(wait=False)
        for node in self.nodes:
            node.wait_listening()
            node.wait_loaded()
        return self

    @property
    def bootstrap(self) -> str:
        return self.nodes[0].bootstrap


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, "--group-initial-rebalance-delay-ms", "500", "--group-min-session-timeout-ms", "1000")
    c.start()
    yield c
    for node in c.nodes:
        if node.proc is not None and node.proc.poll() is None:
            node.kill()


def raw_offset(node: KcoordProcess, group: str, topic: str, partition: int) -> tuple[int, int]:
    """(group error, committed offset) from one node, asked directly (OffsetFetch v8)."""
    client = RawClient(node.port)
    try:
        response = client.call(_fetch(group, topic, partition), 8)
    finally:
        client.close()
    answer = response.groups[0]
    if answer.error_code:
        return answer.error_code, -1
    return 0, answer.topics[0].partitions[0].committed_offset


def _fetch(group: str, topic: str, partition: int) -> OffsetFetchRequest:
    Group = OffsetFetchRequest.OffsetFetchRequestGroup
    return OffsetFetchRequest(groups=[Group(group_id=group, topics=[
        Group.OffsetFetchRequestTopics(name=topic, partition_indexes=[partition])])], require_stable=False)


def test_metadata_names_both_nodes_and_each_partitions_leader(cluster: Cluster) -> None:
    for node in cluster.nodes:
        client = RawClient(node.port)
        try:
            topic = MetadataRequest.MetadataRequestTopic(name="__consumer_offsets", topic_id=None)
            meta = client.call(MetadataRequest(topics=[topic], allow_auto_topic_creation=False,
                                               include_topic_authorized_operations=False), 12)
        finally:
            client.close()
        assert sorted((b.node_id, b.host, b.port) for b in meta.brokers) == [
            (i, "127.0.0.1", n.port) for i, n in enumerate(cluster.nodes)]
        assert meta.controller_id == 0
        leaders = {p.partition_index: p.leader_id for p in meta.topics[0].partitions}
        assert leaders == {p: p % 2 for p in range(50)}


def test_find_coordinator_names_each_groups_owner_from_either_node(cluster: Cluster) -> None:
    keys = groups_of(0, 3) + groups_of(1, 3)
    for node in cluster.nodes:
        client = RawClient(node.port)
        try:
            batched = client.call(FindCoordinatorRequest(key_type=0, coordinator_keys=keys), 4)
            single = [client.call(FindCoordinatorRequest(key=k, key_type=0), 3) for k in keys]
            v0 = client.call(FindCoordinatorRequest(key=keys[-1]), 0)
        finally:
            client.close()
        expected = [(owner(k), cluster.nodes[owner(k)].port) for k in keys]
        assert [(c.node_id, c.port, c.error_code) for c in batched.coordinators] == [(n, p, 0) for n, p in expected]
        assert [(s.node_id, s.port, s.error_code) for s in single] == [(n, p, 0) for n, p in expected]
        assert (v0.node_id, v0.port) == expected[-1]


def test_a_node_refuses_the_groups_of_the_other_with_not_coordinator(cluster: Cluster) -> None:
    mine, theirs = groups_of(0, 1)[0], groups_of(1, 1)[0]
    client = RawClient(cluster.nodes[0].port)
    try:
        ok = client.call(commit_request(mine, {("t", 0): 5}), 8)
        refused = client.call(commit_request(theirs, {("t", 0): 5}), 8)
        refused_v1 = client.call(fetch_request(theirs, {"t": [0]}), 1)
        join = client.call(JoinGroupRequest(group_id=theirs, session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
                                            member_id="", group_instance_id=None, protocol_type="consumer",
                                            protocols=[], reason=None), 9)
    finally:
        client.close()
    assert ok.topics[0].partitions[0].error_code == 0
    assert refused.topics[0].partitions[0].error_code == NOT_COORDINATOR
    assert refused_v1.topics[0].partitions[0].error_code == NOT_COORDINATOR
    assert join.error_code == NOT_COORDINATOR
    assert raw_offset(cluster.nodes[0], mine, "t", 0) == (0, 5)
    assert raw_offset(cluster.nodes[0], theirs, "t", 0)[0] == NOT_COORDINATOR
    assert raw_offset(cluster.nodes[1], theirs, "t", 0) == (0, -1)  # never committed where it is coordinated


def test_stock_clients_commit_at_each_groups_coordinator(cluster: Cluster) -> None:
    """Bootstrapped at node 0, every client commits to both nodes' groups; each commit is held by the
    group's coordinator alone, and reads through node 1 see it."""
    groups = groups_of(0, 2, "c") + groups_of(1, 2, "c")
    node0, node1 = cluster.nodes
    for i, group in enumerate(groups):
        consumer = KafkaConsumer(bootstrap_servers=node0.bootstrap, group_id=group, enable_auto_commit=False,
                                 request_timeout_ms=10_000)
        try:
            consumer.commit({TopicPartition("t", 0): OffsetAndMetadata(100 + i, "kp", -1)}, timeout_ms=10_000)
        finally:
            consumer.close()
        confluent = ck.Consumer({"bootstrap.servers": node0.bootstrap, "group.id": group, "enable.auto.commit": False,
                                 "broker.address.family": "v4"})
        try:
            confluent.commit(offsets=[ck.TopicPartition("t", 1, 200 + i)], asynchronous=False)
        finally:
            confluent.close()
    asyncio.run(_aiokafka_commits(node0.bootstrap, groups))
    for i, group in enumerate(groups):
        coordinator, other = cluster.nodes[owner(group)], cluster.nodes[1 - owner(group)]
        assert [raw_offset(coordinator, group, "t", p) for p in range(3)] == [(0, 100 + i), (0, 200 + i), (0, 300 + i)]
        assert raw_offset(other, group, "t", 0)[0] == NOT_COORDINATOR
        reader = KafkaConsumer(bootstrap_servers=node1.bootstrap, group_id=group, enable_auto_commit=False,
                               request_timeout_ms=10_000)
        try:
            assert [reader.committed(TopicPartition("t", p), timeout_ms=10_000) for p in range(3)] == [
                100 + i, 200 + i, 300 + i]
        finally:
            reader.close()


async def _aiokafka_commits(bootstrap: str, groups: list[str]) -> None:
    for i, group in enumerate(groups):
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                                    auto_offset_reset="none", request_timeout_ms=10_000)
        await asyncio.wait_for(consumer.start(), TIMEOUT)
        try:
            consumer.assign([AioTP("t", 2)])
            await asyncio.wait_for(consumer.commit({AioTP("t", 2): (300 + i, "")}), TIMEOUT)
        finally:
            await asyncio.wait_for(consumer.stop(), TIMEOUT)


def test_stock_members_join_a_group_coordinated_by_the_node_they_did_not_bootstrap_at(
        cluster: Cluster, tmp_path: Path) -> None:
    group = groups_of(1, 1, "members")[0]
    node0 = cluster.nodes[0]
    members = [Member(node0, "kafka-python", group, client_id="a"), Member(node0, "aiokafka", group, client_id="b")]
    try:
        events = settled(*members)
        assert len({e["member_id"] for e in events}) == 2
        assert sorted(tuple(p) for e in events for p in e["partitions"]) == [("events", p) for p in range(4)]
        described = _groups_cli(cluster.nodes[1], "describe", group)
        assert sorted(e["member_id"] for e in events) == sorted(
            line.split()[3] for line in described.splitlines() if " Stable " in line)
    finally:
        for m in members:
            m.kill()


def _groups_cli(node: KcoordProcess, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "coordinator.cli", "groups", "--bootstrap", node.bootstrap, *args],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_kcoord_groups_lists_and_deletes_across_the_nodes(cluster: Cluster) -> None:
    groups = groups_of(0, 2, "admin") + groups_of(1, 2, "admin")
    client = [RawClient(n.port) for n in cluster.nodes]
    try:
        for group in groups:
            assert client[owner(group)].call(commit_request(group, {("t", 0): 1}), 8) \
                .topics[0].partitions[0].error_code == 0
    finally:
        for c in client:
            c.close()
    listed = _groups_cli(cluster.nodes[0], "list")
    assert all(g in listed for g in groups)
    victim = groups_of(1, 1, "admin")[0]
    assert "deleted" in _groups_cli(cluster.nodes[0], "delete", victim)
    assert raw_offset(cluster.nodes[1], victim, "t", 0) == (0, -1)
    after = _groups_cli(cluster.nodes[1], "list")
    assert victim not in after and all(g in after for g in groups if g != victim)


def test_each_node_says_which_it_is_in_its_metrics_and_readiness(cluster: Cluster) -> None:
    for i, node in enumerate(cluster.nodes):
        with urllib.request.urlopen(node.metrics_url + "/metrics", timeout=TIMEOUT) as r:
            text = r.read().decode()
        assert f'kcoord_node_info{{node_id="{i}",nodes="2",partitions="25"}} 1.0' in text
        assert "kcoord_cluster_agreed 1.0" in text
        with urllib.request.urlopen(node.metrics_url + "/readyz", timeout=TIMEOUT) as r:
            assert json.loads(r.read())["partitions"] == 25


def test_a_killed_node_leaves_the_other_serving_and_keeps_its_acknowledged_commits(cluster: Cluster) -> None:
    node0, node1 = cluster.nodes
    mine, theirs = groups_of(0, 1, "k")[0], groups_of(1, 1, "k")[0]
    with RawClient(node1.port) as c1:
        assert c1.call(commit_request(theirs, {("t", 0): 77}), 8).topics[0].partitions[0].error_code == 0
    node1.kill()
    with RawClient(node0.port) as c0:
        assert c0.call(commit_request(mine, {("t", 0): 11}), 8).topics[0].partitions[0].error_code == 0
    node1.start()
    assert raw_offset(node1, theirs, "t", 0) == (0, 77)
    assert raw_offset(node0, mine, "t", 0) == (0, 11)


def test_a_data_directory_started_as_another_node_is_refused(cluster: Cluster) -> None:
    node0, node1 = cluster.nodes
    node1.stop()
    listed = ",".join(f"{i}@127.0.0.1:{n.port}" for i, n in enumerate(cluster.nodes))
    swapped = subprocess.run(
        [sys.executable, "-m", "coordinator.cli", "serve", "--listen", f"127.0.0.1:{free_port()}", "--metrics-listen",
         "off", "--data-dir", str(node0.data_dir.parent / "node1"), "--node-id", "0", "--cluster", listed],
        cwd=REPO, capture_output=True, text=True, timeout=60)
    assert swapped.returncode == 2
    assert "does not move partitions between nodes" in swapped.stderr
    alone = subprocess.run(
        [sys.executable, "-m", "coordinator.cli", "serve", "--listen", node1.bootstrap, "--metrics-listen", "off",
         "--data-dir", str(node0.data_dir.parent / "node1")], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert alone.returncode == 2
    assert "served empty" in alone.stderr


def test_a_node_given_another_cluster_list_than_its_peers_does_not_coordinate_their_groups(cluster: Cluster) -> None:
    """Growing the cluster: a third node is started with a three-node --cluster while nodes 0 and 1 still
    run with two (they cannot be restarted with three: their directories refuse it). The lists disagree on
    the owner of every partition p with p % 2 == 0 and p % 3 == 2 (or p % 2 == 1 and p % 3 == 2), and
    each group there must still have one coordinator: two would each accept a commit (the offsets
    diverge by which node a client bootstrapped at) and each run a generation of the group (members
    consuming the same partitions). Either the newcomer is refused, or it or the peers refuse the
    disputed groups."""
    node0, node1 = cluster.nodes
    port2 = free_port()
    listed = f"0@127.0.0.1:{node0.port},1@127.0.0.1:{node1.port},2@127.0.0.1:{port2}"
    node2 = KcoordProcess(node0.data_dir.parent / "node2", "--node-id", "2", "--cluster", listed, port=port2)
    try:
        node2.start(wait=False)
        try:
            node2.wait_listening()
            node2.wait_loaded()
        except RuntimeError:
            return  # refused at start: the disagreement was noticed
        group = next(g for i in range(100_000) if partition_for(g := f"d{i}", 50) % 6 == 2)  # node 0's, and node 2's
        accepted = []
        for node, offset in ((node0, 100), (node2, 200)):
            with RawClient(node.port) as client:
                code = client.call(commit_request(group, {("t", 0): offset}), 8).topics[0].partitions[0].error_code
            if code == 0:
                accepted.append(node.port)
        assert len(accepted) <= 1, f"group {group} (partition {partition_for(group, 50)}) has two coordinators"
        assert accepted == [node0.port]  # the running nodes go on; the newcomer, which asked them, holds back
        assert "does not share this node's view of the cluster (it names the nodes 0@" in node2.log_since_start()
        with urllib.request.urlopen(node2.metrics_url + "/metrics", timeout=TIMEOUT) as r:
            assert "kcoord_cluster_agreed 0.0" in r.read().decode()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(node2.metrics_url + "/readyz", timeout=TIMEOUT)
        assert refused.value.code == 503 and set(json.loads(refused.value.read())["cluster"]) == {"0", "1"}
    finally:
        if node2.proc is not None and node2.proc.poll() is None:
            node2.kill()


def test_a_running_node_whose_restarted_peer_disagrees_withholds_its_groups_and_lists_none(cluster: Cluster) -> None:
    """Node 1 restarted with a list that gives node 0 another address (same ids, so node 1's directory
    still fits): node 0 finds the difference at its next check and coordinates nothing, ListGroups
    included (a broker that leads nothing lists nothing); its groups' offsets stay on disk."""
    node0, node1 = cluster.nodes
    group = groups_of(0, 1, "w")[0]
    assert commit(node0.port, group, 5) == 0
    node1.stop()
    node1.extra[node1.extra.index("--cluster") + 1] = f"0@127.0.0.1:{free_port()},1@127.0.0.1:{node1.port}"
    node1.start()
    deadline = time.monotonic() + 20
    while "does not share this node's view" not in node0.log_since_start():
        assert time.monotonic() < deadline, node0.log_since_start()
        time.sleep(0.1)
    with RawClient(node0.port) as client:
        assert client.call(ListGroupsRequest(states_filter=[], types_filter=[]), 5).groups == []
    assert raw_offset(node0, group, "t", 0)[0] == NOT_COORDINATOR


def commit(port: int, group: str, offset: int) -> int:
    with RawClient(port) as client:
        return int(client.call(commit_request(group, {("t", 0): offset}), 8).topics[0].partitions[0].error_code)


def test_two_cluster_entries_naming_one_listener_are_refused_at_start(tmp_path: Path) -> None:
    """``localhost`` and ``127.0.0.1`` on one port are one listener: node 1 would answer for node 0's
    groups too (NOT_COORDINATOR for them, for ever). Refused with one ERROR line naming both entries."""
    port = free_port()
    listed = f"0@localhost:{port},1@127.0.0.1:{port}"
    done = subprocess.run(
        [sys.executable, "-m", "coordinator.cli", "serve", "--listen", f"127.0.0.1:{port}", "--metrics-listen", "off",
         "--data-dir", str(tmp_path / "node1"), "--node-id", "1", "--cluster", listed],
        cwd=REPO, capture_output=True, text=True, timeout=30)
    errors = [line for line in done.stderr.splitlines() if "ERROR" in line]
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(errors) == 1 and f"0@localhost:{port} and 1@127.0.0.1:{port}" in errors[0], done.stderr
    assert not (tmp_path / "node1").exists()


def test_a_peer_whose_name_does_not_resolve_yet_does_not_stop_the_start(tmp_path: Path) -> None:
    """A peer's name not yet in DNS (a Kubernetes pod not yet running) leaves that entry unchecked."""
    port = free_port()
    listed = f"0@127.0.0.1:{port},1@kcoord-1.invalid:{port}"
    node = KcoordProcess(tmp_path / "node0", "--node-id", "0", "--cluster", listed, port=port).start()
    try:
        assert "kcoord-1.invalid does not resolve" in node.log() and "WARNING" in node.log()
    finally:
        assert node.stop() == 0
