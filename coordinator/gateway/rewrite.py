"""What the gateway changes in the upstream's answers, and the versions it therefore offers.

Only replies that carry broker addresses are decoded: Metadata (its broker list, at the byte level: the
topics pass as they came), DescribeCluster and FindCoordinator for transaction keys. Their brokers keep
their node ids and get the address of kcoord's listener for that node, so a client never learns an
upstream address. Produce (v10+) and Fetch (v16+) replies may carry
leader endpoints too: those versions are not offered, so none appear and those replies pass undecoded.

ApiVersions is the intersection: APIs kcoord answers itself (the group APIs) at kcoord's versions,
relayed APIs at the upstream's versions, capped where kcoord must parse the reply, and group-like APIs
kcoord does not implement (KIP-848 consumer groups, share and streams groups, TxnOffsetCommit) left
out so that no client takes them to the upstream's own coordinator. Its features (v3+, KIP-584) are
the upstream's, less those whose protocol the gateway does not offer (``HIDDEN_FEATURES``,
``FEATURE_CAPS``).
"""

import struct
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, Protocol, TypeVar

from coordinator.apis import k03_metadata as k03
from coordinator.apis import k10_find_coordinator as k10
from coordinator.apis import k18_api_versions as k18
from coordinator.apis import load_all
from coordinator.gateway.topiccache import NO_ID, TopicCache
from protocol.codec import MessageCodec, read_uvarint, write_uvarint
from protocol.errors import ErrorCode
from protocol.header import response_header
from protocol.hotcodec import BoundedReader
from protocol.registry import REGISTRY, skip_tagged_fields
from protocol.schema import load_message

_SIZE = struct.Struct(">i")
_NO_ID = NO_ID
_INT16 = struct.Struct(">h")
K = TypeVar("K")  # a key of ranges to intersect: an API key, a feature name
UNKNOWN_TOPIC_OR_PARTITION = 3
LEADER_NOT_AVAILABLE = 5  # retriable: clients ask again shortly

# Answered by kcoord's own coordinator on every listener, at kcoord's versions.
LOCAL = frozenset({8, 9, 11, 12, 13, 14, 15, 16, 42, 47})
FIND_COORDINATOR, METADATA, API_VERSIONS, DESCRIBE_CLUSTER = 10, 3, 18, 60
PRODUCE, FETCH = 0, 1
# Never offered: TxnOffsetCommit (it would write the upstream's __consumer_offsets, through a broker
# that is not the upstream's coordinator for the group), ConsumerGroupHeartbeat/Describe (KIP-848),
# share-group and streams-group APIs and the broker-internal share-state ones.
HIDDEN = frozenset({28, 68, 69, *range(76, 93)})
# GetTelemetrySubscriptions and PushTelemetry (KIP-714): relayed, but not offered on the coordinator's listener.
TELEMETRY = frozenset({71, 72})
# Features (ApiVersions v3+) whose protocol is the hidden APIs': the KIP-848 consumer group protocol,
# share groups (KIP-932) and streams groups (KIP-1071). Neither supported nor finalized in kcoord's answer.
HIDDEN_FEATURES = frozenset({"group.version", "share.version", "streams.version"})
# Features offered up to a level only. transaction.version 2 (KIP-890 part 2) has a producer add a
# transaction's partitions by producing to them (Produce v12+, past CAPS) and skip AddPartitionsToTxn:
# Kafka 4's Java producer turns it on from the finalized level alone, then sends its Produce at the
# version negotiated (v9 here), which does not add them, and the upstream refuses its records.
FEATURE_CAPS = {"transaction.version": 1}


def _codec(name: str) -> MessageCodec:
    return MessageCodec(load_message(name))


METADATA_REQUEST = k03.SPEC
METADATA_RESPONSE = k03.SPEC.response
DESCRIBE_CLUSTER_RESPONSE = _codec("DescribeClusterResponse")
FIND_COORDINATOR_RESPONSE = k10.SPEC.response

# The highest version of each rewritten or capped API the gateway relays.
CAPS = {
    PRODUCE: 9,  # v10 adds NodeEndpoints (leader hints) to NOT_LEADER replies
    FETCH: 15,  # v16 adds NodeEndpoints
    METADATA: 12,  # kcoord's Metadata codec
    DESCRIBE_CLUSTER: DESCRIBE_CLUSTER_RESPONSE.spec.valid[1],
    FIND_COORDINATOR: k10.SPEC.max_version,
    API_VERSIONS: k18.SPEC.max_version,
}

Address = Callable[[int], tuple[str, int] | None]  # node id -> kcoord's listener for it


class RewriteError(Exception):
    """An upstream reply that cannot be parsed at its version."""


def decode_reply(codec: MessageCodec, frame: bytes, version: int) -> tuple[int, Any]:
    """``(correlation id, body)`` of a framed reply."""
    try:
        (correlation,) = struct.unpack_from(">i", frame, 4)
        pos = 8
        if codec.spec.is_flexible(version):
            pos = skip_tagged_fields(frame, pos)
        body, _ = codec.decode(frame, version, pos)
    except (ValueError, struct.error) as exc:
        raise RewriteError(f"{codec.spec.name} v{version}: {exc}") from exc
    return correlation, body


def _encode(codec: MessageCodec, body: Any, version: int, correlation: int, flexible_header: bool = True) -> bytes:
    payload = codec.encode(body, version)
    head = response_header(correlation, flexible_header and codec.spec.is_flexible(version))
    return _SIZE.pack(len(head) + len(payload)) + head + payload


class Features(NamedTuple):
    """The features an ApiVersions v3+ answer carries (KIP-584): name -> (min, max) supported, and
    name -> (min level, max level) finalized cluster-wide, valid at ``epoch`` (-1: unknown)."""

    supported: dict[str, tuple[int, int]]
    epoch: int
    finalized: dict[str, tuple[int, int]]


NO_FEATURES = Features({}, -1, {})


class ClusterFacts(Protocol):
    cluster_id: str | None
    coordinator_node: int
    controller_id: int
    topics: TopicCache

    def address(self, node: int) -> tuple[str, int] | None: ...

    def learn(self, brokers: Iterable[tuple[int, str, int]]) -> None: ...

    def nodes(self) -> list[int]: ...


def rewrite_brokers(codec: MessageCodec, frame: bytes, version: int, cluster: ClusterFacts) -> bytes:
    """DescribeCluster: every broker gets kcoord's listener for its node id, and kcoord's group coordinator
    is one more broker; the upstream addresses are learnt first (listeners are made for new node ids
    there). An error answer (a top-level error code) is returned unchanged."""
    correlation, body = decode_reply(codec, frame, version)
    if body.error_code:
        # DescribeCluster's error answer (MISMATCHED_ENDPOINT_TYPE for a controller endpoint asked of a
        # broker, say) lists no broker: passed on as it is, nothing in it learnt
        return frame
    brokers = body.brokers
    ids = [b.broker_id for b in brokers]
    cluster.learn(zip(ids, (b.host for b in brokers), (b.port for b in brokers), strict=True))
    coordinator = cluster.coordinator_node
    if coordinator not in ids:  # (its address is given below, with the others')
        brokers.append(codec.cls.DescribeClusterBroker(broker_id=coordinator, host="", port=-1, rack=None))
        ids.append(coordinator)
    address = cluster.address
    for node, b in zip(ids, brokers, strict=True):
        mapped = address(node)
        if mapped is not None:
            b.host, b.port = mapped
    return _encode(codec, body, version, correlation)


def _string(value: str, flexible: bool) -> bytes:
    data = value.encode()
    return (write_uvarint(len(data) + 1) if flexible else _INT16.pack(len(data))) + data


def rewrite_metadata(frame: bytes, version: int, cluster: ClusterFacts, every_topic: bool = False) -> bytes:
    """Metadata (v0-v12), at the byte level: the broker list is rebuilt, every broker with kcoord's
    listener for its node id and kcoord's group coordinator one more broker (leading no partition), the
    upstream addresses learnt first (listeners are made for new node ids there); the cluster id, the
    controller and the topics are passed on as the upstream wrote them, the topics noted in the cache
    (``TopicCache.note``: read when it is asked, or once enough wait; for a request of ``every_topic``,
    the topics the answer does not name are then forgotten, deleted upstream)."""
    flexible = version >= 9
    try:
        r = BoundedReader(frame, skip_tagged_fields(frame, 8) if flexible else 8)
        if version >= 3:
            r.int32()  # throttle time
        brokers_start = r.pos
        brokers: list[tuple[int, str, int, bytes]] = []  # node id, host, port, the rest (rack, tags) as sent
        for _ in range(r.count(flexible, False, "brokers")):
            node = r.int32()
            host = r.text(flexible, "host")
            port = r.int32()
            rest = r.pos
            if version >= 1:
                r.string(flexible, True, "rack")
            if flexible:
                r.skip_tags()
            brokers.append((node, host, port, frame[rest:r.pos]))
        tail = r.pos
        cluster_id = r.string(flexible, True, "cluster_id") if version >= 2 else None
        controller = r.int32() if version >= 1 else -1
        topics_start = r.pos
    except (ValueError, struct.error) as exc:
        raise RewriteError(f"Metadata v{version}: {exc}") from exc
    cluster.learn((node, host, port) for node, host, port, _ in brokers)
    coordinator = cluster.coordinator_node
    if coordinator not in [node for node, _, _, _ in brokers]:  # (its address is given below, with the others')
        no_rack = (b"\x00" if flexible else _INT16.pack(-1)) if version >= 1 else b""
        brokers.append((coordinator, "", -1, no_rack + (b"\x00" if flexible else b"")))
    if cluster_id is not None:
        cluster.cluster_id = cluster_id
    if controller >= 0:
        cluster.controller_id = controller
    parts: list[bytes | memoryview] = [b"", frame[4:brokers_start],
                                       write_uvarint(len(brokers) + 1) if flexible else _SIZE.pack(len(brokers))]
    for node, host, port, rack_and_tags in brokers:
        mapped = cluster.address(node)
        if mapped is not None:
            host, port = mapped
        parts += (_SIZE.pack(node), _string(host, flexible), _SIZE.pack(port), rack_and_tags)
    parts.append(memoryview(frame)[tail:])  # the bulk, copied once, by the join
    parts[0] = _SIZE.pack(sum(map(len, parts)))
    cluster.topics.note(frame, topics_start, version, every_topic)
    return b"".join(parts)


def metadata_from_cache(request: Any, version: int, correlation: int, cluster: ClusterFacts,
                        last_seen: bool = False) -> bytes:
    """A Metadata answer without the upstream: the brokers known, and each topic asked for (every topic
    known, for a request of all) as a broker whose leaders are offline answers it: its partitions, each
    LEADER_NOT_AVAILABLE without a leader, which clients retry while keeping their assignments. An
    empty partition list instead read as "the topic has no partitions now" to librdkafka, which revoked
    its assignment and asked again hundreds of times a second (a fault campaign's find). A topic never
    seen is LEADER_NOT_AVAILABLE itself, as Kafka answers one it is still creating. With ``last_seen``
    (the upstream is slow, not unreachable), a topic's partitions are as the upstream last gave them,
    leaders included, as a broker with a stale metadata cache answers. Which topics are asked for, and
    the authorized operations, follow kcoord's own Metadata handler (``k03.lookup``): before v12 a
    request naming a topic id or a null name is refused whole with INVALID_REQUEST; from v12 a request
    naming ids is answered by id, UNKNOWN_TOPIC_ID (null name) for an id never seen."""
    cls = METADATA_RESPONSE.cls
    brokers = []
    for node in cluster.nodes():
        mapped = cluster.address(node)
        if mapped is not None:
            brokers.append(cls.MetadataResponseBroker(node_id=node, host=mapped[0], port=mapped[1], rack=None))
    known = cluster.topics.facts()
    asked = k03.lookup(request, version)  # the same rules as kcoord's own Metadata handler
    if asked.invalid:
        return _encode(METADATA_RESPONSE, k03.error_response(request, version, ErrorCode.INVALID_REQUEST), version,
                       correlation)
    topics: list[Any] = []
    wanted: list[str | None]
    if asked.everything:
        wanted = list(known)
    elif asked.ids:  # v12+: by id alone; an id never seen is UNKNOWN_TOPIC_ID, as kcoord's handler answers it
        by_id = {facts.topic_id: name for name, facts in known.items() if facts.topic_id != _NO_ID}
        topics = [k03.unknown_topic_id(i) for i in asked.ids if i not in by_id]
        wanted = [by_id[i] for i in asked.ids if i in by_id]
    else:
        wanted = list(asked.names)
    for name in wanted:
        facts = known.get(name) if name is not None else None
        if facts is None:
            topics.append(cls.MetadataResponseTopic(error_code=LEADER_NOT_AVAILABLE, name=name, topic_id=_NO_ID,
                                                    is_internal=False, partitions=[]))
            continue
        seen = facts.last_seen if last_seen and facts.last_seen else [
            (i, LEADER_NOT_AVAILABLE, -1, -1) for i in range(facts.partitions)]
        partitions = [cls.MetadataResponseTopic.MetadataResponsePartition(
            error_code=error, partition_index=i, leader_id=leader, leader_epoch=epoch, replica_nodes=[], isr_nodes=[],
            offline_replicas=[]) for i, error, leader, epoch in seen]
        topics.append(cls.MetadataResponseTopic(error_code=0, name=name, topic_id=facts.topic_id,
                                                is_internal=facts.is_internal, partitions=partitions))
    cluster_operations = k03.authorized_operations(request, version, topics)
    body = cls(throttle_time_ms=0, brokers=brokers, cluster_id=cluster.cluster_id, controller_id=cluster.controller_id,
               topics=topics, cluster_authorized_operations=cluster_operations)
    return _encode(METADATA_RESPONSE, body, version, correlation)


def _body_start(frame: bytes, flexible: bool) -> int:
    """Where a request's body starts (frame without its size): after the api key, version and correlation
    id, the client id (a nullable int16 string in header v1 and v2 alike) and, in header v2 (a flexible
    version), the tagged fields. struct.error or ValueError for a frame too short to say."""
    (n,) = struct.unpack_from(">h", frame, 8)
    pos = 10 + max(n, 0)
    return skip_tagged_fields(frame, pos) if flexible else pos


def produce_acks(frame: bytes, version: int) -> int:
    """The ``acks`` of a Produce request (frame without its size): 0 means the broker sends no reply,
    so the relay must not wait for one. Header v1 up to v8, v2 (tagged fields) from v9; the body
    starts with the transactional id from v3 (a compact string from v9)."""
    try:
        pos = _body_start(frame, flexible=version >= 9)
        if version >= 9:
            length, pos = read_uvarint(frame, pos)
            pos += max(length - 1, 0)
        elif version >= 3:
            (n,) = struct.unpack_from(">h", frame, pos)
            pos += 2 + max(n, 0)
        (acks,) = struct.unpack_from(">h", frame, pos)
    except (ValueError, struct.error) as exc:
        raise RewriteError(f"Produce v{version}: {exc}") from exc
    return int(acks)


def fetch_max_wait_ms(frame: bytes, version: int) -> int:
    """The ``max_wait_ms`` of a Fetch request (frame without its size): how long the broker may hold it
    while it has less than the minimum to return. Header v1 up to v11, v2 (tagged fields) from v12; the
    body starts with the replica id up to v14 (from v15 it is in a tagged field)."""
    try:
        pos = _body_start(frame, flexible=version >= 12)
        if version <= 14:
            pos += 4
        (wait,) = struct.unpack_from(">i", frame, pos)
    except (ValueError, struct.error) as exc:
        raise RewriteError(f"Fetch v{version}: {exc}") from exc
    return max(int(wait), 0)


def rewrite_find_coordinator(frame: bytes, version: int, address: Address) -> bytes:
    """FindCoordinator for transaction keys, answered upstream: the coordinator's address becomes
    kcoord's listener for that node."""
    codec = FIND_COORDINATOR_RESPONSE
    correlation, body = decode_reply(codec, frame, version)
    nodes = body.coordinators if version >= 4 else [body]
    for node in nodes:
        mapped = address(node.node_id) if node.node_id >= 0 else None
        if mapped is not None:
            node.host, node.port = mapped
    return _encode(codec, body, version, correlation)


def common_ranges(brokers: list[dict[K, tuple[int, int]]]) -> dict[K, tuple[int, int]]:
    """The (min, max) ranges every one of the brokers has, intersected (the API versions every one speaks,
    the features every one supports); a key some broker lacks, or whose ranges do not overlap, is left out."""
    common: dict[K, tuple[int, int]] = {}
    for key, (lo, hi) in brokers[0].items():
        for other in brokers[1:]:
            found = other.get(key)
            if found is None:
                break
            lo, hi = max(lo, found[0]), min(hi, found[1])
        else:
            if lo <= hi:
                common[key] = (lo, hi)
    return common


def common_features(brokers: list[Features]) -> Features:
    """What the brokers' features come to for the cluster: those every one supports (the ranges'
    intersection), and the finalized ones of the latest epoch (finalized levels are cluster-wide; a
    broker may not have seen the latest yet)."""
    supported = common_ranges([b.supported for b in brokers])
    latest = max(brokers, key=lambda b: b.epoch)
    return Features(supported, latest.epoch, dict(latest.finalized))


def gateway_features(upstream: Features) -> Features:
    """The upstream's features as the gateway offers them: less ``HIDDEN_FEATURES``, and those of
    ``FEATURE_CAPS`` no higher than their cap."""
    supported: dict[str, tuple[int, int]] = {}
    for name, (lo, hi) in upstream.supported.items():
        hi = min(hi, FEATURE_CAPS.get(name, hi))
        if name not in HIDDEN_FEATURES and lo <= hi:
            supported[name] = (lo, hi)
    finalized: dict[str, tuple[int, int]] = {}
    for name, (lo, hi) in upstream.finalized.items():
        hi = min(hi, FEATURE_CAPS.get(name, hi))
        if name not in HIDDEN_FEATURES and hi > 0:  # a feature at level 0 is not finalized
            finalized[name] = (min(lo, hi), hi)
    return Features(supported, upstream.epoch, finalized)


def api_versions(upstream: dict[int, tuple[int, int]]) -> list[tuple[int, int, int]]:
    """``(key, min, max)`` offered to clients, given the upstream's ranges."""
    load_all()  # every local API registered (the server has done it; a lone caller may not have)
    out: dict[int, tuple[int, int]] = {}
    for key, (lo, hi) in upstream.items():
        if key in HIDDEN or key in LOCAL:
            continue
        if key in CAPS:
            ours = REGISTRY.get(key)
            floor = max(lo, ours.min_version) if ours is not None and key in (FIND_COORDINATOR, API_VERSIONS) else lo
            hi = min(hi, CAPS[key])
            if hi < floor:
                continue
            lo = floor
        out[key] = (lo, hi)
    for key in LOCAL | {FIND_COORDINATOR, API_VERSIONS}:
        spec = REGISTRY.get(key)
        if spec is not None and key not in out:
            out[key] = (spec.min_version, spec.max_version)
    return [(key, lo, hi) for key, (lo, hi) in sorted(out.items())]


def api_versions_response(versions: list[tuple[int, int, int]], version: int, correlation: int,
                          software: tuple[str | None, str | None] | None, features: Features = NO_FEATURES) -> bytes:
    """kcoord's ApiVersions answer in gateway mode (v3+ requests name valid client software; their
    answers carry the ``features``, below v4 without the supported ones whose minimum is 0, as Kafka's)."""
    cls = k18.Response
    if version >= 3 and software is not None and not all(k18.valid_software(v) for v in software):
        body = cls(error_code=ErrorCode.INVALID_REQUEST, api_keys=[], throttle_time_ms=0)
    else:
        body = cls(error_code=0, throttle_time_ms=0,
                   api_keys=[cls.ApiVersion(api_key=k, min_version=lo, max_version=hi) for k, lo, hi in versions])
        if version >= 3:
            supported = sorted((n, lo, hi) for n, (lo, hi) in features.supported.items() if version >= 4 or lo > 0)
            body.supported_features = [cls.SupportedFeatureKey(name=name, min_version=lo, max_version=hi)
                                       for name, lo, hi in supported]
            body.finalized_features_epoch = features.epoch
            body.finalized_features = [cls.FinalizedFeatureKey(name=name, min_version_level=lo, max_version_level=hi)
                                       for name, (lo, hi) in sorted(features.finalized.items())]
    return k18.SPEC.encode_response(body, version, correlation)


def parse_api_versions(frame: bytes, version: int = 0) -> tuple[dict[int, tuple[int, int]], Features]:
    """The upstream's ApiVersions reply (framed) at ``version``: key -> (min, max), and its features
    (none below v3). RewriteError for an error answer; UnsupportedApiVersions for KIP-511's answer to a
    version above the broker's range."""
    if version and len(frame) >= 10 and struct.unpack_from(">h", frame, 8)[0] == ErrorCode.UNSUPPORTED_VERSION:
        try:  # KIP-511: the v0 body, with its own range
            ranges = [k.max_version for k in decode_reply(k18.SPEC.response, frame, 0)[1].api_keys
                      if k.api_key == API_VERSIONS]
        except RewriteError:  # librdkafka's mock cluster encodes it wrong: v0, which every broker speaks
            ranges = []
        raise UnsupportedApiVersions(ranges[0] if ranges else 0)
    try:  # (its response header has no tagged fields, flexible or not: KIP-511)
        body, _ = k18.SPEC.response.decode(frame, version, 8)
    except (ValueError, struct.error) as exc:
        raise RewriteError(f"ApiVersionsResponse v{version}: {exc}") from exc
    if body.error_code:
        raise RewriteError(f"upstream ApiVersions error {body.error_code}")
    versions = {k.api_key: (k.min_version, k.max_version) for k in body.api_keys}
    if version < 3:
        return versions, NO_FEATURES
    supported = {f.name: (f.min_version, f.max_version) for f in body.supported_features or ()}
    finalized = {f.name: (f.min_version_level, f.max_version_level) for f in body.finalized_features or ()}
    return versions, Features(supported, body.finalized_features_epoch, finalized)


class UnsupportedApiVersions(RewriteError):
    """The broker does not speak the ApiVersions version asked; ``highest`` is the highest it does."""

    def __init__(self, highest: int) -> None:
        super().__init__(f"upstream ApiVersions speaks up to v{highest}")
        self.highest = highest
