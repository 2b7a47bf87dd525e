"""Gateway mode end to end with stock clients, through kcoord only (bootstrap = kcoord), against two real
upstreams: the librdkafka mock cluster (3 brokers) and Tansu.

A confluent-kafka producer writes a 4-partition topic through kcoord; a group of confluent-kafka,
kafka-python and aiokafka consumers (each its own process, classic protocol) consumes it while members
die and leave; every message reaches the group, the group's offsets are in kcoord's log, and no group
request was relayed upstream (the upstream's own coordinator knows nothing of the group).
"""

import subprocess
import sys
from pathlib import Path

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic  # defined here; confluent_kafka.admin does not re-export it
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from tests.gateway.conftest import (
    COORDINATOR,
    Member,
    Upstream,
    coordinator_port,
    node_ports,
    relayed_apis,
    start_gateway,
    wait_all,
)
from tests.kcoord_process import REPO, KcoordProcess, free_port

PARTITIONS = 4  # the mock cluster auto-creates topics with 4 partitions; Tansu's are created so
GROUP_APIS = {"OffsetCommit", "OffsetFetch", "FindCoordinator", "JoinGroup", "Heartbeat", "LeaveGroup", "SyncGroup",
              "DescribeGroups", "ListGroups", "DeleteGroups", "OffsetDelete", "TxnOffsetCommit"}


def create_topic(upstream: Upstream, bootstrap: str, topic: str) -> None:
    """Tansu creates topics through CreateTopics (relayed by kcoord to the controller's listener); the
    mock cluster's controller id points at no broker, so there the first Produce auto-creates it."""
    if upstream.kind == "mock":
        return
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        future.result(30)


def produce(bootstrap: str, topic: str, values: list[str]) -> None:
    producer = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i, value in enumerate(values):
        producer.produce(topic, value=value.encode(), partition=i % PARTITIONS)
    assert producer.flush(30) == 0


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        return {p: consumer.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=10)[1]
                for p in range(PARTITIONS)}
    finally:
        consumer.close()


def test_metadata_names_only_kcoord_listeners(upstream: Upstream, gateway: KcoordProcess) -> None:
    """Every broker a client learns is a kcoord listener: the upstream's with their node ids, and kcoord's
    group coordinator, whichever listener it asks; a group's coordinator is that broker, with exactly its
    address."""
    ports = node_ports(gateway)
    assert ports
    expected = {node: ("127.0.0.1", p) for node, p in {**ports, COORDINATOR: coordinator_port(gateway)}.items()}
    for port in [gateway.port, *(p for _, p in expected.values())]:
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
        brokers: dict[int, tuple[str | None, int]] = {b.id: (b.host, b.port)
                                                      for b in admin.list_topics(timeout=10).brokers.values()}
        assert brokers == expected
    consumer = KafkaConsumer(bootstrap_servers=gateway.bootstrap, group_id="find-me", request_timeout_ms=10_000)
    try:
        client = consumer._client
        consumer._coordinator.ensure_coordinator_ready(timeout_ms=10_000)
        node = consumer._coordinator.coordinator_id  # kafka-python names it "coordinator-<node id>"
        broker = client.cluster.broker_metadata(node)
        assert str(node).rsplit("-", 1)[-1] == str(COORDINATOR)
        assert (broker.host, broker.port) == expected[COORDINATOR]
    finally:
        consumer.close()


def test_ports_that_change_at_every_start_are_warned_about(upstream: Upstream, gateway: KcoordProcess,
                                                           tmp_path: Path) -> None:
    """By default the listeners' ports are chosen at each start; after a restart aiokafka and
    kafka-python consumers kept reconnecting to the old ones and consumed nothing (a client campaign's
    find). kcoord says so at start unless both are fixed."""
    warning = "gateway listeners on ports chosen at this start"
    assert warning in gateway.log()
    (tmp_path / "fixed").mkdir()
    fixed = start_gateway(tmp_path / "fixed", upstream.bootstrap, "--broker-port-base", str(free_port()),
                          "--coordinator-port", str(free_port()))
    try:
        assert warning not in fixed.log()
        assert fixed.stop() == 0
    finally:
        if fixed.proc is not None and fixed.proc.poll() is None:
            fixed.kill()


def test_mixed_group_consumes_every_message(upstream: Upstream, gateway: KcoordProcess, tmp_path: Path) -> None:
    topic, group = "orders", "mixed"
    create_topic(upstream, gateway.bootstrap, topic)
    first = [f"a-{i}" for i in range(200)]
    produce(gateway.bootstrap, topic, first)
    members = [Member(gateway, client, group, topic, client) for client in ("confluent", "kafka-python", "aiokafka")]
    try:
        seen = wait_all(members, set(first))
        assert set(first) <= seen, (len(set(first) - seen), [m.stderr() for m in members])
        # one member dies (its partitions move after its session times out), another leaves
        members[2].kill()
        members[1].leave()
        late = Member(gateway, "aiokafka", group, topic, "aiokafka-late")
        members.append(late)
        second = [f"b-{i}" for i in range(200)]
        produce(gateway.bootstrap, topic, second)
        survivors = [members[0], late]
        seen = wait_all(survivors, set(second))
        assert set(second) <= seen, (len(set(second) - seen), [m.stderr() for m in survivors])
    finally:
        for m in members:
            if m.proc.poll() is None:
                m.leave()

    # every partition's committed offset is its end (100 records each), as kcoord serves it and as its log
    # holds it; the mock cluster's ListOffsets agrees (Tansu's answers about half: not checked there)
    ends = dict.fromkeys(range(PARTITIONS), 100)
    if upstream.kind == "mock":
        assert end_offsets(gateway.bootstrap, topic) == ends
    admin = KafkaAdminClient(bootstrap_servers=gateway.bootstrap, request_timeout_ms=10_000)
    committed = admin.list_group_offsets([group])[group]
    admin.close()
    assert {tp.partition: om.offset for tp, om in committed.items() if tp.topic == topic} == ends

    relayed = relayed_apis(gateway)
    assert {"Produce", "Fetch", "Metadata"} <= set(relayed), relayed
    assert not GROUP_APIS & set(relayed), relayed
    assert not committed_upstream(upstream, group, topic)

    gateway.stop()
    dump = subprocess.run([sys.executable, "-m", "coordinator.cli", "dump-log", str(gateway.data_dir)], cwd=REPO,
                          capture_output=True, text=True, timeout=60).stdout
    for partition, end in ends.items():
        assert f"[{group},{topic},{partition}]::OffsetAndMetadata[{end}," in dump


def committed_upstream(upstream: Upstream, group: str, topic: str) -> dict[int, int]:
    """What the upstream's own coordinator holds for the group, asked directly (not through kcoord)."""
    consumer = KafkaConsumer(bootstrap_servers=upstream.bootstrap, group_id=group, enable_auto_commit=False,
                             request_timeout_ms=10_000, **({"api_version": (2, 3)} if upstream.kind == "mock" else {}))
    try:
        out = {}
        for p in range(PARTITIONS):
            offset = consumer.committed(TopicPartition(topic, p))
            if offset is not None and offset >= 0:
                out[p] = offset
        return out
    finally:
        consumer.close()


@pytest.mark.parametrize("client", ["kafka-python", "aiokafka", "confluent"])
def test_each_client_alone(upstream: Upstream, gateway: KcoordProcess, client: str) -> None:
    """Each stock client on its own consumes a topic produced through kcoord and commits its end."""
    topic = f"solo-{client}"
    create_topic(upstream, gateway.bootstrap, topic)
    values = [f"{client}-{i}" for i in range(40)]
    produce(gateway.bootstrap, topic, values)
    member = Member(gateway, client, f"solo-{client}", topic, client)
    try:
        seen = wait_all([member], set(values))
        assert set(values) <= seen, member.stderr()
    finally:
        member.leave()
