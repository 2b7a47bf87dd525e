"""Exact per-version behaviour of every served API, over a real socket (reference 2-6 and 19.5)."""

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.consumer.group import JoinGroupRequest, OffsetFetchRequest, SyncGroupRequest
from kafka.protocol.metadata import ApiVersionsRequest, FindCoordinatorRequest, MetadataRequest

from coordinator.apis import load_all
from protocol.errors import ErrorCode
from protocol.registry import supported_versions
from storage.segments import list_segments
from tests.kcoord_process import KcoordProcess
from tests.rawclient import RawClient, commit_request, fetch_request

load_all()  # every API module registers itself: the registry is what kcoord serves


@pytest.fixture
def client(kcoord: KcoordProcess) -> Iterator[RawClient]:
    c = RawClient(kcoord.port)
    yield c
    c.close()


@pytest.mark.parametrize("version", range(5))
def test_api_versions_lists_the_registry(client: RawClient, version: int) -> None:
    req = ApiVersionsRequest(client_software_name="kcoord-tests", client_software_version="1.0")
    resp = client.call(req, version)
    assert resp.error_code == 0
    assert [(k.api_key, k.min_version, k.max_version) for k in resp.api_keys] == supported_versions()


def test_api_versions_rejects_invalid_client_software(client: RawClient) -> None:
    # Kafka answers in the request's version (v3 body); kafka-python's decoder would read any error
    # body as v0, so check the bytes: header v0, error 42, empty compact array, throttle 0, no tags.
    correlation = client.send(ApiVersionsRequest(client_software_name="", client_software_version="1.0"), 3)
    frame = client.read_frame()
    assert frame == correlation.to_bytes(4, "big") + bytes.fromhex("002a" "01" "00000000" "00")


@pytest.mark.parametrize("version", [0, 1, 4, 9, 12])
def test_metadata_shows_only_the_offsets_topic(kcoord: KcoordProcess, client: RawClient, version: int) -> None:
    topics = [MetadataRequest.MetadataRequestTopic(name=n) for n in ("__consumer_offsets", "nope")]
    resp = client.call(MetadataRequest(topics=topics, allow_auto_topic_creation=True), version)
    assert [(b.node_id, b.host, b.port) for b in resp.brokers] == [(0, "127.0.0.1", kcoord.port)]
    offsets_topic, unknown = resp.topics
    assert offsets_topic.error_code == 0 and len(offsets_topic.partitions) == 50
    assert all(p.leader_id == 0 for p in offsets_topic.partitions)
    assert (unknown.name, unknown.error_code, unknown.partitions) == ("nope", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, [])
    everything = client.call(MetadataRequest(topics=None if version else []), version)
    assert [t.name for t in everything.topics] == ["__consumer_offsets"]


@pytest.mark.parametrize("version", range(4))
def test_find_coordinator_single_key(kcoord: KcoordProcess, client: RawClient, version: int) -> None:
    resp = client.call(FindCoordinatorRequest(key="any-group", key_type=0), version)
    assert (resp.error_code, resp.node_id, resp.host, resp.port) == (0, 0, "127.0.0.1", kcoord.port)
    if 1 <= version <= 3:
        assert resp.error_message == "NONE"
    if version >= 1:
        txn = client.call(FindCoordinatorRequest(key="txn", key_type=1), version)
        assert (txn.error_code, txn.node_id, txn.host, txn.port) == (ErrorCode.COORDINATOR_NOT_AVAILABLE, -1, "", -1)


@pytest.mark.parametrize("version", [4, 5, 6])
def test_find_coordinator_batched_keys(kcoord: KcoordProcess, client: RawClient, version: int) -> None:
    resp = client.call(FindCoordinatorRequest(key_type=0, coordinator_keys=["a", "", "b"]), version)
    assert [(c.key, c.node_id, c.port, c.error_code) for c in resp.coordinators] == [
        ("a", 0, kcoord.port, 0), ("", 0, kcoord.port, 0), ("b", 0, kcoord.port, 0)
    ]
    share = client.call(FindCoordinatorRequest(key_type=2, coordinator_keys=["s"]), version)
    assert [(c.key, c.node_id, c.error_code) for c in share.coordinators] == [("s", -1, ErrorCode.INVALID_REQUEST)]
    bad = client.call(FindCoordinatorRequest(key_type=9, coordinator_keys=["x"]), version)
    assert bad.coordinators[0].error_code == ErrorCode.INVALID_REQUEST


@pytest.mark.parametrize("version", range(10))
def test_commit_then_fetch_at_every_version(client: RawClient, version: int) -> None:
    group = f"every-version-{version}"
    resp = client.call(commit_request(group, {("t", 0): 10 + version, ("t", 1): 20}, metadata="md"), version)
    assert [(p.partition_index, p.error_code) for p in resp.topics[0].partitions] == [(0, 0), (1, 0)]
    fetch_version = min(version, 7)
    got = client.call(fetch_request(group, {"t": [0, 1, 2]}), fetch_version)
    rows = [(p.partition_index, p.committed_offset, p.metadata, p.error_code) for p in got.topics[0].partitions]
    assert rows == [(0, 10 + version, "md", 0), (1, 20, "md", 0), (2, -1, "", 0)]


def test_unknown_group_with_generation(client: RawClient) -> None:
    v8 = client.call(commit_request("ghost", {("t", 0): 1}, generation=5, member="m"), 8)
    assert v8.topics[0].partitions[0].error_code == ErrorCode.ILLEGAL_GENERATION
    v9 = client.call(commit_request("ghost", {("t", 0): 1}, generation=5, member="m"), 9)
    assert v9.topics[0].partitions[0].error_code == ErrorCode.GROUP_ID_NOT_FOUND


def test_simple_group_then_member_commit_is_refused(client: RawClient) -> None:
    assert client.call(commit_request("simple", {("t", 0): 1}), 8).topics[0].partitions[0].error_code == 0
    # The group now exists (Empty, generation 0) but has no member "m".
    again = client.call(commit_request("simple", {("t", 0): 2}, generation=0, member="m"), 8)
    assert again.topics[0].partitions[0].error_code == ErrorCode.UNKNOWN_MEMBER_ID


def test_metadata_too_large_is_per_partition(client: RawClient) -> None:
    resp = client.call(commit_request("md", {("t", 0): 1}, metadata="x" * 4097), 8)
    assert resp.topics[0].partitions[0].error_code == ErrorCode.OFFSET_METADATA_TOO_LARGE
    ok = client.call(commit_request("md", {("t", 1): 1}, metadata="\u00e9" * 4096), 8)
    assert ok.topics[0].partitions[0].error_code == 0


def test_fetch_all_and_unknown_group(client: RawClient) -> None:
    client.call(commit_request("all", {("a", 0): 1, ("b", 2): 3}), 8)
    everything = client.call(fetch_request("all", None), 7)
    assert sorted((t.name, p.partition_index, p.committed_offset) for t in everything.topics for p in t.partitions) == [
        ("a", 0, 1), ("b", 2, 3)
    ]
    assert client.call(fetch_request("nobody", None), 2).topics == []


def test_fetch_many_groups_in_one_request(client: RawClient) -> None:
    client.call(commit_request("multi-a", {("t", 0): 5}), 8)
    client.call(commit_request("multi-b", {("t", 0): 6}), 8)
    g = OffsetFetchRequest.OffsetFetchRequestGroup
    topics = [g.OffsetFetchRequestTopics(name="t", partition_indexes=[0])]
    req = OffsetFetchRequest(groups=[g(group_id=name, topics=topics) for name in ("multi-a", "multi-b", "multi-c")],
                             require_stable=True)
    for version in (8, 9):
        resp = client.call(req, version)
        got = [(x.group_id, x.error_code, x.topics[0].partitions[0].committed_offset) for x in resp.groups]
        assert got == [("multi-a", 0, 5), ("multi-b", 0, 6), ("multi-c", 0, -1)]


def test_empty_group_id_is_accepted(client: RawClient) -> None:
    assert client.call(commit_request("", {("t", 0): 9}), 8).topics[0].partitions[0].error_code == 0
    assert client.call(fetch_request("", {"t": [0]}), 7).topics[0].partitions[0].committed_offset == 9


def test_leader_epoch_round_trip(client: RawClient) -> None:
    req = commit_request("epochs", {("t", 0): 9})
    req.topics[0].partitions[0].committed_leader_epoch = 17
    client.call(req, 8)
    got = client.call(fetch_request("epochs", {"t": [0]}), 7).topics[0].partitions[0]
    assert (got.committed_offset, got.committed_leader_epoch) == (9, 17)


def test_metadata_answers_each_topic_once_however_often_it_is_named(client: RawClient) -> None:
    """Fault campaign D2: naming the offsets topic 20,000 times made a 27 MB answer."""
    topics = [MetadataRequest.MetadataRequestTopic(name="__consumer_offsets")] * 500
    topics += [MetadataRequest.MetadataRequestTopic(name="nope")] * 500
    resp = client.call(MetadataRequest(topics=topics, allow_auto_topic_creation=False), 9)
    assert [t.name for t in resp.topics] == ["__consumer_offsets", "nope"]


def test_metadata_topic_looked_up_by_id_before_v12_is_invalid_not_a_closed_connection(client: RawClient) -> None:
    """Fault campaign L1: a null name in Metadata v10/v11 could not be encoded back. Kafka refuses ids
    before v12 (KafkaApis.handleTopicMetadataRequest): INVALID_REQUEST for the whole request."""
    for looked_up in (uuid.uuid4(), None):  # an id, or only a null name: refused either way
        topics = [MetadataRequest.MetadataRequestTopic(name=None, topic_id=looked_up),
                  MetadataRequest.MetadataRequestTopic(name="__consumer_offsets", topic_id=None)]
        for version in (10, 11):
            resp = client.call(MetadataRequest(topics=topics, allow_auto_topic_creation=False), version)
            assert [(t.name, t.error_code, t.partitions) for t in resp.topics] == [
                ("", ErrorCode.INVALID_REQUEST, []), ("__consumer_offsets", ErrorCode.INVALID_REQUEST, [])]


def test_metadata_v12_looks_topics_up_by_id(client: RawClient) -> None:
    """From v12 a request naming ids is answered by id, as Kafka: the offsets topic by the id kcoord
    advertises, any other id UNKNOWN_TOPIC_ID with a null name; names beside them are not looked at."""
    everything = client.call(MetadataRequest(topics=None, allow_auto_topic_creation=False), 12)
    offsets_id = everything.topics[0].topic_id
    assert offsets_id not in (None, uuid.UUID(int=0))
    stranger = uuid.uuid4()
    topics = [MetadataRequest.MetadataRequestTopic(name=None, topic_id=stranger),
              MetadataRequest.MetadataRequestTopic(name="nope", topic_id=None),
              MetadataRequest.MetadataRequestTopic(name=None, topic_id=offsets_id),
              MetadataRequest.MetadataRequestTopic(name=None, topic_id=stranger)]
    resp = client.call(MetadataRequest(topics=topics, allow_auto_topic_creation=False), 12)
    assert [(t.name, t.topic_id, t.error_code, len(t.partitions)) for t in resp.topics] == [
        (None, stranger, ErrorCode.UNKNOWN_TOPIC_ID, 0), ("__consumer_offsets", offsets_id, 0, 50)]


NOT_INCLUDED = None  # -2147483648, the schema default: kafka-python reads it as None


@pytest.mark.parametrize("version", [7, 8, 10, 11, 12])
def test_metadata_authorized_operations_are_every_supported_one_when_asked(client: RawClient, version: int) -> None:
    """A broker without an authorizer answers every operation Kafka supports on the resource
    (AclEntry.supportedOperations); the cluster's only v8-v10, and nothing before v8."""
    topic = {3, 4, 5, 6, 7, 8, 10, 11}  # READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, DESCRIBE_CONFIGS, ALTER_CONFIGS
    cluster = {5, 7, 8, 9, 10, 11, 12}  # CREATE, ALTER, DESCRIBE, CLUSTER_ACTION, the two CONFIGS, IDEMPOTENT_WRITE
    topics = [MetadataRequest.MetadataRequestTopic(name=n) for n in ("__consumer_offsets", "nope")]
    asked = client.call(MetadataRequest(topics=topics, allow_auto_topic_creation=False,
                                        include_cluster_authorized_operations=True,
                                        include_topic_authorized_operations=True), version)
    assert [t.authorized_operations for t in asked.topics] == [topic if version >= 8 else NOT_INCLUDED] * 2
    if version <= 10:
        assert asked.authorized_operations == (cluster if version >= 8 else NOT_INCLUDED)
    plain = client.call(MetadataRequest(topics=topics, allow_auto_topic_creation=False), version)
    assert [t.authorized_operations for t in plain.topics] == [NOT_INCLUDED] * 2
    if version <= 10:
        assert plain.authorized_operations == NOT_INCLUDED


def _join(group: str, member: str, protocol: str, version: int) -> Any:
    return JoinGroupRequest(group_id=group, session_timeout_ms=10_000, rebalance_timeout_ms=10_000, member_id=member,
                            group_instance_id=None, protocol_type="consumer", reason=None,
                            protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name=protocol, metadata=b"m")])


@pytest.mark.parametrize("version", [6, 7])
def test_join_group_sends_an_empty_chosen_protocol_as_null_from_v7(server: KcoordProcess, version: int) -> None:
    """Kafka's JoinGroupResponse turns a protocol name of "" into null from v7, where the field is nullable."""
    client = RawClient(server.port)
    group = f"unnamed-protocol-v{version}"
    first = client.call(_join(group, "", "", version), version)
    assert first.error_code == ErrorCode.MEMBER_ID_REQUIRED
    joined = client.call(_join(group, first.member_id, "", version), version)  # after the initial delay
    assert (joined.error_code, joined.leader) == (0, first.member_id)
    assert joined.protocol_name == ("" if version < 7 else None)
    client.close()


@pytest.mark.parametrize(("version", "protocol_type", "error"), [
    (5, None, ErrorCode.INCONSISTENT_GROUP_PROTOCOL), (5, "consumer", ErrorCode.INVALID_GROUP_ID),
    (4, None, ErrorCode.INVALID_GROUP_ID)])
def test_sync_group_v5_checks_its_protocol_fields_before_the_group_id(client: RawClient, version: int,
                                                                       protocol_type: str | None,
                                                                       error: ErrorCode) -> None:
    """As Kafka, where KafkaApis refuses a v5 SyncGroup missing its protocol type or name before the
    coordinator looks at the group id."""
    request = SyncGroupRequest(group_id="", generation_id=1, member_id="m", group_instance_id=None,
                               protocol_type=protocol_type, protocol_name="range", assignments=[])
    assert client.call(request, version).error_code == error


def test_join_group_refused_by_a_failed_partition_carries_no_member_id(tmp_path: Path) -> None:
    """Kafka answers a coordinator operation that failed (loading, not the coordinator) with an empty
    member id, not the one the request carried."""
    server = KcoordProcess(tmp_path / "data", "--offsets-partitions", "1").start()
    client = RawClient(server.port)
    for offset in range(3):  # three batches, so damage to the first one is not a torn tail
        client.call(commit_request("broken", {("t", 0): offset}), 8)
    client.close()
    server.stop()
    segment = list_segments(tmp_path / "data" / "__consumer_offsets-0")[0].path
    data = bytearray(segment.read_bytes())
    data[70] ^= 0xFF  # inside the first batch's records: its CRC no longer matches, the partition fails
    segment.write_bytes(bytes(data))
    server.start()
    try:
        client = RawClient(server.port)
        for version in (1, 5, 9):
            answer = client.call(_join("broken", "member-1", "range", version), version)
            assert (answer.error_code, answer.member_id) == (ErrorCode.NOT_COORDINATOR, "")
        client.close()
    finally:
        server.stop()
