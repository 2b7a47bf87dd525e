"""The gateway's rewrites without processes: answers it builds or re-encodes must decode with a stock
codec (kafka-python's) at every version served, with kcoord's listener addresses."""

import struct
import uuid
from collections.abc import Iterable

import pytest
from kafka.protocol.metadata import MetadataResponse

from coordinator.apis import k03_metadata as k03
from coordinator.apis import load_all
from coordinator.gateway import rewrite
from coordinator.gateway.topiccache import TopicCache, TopicFacts
from protocol.registry import REGISTRY

Request = k03.SPEC.request.cls
Topic = Request.MetadataRequestTopic
_ID = uuid.UUID(int=7)
_ZERO = uuid.UUID(int=0)


class Facts:
    cluster_id: str | None = "up-cluster"
    controller_id = 2
    coordinator_node = 9

    def __init__(self, topics: dict[str, TopicFacts] | None = None) -> None:
        self.learnt: list[tuple[int, str, int]] = []
        self.topics = TopicCache(topics)

    def address(self, node: int) -> tuple[str, int] | None:
        return ("kcoord.local", 40000 + node)

    def learn(self, brokers: Iterable[tuple[int, str, int]]) -> None:
        self.learnt += list(brokers)

    def nodes(self) -> list[int]:
        return [1, 2, 3, 9]


def stock_decode(frame: bytes, version: int) -> MetadataResponse:
    body = frame[9:] if version >= 9 else frame[8:]  # size, correlation id (+ tagged fields from v9)
    assert struct.unpack_from(">i", frame, 4)[0] == 77
    return MetadataResponse.decode(body, version=version)


@pytest.mark.parametrize("version", range(0, 13))
def test_metadata_from_cache_every_version(version: int) -> None:
    topics = [Topic(name="orders", topic_id=uuid.UUID(int=0) if version >= 10 else None)]
    request = Request(topics=topics, allow_auto_topic_creation=False)
    frame = rewrite.metadata_from_cache(request, version, 77, Facts())
    reply = stock_decode(frame, version)
    got = [(b.node_id, b.host, b.port) for b in reply.brokers]
    assert got == [(n, "kcoord.local", 40000 + n) for n in (1, 2, 3, 9)]
    assert [(t.error_code, t.name) for t in reply.topics] == [(rewrite.LEADER_NOT_AVAILABLE, "orders")]


@pytest.mark.parametrize("version", range(0, 13))
def test_metadata_from_cache_keeps_a_known_topics_partitions_leaderless(version: int) -> None:
    """A topic a relayed answer described keeps its partitions, each LEADER_NOT_AVAILABLE with no
    leader (an empty list read to librdkafka as a topic shrunk to nothing); asked by name, by id
    (v12+), or as every topic (None; v0's empty list)."""
    known = uuid.uuid4()
    facts = Facts({"orders": TopicFacts(known, 3, False)})
    asked = [[Topic(name="orders")], None if version >= 1 else []]
    if version >= 12:
        asked.append([Topic(name=None, topic_id=known)])
    for topics in asked:
        reply = stock_decode(rewrite.metadata_from_cache(Request(topics=topics, allow_auto_topic_creation=False),
                                                         version, 77, facts), version)
        [topic] = reply.topics
        assert (topic.error_code, topic.name) == (0, "orders")
        assert [(p.error_code, p.partition_index, p.leader_id) for p in topic.partitions] == [
            (rewrite.LEADER_NOT_AVAILABLE, i, -1) for i in range(3)]


@pytest.mark.parametrize("version", range(10, 13))
def test_metadata_from_cache_takes_topic_ids_as_kcoords_own_handler(version: int) -> None:
    """The answer kcoord gives while the upstream is away followed none of the rules its own Metadata
    handler applies to topic ids: before v12 a request naming an id or a null name is refused whole
    with INVALID_REQUEST (it was answered by id); from v12 an id never seen is UNKNOWN_TOPIC_ID with a
    null name (it was LEADER_NOT_AVAILABLE), and the names beside ids are not looked at."""
    known, unseen = uuid.uuid4(), uuid.uuid4()
    facts = Facts({"orders": TopicFacts(known, 2, False), "other": TopicFacts(uuid.uuid4(), 1, False)})
    for topics in ([Topic(name=None, topic_id=known)], [Topic(name="orders", topic_id=known), Topic(name="other")],
                   [Topic(name=None, topic_id=unseen), Topic(name=None, topic_id=known)]):
        request = Request(topics=topics, allow_auto_topic_creation=False)
        reply = stock_decode(rewrite.metadata_from_cache(request, version, 77, facts), version)
        got = [(t.error_code, t.name, t.topic_id or _ZERO) for t in reply.topics]  # kafka-python: zero id is None
        if version < 12:
            assert got == [(42, t.name or "", t.topic_id or _ZERO) for t in topics]
            assert reply.brokers == []
        elif unseen in {t.topic_id for t in topics}:
            assert got == [(100, None, unseen), (0, "orders", known)]
        else:
            assert got == [(0, "orders", known)]
    if version < 12:  # a null name alone, without an id, is refused too
        request = Request(topics=[Topic(name=None, topic_id=uuid.UUID(int=0))], allow_auto_topic_creation=False)
        assert [t.error_code for t in stock_decode(rewrite.metadata_from_cache(request, version, 77, facts),
                                                   version).topics] == [42]


@pytest.mark.parametrize("version", range(0, 13))
def test_metadata_from_cache_answers_authorized_operations_as_kcoords_own_handler(version: int) -> None:
    """Authorized operations asked for (v8+) were left at the schema's default (-2^31) in the cached
    answer; kcoord's handler answers every operation a broker without an authorizer allows (none on
    an UNKNOWN_TOPIC_ID topic), the cluster's for v8-v10."""
    facts = Facts({"orders": TopicFacts(uuid.uuid4(), 1, False)})
    fields = {"include_topic_authorized_operations": True, "include_cluster_authorized_operations": True}
    topics = [Topic(name="orders"), Topic(name="never-seen")]
    if version >= 12:
        known = facts.topics.facts()["orders"].topic_id
        topics = [Topic(name=None, topic_id=known), Topic(name=None, topic_id=uuid.uuid4())]
    request = Request(topics=topics, allow_auto_topic_creation=False, **fields)
    reply = stock_decode(rewrite.metadata_from_cache(request, version, 77, facts), version)
    if version < 8:
        return
    def bits(operations: int) -> set[int]:  # as kafka-python decodes the field
        return {op for op in range(32) if operations & (1 << op)}

    ops = [t.authorized_operations for t in reply.topics]
    assert ops == ([None, bits(k03.TOPIC_OPERATIONS)] if version >= 12 else [bits(k03.TOPIC_OPERATIONS)] * 2)
    if version <= 10:
        assert reply.authorized_operations == bits(k03.CLUSTER_OPERATIONS)


@pytest.mark.parametrize("version", [1, 9, 12])
def test_a_relayed_metadata_answer_teaches_the_cache_its_topics(version: int) -> None:
    cls = rewrite.METADATA_RESPONSE.cls
    part = cls.MetadataResponseTopic.MetadataResponsePartition
    def topic(name: str, error: int, partitions: int) -> object:
        return cls.MetadataResponseTopic(error_code=error, name=name, topic_id=_ID, is_internal=False, partitions=[
            part(error_code=0, partition_index=i, leader_id=1, leader_epoch=0, replica_nodes=[1], isr_nodes=[1],
                 offline_replicas=[]) for i in range(partitions)])
    upstream = cls(throttle_time_ms=0, cluster_id="up", controller_id=1, brokers=[], topics=[
        topic("kept", 0, 2), topic("gone", 3, 0)])
    payload = rewrite.METADATA_RESPONSE.encode(upstream, version)
    head = struct.pack(">i", 77) + (b"\x00" if version >= 9 else b"")
    facts = Facts({"gone": TopicFacts(_ID, 1, False)})
    rewrite.rewrite_metadata(struct.pack(">i", len(head) + len(payload)) + head + payload, version, facts)
    assert {name: facts[:3] for name, facts in facts.topics.facts().items()} == {
        "kept": (_ID if version >= 10 else uuid.UUID(int=0), 2, False)}
    assert [leader for _, _, leader, _ in facts.topics.facts()["kept"].last_seen] == [1, 1]


@pytest.mark.parametrize("learnt_at", [1, 12])
@pytest.mark.parametrize("version", range(0, 13))
def test_metadata_from_cache_with_the_leaders_last_seen(learnt_at: int, version: int) -> None:
    """When the upstream is only slow, a known topic is answered as the upstream last gave it, leaders
    included, at any version, whatever version taught it."""
    cls = rewrite.METADATA_RESPONSE.cls
    part = cls.MetadataResponseTopic.MetadataResponsePartition
    upstream = cls(throttle_time_ms=0, cluster_id="up", controller_id=1, brokers=[], topics=[
        cls.MetadataResponseTopic(error_code=0, name="orders", topic_id=_ID, is_internal=False, partitions=[
            part(error_code=0, partition_index=i, leader_id=i + 1, leader_epoch=4, replica_nodes=[i + 1],
                 isr_nodes=[i + 1], offline_replicas=[]) for i in range(3)])])
    payload = rewrite.METADATA_RESPONSE.encode(upstream, learnt_at)
    head = struct.pack(">i", 77) + (b"\x00" if learnt_at >= 9 else b"")
    facts = Facts()
    rewrite.rewrite_metadata(struct.pack(">i", len(head) + len(payload)) + head + payload, learnt_at, facts)
    request = Request(topics=[Topic(name="orders", topic_id=None)], allow_auto_topic_creation=False)
    for last_seen, expected in ((True, [(0, 1), (0, 2), (0, 3)]), (False, [(5, -1)] * 3)):
        reply = stock_decode(rewrite.metadata_from_cache(request, version, 77, facts, last_seen=last_seen), version)
        assert [(p.error_code, p.leader_id) for p in reply.topics[0].partitions] == expected
        assert reply.topics[0].error_code == 0


@pytest.mark.parametrize("version", [0, 1, 5, 9, 12])
@pytest.mark.parametrize("nodes", [(1, 2), (1, 9)])
def test_metadata_rewrite_keeps_everything_but_addresses(version: int, nodes: tuple[int, int]) -> None:
    """Every broker keeps its node id and gets kcoord's address for it; kcoord's coordinator (node 9 here)
    is one more broker, unless an upstream broker has its id (then that listener stands for both)."""
    cls = rewrite.METADATA_RESPONSE.cls
    upstream = cls(throttle_time_ms=0, cluster_id="up", controller_id=1, topics=[], brokers=[
        cls.MetadataResponseBroker(node_id=n, host="10.0.0.9", port=9092 + n, rack="r") for n in nodes])
    payload = rewrite.METADATA_RESPONSE.encode(upstream, version)
    head = struct.pack(">i", 77) + (b"\x00" if version >= 9 else b"")
    frame = struct.pack(">i", len(head) + len(payload)) + head + payload
    facts = Facts()
    reply = stock_decode(rewrite.rewrite_metadata(frame, version, facts), version)
    got = [(b.node_id, b.host, b.port) for b in reply.brokers]
    assert got == [(n, "kcoord.local", 40000 + n) for n in sorted({*nodes, 9})]
    assert facts.learnt == [(n, "10.0.0.9", 9092 + n) for n in nodes]
    if version >= 1:
        assert reply.controller_id == 1


def test_api_versions_offered() -> None:
    load_all()
    upstream = {0: (0, 11), 1: (0, 17), 3: (0, 13), 8: (0, 9), 10: (0, 6), 18: (0, 4), 28: (0, 4), 60: (0, 2),
                68: (0, 1), 19: (2, 7)}
    offered = {k: (lo, hi) for k, lo, hi in rewrite.api_versions(upstream)}
    assert offered[0] == (0, 9) and offered[1] == (0, 15) and offered[3] == (0, 12)
    assert offered[19] == (2, 7)  # passed through as the upstream has it
    assert 28 not in offered and 68 not in offered
    for key in rewrite.LOCAL:  # kcoord's own, whether the upstream has them or not (ListGroups: 16)
        spec = REGISTRY[key]
        assert offered[key] == (spec.min_version, spec.max_version)


@pytest.mark.parametrize("version", range(0, rewrite.CAPS[rewrite.DESCRIBE_CLUSTER] + 1))
def test_describe_cluster_rewrite_names_the_coordinator_too(version: int) -> None:
    """Admin clients list brokers with DescribeCluster: the coordinator is one of them, as in Metadata."""
    codec = rewrite.DESCRIBE_CLUSTER_RESPONSE
    cls = codec.cls
    upstream = cls(throttle_time_ms=0, error_code=0, error_message=None, endpoint_type=1, cluster_id="up",
                   controller_id=1, cluster_authorized_operations=-2147483648,
                   brokers=[cls.DescribeClusterBroker(broker_id=1, host="10.0.0.9", port=9093, rack=None)])
    payload = codec.encode(upstream, version)
    head = struct.pack(">i", 77) + b"\x00"
    facts = Facts()
    reply = rewrite.rewrite_brokers(codec, struct.pack(">i", len(head) + len(payload)) + head + payload, version, facts)
    _, body = rewrite.decode_reply(codec, reply, version)
    assert [(b.broker_id, b.host, b.port) for b in body.brokers] == [(1, "kcoord.local", 40001),
                                                                       (9, "kcoord.local", 40009)]


@pytest.mark.parametrize("every_topic", [True, False])
def test_an_answer_for_every_topic_forgets_topics_it_does_not_name(every_topic: bool) -> None:
    """A review's find: topics deleted upstream were remembered for ever (and, with their last leaders,
    answered as live when the upstream was slow). An answer to a request for every topic names them all:
    the others are gone. An answer for some topics says nothing of the rest."""
    cls = rewrite.METADATA_RESPONSE.cls
    upstream = cls(throttle_time_ms=0, cluster_id="up", controller_id=1, brokers=[], topics=[
        cls.MetadataResponseTopic(error_code=0, name="kept", topic_id=_ID, is_internal=False, partitions=[])])
    payload = rewrite.METADATA_RESPONSE.encode(upstream, 1)
    head = struct.pack(">i", 77)
    facts = Facts({"deleted": TopicFacts(_ID, 1, False)})
    rewrite.rewrite_metadata(struct.pack(">i", len(head) + len(payload)) + head + payload, 1, facts, every_topic)
    assert sorted(facts.topics.facts()) == (["kept"] if every_topic else ["deleted", "kept"])


@pytest.mark.parametrize(("version", "topics", "every"), [
    (0, [], True), (0, ["t"], False), (1, None, True), (1, [], False), (12, None, True), (12, ["t"], False)])
def test_every_topic_asked(version: int, topics: list[str] | None, every: bool) -> None:
    from kafka.protocol.metadata import MetadataRequest  # a stock encoder

    asked = None if topics is None else [MetadataRequest.MetadataRequestTopic(name=t) for t in topics]
    request = MetadataRequest(topics=asked, allow_auto_topic_creation=False)
    request.with_header(correlation_id=1, client_id="tests")
    frame = bytes(request.encode(version=version, header=True))
    asked = rewrite.METADATA_REQUEST.decode_request(frame, version)[1]
    assert k03.every_topic_asked(asked.topics, version) is every
