"""Heartbeat (key 12), v0-v4.

v0: group, generation, member id. v1: throttle time. v2: same. v3: group instance id. v4: first flexible
version. While the group's partition is loading, a heartbeat is answered NONE, as Kafka does: the
member keeps its session and learns about any rebalance from its next heartbeat.
"""

from typing import Any

from coordinator.apis import handles
from coordinator.request import Request
from coordinator.runtime import Runtime
from protocol.errors import ErrorCode
from protocol.registry import register

SPEC = register(12, "Heartbeat", 0, 4)
Response = SPEC.response.cls


def error_response(body: Any, version: int, error: ErrorCode) -> ErrorCode:
    return ErrorCode.NONE if error is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS else error


def render(error: ErrorCode, version: int) -> Any:
    return Response(throttle_time_ms=0, error_code=error)


@handles(SPEC, error_response=error_response, render=render)
def heartbeat(runtime: Runtime, req: Request, body: Any) -> Any:
    if not body.group_id:
        return ErrorCode.INVALID_GROUP_ID
    return runtime.groups_for(body.group_id).membership.heartbeat(
        req, body.group_id, body.generation_id, body.member_id, body.group_instance_id if req.version >= 3 else None)
