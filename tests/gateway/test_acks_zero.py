"""Gateway mode and Produce with acks=0: the broker sends no reply, so the relay must not wait for one;
a link whose unanswered requests may have failed closes its client's connection, as Kafka's closing it
says they failed; a broker that answers them anyway does not shift later replies."""

import re
import struct
import time
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
from kafka.protocol.metadata.api_versions import ApiVersionsRequest

from tests.gateway.cable import Cable
from tests.gateway.conftest import Upstream, node_ports, scrape, start_gateway
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.mock_cluster import MockCluster
from tests.kcoord_process import KcoordProcess
from tests.rawclient import RawClient
from tests.tansu_process import TansuProcess


@pytest.mark.parametrize("upstream", ["mock"], indirect=True)
def test_acks_zero_producers(upstream: Upstream, gateway: KcoordProcess) -> None:
    """Produce with acks=0 has no reply (Kafka sends none): the relay must not wait for one, or every
    later reply on that connection would be matched to the wrong request."""
    from kafka import KafkaProducer

    kp = KafkaProducer(bootstrap_servers=gateway.bootstrap, acks=0)
    for i in range(50):
        kp.send("acks0", value=b"kp-%d" % i, partition=i % 4)
    kp.flush(30)
    assert kp.partitions_for("acks0") == {0, 1, 2, 3}  # a request after them is answered
    for i in range(50, 100):
        kp.send("acks0", value=b"kp-%d" % i, partition=i % 4)
    kp.close(30)
    cp = ck.Producer({"bootstrap.servers": gateway.bootstrap, "acks": 0})
    for i in range(100):
        cp.produce("acks0", value=b"ck-%d" % i, partition=i % 4)
    assert cp.flush(30) == 0
    assert "acks0" in cp.list_topics("acks0", timeout=10).topics
    consumer = ck.Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": "acks0-reader"})
    consumer.assign([ck.TopicPartition("acks0", p, 0) for p in range(4)])
    values: set[bytes | None] = set()
    deadline = time.monotonic() + 30
    while len(values) < 200 and time.monotonic() < deadline:
        values |= {m.value() for m in consumer.consume(100, 1.0) if m.error() is None}
    consumer.close()
    assert values == {b"kp-%d" % i for i in range(100)} | {b"ck-%d" % i for i in range(100)}


def _produce(topic: str, acks: int, value: bytes) -> Any:
    """A raw Produce v7 request of one record to partition 0 of ``topic``."""
    from kafka.protocol.producer import ProduceRequest as Produce
    from kafka.record.memory_records import MemoryRecordsBuilder

    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 16)
    builder.append(timestamp=None, key=None, value=value, headers=[])
    builder.close()
    return Produce(transactional_id=None, acks=acks, timeout_ms=1000, topic_data=[Produce.TopicProduceData(
        name=topic, partition_data=[Produce.TopicProduceData.PartitionProduceData(index=0, records=builder.buffer())])])


def _leader_port(kcoord: KcoordProcess, topic: str) -> int:
    """kcoord's listener for the broker leading partition 0 of ``topic``, created by producing to it."""
    producer = ck.Producer({"bootstrap.servers": kcoord.bootstrap})
    producer.produce(topic, b"x", partition=0)  # (auto-created)
    assert producer.flush(30) == 0
    leader = producer.list_topics(topic, timeout=10).topics[topic].partitions[0].leader
    return node_ports(kcoord)[leader]


def test_an_acks_zero_producers_connection_closes_with_its_upstream_link(tmp_path: Path) -> None:
    """A broker sends no reply to a Produce with acks=0: it closes the connection when such a request
    fails (a partition it no longer leads), and a client learns a broker is gone when its connection
    closes; either way it refreshes its metadata and finds the new leader. kcoord kept the client's
    connection when the link carrying only acks=0 requests closed (no reply was outstanding), so a
    producer went on sending to a listener whose broker was gone, every record dropped, till its next
    periodic metadata refresh (5 minutes by default). The client's connection now closes with it."""
    mock = MockCluster(3)
    kcoord = start_gateway(tmp_path, mock.bootstrap)
    try:
        request = _produce("acks0-lost", 0, b"y")
        client = RawClient(_leader_port(kcoord, "acks0-lost"), timeout=1)
        try:
            client.send(request, 7)
            with pytest.raises(TimeoutError):
                client.read_frame()  # no reply, and the connection stays open
            mock.stop()  # every broker gone
            # (the mock cluster, unlike Kafka, answers acks=0: kcoord drops that answer)
            client.send(request, 7)
            client.sock.settimeout(10)
            with pytest.raises(ConnectionError):
                client.read_frame()
        finally:
            client.close()
    finally:
        kcoord.stop()
        mock.stop()


def upstream_errors(kcoord: KcoordProcess) -> float:
    """kcoord_gateway_upstream_errors_total, every node and kind."""
    return sum(float(v) for v in re.findall(r"^kcoord_gateway_upstream_errors_total\{[^}]*\} (\S+)$", scrape(kcoord),
                                            re.M))


def test_a_link_whose_acks_zero_requests_were_answered_past_closes_quietly(
        tmp_path: Path, cabled_tansu: tuple[Cable, TansuProcess]) -> None:
    """A gateway audit's find: a link that had ever carried a Produce with acks=0 stayed marked for
    its whole life, so the broker's later close of it, with nothing waiting (a broker closes a
    connection idle for connections.max.idle.ms), closed the client's connection and counted an upstream
    error. A reply to a later request shows the broker got past the acks=0 one: the close is now an idle
    link's, dropped quietly, and the client's next request opens a new link. Tansu, reached through a
    cable that closes every connection through it (the broker itself keeps running)."""
    cable, tansu = cabled_tansu
    kcoord = start_gateway(tmp_path, f"127.0.0.1:{cable.port}")
    try:
        client = RawClient(_leader_port(kcoord, "acks0-idle"), timeout=10)
        try:
            client.send(_produce("acks0-idle", 0, b"unanswered"), 7)
            client.call(_produce("acks0-idle", 1, b"answered"), 7)
            cable.cut()  # the broker closes the link
            cable.restore()
            time.sleep(1)
            [answer] = client.call(_produce("acks0-idle", 1, b"after"), 7).responses
            assert answer.partition_responses[0].error_code == 0
        finally:
            client.close()
        assert upstream_errors(kcoord) == 0
    finally:
        kcoord.stop()
        cable.close()
        tansu.stop()


def test_a_broker_that_never_answers_acks_zero_closing_the_link_later_is_an_idle_close(tmp_path: Path) -> None:
    """As Kafka, a broker that never answers acks=0: its close of a link that carried only such requests
    closes the client's connection (and counts an upstream error) when the last was sent within
    --upstream-timeout-ms, its way of saying one failed; later, the link was idle (no request of the
    client waits, none can have failed unnoticed that long), and the close is dropped quietly: before,
    the client's connection closed and an error was counted however long ago the request was sent."""
    fake = FakeUpstream(3)
    kcoord = start_gateway(tmp_path, fake.bootstrap, "--upstream-timeout-ms", "1500")
    try:
        fake.delay[1] = None  # answers nothing, acks=0 included
        client = RawClient(node_ports(kcoord)[1], timeout=10)
        try:
            client.send(_produce("t", 0, b"old"), 7)
            time.sleep(2.5)
            fake.drop(1)
            time.sleep(0.5)
            assert client.call(ApiVersionsRequest(), 0).error_code == 0  # (answered by kcoord itself)
            assert upstream_errors(kcoord) == 0
            client.send(_produce("t", 0, b"new"), 7)
            time.sleep(0.5)
            fake.drop(1)
            with pytest.raises(ConnectionError):
                client.read_frame()
        finally:
            client.close()
        assert upstream_errors(kcoord) == 1
    finally:
        kcoord.stop()
        fake.stop()


def test_a_broker_answering_acks_zero_does_not_shift_the_replies_of_later_requests(tmp_path: Path) -> None:
    """Kafka never answers a Produce with acks=0; the mock cluster (and Tansu) do. The link handed such a
    reply to the next request waiting on it, so a client pipelining acks=0 and acks=1 Produce requests got
    the acks=0 answer for its acks=1 request (or the link failed: "a reply nobody asked for"). Replies
    are now matched by correlation id, and an acks=0 answer is dropped (a gateway audit's find)."""
    mock = MockCluster(3)
    kcoord = start_gateway(tmp_path, mock.bootstrap)
    try:
        client = RawClient(_leader_port(kcoord, "acks-mixed"), timeout=10)
        try:
            for _ in range(30):
                _, unanswered = client.encode(_produce("acks-mixed", 0, b"v"), 7)
                answered, frame = client.encode(_produce("acks-mixed", 1, b"v"), 7)
                client.sock.sendall(unanswered + frame)
                assert struct.unpack(">i", client.read_frame()[:4])[0] == answered
        finally:
            client.close()
    finally:
        kcoord.stop()
        mock.stop()
