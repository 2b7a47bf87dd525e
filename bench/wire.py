"""The Kafka wire side of the harness: request frames, response checks and ApiVersions.

Requests are encoded once with kafka-python (a stock codec, not kcoord's own) and afterwards only
their correlation id is patched, so the load generator spends no time encoding. Responses are
decoded with kafka-python too, and only when their bytes differ from a known-good answer.
"""

import asyncio
import socket
import struct
from dataclasses import dataclass
from typing import Any

from kafka.protocol.admin.topics import CreateTopicsRequest, CreateTopicsResponse
from kafka.protocol.consumer.group import (
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)
from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse

TOPIC = "bench-topic"
TOPIC_PARTITIONS = 128  # partitions the topic has where a server needs it to exist (mock, Tansu)
COMMIT_VERSION = 8  # the OffsetCommit version: simple commits, no KIP-848 member epoch
HIGHEST_FETCH_VERSION = 9  # the newest OffsetFetch kafka-python 3.0.12 encodes
# Committed with every offset and checked on fetch. 0 is what a consumer of a topic whose leader never
# moved sends; the mock refuses any epoch above its partition's (UNKNOWN_LEADER_EPOCH) and answers
# fetches with the partition's epoch (0) rather than the committed one, so 0 is the one value all
# servers can be checked with.
LEADER_EPOCH = 0
METADATA = "b"  # ditto: one character, so a server that drops metadata is noticed
CLIENT_ID = "kcoord-bench"
OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, API_VERSIONS = 8, 9, 10, 18
BATCHED_FIND_COORDINATOR = 4  # FindCoordinator v4+ asks for many keys in one request (KIP-699)
HIGHEST_FIND_COORDINATOR = 4  # what the harness asks with, as a v4 client (the Java client 3.x) does
FIND_COORDINATOR_KEYS = 1000  # keys per batched request
GROUP_KEY = 0  # FindCoordinator key type of a consumer group
RETRYABLE = frozenset({14, 15, 16})  # load in progress, coordinator not available, not coordinator
SIZE = struct.Struct(">i")

CommitTopic = OffsetCommitRequest.OffsetCommitRequestTopic
CommitPartition = CommitTopic.OffsetCommitRequestPartition
FetchTopic = OffsetFetchRequest.OffsetFetchRequestTopic
FetchGroup = OffsetFetchRequest.OffsetFetchRequestGroup
FetchGroupTopic = FetchGroup.OffsetFetchRequestTopics


@dataclass(frozen=True)
class Template:
    """One request shape: a group, the partitions of ``TOPIC`` it names and the offset it commits."""

    group: str
    partitions: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class Tolerance:
    """Fields a peer is documented not to keep; fetch checks skip exactly these and nothing else."""

    leader_epoch: bool = False
    metadata: bool = False

    def describe(self) -> str:
        dropped = [name for name, on in (("leader epoch", self.leader_epoch), ("metadata", self.metadata)) if on]
        return "ignores " + " and ".join(dropped) if dropped else "checks every field"


@dataclass(frozen=True)
class Versions:
    """The API versions used against one server (chosen from its ApiVersions answer)."""

    commit: int
    fetch: int


def commit_frame(t: Template, version: int = COMMIT_VERSION, correlation_id: int = 0) -> bytes:
    parts = [
        CommitPartition(partition_index=p, committed_offset=t.offset, committed_leader_epoch=LEADER_EPOCH,
                        committed_metadata=METADATA)
        for p in t.partitions
    ]
    req = OffsetCommitRequest[version](
        group_id=t.group, generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
        retention_time_ms=-1, topics=[CommitTopic(name=TOPIC, partitions=parts)],
    )
    req.with_header(correlation_id=correlation_id, client_id=CLIENT_ID)
    return bytes(req.encode(header=True, framed=True))


def fetch_frame(t: Template, version: int, correlation_id: int = 0) -> bytes:
    """v8+ carries a list of groups (here one); v0-v7 one group at the top level."""
    if version >= 8:
        group = FetchGroup(group_id=t.group, member_id=None, member_epoch=-1,
                           topics=[FetchGroupTopic(name=TOPIC, partition_indexes=list(t.partitions))])
        req: Any = OffsetFetchRequest[version](groups=[group], require_stable=False)
    else:
        req = OffsetFetchRequest[version](
            group_id=t.group, topics=[FetchTopic(name=TOPIC, partition_indexes=list(t.partitions))],
            require_stable=False,
        )
    req.with_header(correlation_id=correlation_id, client_id=CLIENT_ID)
    return bytes(req.encode(header=True, framed=True))


def with_correlation_id(frame: bytes, correlation_id: int) -> bytes:
    """Frame layout: size int32 | api key int16 | api version int16 | correlation id int32 | ..."""
    return frame[:8] + SIZE.pack(correlation_id) + frame[12:]


def _body(cls: Any, version: int, body: bytes) -> tuple[Any, str | None]:
    """Strips the response header's tagged fields (flexible versions) and decodes the body."""
    if cls.flexible_version_q(version):
        if not body or body[0] != 0:
            return None, "response header has tagged fields" if body else "empty response"
        body = body[1:]
    try:
        return cls[version].decode(body, version=version), None
    except Exception as exc:  # kafka-python raises many types on malformed input
        return None, f"undecodable response: {type(exc).__name__}"


def commit_problems(body: bytes, t: Template, version: int) -> list[str]:
    """What is wrong with an OffsetCommit response body (the bytes after the correlation id)."""
    resp, problem = _body(OffsetCommitResponse, version, body)
    if problem:
        return [problem]
    problems, seen = [], []
    for topic in resp.topics:
        for p in topic.partitions:
            seen.append((topic.name, p.partition_index))
            if p.error_code:
                problems.append(f"error {p.error_code}")
    if not problems and sorted(seen) != [(TOPIC, p) for p in sorted(t.partitions)]:
        problems.append("answered other partitions than asked")
    return problems


def fetch_problems(body: bytes, t: Template, version: int, tolerance: Tolerance) -> list[str]:
    """What is wrong with an OffsetFetch response: errors, missing partitions, or a committed offset,
    leader epoch or metadata other than the template committed (minus what ``tolerance`` skips)."""
    resp, problem = _body(OffsetFetchResponse, version, body)
    if problem:
        return [problem]
    if version >= 8:
        if len(resp.groups) != 1 or resp.groups[0].group_id != t.group:
            return ["answered other groups than asked"]
        error, topics = resp.groups[0].error_code, resp.groups[0].topics
    else:
        error, topics = (resp.error_code if version >= 2 else 0), resp.topics
    if error:
        return [f"error {error}"]
    problems, seen = [], []
    for topic in topics:
        for p in topic.partitions:
            seen.append((topic.name, p.partition_index))
            if p.error_code:
                problems.append(f"error {p.error_code}")
            elif p.committed_offset != t.offset:
                problems.append("wrong committed offset")
            elif version >= 5 and not tolerance.leader_epoch and p.committed_leader_epoch != LEADER_EPOCH:
                problems.append("wrong leader epoch")
            elif not tolerance.metadata and p.metadata != METADATA:
                problems.append("wrong metadata")
    if not problems and sorted(seen) != [(TOPIC, p) for p in sorted(t.partitions)]:
        problems.append("answered other partitions than asked")
    return problems


async def call(host: str, port: int, request: Any, response_cls: Any, version: int, timeout: float = 10.0) -> Any:
    """One request on its own connection (non-flexible versions only: header v0 both ways)."""
    request.with_header(correlation_id=1, client_id=CLIENT_ID)
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    try:
        writer.write(bytes(request.encode(header=True, framed=True)))
        size = SIZE.unpack(await asyncio.wait_for(reader.readexactly(4), timeout))[0]
        frame = await asyncio.wait_for(reader.readexactly(size), timeout)
    finally:
        writer.close()
    return response_cls[version].decode(frame[4:], version=version)


async def api_versions(host: str, port: int) -> dict[int, tuple[int, int]]:
    """``{api key: (min, max)}`` from an ApiVersions v0 request (every server answers v0)."""
    resp = await call(host, port, ApiVersionsRequest[0](), ApiVersionsResponse, 0)
    if resp.error_code:
        raise RuntimeError(f"ApiVersions answered error {resp.error_code}")
    return {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}


async def create_topic(host: str, port: int, name: str = TOPIC, partitions: int = TOPIC_PARTITIONS) -> None:
    """CreateTopics v4, for a peer that refuses commits to topics it does not have (Tansu)."""
    topic = CreateTopicsRequest.CreatableTopic(name=name, num_partitions=partitions, replication_factor=1,
                                               assignments=[], configs=[])
    req = CreateTopicsRequest[4](topics=[topic], timeout_ms=10_000, validate_only=False)
    resp = await call(host, port, req, CreateTopicsResponse, 4)
    errors = {t.error_code for t in resp.topics} - {0, 36}  # 36: TOPIC_ALREADY_EXISTS
    if errors:
        raise RuntimeError(f"CreateTopics {name}: errors {sorted(errors)}")


@dataclass(frozen=True)
class Broker:
    """A broker: its node id and the address it advertises (what FindCoordinator answers for a group)."""

    node_id: int
    host: str
    port: int


def find_coordinator_version(supported: dict[int, tuple[int, int]]) -> int:
    """The newest FindCoordinator version both the server and the harness (v0-v4) speak."""
    low, high = supported.get(FIND_COORDINATOR, (0, -1))
    version = min(high, HIGHEST_FIND_COORDINATOR)
    if version < low:
        raise RuntimeError(f"the server does not serve FindCoordinator v0-v{HIGHEST_FIND_COORDINATOR} "
                           f"(it serves v{low}-v{high})")
    return version


async def find_coordinators(host: str, port: int, groups: list[str], version: int,
                            timeout: float = 30.0) -> dict[str, Broker]:
    """Asks the broker at ``host:port`` which broker coordinates each group, as a client does before its
    first group request: v4+ batches up to ``FIND_COORDINATOR_KEYS`` groups per request, older versions
    ask one group per request (all pipelined on one connection). Any error code, or an answer for other
    groups than asked, raises RuntimeError: a cluster that cannot say where a group lives is not run."""
    if version >= BATCHED_FIND_COORDINATOR:
        asks = [groups[i : i + FIND_COORDINATOR_KEYS] for i in range(0, len(groups), FIND_COORDINATOR_KEYS)]
    else:
        asks = [[g] for g in groups]
    frames = []
    for cid, keys in enumerate(asks):
        if version >= BATCHED_FIND_COORDINATOR:
            req = FindCoordinatorRequest[version](key_type=GROUP_KEY, coordinator_keys=keys)
        else:
            req = FindCoordinatorRequest[version](key=keys[0], key_type=GROUP_KEY) if version >= 1 else \
                FindCoordinatorRequest[version](key=keys[0])
        req.with_header(correlation_id=cid, client_id=CLIENT_ID)
        frames.append(bytes(req.encode(header=True, framed=True)))
    found: dict[str, Broker] = {}
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    try:
        writer.write(b"".join(frames))
        for cid, keys in enumerate(asks):
            size = SIZE.unpack(await asyncio.wait_for(reader.readexactly(4), timeout))[0]
            frame = await asyncio.wait_for(reader.readexactly(size), timeout)
            if SIZE.unpack_from(frame)[0] != cid:
                raise RuntimeError(f"FindCoordinator: correlation id {SIZE.unpack_from(frame)[0]}, expected {cid}")
            resp, problem = _body(FindCoordinatorResponse, version, frame[4:])
            if problem:
                raise RuntimeError(f"FindCoordinator v{version} from {host}:{port}: {problem}")
            if version >= BATCHED_FIND_COORDINATOR:
                answers = [(c.key, c.error_code, Broker(c.node_id, c.host, c.port)) for c in resp.coordinators]
            else:
                answers = [(keys[0], resp.error_code, Broker(resp.node_id, resp.host, resp.port))]
            if sorted(key for key, _, _ in answers) != sorted(keys):
                raise RuntimeError(f"FindCoordinator v{version} from {host}:{port} answered other groups than asked")
            for key, error, coordinator in answers:
                if error:
                    raise RuntimeError(f"FindCoordinator v{version} from {host}:{port}: error {error} for {key!r}")
                found[key] = coordinator
    finally:
        writer.close()
    return found


def pick_versions(supported: dict[int, tuple[int, int]], fetch_override: int | None = None) -> Versions:
    """OffsetCommit v8 and the newest OffsetFetch both the server and kafka-python speak."""
    low, high = supported.get(OFFSET_COMMIT, (0, -1))
    if not low <= COMMIT_VERSION <= high:
        raise RuntimeError(f"the server does not serve OffsetCommit v{COMMIT_VERSION} (it serves v{low}-v{high})")
    low, high = supported.get(OFFSET_FETCH, (0, -1))
    fetch = min(high, HIGHEST_FETCH_VERSION) if fetch_override is None else fetch_override
    if not low <= fetch <= high:
        raise RuntimeError(f"the server does not serve OffsetFetch v{fetch} (it serves v{low}-v{high})")
    return Versions(COMMIT_VERSION, fetch)


def recv_frame(sock: socket.socket) -> bytes:
    """The next size-prefixed frame on a blocking socket (its body, without the size)."""

    def exactly(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("the server closed the connection")
            buf += chunk
        return buf

    size: int = SIZE.unpack(exactly(4))[0]
    return exactly(size)
