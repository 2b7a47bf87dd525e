"""SyncGroup (key 14), v0-v5.

v0: group, generation, member id and (from the leader) every member's assignment. v1: throttle time.
v2: same. v3: group instance id. v4: first flexible version. v5: protocol type and name, which the
request must carry (missing: INCONSISTENT_GROUP_PROTOCOL) and the response echoes.
"""

from typing import Any

from coordinator.apis import handles
from coordinator.groups.messages import SyncResult
from coordinator.request import Request
from coordinator.runtime import Runtime
from protocol.errors import ErrorCode
from protocol.registry import register

SPEC = register(14, "SyncGroup", 0, 5)
Response = SPEC.response.cls


def error_response(body: Any, version: int, error: ErrorCode) -> SyncResult:
    return SyncResult(error)


def render(result: SyncResult, version: int) -> Any:
    return Response(throttle_time_ms=0, error_code=result.error, protocol_type=result.protocol_type,
                    protocol_name=result.protocol, assignment=result.assignment)


@handles(SPEC, error_response=error_response, render=render)
def sync_group(runtime: Runtime, req: Request, body: Any) -> Any:
    v = req.version
    # Kafka checks the v5 fields as it reads the request (KafkaApis), before the coordinator sees the group id.
    if v >= 5 and (body.protocol_type is None or body.protocol_name is None):
        return SyncResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
    if not body.group_id:
        return SyncResult(ErrorCode.INVALID_GROUP_ID)
    assignments = {a.member_id: bytes(a.assignment) for a in body.assignments}
    return runtime.groups_for(body.group_id).membership.sync(
        req, body.group_id, body.generation_id, body.member_id, body.group_instance_id if v >= 3 else None,
        body.protocol_type if v >= 5 else None, body.protocol_name if v >= 5 else None, assignments)
