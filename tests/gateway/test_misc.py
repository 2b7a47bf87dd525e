"""Gateway mode details: the ApiVersions intersection, DescribeCluster and transactional producers (their
coordinator stays upstream, its address rewritten), the per-broker port base and advertised host, and
the gateway's metrics."""

import contextlib
import re
import socket
import struct
import threading
import time
from pathlib import Path

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient
from kafka.protocol.metadata.api_versions import ApiVersionsRequest

from coordinator.apis import load_all
from coordinator.gateway import rewrite
from protocol.registry import REGISTRY
from tests.gateway.conftest import (
    COORDINATOR,
    Upstream,
    coordinator_port,
    node_ports,
    relayed_apis,
    scrape,
    start_gateway,
)
from tests.gateway.fake_upstream import MISMATCHED_ENDPOINT_TYPE, FakeUpstream, Features
from tests.gateway.mock_cluster import MockCluster
from tests.kcoord_process import KcoordProcess, free_port
from tests.rawclient import RawClient, commit_request, fetch_request
from tests.tansu_process import TansuProcess


def api_versions(port: int, version: int = 3) -> dict[int, tuple[int, int]]:
    client = RawClient(port)
    try:
        reply = client.call(ApiVersionsRequest(client_software_name="test", client_software_version="1"), version)
    finally:
        client.close()
    assert reply.error_code == 0
    return {k.api_key: (k.min_version, k.max_version) for k in reply.api_keys}


def test_api_versions_intersection(upstream: Upstream, gateway: KcoordProcess) -> None:
    """Relayed APIs at the upstream's versions (capped where kcoord rewrites or where replies would
    carry leader endpoints), group APIs at kcoord's, group-like APIs kcoord lacks not at all."""
    direct = api_versions(int(upstream.bootstrap.split(",")[0].rsplit(":", 1)[1]), 0)
    offered = api_versions(gateway.port)
    assert offered[0][1] == min(direct[0][1], 9) and offered[1][1] == min(direct[1][1], 15)
    assert offered[3][1] == min(direct[3][1], 12)
    load_all()
    for key in rewrite.LOCAL:
        spec = REGISTRY[key]
        assert offered[key] == (spec.min_version, spec.max_version)
    assert not rewrite.HIDDEN & set(offered)
    for key, (lo, hi) in direct.items():
        if key not in rewrite.LOCAL and key not in rewrite.HIDDEN and key not in rewrite.CAPS:
            assert offered[key] == (lo, hi)
    for port in node_ports(gateway).values():
        assert api_versions(port) == offered


def test_api_versions_are_what_every_live_broker_speaks(tmp_path: Path) -> None:
    """A gateway audit's find: the versions offered were those of the broker that answered discovery
    (the first bootstrap address), so in a cluster whose brokers differ (a rolling upgrade) a request
    could be relayed at a version another broker refuses. Every live broker is now asked (one that
    appears in a broker list at once, one in turn every round, so a broker restarted with other
    software is seen too), and the versions offered are those all of them speak."""
    fake = FakeUpstream(3)
    fake.listed = {1, 2}
    older = [(key, lo, min(hi, 7)) if key == 0 else (key, max(lo, 4), hi) if key == 1 else (key, lo, hi)
             for key, lo, hi in fake.offered[3]]  # Produce up to v7 only, Fetch from v4 only
    fake.offered[3] = older
    kcoord = start_gateway(tmp_path, f"127.0.0.1:{fake.ports[1]}")

    def offered_until(produce: tuple[int, int], fetch: tuple[int, int]) -> None:
        deadline = time.monotonic() + 15
        while True:
            got = api_versions(kcoord.port)
            if (got[0], got[1]) == (produce, fetch) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert (got[0], got[1]) == (produce, fetch)
        for port in node_ports(kcoord).values():
            assert api_versions(port) == got

    try:
        offered_until((0, 8), (0, 11))
        fake.listed = {1, 2, 3}  # a broker of the older version joins
        offered_until((0, 7), (4, 11))
        fake.offered[2] = [(key, lo, min(hi, 6)) if key == 0 else (key, lo, hi) for key, lo, hi in fake.offered[2]]
        offered_until((0, 6), (4, 11))  # broker 2 restarted with older software, in place
        fake.listed = {1, 2}  # broker 3 leaves
        offered_until((0, 6), (0, 11))
    finally:
        kcoord.stop()
        fake.stop()


def test_a_broker_first_seen_in_a_relayed_metadata_answer_is_asked_its_versions_at_once(tmp_path: Path) -> None:
    """A broker a client's Metadata answer names first (kcoord's own discovery is a minute away) is
    asked its API versions then, not at the next discovery round."""
    from kafka.protocol.metadata import MetadataRequest

    fake = FakeUpstream(3)
    fake.listed = {1, 2}
    fake.offered[3] = [(key, lo, min(hi, 7)) if key == 0 else (key, lo, hi) for key, lo, hi in fake.offered[3]]
    kcoord = start_gateway(tmp_path, f"127.0.0.1:{fake.ports[1]}", "--upstream-refresh-ms", "60000")
    try:
        assert api_versions(kcoord.port)[0] == (0, 8)
        fake.listed = {1, 2, 3}
        client = RawClient(kcoord.port)
        try:
            assert {b.node_id for b in client.call(MetadataRequest(topics=[]), 1).brokers} == {1, 2, 3, COORDINATOR}
        finally:
            client.close()
        deadline = time.monotonic() + 5
        while api_versions(kcoord.port)[0] != (0, 7) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert api_versions(kcoord.port)[0] == (0, 7)
    finally:
        kcoord.stop()
        fake.stop()


def test_api_versions_carry_the_upstreams_features(tmp_path: Path) -> None:
    """A gateway audit's find: kcoord's ApiVersions v3+ answer carried no features (KIP-584), which
    kafka-python's describe_features and Kafka's Java clients read (Kafka 4's producer takes
    transaction.version 2 to mean the transaction protocol v2). They are now the upstream's: those
    every broker supports, finalized as the latest epoch says, less the group-protocol features of APIs
    kcoord hides and transaction.version above 1 (its v2 needs Produce v12, past the gateway's v9).
    Below v4, supported features whose minimum is 0 are left out, as Kafka's brokers do."""
    from kafka import KafkaAdminClient

    fake = FakeUpstream(3)
    supported = [("metadata.version", 1, 27), ("kraft.version", 0, 1), ("transaction.version", 0, 2),
                 ("group.version", 0, 1), ("share.version", 0, 1)]
    finalized = [("metadata.version", 27, 27), ("kraft.version", 1, 1), ("transaction.version", 2, 2),
                 ("group.version", 1, 1)]
    for node in fake.offered:
        fake.offered[node] = [(key, lo, 4 if key == 18 else hi) for key, lo, hi in fake.offered[node]]
        fake.features[node] = Features(supported, 42, finalized)
    fake.features[2] = Features([("metadata.version", 1, 25), *supported[1:]], 40, [("metadata.version", 25, 25)])
    kcoord = start_gateway(tmp_path, fake.bootstrap)
    try:
        admin = KafkaAdminClient(bootstrap_servers=kcoord.bootstrap)
        try:
            described = admin.describe_features()
        finally:
            admin.close()
        assert described == {
            "metadata.version": {"supported": (1, 25), "finalized": (27, 27), "finalized_epoch": 42},
            "kraft.version": {"supported": (0, 1), "finalized": (1, 1), "finalized_epoch": 42},
            "transaction.version": {"supported": (0, 1), "finalized": (1, 1), "finalized_epoch": 42},
        }
        client = RawClient(kcoord.port)
        try:
            v3 = client.call(ApiVersionsRequest(client_software_name="test", client_software_version="1"), 3)
        finally:
            client.close()
        assert [(f.name, f.min_version, f.max_version) for f in v3.supported_features] == [("metadata.version", 1, 25)]
        assert len(v3.finalized_features) == 3
    finally:
        kcoord.stop()
        fake.stop()


def test_api_versions_outside_the_range_get_the_v0_fallback(upstream: Upstream, gateway: KcoordProcess) -> None:
    """KIP-511, as a broker answers: a version above the range, or below it, gets UNSUPPORTED_VERSION in
    the v0 body with kcoord's ApiVersions range, and the connection stays open."""
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        for correlation_id, version in ((7, 127), (8, -1)):
            payload = struct.pack(">hhih", 18, version, correlation_id, 1) + b"x"
            sock.sendall(struct.pack(">i", len(payload)) + payload)
            answer = b""
            while len(answer) < 20:
                chunk = sock.recv(20 - len(answer))
                assert chunk, "closed"
                answer += chunk
            assert answer == struct.pack(">iihih", 16, correlation_id, 35, 1, 18) + bytes.fromhex("00000004")


def test_transactional_producer_and_read_committed(tmp_path: Path) -> None:
    """FindCoordinator for a transaction key, InitProducerId, AddPartitionsToTxn and EndTxn go upstream;
    the transaction coordinator's address comes back as kcoord's listener for it."""
    mock = MockCluster(3)
    kcoord = start_gateway(tmp_path, mock.bootstrap)
    try:
        producer = ck.Producer({"bootstrap.servers": kcoord.bootstrap, "transactional.id": "tx-1"})
        producer.init_transactions(30)
        producer.begin_transaction()
        for i in range(10):
            producer.produce("txn-topic", value=b"v%d" % i, partition=i % 4)
        producer.commit_transaction(30)
        consumer = ck.Consumer({"bootstrap.servers": kcoord.bootstrap, "group.id": "rc",
                                "isolation.level": "read_committed"})
        consumer.assign([ck.TopicPartition("txn-topic", p, 0) for p in range(4)])
        got, deadline = 0, time.monotonic() + 30
        while got < 10 and time.monotonic() < deadline:
            got += sum(1 for m in consumer.consume(100, 1.0) if m.error() is None)
        consumer.close()
        assert got == 10
        relayed = relayed_apis(kcoord)
        assert {"FindCoordinator", "InitProducerId", "AddPartitionsToTxn", "EndTxn"} <= set(relayed), relayed
    finally:
        kcoord.stop()
        mock.stop()


@pytest.mark.parametrize("upstream", ["tansu"], indirect=True)
def test_describe_cluster_rewritten(upstream: Upstream, gateway: KcoordProcess) -> None:
    admin = AdminClient({"bootstrap.servers": gateway.bootstrap})  # kept alive until the answer is in
    described = admin.describe_cluster(request_timeout=10).result()
    ports = {**node_ports(gateway), COORDINATOR: coordinator_port(gateway)}
    assert {(n.id, n.host, n.port) for n in described.nodes} == {(n, "127.0.0.1", p) for n, p in ports.items()}


def test_describe_cluster_error_answer_passed_through(tmp_path: Path) -> None:
    """A gateway audit's find: DescribeCluster's error answer (a broker asked for the controllers'
    endpoint answers MISMATCHED_ENDPOINT_TYPE and no broker) came back with kcoord's coordinator added
    as its one broker, and its empty broker list and empty cluster id taken as the upstream's view. It
    is now passed on byte for byte; an answer without error is still rewritten."""
    from kafka.protocol.admin import DescribeClusterRequest

    fake = FakeUpstream(3)
    kcoord = start_gateway(tmp_path, fake.bootstrap)
    try:
        answers = []
        for port in (kcoord.port, fake.ports[1]):
            client = RawClient(port)
            try:
                client.send(DescribeClusterRequest(include_cluster_authorized_operations=False, endpoint_type=2), 1)
                answers.append(client.read_frame())
            finally:
                client.close()
        assert answers[0] == answers[1]
        framed = struct.pack(">i", len(answers[0])) + answers[0]
        _, body = rewrite.decode_reply(rewrite.DESCRIBE_CLUSTER_RESPONSE, framed, 1)
        assert (body.error_code, body.brokers) == (MISMATCHED_ENDPOINT_TYPE, [])
        client = RawClient(kcoord.port)
        try:
            described = client.call(DescribeClusterRequest(include_cluster_authorized_operations=False,
                                                           endpoint_type=1), 1)
        finally:
            client.close()
        ports = {**node_ports(kcoord), COORDINATOR: coordinator_port(kcoord)}
        assert {(b.broker_id, b.port) for b in described.brokers} == set(ports.items())
    finally:
        kcoord.stop()
        fake.stop()


def test_port_base_and_advertised_host(tmp_path: Path) -> None:
    mock = MockCluster(3)
    base = free_port() - 1  # nodes 1-3: base+1 is known free, the next two almost surely
    coordinator = free_port()
    kcoord = start_gateway(tmp_path, mock.bootstrap, "--broker-port-base", str(base),
                           "--broker-advertised-host", "localhost", "--coordinator-port", str(coordinator))
    try:
        ports = node_ports(kcoord)
        assert ports[1] == base + 1
        assert coordinator_port(kcoord) == coordinator
        ports[COORDINATOR] = coordinator
        brokers = AdminClient({"bootstrap.servers": kcoord.bootstrap}).list_topics(timeout=10).brokers
        found: dict[int, tuple[str | None, int]] = {b.id: (b.host, b.port) for b in brokers.values()}
        assert found == {n: ("localhost", p) for n, p in ports.items()}
    finally:
        kcoord.stop()
        mock.stop()


@pytest.mark.parametrize("upstream", ["mock"], indirect=True)
def test_metrics(upstream: Upstream, gateway: KcoordProcess) -> None:
    producer = ck.Producer({"bootstrap.servers": gateway.bootstrap})
    producer.produce("m", value=b"x" * 1000, partition=0)
    assert producer.flush(30) == 0
    text = scrape(gateway)
    assert re.search(r'^kcoord_gateway_relayed_requests_total\{api="Produce",upstream_node="\d+"\} [1-9]', text, re.M)
    assert re.search(r'^kcoord_gateway_relayed_request_bytes_total\{api="Produce",[^}]*\} (\d+)', text, re.M)
    assert re.search(r"^kcoord_gateway_upstream_brokers 3\.0$", text, re.M)
    assert "kcoord_gateway_upstream_errors_total" in text or "kcoord_gateway_upstream_errors" in text
    assert re.search(r"^kcoord_ready 1\.0$", text, re.M)  # the upstream has answered: /readyz says 200


def test_slow_client_bounded(upstream: Upstream, gateway: KcoordProcess) -> None:
    """A client that pipelines Metadata requests and never reads: kcoord stops reading it (at most
    MAX_IN_FLIGHT replies queued) instead of buffering without bound, and serves others meanwhile."""
    sock = socket.create_connection(("127.0.0.1", gateway.port))
    body = struct.pack(">hhih", 3, 1, 1, 4) + b"slow" + struct.pack(">i", -1)
    frame = struct.pack(">i", len(body)) + body
    sock.setblocking(False)
    sent = 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            sent += sock.send(frame * 256)
        except BlockingIOError:
            time.sleep(0.05)
    assert sent < 64 * 1024 * 1024  # the sockets pushed back long before
    assert api_versions(gateway.port)  # others are served
    sock.close()


def test_send_offsets_to_transaction_is_refused(tmp_path: Path) -> None:
    """TxnOffsetCommit is not offered (it would write the upstream's __consumer_offsets): librdkafka's
    send_offsets_to_transaction fails cleanly with UNSUPPORTED_FEATURE instead of committing elsewhere."""
    mock = MockCluster(3)
    kcoord = start_gateway(tmp_path, mock.bootstrap)
    try:
        producer = ck.Producer({"bootstrap.servers": kcoord.bootstrap, "transactional.id": "eos"})
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce("out", b"x", partition=0)
        consumer = ck.Consumer({"bootstrap.servers": kcoord.bootstrap, "group.id": "eos-group"})
        with pytest.raises(ck.KafkaException) as refused:
            producer.send_offsets_to_transaction([ck.TopicPartition("in", 0, 5)], consumer.consumer_group_metadata(),
                                                 20)
        assert refused.value.args[0].code() == ck.KafkaError._UNSUPPORTED_FEATURE
        producer.abort_transaction(30)
        consumer.close()
        assert "TxnOffsetCommit" not in relayed_apis(kcoord)
    finally:
        kcoord.stop()
        mock.stop()


def test_an_api_not_offered_is_refused_not_relayed(tmp_path: Path, tansu: TansuProcess) -> None:
    """A client that pins its versions instead of asking ApiVersions (kafka-python's ``api_version``)
    sent TxnOffsetCommit though the gateway does not offer it, and kcoord relayed it: the upstream's
    coordinator wrote the offsets to its own __consumer_offsets, where no consumer of kcoord's looks,
    and the producer was told they were committed. An API or version the gateway does not offer is
    refused as Kafka refuses one it does not enable (the connection closes); nothing reaches the
    upstream, whose group has no offset."""
    from kafka import KafkaProducer
    from kafka.errors import KafkaError
    from kafka.structs import OffsetAndMetadata, TopicPartition

    kcoord = start_gateway(tmp_path, tansu.bootstrap)
    producer = KafkaProducer(bootstrap_servers=kcoord.bootstrap, transactional_id="pinned", api_version=(2, 5, 0),
                             request_timeout_ms=10_000)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("pinned-out", b"x")
        outcome: list[object] = []

        def send_offsets() -> None:
            try:
                producer.send_offsets_to_transaction({TopicPartition("pinned-in", 0): OffsetAndMetadata(5, "", -1)},
                                                     "pinned-group")
                outcome.append("committed")
            except Exception as exc:  # any failure is the client's way of hearing the refusal
                outcome.append(exc)

        sender = threading.Thread(target=send_offsets, daemon=True)  # kafka-python retries a closed connection
        sender.start()
        sender.join(8)
        assert outcome != ["committed"]
        assert "not offered by the gateway" in kcoord.log()
        upstream = RawClient(tansu.port)
        try:
            [topic] = upstream.call(fetch_request("pinned-group", {"pinned-in": [0]}), 5).topics
        finally:
            upstream.close()
        assert [p.committed_offset for p in topic.partitions] == [-1]
        assert "TxnOffsetCommit" not in relayed_apis(kcoord)
    finally:
        try:
            with contextlib.suppress(KafkaError):  # its offsets still waiting to be sent
                producer.close(timeout=1)
        finally:
            kcoord.stop()
            tansu.stop()


def test_every_listener_names_one_coordinator_per_group_and_lists_it_once(tmp_path: Path) -> None:
    """A compatibility sweep's find: every listener answered FindCoordinator with itself and ListGroups
    with every group, so admin clients (which ask every broker and merge the answers, as Kafka's brokers
    each list their own groups) got each group once per broker: kafka-python, kafkajs and
    ``kcoord groups list`` showed duplicates. Every group's coordinator is now kcoord's own node, a broker
    of every Metadata answer with a listener of its own, whichever listener is asked; it lists the groups
    and the upstream brokers' listeners list none."""
    from kafka import KafkaAdminClient
    from kafka.protocol.admin import ListGroupsRequest
    from kafka.protocol.metadata import MetadataRequest
    from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest

    mock = MockCluster(3)
    kcoord = start_gateway(tmp_path, mock.bootstrap)
    try:
        groups = [f"listed-{i}" for i in range(12)]
        committer = RawClient(kcoord.port)
        for group in groups:
            assert committer.call(commit_request(group, {("t", 0): 1}), 8).topics[0].partitions[0].error_code == 0
        committer.close()
        ports = node_ports(kcoord)
        assert len(ports) == 3

        def coordinators(port: int) -> dict[str, int]:
            client = RawClient(port)
            try:
                one = {g: client.call(FindCoordinatorRequest(key=g, key_type=0), 3).node_id for g in groups[:3]}
                batch = client.call(FindCoordinatorRequest(key_type=0, coordinator_keys=groups), 4)
            finally:
                client.close()
            assert all(c.error_code == 0 for c in batch.coordinators)
            many = {c.key: c.node_id for c in batch.coordinators}
            assert {g: many[g] for g in one} == one
            return many

        answers = [coordinators(port) for port in [kcoord.port, *ports.values()]]
        assert all(answer == {g: COORDINATOR for g in groups} for answer in answers)
        client = RawClient(kcoord.port)
        try:
            brokers = {b.node_id: b.port for b in client.call(MetadataRequest(topics=[]), 1).brokers}
        finally:
            client.close()
        assert brokers == {**ports, COORDINATOR: coordinator_port(kcoord)}
        for node, port in brokers.items():
            client = RawClient(port)
            try:
                listed = [g.group_id for g in client.call(ListGroupsRequest(), 3).groups]
            finally:
                client.close()
            assert sorted(listed) == (sorted(groups) if node == COORDINATOR else [])
        admin = KafkaAdminClient(bootstrap_servers=kcoord.bootstrap)
        try:
            listed = [g["group_id"] for g in admin.list_groups()]
        finally:
            admin.close()
        assert sorted(listed) == sorted(groups)
    finally:
        kcoord.stop()
        mock.stop()
