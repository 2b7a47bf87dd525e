"""DescribeGroups (key 15), v0-v5.

v0: group ids; per group its state, protocol, and members (client id, host, metadata, assignment).
v1: throttle time. v2: same. v3: authorized operations on request. v4: members' group instance ids.
v5: first flexible version. An unknown group is described as Dead, without error (as Kafka does).
"""

from typing import Any

from coordinator.apis import handles
from coordinator.apis.slices import in_slices
from coordinator.groups.admin import describe_group
from coordinator.request import Request, ShardUnavailable
from coordinator.runtime import Runtime
from protocol.errors import ErrorCode
from protocol.registry import register

SPEC = register(15, "DescribeGroups", 0, 5)
Response = SPEC.response.cls
Group = Response.DescribedGroup
Member = Group.DescribedGroupMember
NOT_REQUESTED = -(2**31)
# No authorizer: Kafka reports every operation a group supports (AclEntry.supportedOperations(GROUP): READ 3,
# DELETE 6, DESCRIBE 8, DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11, as AclOperation bits: 3400).
GROUP_OPERATIONS = (1 << 3) | (1 << 6) | (1 << 8) | (1 << 10) | (1 << 11)


def _errored(group_id: str, error: ErrorCode) -> Any:
    return Group(error_code=error, group_id=group_id, group_state="", protocol_type="", protocol_data="", members=[])


def error_response(body: Any, version: int, error: ErrorCode) -> Any:
    return Response(throttle_time_ms=0, groups=[_errored(g, error) for g in body.groups])


def _failer(entry: Any) -> Any:
    def fail(error: ErrorCode) -> None:
        entry.error_code, entry.group_state, entry.members = error, "", []

    return fail


@handles(SPEC, error_response=error_response)
def describe_groups(runtime: Runtime, req: Request, body: Any) -> Any:
    operations = GROUP_OPERATIONS if req.version >= 3 and body.include_authorized_operations else NOT_REQUESTED
    names = body.groups
    groups: list[Any] = []

    def describe(start: int, end: int) -> None:
        for group_id in names[start:end]:
            entry = _errored(group_id, ErrorCode.NONE)
            groups.append(entry)
            try:
                d = runtime.shard_for(group_id).read(req, _failer(entry), describe_group, group_id)
            except ShardUnavailable as exc:
                entry.error_code = exc.error
                continue
            entry.group_state, entry.protocol_type, entry.protocol_data = d.state, d.protocol_type, d.protocol
            entry.authorized_operations = operations
            entry.members = [
                Member(member_id=m.member_id, group_instance_id=m.group_instance_id, client_id=m.client_id,
                       client_host=m.client_host, member_metadata=m.metadata, member_assignment=m.assignment)
                for m in d.members
            ]

    in_slices(req, len(names), describe)  # a million names must not hold the event loop for seconds
    return Response(throttle_time_ms=0, groups=groups)
