"""DeleteGroups (key 42), v0-v2.

v0: group ids; a result per group. v1: same. v2: first flexible version. A group with members is
NON_EMPTY_GROUP; an unknown one GROUP_ID_NOT_FOUND; an empty one loses its offsets and itself, written as
tombstones. Groups on different partitions are deleted by one write each.
"""

from typing import Any

from coordinator.apis import handles
from coordinator.groups.admin import delete_groups
from coordinator.request import Request, ShardUnavailable
from coordinator.runtime import Runtime
from protocol.errors import ErrorCode
from protocol.registry import register

SPEC = register(42, "DeleteGroups", 0, 2)
Response = SPEC.response.cls
Result = Response.DeletableGroupResult


def error_response(body: Any, version: int, error: ErrorCode) -> Any:
    return Response(throttle_time_ms=0, results=[Result(group_id=g, error_code=error) for g in body.groups_names])


@handles(SPEC, error_response=error_response)
def delete_group_ids(runtime: Runtime, req: Request, body: Any) -> Any:
    entries = {g: Result(group_id=g, error_code=ErrorCode.NONE) for g in body.groups_names}
    by_shard: dict[int, list[str]] = {}
    for group_id in entries:
        by_shard.setdefault(runtime.shard_for(group_id).partition, []).append(group_id)
    for partition, group_ids in by_shard.items():
        written = [entries[g] for g in group_ids]

        def fail(error: ErrorCode, written: list[Any] = written) -> None:
            for entry in written:
                if entry.error_code == ErrorCode.NONE:
                    entry.error_code = error

        try:
            results = runtime.shards[partition].write(req, _delete, group_ids, fail)
        except ShardUnavailable as exc:
            for entry in written:
                entry.error_code = exc.error
            continue
        for group_id, error in results:
            entries[group_id].error_code = error
    return Response(throttle_time_ms=0, results=list(entries.values()))


def _delete(data: Any, group_ids: list[str], fail: Any) -> Any:
    return delete_groups(data, group_ids)._replace(fixup=fail)
