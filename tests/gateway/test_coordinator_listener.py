"""The coordinator's own listener in gateway mode: what a client sends there besides its group requests
(Metadata, which clients send any broker) must not hold those requests up for long, whatever the
upstream does (coordinator/gateway/relay.py). Against a fake upstream whose brokers answer at once,
late or never (tests/gateway/fake_upstream.py)."""

import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest

from tests.gateway.conftest import coordinator_port, node_ports, start_gateway
from tests.gateway.fake_upstream import FakeUpstream
from tests.kcoord_process import KcoordProcess
from tests.rawclient import RawClient, commit_request

LEADER_NOT_AVAILABLE = 5


@pytest.fixture
def fake() -> Iterator[FakeUpstream]:
    upstream = FakeUpstream(3)
    yield upstream
    upstream.stop()


@pytest.fixture
def kcoord(tmp_path: Path, fake: FakeUpstream) -> Iterator[KcoordProcess]:
    proc = start_gateway(tmp_path, fake.bootstrap)
    yield proc
    proc.stop()


def metadata_of_t(client: RawClient) -> tuple[int, bytes]:
    return client.encode(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name="t")]), 1)


def init_producer_id(correlation: int) -> bytes:
    """InitProducerId v0 for no transactional id: relayed untouched, its reply read raw."""
    frame = struct.pack(">hhih", 22, 0, correlation, 5) + b"tests" + struct.pack(">hi", -1, 60_000)
    return struct.pack(">i", len(frame)) + frame


def test_a_stalled_broker_is_passed_over_for_the_next(fake: FakeUpstream, kcoord: KcoordProcess) -> None:
    """A review's find: the coordinator's listener asked only the lowest broker and, when it had not
    answered within the wait, answered every partition leaderless from kcoord's view, though two brokers
    of three were healthy. Now the stalled broker gets half the wait, is marked down, and the next broker
    answers; the next request goes to a healthy broker first."""
    client = RawClient(coordinator_port(kcoord), timeout=30)
    try:
        fake.delay[1] = None
        for limit in (1.9, 0.5):
            started = time.monotonic()
            correlation, request = metadata_of_t(client)
            client.sock.sendall(request)
            got, answer = client.receive(3, 1)
            assert got == correlation and time.monotonic() - started < limit
            assert [(p.partition_index, p.error_code, p.leader_id) for p in answer.topics[0].partitions] == [
                (0, 0, 1), (1, 0, 2), (2, 0, 3)]
    finally:
        client.close()


def test_a_slow_upstream_does_not_close_the_coordinators_connection(fake: FakeUpstream,
                                                                    kcoord: KcoordProcess) -> None:
    """A review's find: a Metadata request past its wait failed the whole upstream link, and with it the
    client's connection, when another relayed request waited on that link (librdkafka's telemetry, say):
    no reply at all, the group request's included. Now only the Metadata request is given up (answered
    from kcoord's view, its late reply dropped); the request before it keeps waiting for its own reply.
    The upstream is slow, not unreachable, so that view has the leaders it last gave (answering every
    partition leaderless, as for an unreachable upstream, held a kafka-python consumer's fetching up for
    12-14 s against 4.5 s)."""
    client = RawClient(coordinator_port(kcoord), timeout=30)
    try:
        client.sock.sendall(metadata_of_t(client)[1])  # relayed at once: kcoord learns the leaders
        assert [p.leader_id for p in client.receive(3, 1)[1].topics[0].partitions] == [1, 2, 3]
        for node in fake.delay:
            fake.delay[node] = 3.0
        started = time.monotonic()
        client.correlation += 1
        relayed = client.correlation
        metadata_id, metadata = metadata_of_t(client)
        commit_id, commit = client.encode(commit_request("slow", {("t", 0): 5}), 8)
        client.sock.sendall(init_producer_id(relayed) + metadata + commit)
        assert struct.unpack(">i", client.read_frame()[:4])[0] == relayed  # the upstream's own reply, at 3 s
        got, answer = client.receive(3, 1)
        assert got == metadata_id and answer.topics[0].error_code == 0  # kcoord's view
        assert [(p.error_code, p.leader_id) for p in answer.topics[0].partitions] == [(0, 1), (0, 2), (0, 3)]
        got, reply = client.receive(8, 8)
        assert (got, reply.topics[0].partitions[0].error_code) == (commit_id, 0)
        assert time.monotonic() - started < 6.0
        time.sleep(2.0)  # the abandoned Metadata replies arrive and are dropped
        assert client.call(commit_request("slow", {("t", 0): 6}), 8).topics[0].partitions[0].error_code == 0
    finally:
        client.close()


def test_the_wait_is_bounded_when_every_broker_stalls(fake: FakeUpstream, kcoord: KcoordProcess) -> None:
    """A review's find: a Metadata request whose link failed under an earlier one gave the next broker a
    full wait of its own, so the group request behind it waited 3-4 s. The wait is one budget for all
    the brokers a request is tried on."""
    client = RawClient(coordinator_port(kcoord), timeout=30)
    try:
        for node in fake.delay:
            fake.delay[node] = None
        first_id, first = metadata_of_t(client)
        client.sock.sendall(first)
        time.sleep(1.0)
        started = time.monotonic()
        second_id, second = metadata_of_t(client)
        commit_id, commit = client.encode(commit_request("stalled", {("t", 0): 5}), 8)
        client.sock.sendall(second + commit)
        for metadata_id in (first_id, second_id):
            got, answer = client.receive(3, 1)
            assert (got, answer.topics[0].error_code) == (metadata_id, LEADER_NOT_AVAILABLE)
        got, reply = client.receive(8, 8)
        assert (got, reply.topics[0].partitions[0].error_code) == (commit_id, 0)
        assert time.monotonic() - started < 2.5
    finally:
        client.close()


def test_telemetry_is_not_offered_on_the_coordinators_listener(fake: FakeUpstream, kcoord: KcoordProcess) -> None:
    """A review's find: librdkafka sends GetTelemetrySubscriptions every few seconds to a broker that offers
    it, the coordinator's node included, and the group requests behind it waited for the upstream's answer
    (the whole upstream timeout, if it stalls). librdkafka asks only brokers that offer it."""

    def offered(port: int) -> set[int]:
        client = RawClient(port)
        try:
            answer = client.call(ApiVersionsRequest(client_software_name="tests", client_software_version="1"), 3)
        finally:
            client.close()
        return {api.api_key for api in answer.api_keys}

    assert {71, 72} <= offered(kcoord.port)
    coordinator = offered(coordinator_port(kcoord))
    assert not {71, 72} & coordinator and {3, 8, 10, 12} <= coordinator


def test_a_client_that_leaves_marks_no_broker_down(fake: FakeUpstream, kcoord: KcoordProcess) -> None:
    """A review's find: a client that left before its Metadata answer came (within its broker's share of
    the wait) still had the broker given up when the timer fired, marked down for every client's
    Metadata for 5 s. The Metadata on the bootstrap listener here goes to node 1 first, as it should."""
    fake.delay[1] = 0.5
    leaving = RawClient(coordinator_port(kcoord))
    leaving.sock.sendall(metadata_of_t(leaving)[1])
    time.sleep(0.1)
    leaving.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    leaving.close()  # a reset: kcoord closes its side, and the upstream links, at once
    time.sleep(1.5)
    fake.delay[1] = 0.0
    before = fake.asked[2][3]
    client = RawClient(kcoord.port)
    try:
        client.call(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name="t")]), 1)
    finally:
        client.close()
    assert fake.asked[2][3] == before  # node 2 only gets Metadata when node 1 is down (discovery asks node 1)


def test_an_unreachable_upstream_is_answered_leaderless(fake: FakeUpstream, kcoord: KcoordProcess) -> None:
    """A review's find: with every broker unreachable in a way that never fails a connect (SYNs dropped),
    the last broker was 'given up' as slow and kcoord answered with the leaders last seen, error 0. A
    broker that never took the connection is not slow: the answer is leaderless, as when connects fail."""
    client = RawClient(coordinator_port(kcoord), timeout=30)
    try:
        client.sock.sendall(metadata_of_t(client)[1])
        assert [p.leader_id for p in client.receive(3, 1)[1].topics[0].partitions] == [1, 2, 3]  # learnt
    finally:
        client.close()
    fake.blackhole()
    client = RawClient(coordinator_port(kcoord), timeout=30)  # a new connection: new upstream links
    try:
        client.sock.sendall(metadata_of_t(client)[1])
        answer = client.receive(3, 1)[1]
        assert [(p.error_code, p.leader_id) for p in answer.topics[0].partitions] == [(LEADER_NOT_AVAILABLE, -1)] * 3
    finally:
        client.close()


def peak_rss_mib(proc: KcoordProcess) -> float:
    assert proc.proc is not None
    with open(f"/proc/{proc.proc.pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024


def test_relayed_frames_are_freed_once_sent(fake: FakeUpstream, kcoord: KcoordProcess) -> None:
    """A memory campaign's find: each relayed request's closures formed a reference cycle holding its
    frame, which only the cyclic collector (run rarely here on purpose) freed, so ~1 MB Produce frames
    piled up: RSS ~940 MiB under 8 producers, kept for good. 400 frames of 1 MB relayed one after the
    other now leave the peak RSS within a few frames of where it was (it grew by ~400 MB before)."""
    port = node_ports(kcoord)[1]
    client = RawClient(port, timeout=30)
    try:
        client.sock.sendall(init_producer_id(1))  # the link to broker 1 is up before the measure
        assert struct.unpack_from(">i", client.read_frame())[0] == 1
        before = peak_rss_mib(kcoord)
        padding = bytes(1 << 20)  # the broker reads the frame whole; kcoord relays it untouched
        for correlation in range(2, 402):
            frame = init_producer_id(correlation)
            client.sock.sendall(struct.pack(">i", len(frame) - 4 + len(padding)) + frame[4:] + padding)
            assert struct.unpack_from(">i", client.read_frame())[0] == correlation
        grown = peak_rss_mib(kcoord) - before
        assert grown < 100, f"peak RSS grew by {grown:.0f} MiB relaying 400 MiB"
    finally:
        client.close()


def test_a_malformed_metadata_request_is_refused_after_the_replies_before_it(kcoord: KcoordProcess) -> None:
    """A review's find: a Metadata request kcoord could not decode was relayed all the same, and when
    kcoord had to answer it itself (the upstream away) its DecodeError aborted the connection, throwing
    away the replies before it. It is refused now, as standalone refuses it: those replies first."""
    client = RawClient(coordinator_port(kcoord), timeout=10)
    try:
        correlation, commit = client.encode(commit_request("before-bad-metadata", {("t", 0): 3}), 8)
        bad = struct.pack(">hhih", 3, 1, 77, 5) + b"tests" + struct.pack(">i", 5)  # 5 topics, none sent
        client.sock.sendall(commit + struct.pack(">i", len(bad)) + bad)
        got, answer = client.receive(8, 8)
        assert (got, answer.topics[0].partitions[0].error_code) == (correlation, 0)
        with pytest.raises(ConnectionError):
            client.read_frame()  # closed, nothing more answered
    finally:
        client.close()


def test_each_broker_a_metadata_request_is_relayed_to_is_logged_at_debug(tmp_path: Path, fake: FakeUpstream) -> None:
    """A Metadata request whose broker refuses the link goes to the next: the debug log names each broker
    asked, in turn (after a refactoring it named only the listener's, even when that one was asked last)."""
    kcoord = start_gateway(tmp_path, fake.bootstrap, "--log-level", "debug")
    try:
        fake.refuse(1)
        with RawClient(node_ports(kcoord)[1]) as client:
            assert client.call(MetadataRequest(topics=[]), 1).brokers
        asked = {int(line.rsplit(":", 1)[1]) for line in kcoord.log_since_start().splitlines()
                 if "api 3 v1 relayed to node 1 at " in line}
        assert fake.ports[2] in asked, asked  # (the listener's broker first, or last if already marked down)
    finally:
        kcoord.stop()
