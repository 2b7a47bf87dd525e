"""The one list of APIs and versions kcoord serves.

Every API is registered here with its version range; the ApiVersions answer is built from this
registry, and the server rejects any version outside it before decoding. kafka-python's classes
accept every version from 0 up to the schema's max, so our floors and ceilings are enforced here.
"""

import struct
from dataclasses import dataclass
from typing import Any

from kafka.protocol.consumer.group import (
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)

from protocol.header import response_header
from protocol.validate import null_violation

__all__ = [
    "API_VERSIONS", "FIND_COORDINATOR", "METADATA", "OFFSET_COMMIT", "OFFSET_FETCH", "REGISTRY",
    "ApiSpec", "ApiVersionsResponse", "DecodeError", "FindCoordinatorResponse", "MetadataResponse",
    "OffsetCommitResponse", "OffsetFetchResponse", "api_versions_fallback", "supported_versions",
]

_SIZE = struct.Struct(">i")


class DecodeError(Exception):
    """A request body that does not parse for the version its header claims."""


@dataclass(frozen=True)
class ApiSpec:
    """One API: its key, its served version range and its kafka-python message classes."""

    key: int
    name: str
    request: Any
    response: Any
    min_version: int
    max_version: int

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version

    def decode_request(self, frame: bytes, version: int) -> Any:
        """Decodes header + body; any failure is a DecodeError (the connection is then closed)."""
        try:
            request: Any = self.request.decode(frame, version=version, header=True)
        except Exception as exc:  # kafka-python raises many types on malformed input
            raise DecodeError(f"{self.name} v{version}: {exc!r}") from exc
        null_field = null_violation(self.request, request, version)
        if null_field is not None:
            raise DecodeError(f"{self.name} v{version}: null {null_field} is not allowed at this version")
        return request

    def encode_response(self, response: Any, version: int, correlation_id: int) -> bytes:
        """A framed response: size, header (v0 for ApiVersions per KIP-511, else by flexibility), body."""
        flexible = self.key != API_VERSIONS and self.response.flexible_version_q(version)
        body: bytes = response.encode(version=version)
        head = response_header(correlation_id, flexible)
        return _SIZE.pack(len(head) + len(body)) + head + body


API_VERSIONS = 18
METADATA = 3
FIND_COORDINATOR = 10
OFFSET_COMMIT = 8
OFFSET_FETCH = 9

REGISTRY: dict[int, ApiSpec] = {
    spec.key: spec
    for spec in (
        ApiSpec(API_VERSIONS, "ApiVersions", ApiVersionsRequest, ApiVersionsResponse, 0, 4),
        ApiSpec(METADATA, "Metadata", MetadataRequest, MetadataResponse, 0, 12),
        ApiSpec(FIND_COORDINATOR, "FindCoordinator", FindCoordinatorRequest, FindCoordinatorResponse, 0, 6),
        ApiSpec(OFFSET_COMMIT, "OffsetCommit", OffsetCommitRequest, OffsetCommitResponse, 0, 9),
        ApiSpec(OFFSET_FETCH, "OffsetFetch", OffsetFetchRequest, OffsetFetchResponse, 0, 9),
    )
}


def supported_versions() -> list[tuple[int, int, int]]:
    """``(api_key, min_version, max_version)`` for every served API, in key order."""
    return [(s.key, s.min_version, s.max_version) for s in sorted(REGISTRY.values(), key=lambda s: s.key)]


def api_versions_fallback(correlation_id: int) -> bytes:
    """KIP-511 answer to a too-new ApiVersions: header v0, v0 body, UNSUPPORTED_VERSION(35) and only
    ApiVersions' own range, so the client retries with a version we speak."""
    spec = REGISTRY[API_VERSIONS]
    entry = ApiVersionsResponse.ApiVersion(
        api_key=API_VERSIONS, min_version=spec.min_version, max_version=spec.max_version
    )
    response = ApiVersionsResponse(error_code=35, api_keys=[entry])
    return spec.encode_response(response, 0, correlation_id)
