"""The registry: whole request frames (header included) decode as kafka-python encodes them, responses
frame with the right header version, and the reference byte vectors hold."""

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer.group import OffsetCommitRequest

from coordinator.apis import load_all
from protocol.registry import REGISTRY, ApiSpec, DecodeError, api_versions_fallback, supported_versions
from tests.protocol.test_codec import assert_same, message_strategy, reference_class

load_all()
ALL_VERSIONS = [(spec, v) for spec in REGISTRY.values() for v in range(spec.min_version, spec.max_version + 1)]


def _ids(item: tuple[ApiSpec, int]) -> str:
    return f"{item[0].name}-v{item[1]}"


@settings(max_examples=5, deadline=None)
@pytest.mark.parametrize("item", ALL_VERSIONS, ids=_ids)
@given(data=st.data(), client_id=st.sampled_from(["client", "", None, "clïent-ünicode"]))
def test_whole_frames_decode_like_kafka_python(item: tuple[ApiSpec, int], data: st.DataObject,
                                               client_id: str | None) -> None:
    spec, version = item
    message = data.draw(message_strategy(spec.name + "Request", version))
    body = spec.request.encode(message, version)
    ref = reference_class(spec.name + "Request").decode(body, version=version)
    ref.with_header(correlation_id=99, client_id=client_id)
    frame = bytes(ref.encode(version=version, header=True))
    got_client, decoded = spec.decode_request(frame, version)
    assert got_client == (client_id or "")  # a null client id reads as "", as Kafka does
    assert_same(spec.request.spec.root, version, decoded, ref)


@pytest.mark.parametrize("item", ALL_VERSIONS, ids=_ids)
def test_every_served_version_builds(item: tuple[ApiSpec, int]) -> None:
    """Codecs are built on a version's first request, not at start-up: each must build."""
    spec, version = item
    assert callable(spec.request.decoder(version)) and callable(spec.response.encoder(version))


def test_truncated_frames_are_decode_errors() -> None:
    spec = REGISTRY[8]
    req = OffsetCommitRequest(group_id="g", topics=[])
    req.with_header(correlation_id=1, client_id="client")
    frame = bytes(req.encode(version=8, header=True))
    for cut in range(8, len(frame)):
        with pytest.raises(DecodeError):
            spec.decode_request(frame[:cut], 8)


def test_served_ranges() -> None:
    assert supported_versions() == [
        (3, 0, 12), (8, 0, 9), (9, 0, 9), (10, 0, 6), (11, 0, 9), (12, 0, 4), (13, 0, 5), (14, 0, 5), (15, 0, 5),
        (16, 0, 5), (18, 0, 4), (42, 0, 2), (47, 0, 0),
    ]


def test_api_versions_fallback_vector() -> None:
    # Reference 19.4: header v0, v0 body, error 35, only ApiVersions' own range.
    assert api_versions_fallback(7).hex() == "0000001000000007002300000001001200000004"


def test_find_coordinator_v0_and_v3_response_vectors() -> None:
    spec = REGISTRY[10]
    response: Any = spec.response.cls
    v0 = response(error_code=0, node_id=1, host="localhost", port=9092)
    assert spec.encode_response(v0, 0, 2).hex() == "000000190000000200000000000100096c6f63616c686f737400002384"
    v3 = response(throttle_time_ms=0, error_code=0, error_message="NONE", node_id=1, host="localhost", port=9092)
    assert spec.encode_response(v3, 3, 3).hex() == (
        "000000230000000300000000000000054e4f4e45000000010a6c6f63616c686f73740000238400"
    )


def test_api_versions_request_vector() -> None:
    # Reference 19.4: ApiVersions v3, correlation 1, client "test", software kcoord / 0.1 (header v2).
    frame = bytes.fromhex("001200030000000100047465737400076b636f6f726404302e3100")
    client_id, body = REGISTRY[18].decode_request(frame, 3)
    assert (client_id, body.client_software_name, body.client_software_version) == ("test", "kcoord", "0.1")


def test_api_versions_response_always_uses_header_v0() -> None:
    spec = REGISTRY[18]
    framed = spec.encode_response(spec.response.cls(error_code=0, api_keys=[], throttle_time_ms=0), 3, 5)
    assert framed[4:8] == b"\x00\x00\x00\x05"
    assert framed[8:10] == b"\x00\x00"  # the body's error code follows the correlation id at once
