"""ApiVersions (key 18), v0-v4.

v0: error code + api key ranges. v1: throttle time. v2: throttling semantics only. v3: first flexible
version; the request names the client software (validated). v4: semantics of feature listing only.
A too-new version never reaches here: the server answers it with the KIP-511 v0 fallback.
"""

import re
from typing import Any

from coordinator.apis import Reply, RequestContext, handles
from coordinator.runtime import Runtime
from protocol.errors import ErrorCode
from protocol.registry import API_VERSIONS, ApiVersionsResponse, supported_versions

_SOFTWARE = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")


def _valid_software(value: str | None) -> bool:
    return value is not None and _SOFTWARE.fullmatch(value) is not None


@handles(API_VERSIONS)
def api_versions(runtime: Runtime, ctx: RequestContext, req: Any) -> Reply:
    if ctx.api_version >= 3 and not (
        _valid_software(req.client_software_name) and _valid_software(req.client_software_version)
    ):
        return Reply(ApiVersionsResponse(error_code=ErrorCode.INVALID_REQUEST, api_keys=[], throttle_time_ms=0))
    keys = [
        ApiVersionsResponse.ApiVersion(api_key=key, min_version=lo, max_version=hi)
        for key, lo, hi in supported_versions()
    ]
    return Reply(ApiVersionsResponse(error_code=ErrorCode.NONE, api_keys=keys, throttle_time_ms=0))
