"""Hostile and malformed input on raw sockets against the real kcoord process (reference 1.1, 2, 19.4).

Every bad request must cost exactly its own connection: closed by the server with no response bytes,
while connections opened earlier (a raw socket and a kafka-python consumer) keep working and the server
process stays up. Frames are built with kafka-python's protocol classes where a valid encoding is needed.
"""

import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.protocol.consumer.group import (
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest
from kafka.structs import OffsetAndMetadata

from tests.kcoord_process import KcoordProcess

TIMEOUT = 10.0
OCTopic = OffsetCommitRequest.OffsetCommitRequestTopic
OCPartition = OCTopic.OffsetCommitRequestPartition
OFGroup = OffsetFetchRequest.OffsetFetchRequestGroup


# -- raw wire helpers ------------------------------------------------------------------------------

def connect(server: KcoordProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT)
    sock.settimeout(TIMEOUT)
    return sock


def encode(request: Any, version: int, correlation_id: int) -> bytes:
    """A framed request (size + header + body) encoded by kafka-python."""
    request.API_VERSION = version
    request.with_header(correlation_id=correlation_id, client_id="bad-input-test")
    return bytes(request.encode(header=True, framed=True))


def header(api_key: int, version: int, correlation_id: int, flexible: bool = False) -> bytes:
    """A hand-made request header v1 (or v2 when ``flexible``) with client id "raw"."""
    return struct.pack(">hhih", api_key, version, correlation_id, 3) + b"raw" + (b"\x00" if flexible else b"")


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(data)} of {n} bytes")
        data += chunk
    return data


def read_frame(sock: socket.socket) -> bytes:
    (size,) = struct.unpack(">i", recv_exact(sock, 4))
    return recv_exact(sock, size)


def assert_closed_without_response(sock: socket.socket) -> None:
    """The server must close (FIN or RST) without sending a single byte; bounded by the socket timeout."""
    try:
        received = sock.recv(65536)
    except ConnectionResetError:
        received = b""
    assert received == b"", f"server answered bad input with {received[:64].hex()}"


def commit_request(group: str, topic: str, partition: int, offset: int, metadata: str = "") -> Any:
    part = OCPartition(partition_index=partition, committed_offset=offset, committed_leader_epoch=-1,
                       committed_metadata=metadata)
    return OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=-1, member_id="",
                               group_instance_id=None, topics=[OCTopic(name=topic, partitions=[part])])


def raw_commit(sock: socket.socket, group: str, offset: int, correlation_id: int) -> None:
    sock.sendall(encode(commit_request(group, "raw-topic", 0, offset), 8, correlation_id))
    resp = OffsetCommitResponse.decode(read_frame(sock), version=8, header=True)
    assert resp.header.correlation_id == correlation_id
    assert [p.error_code for t in resp.topics for p in t.partitions] == [0]


def raw_fetch(sock: socket.socket, groups: list[str], correlation_id: int) -> dict[str, int]:
    """OffsetFetch v8 of ``raw-topic``/0 for several groups: {group: committed offset}."""
    topics = [OFGroup.OffsetFetchRequestTopics(name="raw-topic", partition_indexes=[0])]
    req = OffsetFetchRequest(groups=[OFGroup(group_id=g, topics=topics) for g in groups], require_stable=False)
    sock.sendall(encode(req, 8, correlation_id))
    resp = OffsetFetchResponse.decode(read_frame(sock), version=8, header=True)
    assert resp.header.correlation_id == correlation_id
    return {g.group_id: g.topics[0].partitions[0].committed_offset for g in resp.groups}


class Bystanders:
    """Connections opened before the bad input; ``check()`` proves they and the server survived it."""

    def __init__(self, server: KcoordProcess) -> None:
        self.server = server
        self.sock = connect(server)
        raw_commit(self.sock, "bystander-raw", 1, correlation_id=1)
        self.consumer = KafkaConsumer(bootstrap_servers=server.bootstrap, group_id="bystander-kp",
                                      enable_auto_commit=False, request_timeout_ms=10_000)
        self.tp = TopicPartition("bystander-topic", 2)
        self.consumer.commit({self.tp: OffsetAndMetadata(1, "before", -1)}, timeout_ms=10_000)

    def check(self) -> None:
        assert self.server.proc is not None and self.server.proc.poll() is None, self.server.log()
        raw_commit(self.sock, "bystander-raw", 2, correlation_id=2)
        assert raw_fetch(self.sock, ["bystander-raw"], correlation_id=3) == {"bystander-raw": 2}
        self.consumer.commit({self.tp: OffsetAndMetadata(2, "after ✓", -1)}, timeout_ms=10_000)
        got = self.consumer.committed(self.tp, metadata=True, timeout_ms=10_000)
        assert (got.offset, got.metadata) == (2, "after ✓")

    def close(self) -> None:
        self.sock.close()
        self.consumer.close()


@pytest.fixture
def bystanders(kcoord: KcoordProcess) -> Iterator[Bystanders]:
    b = Bystanders(kcoord)
    yield b
    b.close()


def wait_for_log(server: KcoordProcess, text: str) -> str:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        log = server.log()
        if text in log:
            return log
        time.sleep(0.02)
    raise AssertionError(f"{text!r} not in the kcoord log:\n{server.log()}")


def send_bad(server: KcoordProcess, data: bytes) -> None:
    """Sends ``data`` on a fresh connection, expects a silent close and a log line naming the peer."""
    with connect(server) as sock:
        peer = f"127.0.0.1:{sock.getsockname()[1]}"
        sock.sendall(data)
        assert_closed_without_response(sock)
    log = wait_for_log(server, peer)
    # the client's fault, said as such: never an internal error (compiled, a handler's exception variable
    # once took the type of an earlier handler's, and every malformed body closed as "internal error")
    assert f"{peer}: dispatch failed" not in log and "Traceback" not in log, log


# -- bad input cases -------------------------------------------------------------------------------

def _truncated_commit_body() -> bytes:
    full = encode(commit_request("g", "t", 0, 5, "meta"), 8, 11)[4:]
    return frame(full[:-9])


BAD_INPUT: dict[str, bytes] = {
    # garbage: the first four bytes read as an absurd size, or as a frame with no header
    "http-request": b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    "tls-client-hello": bytes.fromhex("16030100a5010000a10303") + bytes(32),
    "zeros": bytes(64),
    "frame-too-short-for-header": frame(b"\x00\x08\x00"),
    # frame sizes outside [0, 100 MiB]: only the size prefix is sent, the server must not wait for the body
    "size-100MiB+1": struct.pack(">i", 100 * 1024 * 1024 + 1),
    "size-int32-max": struct.pack(">i", 2**31 - 1),
    "size-minus-1": struct.pack(">i", -1),
    "size-int32-min": struct.pack(">i", -(2**31)) + b"\x00" * 16,
    # unknown API keys (Produce is a real Kafka API that kcoord does not serve)
    "produce-v9": frame(header(0, 9, 5, flexible=True) + b"\x00" * 20),
    "api-key-999": frame(header(999, 0, 5) + b"\x00" * 8),
    "api-key-minus-1": frame(header(-1, 0, 5)),
    # unsupported versions of served APIs
    "offset-commit-v10": encode(commit_request("g", "t", 0, 5), 10, 5),
    "offset-fetch-v10": encode(OffsetFetchRequest(groups=[OFGroup(group_id="g", topics=None)]), 10, 5),
    "metadata-v13": encode(MetadataRequest(topics=None), 13, 5),
    "find-coordinator-v7": frame(header(10, 7, 5, flexible=True) + b"\x02\x02g\x00"),
    "offset-commit-v-1": frame(header(8, -1, 5) + b"\x00" * 8),
    # malformed bodies for valid API/version pairs
    "offset-commit-v8-truncated": _truncated_commit_body(),
    "client-id-longer-than-frame": frame(struct.pack(">hhih", 8, 2, 5, 0x7FFF) + b"abc"),
    "offset-fetch-v1-huge-array": frame(header(9, 1, 5) + b"\x00\x01g" + struct.pack(">i", 2**31 - 1)),
    "offset-fetch-v6-huge-compact-array": frame(header(9, 6, 5, flexible=True) + b"\x02g" + b"\xff\xff\xff\xff\x0f"),
    "offset-commit-v8-huge-compact-string": frame(header(8, 8, 5, flexible=True) + b"\xff\xff\xff\xff\x0f"),
    "api-versions-v3-truncated": frame(header(18, 3, 5, flexible=True) + b"\x07kco"),
    # non-nullable fields sent as null (length -1): Kafka's generated parsers reject them
    "offset-commit-v2-null-topics": frame(header(8, 2, 5) + b"\x00\x01g" + struct.pack(">ihqi", -1, 0, -1, -1)),
    "offset-commit-v2-null-group": frame(header(8, 2, 5) + struct.pack(">hihqi", -1, -1, 0, -1, 0)),
    "offset-fetch-v8-null-groups": frame(header(9, 8, 5, flexible=True) + b"\x00\x00\x00"),
}

NULL_SERVED: dict[str, bytes] = {
    "offset-fetch-v1-null-topics": frame(header(9, 1, 5) + b"\x00\x01g" + struct.pack(">i", -1)),
    "metadata-v0-null-topics": frame(header(3, 0, 5) + struct.pack(">i", -1)),
    "find-coordinator-v0-null-key": frame(header(10, 0, 5) + struct.pack(">h", -1)),
}


@pytest.mark.parametrize("data", list(BAD_INPUT.values()), ids=list(BAD_INPUT))
def test_bad_input_closes_only_that_connection(kcoord: KcoordProcess, bystanders: Bystanders, data: bytes) -> None:
    send_bad(kcoord, data)
    bystanders.check()


@pytest.mark.parametrize("data", list(NULL_SERVED.values()), ids=list(NULL_SERVED))
def test_null_in_non_nullable_field_closes_connection(kcoord: KcoordProcess, data: bytes) -> None:
    send_bad(kcoord, data)


def test_every_bad_input_in_turn_leaves_server_serving(kcoord: KcoordProcess, bystanders: Bystanders) -> None:
    for data in BAD_INPUT.values():
        send_bad(kcoord, data)
    bystanders.check()
    assert kcoord.stop() == 0


def test_truncated_frame_then_close(kcoord: KcoordProcess, bystanders: Bystanders) -> None:
    whole = encode(commit_request("trunc", "t", 0, 99), 8, 21)
    with connect(kcoord) as sock:
        peer = f"127.0.0.1:{sock.getsockname()[1]}"
        sock.sendall(whole[: len(whole) // 2])
        sock.shutdown(socket.SHUT_WR)
        assert_closed_without_response(sock)
    wait_for_log(kcoord, f"{peer}: connection ended inside a frame")
    bystanders.check()
    with connect(kcoord) as sock:  # the half request was not applied
        assert raw_fetch(sock, ["trunc"], correlation_id=1) == {"trunc": -1}


def test_frame_size_limit_is_inclusive(tmp_path: Path) -> None:
    """With --max-frame-bytes 8192 (the lowest accepted) a request of exactly 8192 bytes is served and
    one of 8193 closes the connection."""
    limit = 8192
    server = KcoordProcess(tmp_path / "data", "--max-frame-bytes", str(limit),
                           "--offset-metadata-max-bytes", "10000").start()
    try:
        # metadata of 200+ chars: its compact length prefix is 2 bytes whatever the exact size
        base = len(encode(commit_request("limit", "raw-topic", 0, 7, "m" * 200), 8, 1)) - 4 - 200
        at_limit = encode(commit_request("limit", "raw-topic", 0, 7, "m" * (limit - base)), 8, 1)
        over = encode(commit_request("limit", "raw-topic", 0, 8, "m" * (limit + 1 - base)), 8, 2)
        assert (len(at_limit), len(over)) == (4 + limit, 4 + limit + 1)
        with connect(server) as sock:
            sock.sendall(at_limit)
            resp = OffsetCommitResponse.decode(read_frame(sock), version=8, header=True)
            assert resp.topics[0].partitions[0].error_code == 0
            sock.sendall(over)
            assert_closed_without_response(sock)
        with connect(server) as sock:
            assert raw_fetch(sock, ["limit"], correlation_id=3) == {"limit": 7}
    finally:
        code = server.stop()
    assert code == 0


# -- ApiVersions (KIP-511) -------------------------------------------------------------------------

def api_versions_v3(sock: socket.socket, correlation_id: int) -> Any:
    sock.sendall(encode(ApiVersionsRequest(client_software_name="kcoord-test", client_software_version="1.0"), 3,
                        correlation_id))
    resp = ApiVersionsResponse.decode(read_frame(sock), version=3, header=True)
    assert resp.header.correlation_id == correlation_id
    return resp


def test_api_versions_too_new_gets_fallback_and_connection_stays_open(kcoord: KcoordProcess) -> None:
    with connect(kcoord) as sock:
        sock.sendall(frame(header(18, 127, 7, flexible=True) + b"\x07future\x041.0\x00\x05more"))
        assert recv_exact(sock, 20) == bytes.fromhex("0000001000000007002300000001001200000004")
        resp = api_versions_v3(sock, correlation_id=8)
        assert resp.error_code == 0
        ranges = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
        expected = {3: (0, 12), 8: (0, 9), 9: (0, 9), 10: (0, 6), 18: (0, 4)}
        assert {k: ranges.get(k) for k in expected} == expected
        # a much newer one too, then the reference request vector byte for byte, on the same connection
        sock.sendall(frame(header(18, 32767, 9)))
        assert recv_exact(sock, 20) == bytes.fromhex("0000001000000009002300000001001200000004")
        # below the range as well (Kafka's isVersionSupported): a fuzz campaign found it closed here
        sock.sendall(frame(header(18, -1, 10)))
        assert recv_exact(sock, 20) == bytes.fromhex("000000100000000a002300000001001200000004")
        sock.sendall(bytes.fromhex("0000001b001200030000000100047465737400076b636f6f726404302e3100"))
        resp = ApiVersionsResponse.decode(read_frame(sock), version=3, header=True)
        assert (resp.header.correlation_id, resp.error_code) == (1, 0)


@pytest.mark.parametrize("client_id", [struct.pack(">h", 4) + b"caf\xe9", struct.pack(">h", -2)],
                         ids=["latin-1", "length-minus-2"])
def test_a_client_id_kafka_reads_is_read(kcoord: KcoordProcess, client_id: bytes) -> None:
    """Kafka's RequestHeader reads a client id that is not UTF-8 with its bad bytes replaced, and any
    negative length as null; kcoord closed such connections (a fuzz campaign). Both codec paths: the
    commit's own decoder and the generated ones (ApiVersions)."""
    commit = encode(commit_request("latin-group", "raw-topic", 0, 3), 8, 1)
    version_request = encode(ApiVersionsRequest(client_software_name="x", client_software_version="1"), 3, 2)
    with connect(kcoord) as sock:
        for correlation_id, framed in ((1, commit), (2, version_request)):
            head = framed[4:12] + client_id
            body = framed[12 + 2 + len("bad-input-test"):]  # after the client id encode() wrote
            sock.sendall(frame(head + body))
            answer = read_frame(sock)
            assert struct.unpack_from(">i", answer)[0] == correlation_id
        assert raw_fetch(sock, ["latin-group"], 3) == {"latin-group": 3}



def test_a_find_coordinator_key_that_is_not_utf8_is_answered(kcoord: KcoordProcess) -> None:
    """The generated codecs, compiled or not (OffsetCommit and OffsetFetch go through their own when
    compiled, below): FindCoordinator v1 for a key that is not UTF-8 is answered, not closed."""
    with connect(kcoord) as sock:
        sock.sendall(frame(header(10, 1, 9) + struct.pack(">h", 4) + b"caf\xe9" + b"\x00"))
        answer = read_frame(sock)
        correlation_id, _throttle, error = struct.unpack_from(">iih", answer)
        assert (correlation_id, error) == (9, 0)


@pytest.mark.parametrize("version", [2, 8])  # both codec paths when interpreted (test_pure_python runs these)
def test_strings_that_are_not_utf8_are_read_as_kafka_reads_them(kcoord: KcoordProcess, version: int) -> None:
    """A fuzzing campaign's find: a group id (or metadata) that is not UTF-8 closed the connection;
    Kafka's readString replaces the bad bytes (U+FFFD) and answers. The group is then the replaced
    name, as in Kafka, and the same bytes find it again."""
    name = "latin-\xe9-" + str(version)  # encoded below as latin-1: one byte 0xe9, not UTF-8
    marker = name.encode()  # what encode() writes, UTF-8: swapped for the latin-1 bytes
    commit = encode(commit_request(name, "raw-topic", 0, 9, "m"), version, 1)
    one_byte = name.encode("latin-1")
    latin = commit.replace(struct.pack(">h", len(marker)) + marker, struct.pack(">h", len(one_byte)) + one_byte)
    if version >= 8:  # compact string: length + 1 as an unsigned varint
        latin = commit.replace(bytes([len(marker) + 1]) + marker, bytes([len(one_byte) + 1]) + one_byte)
    assert latin != commit
    with connect(kcoord) as sock:
        sock.sendall(struct.pack(">i", len(latin) - 4) + latin[4:])
        resp = OffsetCommitResponse.decode(read_frame(sock), version=version, header=True)
        assert [p.error_code for t in resp.topics for p in t.partitions] == [0]
        assert raw_fetch(sock, [name.replace("\xe9", "\ufffd")], 2) == {name.replace("\xe9", "\ufffd"): 9}

def test_api_versions_invalid_software_name_keeps_connection(kcoord: KcoordProcess) -> None:
    """Reference 2: INVALID_REQUEST(42) in the request's own version (v3 body: error, empty compact array,
    throttle, tags), not the v0 fallback body; kafka-python's decoder assumes v0 on any error, so the
    bytes are checked directly."""
    with connect(kcoord) as sock:
        sock.sendall(encode(ApiVersionsRequest(client_software_name="", client_software_version="1.0"), 3, 4))
        assert read_frame(sock) == bytes.fromhex("00000004" "002a" "01" "00000000" "00")
        assert api_versions_v3(sock, correlation_id=5).error_code == 0


# -- pipelining ------------------------------------------------------------------------------------

@pytest.mark.parametrize("count", [50, 1500])
def test_pipelined_commits_answered_in_request_order(kcoord: KcoordProcess, count: int) -> None:
    """``count`` OffsetCommits sent back to back (1500 crosses the server's 1024 in-flight pause), groups
    spread over all offsets partitions, correlation ids not monotonic: replies come back in request order."""
    correlation_ids = [(i * 7919) % 100_003 + 10 for i in range(count)]
    groups = [f"pipe-{i}" for i in range(count)]
    batch = b"".join(encode(commit_request(g, "raw-topic", 0, 1000 + i), 8, c)
                     for i, (g, c) in enumerate(zip(groups, correlation_ids, strict=True)))
    with connect(kcoord) as sock:
        sock.sendall(batch)
        seen = []
        for _ in range(count):
            resp = OffsetCommitResponse.decode(read_frame(sock), version=8, header=True)
            assert [p.error_code for t in resp.topics for p in t.partitions] == [0]
            seen.append(resp.header.correlation_id)
        assert seen == correlation_ids
        fetched = raw_fetch(sock, groups[:50], correlation_id=1)
        assert fetched == {g: 1000 + i for i, g in enumerate(groups[:50])}


def test_pipelined_mixed_apis_keep_order(kcoord: KcoordProcess) -> None:
    """Replies that need no disk write (ApiVersions, Metadata) must wait behind earlier parked commits."""
    requests: list[tuple[int, bytes]] = []
    for i in range(40):
        if i % 2 == 0:
            requests.append((8, encode(commit_request(f"mix-{i}", "raw-topic", 0, i), 8, 500 + i)))
        elif i % 4 == 1:
            requests.append((18, encode(ApiVersionsRequest(client_software_name="x", client_software_version="1"),
                                        3, 500 + i)))
        else:
            requests.append((9, encode(OffsetFetchRequest(groups=[OFGroup(group_id=f"mix-{i - 1}", topics=None)]),
                                       8, 500 + i)))
    with connect(kcoord) as sock:
        sock.sendall(b"".join(data for _, data in requests))
        for i, (api, _) in enumerate(requests):
            payload = read_frame(sock)
            assert struct.unpack_from(">i", payload)[0] == 500 + i
            if api == 9:  # the fetch right after a commit of the same group sees it
                resp = OffsetFetchResponse.decode(payload, version=8, header=True)
                assert resp.groups[0].topics[0].partitions[0].committed_offset == i - 1


@pytest.mark.parametrize("bad", ["offset-commit-v8-truncated", "api-key-999", "offset-commit-v10", "size-minus-1"])
def test_requests_before_a_bad_one_are_answered_before_the_close(kcoord: KcoordProcess, bad: str) -> None:
    """Fuzzing campaign: the connection was aborted at the bad request, throwing away the replies to
    the commits sent before it on the same connection, though they were applied. Kafka reads a
    connection's next request only after answering the last, so those answers were sent."""
    groups = [f"before-bad-{bad}-{i}" for i in range(8)]
    batch = b"".join(encode(commit_request(g, "raw-topic", 0, 70 + i), 8, 600 + i) for i, g in enumerate(groups))
    with connect(kcoord) as sock:
        sock.sendall(batch + BAD_INPUT[bad] + encode(commit_request("after-bad", "raw-topic", 0, 1), 8, 700))
        for i in range(len(groups)):
            resp = OffsetCommitResponse.decode(read_frame(sock), version=8, header=True)
            assert resp.header.correlation_id == 600 + i
            assert [p.error_code for t in resp.topics for p in t.partitions] == [0]
        assert_closed_without_response(sock)  # then closed: nothing after the bad request is answered
    with connect(kcoord) as sock:
        assert raw_fetch(sock, [*groups, "after-bad"], correlation_id=1) == {
            **{g: 70 + i for i, g in enumerate(groups)}, "after-bad": -1}


def test_a_bad_frame_behind_a_malformed_large_request_still_closes(kcoord: KcoordProcess) -> None:
    """A review's find: a bad frame size read while a large request was decoded off the loop refused the
    connection first; the large request's own refusal then returned early, and the connection, reading
    and answering nothing, stayed open until the idle sweep (600 s)."""
    parts = [OCPartition(partition_index=i, committed_offset=i, committed_leader_epoch=-1, committed_metadata="m")
             for i in range(300_000)]
    req = OffsetCommitRequest(group_id="bulk-bad", generation_id_or_member_epoch=-1, member_id="",
                              group_instance_id=None, topics=[OCTopic(name="t", partitions=parts)])
    payload = encode(req, 8, 1)[4:-3]  # cut short: its decode, on the bulk thread, fails at the very end
    with connect(kcoord) as sock:
        sock.sendall(frame(payload))
        time.sleep(0.01)  # complete, and being decoded: now a bad size, on its own
        sock.sendall(b"\xff\xff\xff\xff")
        assert_closed_without_response(sock)  # within the socket's timeout (10 s); 600 s before
