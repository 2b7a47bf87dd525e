"""Every served version of every API decodes what a client encodes, and encodes what a client decodes."""

from typing import Any

import pytest

from protocol.registry import (
    API_VERSIONS,
    FIND_COORDINATOR,
    OFFSET_COMMIT,
    OFFSET_FETCH,
    REGISTRY,
    ApiSpec,
    DecodeError,
    api_versions_fallback,
    supported_versions,
)

ALL_VERSIONS = [(spec, v) for spec in REGISTRY.values() for v in range(spec.min_version, spec.max_version + 1)]


def _ids(item: tuple[ApiSpec, int]) -> str:
    return f"{item[0].name}-v{item[1]}"


def sample_request(spec: ApiSpec, version: int) -> Any:
    cls = spec.request
    if spec.key == OFFSET_COMMIT:
        t = cls.OffsetCommitRequestTopic
        part = t.OffsetCommitRequestPartition(partition_index=3, committed_offset=42, committed_leader_epoch=7,
                                              commit_timestamp=5, committed_metadata="meta")
        return cls(group_id="g", generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
                   retention_time_ms=-1, topics=[t(name="topic", partitions=[part])])
    if spec.key == OFFSET_FETCH:
        if version >= 8:
            g = cls.OffsetFetchRequestGroup
            topic = g.OffsetFetchRequestTopics(name="topic", partition_indexes=[0, 1])
            return cls(groups=[g(group_id="g", member_id=None, member_epoch=-1, topics=[topic])], require_stable=True)
        topic = cls.OffsetFetchRequestTopic(name="topic", partition_indexes=[0, 1])
        return cls(group_id="g", topics=[topic], require_stable=False)
    if spec.key == FIND_COORDINATOR:
        return cls(key="g", key_type=0, coordinator_keys=["g", "h"])
    if spec.key == API_VERSIONS:
        return cls(client_software_name="kcoord-test", client_software_version="1.0")
    return cls(topics=[cls.MetadataRequestTopic(name="__consumer_offsets")], allow_auto_topic_creation=False,
               include_topic_authorized_operations=False)


@pytest.mark.parametrize("item", ALL_VERSIONS, ids=_ids)
def test_request_round_trip(item: tuple[ApiSpec, int]) -> None:
    spec, version = item
    req = sample_request(spec, version)
    req.with_header(correlation_id=99, client_id="client")
    frame = bytes(req.encode(version=version, header=True))
    decoded = spec.decode_request(frame, version)
    assert decoded.header.correlation_id == 99
    assert decoded.header.client_id == "client"
    assert decoded.to_dict() == spec.request.decode(frame, version=version, header=True).to_dict()
    assert bytes(decoded.encode(version=version)) == bytes(req.encode(version=version))


def test_truncated_body_is_a_decode_error() -> None:
    spec = REGISTRY[OFFSET_COMMIT]
    req = sample_request(spec, 8)
    req.with_header(correlation_id=1, client_id="c")
    frame = bytes(req.encode(version=8, header=True))
    with pytest.raises(DecodeError):
        spec.decode_request(frame[:-6], 8)


def test_served_ranges() -> None:
    assert supported_versions() == [(3, 0, 12), (8, 0, 9), (9, 0, 9), (10, 0, 6), (18, 0, 4)]


def test_api_versions_fallback_vector() -> None:
    # Reference 19.4: header v0, v0 body, error 35, only ApiVersions' own range.
    assert api_versions_fallback(7).hex() == "0000001000000007002300000001001200000004"


def test_find_coordinator_v0_and_v3_response_vectors() -> None:
    spec = REGISTRY[FIND_COORDINATOR]
    v0 = spec.response(error_code=0, node_id=1, host="localhost", port=9092)
    assert spec.encode_response(v0, 0, 2).hex() == "000000190000000200000000000100096c6f63616c686f737400002384"
    v3 = spec.response(throttle_time_ms=0, error_code=0, error_message="NONE", node_id=1, host="localhost", port=9092)
    assert spec.encode_response(v3, 3, 3).hex() == (
        "000000230000000300000000000000054e4f4e45000000010a6c6f63616c686f73740000238400"
    )


def test_api_versions_response_always_uses_header_v0() -> None:
    spec = REGISTRY[API_VERSIONS]
    resp = spec.response(error_code=0, api_keys=[], throttle_time_ms=0)
    framed = spec.encode_response(resp, 3, 5)
    assert framed[4:8] == b"\x00\x00\x00\x05"
    assert framed[8:10] == b"\x00\x00"  # the body's error code follows the correlation id at once
