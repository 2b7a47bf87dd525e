"""Upstream faults in gateway mode: a broker that goes away mid-run and comes back, and a whole upstream
cluster killed. kcoord must neither hang nor crash, must keep serving groups and offsets on every
listener meanwhile, and clients must recover by themselves once the broker is back."""

import os
import re
import signal
import socket
import struct
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic  # defined here; confluent_kafka.admin does not re-export it
from kafka import KafkaAdminClient
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from tests.gateway.cable import Cable
from tests.gateway.conftest import (
    COORDINATOR,
    Member,
    coordinator_port,
    node_ports,
    relayed_apis,
    scrape,
    start_gateway,
    wait_all,
)
from tests.gateway.mock_cluster import MockCluster
from tests.kcoord_process import KcoordProcess, free_port
from tests.rawclient import RawClient, commit_request
from tests.tansu_process import TansuProcess

PARTITIONS = 4


def group_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        offsets = admin.list_group_offsets([group])[group]
    finally:
        admin.close()
    return {tp.partition: om.offset for tp, om in offsets.items() if tp.topic == topic}


def committed_sum(kcoord: KcoordProcess, group: str, topic: str, total: int, timeout: float = 30.0) -> dict[int, int]:
    """The group's offsets once they add up to ``total`` (members commit right after they print)."""
    deadline = time.monotonic() + timeout
    while True:
        offsets = group_offsets(kcoord.bootstrap, group, topic)
        if sum(offsets.values()) == total or time.monotonic() > deadline:
            assert sum(offsets.values()) == total, offsets
            return offsets
        time.sleep(0.2)


def _request(port: int, body: bytes, timeout: float = 60.0) -> bytes:
    """One request on a fresh connection: the reply's first bytes, or b"" if kcoord closed the connection
    (a socket timeout, a hang, fails the test)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        try:
            return sock.recv(8)
        except ConnectionResetError:
            return b""


def metadata_request_answered(port: int) -> bool:
    """Metadata v1 for topic "t": answered (from kcoord's own view when the upstream is away)."""
    body = struct.pack(">hhih", 3, 1, 7, 4) + b"test" + struct.pack(">ih", 1, 1) + b"t"
    return len(_request(port, body)) == 8


def produce_request_closed(port: int) -> bool:
    """Produce v3 with no topics: relayed, so with the upstream gone the connection is closed."""
    body = struct.pack(">hhih", 0, 3, 9, 4) + b"test" + struct.pack(">hhii", -1, 1, 1000, 0)
    return _request(port, body) == b""


def test_broker_cut_and_restored_mid_run(tmp_path: Path, cabled_tansu: tuple[Cable, TansuProcess]) -> None:
    """Tansu reached only through a cable: cut it while a producer and a group are running, check kcoord
    still serves the group's offsets, restore it, and every message produced (before, during and after
    the cut) reaches the group; committed offsets only grow."""
    cable, tansu = cabled_tansu
    kcoord = start_gateway(tmp_path, f"127.0.0.1:{cable.port}", "--upstream-timeout-ms", "5000")
    topic, group = "faults", "survivors"
    members: list[Member] = []
    try:
        admin = AdminClient({"bootstrap.servers": kcoord.bootstrap})
        for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
            future.result(30)
        producer = ck.Producer({"bootstrap.servers": kcoord.bootstrap, "linger.ms": 5,
                                "message.timeout.ms": 120_000})
        before = [f"before-{i}" for i in range(100)]
        for i, v in enumerate(before):
            producer.produce(topic, value=v.encode(), partition=i % PARTITIONS)
        assert producer.flush(30) == 0
        members = [Member(kcoord, "confluent", group, topic, "confluent"),
                   Member(kcoord, "aiokafka", group, topic, "aiokafka")]
        assert set(before) <= wait_all(members, set(before))
        committed = committed_sum(kcoord, group, topic, 100)

        cable.cut()
        during = [f"during-{i}" for i in range(100)]
        for i, v in enumerate(during):
            producer.produce(topic, value=v.encode(), partition=i % PARTITIONS)
        producer.poll(0)
        time.sleep(3)
        # the upstream is unreachable: kcoord answers promptly (closes) instead of hanging, stays up,
        # and keeps serving groups and offsets on every listener
        assert metadata_request_answered(kcoord.port)
        assert produce_request_closed(kcoord.port)
        assert kcoord.proc is not None and kcoord.proc.poll() is None
        assert group_offsets(kcoord.bootstrap, group, topic) == committed
        for port in node_ports(kcoord).values():
            assert group_offsets(f"127.0.0.1:{port}", group, topic) == committed

        cable.restore()
        assert producer.flush(120) == 0
        after = [f"after-{i}" for i in range(100)]
        for i, v in enumerate(after):
            producer.produce(topic, value=v.encode(), partition=i % PARTITIONS)
        assert producer.flush(60) == 0
        everything = set(before) | set(during) | set(after)
        seen = wait_all(members, everything, timeout=120)
        assert everything <= seen, (len(everything - seen), [m.stderr() for m in members])
        final = committed_sum(kcoord, group, topic, 300)
        assert all(final[p] >= committed[p] for p in committed)
        assert "Produce" in relayed_apis(kcoord)
    finally:
        for m in members:
            if m.proc.poll() is None:
                m.leave()
        if kcoord.proc is not None and kcoord.proc.poll() is None:
            kcoord.stop()
        tansu.stop()
        cable.close()


def test_whole_upstream_killed(tmp_path: Path) -> None:
    """The mock cluster's process killed outright: kcoord stays up, closes relayed requests' connections
    (clients retry) and still answers group APIs from its own log."""
    mock = MockCluster(3)
    kcoord = start_gateway(tmp_path, mock.bootstrap, "--upstream-timeout-ms", "3000")
    try:
        producer = ck.Producer({"bootstrap.servers": kcoord.bootstrap})
        producer.produce("t", value=b"x", partition=0)
        assert producer.flush(30) == 0
        consumer = ck.Consumer({"bootstrap.servers": kcoord.bootstrap, "group.id": "kept", "enable.auto.commit": False})
        consumer.commit(offsets=[ck.TopicPartition("t", 0, 1)], asynchronous=False)
        consumer.close()
        assert "kcoord_gateway_upstream_reachable 1.0" in scrape(kcoord)
        mock.proc.kill()
        mock.proc.wait(10)
        deadline = time.monotonic() + 15  # the next discovery round (every second here) finds nobody
        while "kcoord_gateway_upstream_reachable 0.0" not in scrape(kcoord):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        for port in [kcoord.port, *node_ports(kcoord).values()]:
            assert metadata_request_answered(port)
            assert group_offsets(f"127.0.0.1:{port}", "kept", "t") == {0: 1}
        assert kcoord.proc is not None and kcoord.proc.poll() is None
        # a relayed data request gets its connection closed (a retriable network error), not a hang
        assert produce_request_closed(kcoord.port)
    finally:
        kcoord.stop()
        mock.stop()


def metadata_from_cache(kcoord: KcoordProcess) -> float:
    m = re.search(r"^kcoord_gateway_metadata_from_cache_total (\S+)$", scrape(kcoord), re.M)
    assert m is not None
    return float(m.group(1))


def assigned_member(kcoord: KcoordProcess, topic: str, partitions: int, heartbeat_ms: int,
                    events: list[str]) -> ck.Consumer:
    """A confluent-kafka member (6 s session, Metadata refreshed every second) of a new topic's group,
    once it holds every partition; revocations and losses are added to ``events``."""
    admin = AdminClient({"bootstrap.servers": kcoord.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    consumer = ck.Consumer({"bootstrap.servers": kcoord.bootstrap, "group.id": topic,
                            "topic.metadata.refresh.interval.ms": 1000, "session.timeout.ms": 6000,
                            "heartbeat.interval.ms": heartbeat_ms})
    consumer.subscribe([topic], on_revoke=lambda _, parts: events.extend(f"revoked {p}" for p in parts),
                       on_lost=lambda _, parts: events.extend(f"lost {p}" for p in parts))
    deadline = time.monotonic() + 30
    while len(consumer.assignment()) < partitions:
        assert time.monotonic() < deadline, consumer.assignment()
        consumer.poll(0.2)
    return consumer


def test_a_consumer_keeps_its_assignment_while_the_upstream_is_down(tmp_path: Path, tansu: TansuProcess) -> None:
    """While no upstream broker answers, kcoord answers Metadata itself. It gave each topic an empty
    partition list, which librdkafka read as the topic shrinking to nothing: it revoked its assignment
    and asked again hundreds of times a second, each answer logged (a fault campaign's find; with a
    short session timeout the member was then expired). A topic kcoord has seen keeps its partitions,
    each without a leader, as a broker whose leaders are offline answers."""
    kcoord = start_gateway(tmp_path, tansu.bootstrap, "--upstream-timeout-ms", "3000")
    revoked: list[str] = []
    consumer = None
    try:
        consumer = assigned_member(kcoord, "four", 4, 500, revoked)
        assert tansu.proc is not None
        tansu.proc.kill()
        tansu.proc.wait(10)
        before = metadata_from_cache(kcoord)
        until = time.monotonic() + 8
        while time.monotonic() < until:
            consumer.poll(0.2)
        assert revoked == [] and len(consumer.assignment()) == 4
        asked = metadata_from_cache(kcoord) - before
        assert 0 < asked < 100, asked  # a few refreshes (~1 a second), not a storm
    finally:
        if consumer is not None:
            consumer.close()
        kcoord.stop()
        tansu.stop()


def test_metadata_answered_while_the_upstream_is_down_takes_topic_ids_as_kcoord_does(
        tmp_path: Path, tansu: TansuProcess) -> None:
    """The answer kcoord gives itself while no upstream broker answers followed none of the rules of its
    own Metadata handler (KafkaApis'): before v12 a request naming a topic id, or a null name, was
    answered by id instead of refused whole with INVALID_REQUEST; from v12 an id never seen was
    LEADER_NOT_AVAILABLE, not UNKNOWN_TOPIC_ID with a null name; authorized operations asked for were
    left at the schema's default. Tansu killed after kcoord has learnt a topic and its id."""
    kcoord = start_gateway(tmp_path, tansu.bootstrap, "--upstream-timeout-ms", "3000")
    Topic = MetadataRequest.MetadataRequestTopic

    def ask(version: int, topics: list[Any], **flags: bool) -> MetadataResponse:
        client = RawClient(kcoord.port, timeout=30)
        try:
            return client.call(MetadataRequest(topics=topics, allow_auto_topic_creation=False, **flags), version)
        finally:
            client.close()

    try:
        admin = AdminClient({"bootstrap.servers": kcoord.bootstrap})
        admin.create_topics([NewTopic("by-id", 2, 1)])["by-id"].result(30)
        [learnt] = ask(12, [Topic(name="by-id")]).topics
        assert learnt.error_code == 0 and learnt.topic_id is not None
        assert tansu.proc is not None
        tansu.proc.kill()
        tansu.proc.wait(10)
        before = metadata_from_cache(kcoord)
        for version in (10, 11):
            for topics in ([Topic(name="by-id", topic_id=learnt.topic_id)], [Topic(name=None)]):
                reply = ask(version, topics)
                assert [(t.error_code, t.name) for t in reply.topics] == [(42, topics[0].name or "")], version
        unseen = uuid.uuid4()
        reply = ask(12, [Topic(name=None, topic_id=unseen), Topic(name=None, topic_id=learnt.topic_id)])
        assert [(t.error_code, t.name, t.topic_id) for t in reply.topics] == [
            (100, None, unseen), (0, "by-id", learnt.topic_id)]
        assert [p.error_code for p in reply.topics[1].partitions] == [5, 5]  # leaderless while it is away
        operations = {3, 4, 5, 6, 7, 8, 10, 11}  # as kafka-python decodes kcoord's own handler's answer
        reply = ask(10, [Topic(name="by-id")], include_topic_authorized_operations=True,
                    include_cluster_authorized_operations=True)
        assert reply.topics[0].authorized_operations == operations
        assert reply.authorized_operations == {5, 7, 8, 9, 10, 11, 12}
        assert metadata_from_cache(kcoord) - before == 6  # every answer above was kcoord's own
    finally:
        kcoord.stop()
        tansu.stop()


def stop_stalled(proc: "subprocess.Popen[bytes]") -> None:
    """SIGSTOP, and wait until every thread of the process has stopped: kill() returns as soon as the signal
    is queued, and until the thread it was given to next runs (late on a loaded machine), Tansu's other
    threads still answer requests (an empty Produce's reply reached the client that way, under load)."""
    os.kill(proc.pid, signal.SIGSTOP)
    _, status = os.waitpid(proc.pid, os.WUNTRACED)  # a group stop is reported once all its threads stopped
    assert os.WIFSTOPPED(status), status


def test_a_stop_does_not_wait_for_a_stalled_upstream(tmp_path: Path, tansu: TansuProcess) -> None:
    """A relayed request the upstream never answers (Tansu stopped) held its connection, and with it the
    whole stop, until --shutdown-timeout-ms (a fault campaign: 10.5 s instead of 0.5 s, group coordination
    offline meanwhile). At a stop it is given up: the replies before it are still written, then the
    connection closes, and the stop is prompt and clean."""
    kcoord = start_gateway(tmp_path, tansu.bootstrap)  # the upstream timeout stays 30 s
    assert tansu.proc is not None and kcoord.proc is not None
    client = RawClient(kcoord.port, timeout=30)
    try:
        assert client.call(commit_request("stays", {("t", 0): 7}), 8).topics[0].partitions[0].error_code == 0
        stop_stalled(tansu.proc)
        commit_id, commit = client.encode(commit_request("stays", {("t", 0): 8}), 8)
        produce = struct.pack(">hhih", 0, 3, 99, 4) + b"test" + struct.pack(">hhii", -1, 1, 1000, 0)
        client.sock.sendall(commit + struct.pack(">i", len(produce)) + produce)
        got, reply = client.receive(8, 8)
        assert (got, reply.topics[0].partitions[0].error_code) == (commit_id, 0)
        time.sleep(0.5)  # the Produce is on its way to the stopped upstream
        started = time.monotonic()
        kcoord.proc.send_signal(signal.SIGTERM)
        with pytest.raises(ConnectionError):
            client.read_frame()  # no reply to the Produce: the connection closes
        assert kcoord.proc.wait(20) == 0
        assert time.monotonic() - started < 5.0  # the shutdown timeout is 10 s
        log = kcoord.log_since_start()
        assert "not answered by the deadline" not in log and "kcoord stopped" in log
    finally:
        client.close()
        if tansu.proc.poll() is None:
            os.kill(tansu.proc.pid, signal.SIGCONT)
        if kcoord.proc.poll() is None:
            kcoord.kill()
        tansu.stop()


def test_upstream_broker_killed_and_restarted(tmp_path: Path, tansu: TansuProcess) -> None:
    """Tansu itself killed (SIGKILL) mid-run and started again on the same port. Its storage is in
    memory, so the topic comes back empty (an upstream's loss, not kcoord's): kcoord stays up, serves
    the group's committed offsets throughout, and the same consumer processes carry on with what is
    produced after the restart from their committed positions (nothing committed is lost)."""
    kcoord = start_gateway(tmp_path, tansu.bootstrap, "--upstream-timeout-ms", "5000")
    topic, group = "restarts", "restarted"
    members: list[Member] = []

    def make_topic() -> None:
        """After the restart a member's Metadata request may have auto-created it already."""
        admin = AdminClient({"bootstrap.servers": kcoord.bootstrap})
        for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
            try:
                future.result(30)
            except ck.KafkaException as exc:
                if exc.args[0].code() != ck.KafkaError.TOPIC_ALREADY_EXISTS:
                    raise

    try:
        make_topic()
        producer = ck.Producer({"bootstrap.servers": kcoord.bootstrap, "linger.ms": 5})
        before = [f"before-{i}" for i in range(40)]
        for i, v in enumerate(before):
            producer.produce(topic, value=v.encode(), partition=i % PARTITIONS)
        assert producer.flush(30) == 0
        members = [Member(kcoord, "confluent", group, topic, "confluent"),
                   Member(kcoord, "aiokafka", group, topic, "aiokafka")]
        assert set(before) <= wait_all(members, set(before))
        committed = committed_sum(kcoord, group, topic, 40)

        assert tansu.proc is not None
        tansu.proc.kill()
        tansu.proc.wait(10)
        time.sleep(2)
        assert kcoord.proc is not None and kcoord.proc.poll() is None
        assert group_offsets(kcoord.bootstrap, group, topic) == committed
        tansu.start()  # same port, empty storage
        make_topic()
        offsets: dict[str, tuple[int, int]] = {}

        def delivered(err: object, msg: ck.Message) -> None:
            if err is None:
                value, partition, offset = msg.value(), msg.partition(), msg.offset()
                assert value is not None and partition is not None and offset is not None
                offsets[value.decode()] = (partition, offset)

        producer = ck.Producer({"bootstrap.servers": kcoord.bootstrap, "linger.ms": 5})
        after = [f"after-{i}" for i in range(80)]
        for v in after:  # the partitioner's choice: an auto-created topic may have fewer partitions
            producer.produce(topic, value=v.encode(), on_delivery=delivered)
        assert producer.flush(60) == 0
        assert len(offsets) == len(after)
        # records below a partition's committed offset were "already consumed" as far as the group
        # knows; every record at or above it must reach the group
        expected = {v for v, (p, o) in offsets.items() if o >= committed.get(p, 0)}
        assert expected
        seen = wait_all(members, expected, timeout=120)
        assert expected <= seen, (len(expected - seen), [m.stderr() for m in members])
    finally:
        for m in members:
            if m.proc.poll() is None:
                m.leave()
        if kcoord.proc is not None and kcoord.proc.poll() is None:
            kcoord.stop()
        tansu.stop()


def continue_and_stop(tansu: TansuProcess, kcoord: KcoordProcess) -> None:
    """Teardown after a SIGSTOP: the upstream continued, then both stopped."""
    if tansu.proc is not None and tansu.proc.poll() is None:
        os.kill(tansu.proc.pid, signal.SIGCONT)
    kcoord.stop()
    tansu.stop()


def test_group_requests_on_the_coordinators_connection_do_not_wait_for_a_stalled_upstream(
        tmp_path: Path, tansu: TansuProcess) -> None:
    """Replies leave in request order, so a group request behind a relayed one waits for it. kcoord's
    coordinator is a node of its own, whose connections carry only what clients send any broker: a
    Metadata request there is answered from kcoord's own view once the upstream has not answered it for
    2 s, and the OffsetCommit behind it then at once (it waited for the 30 s upstream timeout before)."""
    kcoord = start_gateway(tmp_path, tansu.bootstrap)  # the upstream timeout stays 30 s
    assert tansu.proc is not None
    client = RawClient(coordinator_port(kcoord), timeout=30)
    try:
        assert client.call(commit_request("hol", {("t", 0): 7}), 8).topics[0].partitions[0].error_code == 0
        stop_stalled(tansu.proc)
        started = time.monotonic()
        asked = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name="t")])
        metadata_id, metadata = client.encode(asked, 1)
        commit_id, commit = client.encode(commit_request("hol", {("t", 0): 8}), 8)
        client.sock.sendall(metadata + commit)
        got, answer = client.receive(3, 1)
        assert got == metadata_id
        assert [(t.name, t.error_code) for t in answer.topics] == [("t", 5)]  # LEADER_NOT_AVAILABLE: retriable
        assert COORDINATOR in {b.node_id for b in answer.brokers}
        got, reply = client.receive(8, 8)
        assert (got, reply.topics[0].partitions[0].error_code) == (commit_id, 0)
        assert time.monotonic() - started < 10.0
        os.kill(tansu.proc.pid, signal.SIGCONT)
        assert client.call(commit_request("hol", {("t", 0): 9}), 8).topics[0].partitions[0].error_code == 0
    finally:
        client.close()
        continue_and_stop(tansu, kcoord)


def test_a_member_is_not_expired_while_only_the_upstream_stalls(tmp_path: Path, tansu: TansuProcess) -> None:
    """A fault campaign's find: with the coordinator on an upstream broker's node id, librdkafka sent its
    heartbeats on that broker's connection, behind a Fetch and a Metadata the stalled upstream did not
    answer, and a member with a 6-10 s session was expired although kcoord itself was healthy. On a
    connection of its own the member keeps heartbeating and keeps its assignment."""
    kcoord = start_gateway(tmp_path, tansu.bootstrap, "--upstream-timeout-ms", "4000")
    assert tansu.proc is not None
    lost: list[str] = []
    consumer = None
    try:
        consumer = assigned_member(kcoord, "stalls", 2, 1000, lost)
        os.kill(tansu.proc.pid, signal.SIGSTOP)
        until = time.monotonic() + 16  # four upstream timeouts, over twice the session
        while time.monotonic() < until:
            consumer.poll(0.2)
        os.kill(tansu.proc.pid, signal.SIGCONT)
        until = time.monotonic() + 3
        while time.monotonic() < until:
            consumer.poll(0.2)
        assert lost == [] and len(consumer.assignment()) == 2
        assert "session timeout" not in kcoord.log_since_start()
    finally:
        if consumer is not None:
            consumer.close()
        continue_and_stop(tansu, kcoord)


def test_stalled_broker_times_out(tmp_path: Path, cabled_tansu: tuple[Cable, TansuProcess]) -> None:
    """A broker that accepts but never answers: after --upstream-timeout-ms the client's connection is
    closed (clients retry), counted as an upstream timeout; group APIs are answered meanwhile."""
    cable, tansu = cabled_tansu
    kcoord = start_gateway(tmp_path, f"127.0.0.1:{cable.port}", "--upstream-timeout-ms", "1500")
    try:
        cable.stalled = True
        assert produce_request_closed(kcoord.port)
        assert metadata_request_answered(kcoord.port)  # from kcoord's own view, after the timeout
        assert group_offsets(kcoord.bootstrap, "nobody", "t") == {}
        text = scrape(kcoord)
        assert 'kind="timeout"' in text, text[-2000:]
    finally:
        cable.stalled = False
        kcoord.stop()
        tansu.stop()
        cable.close()


def test_stop_and_health_are_served_while_the_upstream_has_not_answered_yet(tmp_path: Path) -> None:
    """With the upstream down at start-up, kcoord waits up to 10 s for its first answer before it takes
    the cluster's view; meanwhile /healthz answers and SIGTERM stops it cleanly (before, neither the
    metrics listener nor the signal handlers were set up until that wait ended: SIGTERM killed it
    with exit 143, leaving its journal behind)."""
    nothing = free_port()  # nothing listens there
    kcoord = start_gateway(tmp_path, f"127.0.0.1:{nothing}")
    try:
        started = time.monotonic()
        with urllib.request.urlopen(kcoord.metrics_url + "/healthz", timeout=5) as response:
            assert response.status == 200
        assert time.monotonic() - started < 5  # well within the upstream wait
        with pytest.raises(urllib.error.HTTPError) as not_ready:  # every client would be turned away
            urllib.request.urlopen(kcoord.metrics_url + "/readyz", timeout=5)
        assert not_ready.value.code == 503 and b"no broker has answered yet" in not_ready.value.read()
        assert "upstream" in kcoord.log_since_start()  # still trying
        assert kcoord.stop(timeout=8) == 0
        assert "kcoord stopped" in kcoord.log_since_start()
        assert not any((tmp_path / "data" / "journal").iterdir())  # a clean stop leaves no journal
    finally:
        if kcoord.proc is not None and kcoord.proc.poll() is None:
            kcoord.kill()
