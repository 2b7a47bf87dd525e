"""ApiVersions (key 18), v0-v4.

v0: error code + api key ranges. v1: throttle time. v2: throttling semantics only. v3: first flexible
version; the request names the client software (validated). v4: semantics of feature listing only.
A too-new version never reaches here: the server answers it with the KIP-511 v0 fallback.
"""

import re
from typing import Any

from coordinator.apis import handles
from coordinator.request import Request
from coordinator.runtime import Runtime
from protocol.errors import ErrorCode
from protocol.registry import API_VERSIONS, register, supported_versions

SPEC = register(API_VERSIONS, "ApiVersions", 0, 4)
Response = SPEC.response.cls

_SOFTWARE = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")


def valid_software(value: str | None) -> bool:
    return value is not None and _SOFTWARE.fullmatch(value) is not None


def error_response(body: Any, version: int, error: ErrorCode) -> Any:
    return Response(error_code=error, api_keys=[], throttle_time_ms=0)


@handles(SPEC, error_response=error_response)
def api_versions(runtime: Runtime, req: Request, body: Any) -> Any:
    if req.version >= 3 and not (
        valid_software(body.client_software_name) and valid_software(body.client_software_version)
    ):
        return error_response(body, req.version, ErrorCode.INVALID_REQUEST)
    keys = [Response.ApiVersion(api_key=key, min_version=lo, max_version=hi) for key, lo, hi in supported_versions()]
    return Response(error_code=ErrorCode.NONE, api_keys=keys, throttle_time_ms=0)
