"""LeaveGroup (key 13), v0-v5.

v0: group and one member id; only a top-level error. v1: throttle time. v2: same. v3: a batch of members
(member id or group instance id) with an error each (KIP-345). v4: first flexible version. v5: a reason.
Before v3 a member's error is the response's error.
"""

from typing import Any

from coordinator.apis import handles
from coordinator.groups.messages import LeaveResult
from coordinator.request import Request
from coordinator.runtime import Runtime
from protocol.errors import ErrorCode
from protocol.registry import register

SPEC = register(13, "LeaveGroup", 0, 5)
Response = SPEC.response.cls
Member = Response.MemberResponse


def error_response(body: Any, version: int, error: ErrorCode) -> LeaveResult:
    return LeaveResult(error)


def render(result: LeaveResult, version: int) -> Any:
    if version < 3:
        error = result.error or next((e for _, _, e in result.members if e), ErrorCode.NONE)
        return Response(throttle_time_ms=0, error_code=error)
    return Response(throttle_time_ms=0, error_code=result.error, members=[
        Member(member_id=m, group_instance_id=i, error_code=e) for m, i, e in result.members])


@handles(SPEC, error_response=error_response, render=render)
def leave_group(runtime: Runtime, req: Request, body: Any) -> Any:
    if not body.group_id:
        return LeaveResult(ErrorCode.INVALID_GROUP_ID)
    members: list[tuple[str, str | None]]
    if req.version < 3:
        members = [(body.member_id, None)]
    else:
        members = [(m.member_id, m.group_instance_id) for m in body.members]
    return runtime.groups_for(body.group_id).membership.leave(req, body.group_id, members)
