"""ListGroups (key 16), v0-v5.

v0: every group with its protocol type. v1: throttle time. v2: same. v3: first flexible version.
v4: group states in the response and a states filter (KIP-518). v5: group types and a types filter
(KIP-848; kcoord's groups are all "classic"). While any partition is still loading the answer is
COORDINATOR_LOAD_IN_PROGRESS and no group, as Kafka's group coordinator answers (its read of every
shard fails on a loading one; the old coordinator listed the groups already loaded with the error).
"""

from typing import Any

from coordinator.apis import handles
from coordinator.groups.admin import list_filter, list_groups
from coordinator.request import Request, ShardUnavailable
from coordinator.runtime import Runtime
from protocol.errors import ErrorCode
from protocol.registry import register

SPEC = register(16, "ListGroups", 0, 5)
Response = SPEC.response.cls
Listed = Response.ListedGroup


def error_response(body: Any, version: int, error: ErrorCode) -> Any:
    return Response(throttle_time_ms=0, error_code=error, groups=[])


@handles(SPEC, error_response=error_response)
def list_all_groups(runtime: Runtime, req: Request, body: Any) -> Any:
    wanted = list_filter(set(body.states_filter) if req.version >= 4 else set(),
                         set(body.types_filter) if req.version >= 5 else set())
    response = Response(throttle_time_ms=0, error_code=ErrorCode.NONE, groups=[])

    def fail(error: ErrorCode) -> None:
        response.error_code = error

    listed = runtime.lists_groups
    if listed is not None and not listed(getattr(req.sink, "node", None)):
        return response  # gateway mode: an upstream broker's listener; the groups' coordinator is another node
    for shard in runtime.coordinated:  # cluster mode: none while withheld, as a broker leading nothing
        try:
            found = shard.read(req, fail, list_groups, wanted)
        except ShardUnavailable as exc:
            if exc.error is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
                return error_response(body, req.version, exc.error)
            continue  # a failed partition hosts no group right now, as a partition Kafka does not lead
        response.groups.extend(Listed(group_id=g, protocol_type=p, group_state=s, group_type=t) for g, p, s, t in found)
    return response
