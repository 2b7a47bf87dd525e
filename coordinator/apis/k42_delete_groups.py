"""DeleteGroups (key 42), v0-v2.

v0: group ids; a result per group. v1: same. v2: first flexible version. A group with members is
NON_EMPTY_GROUP; an unknown one GROUP_ID_NOT_FOUND; an empty one loses its offsets and itself, written as
tombstones. Groups on different partitions are deleted by one write each (per slice of 1,024 names:
coordinator.apis.slices).
"""

from typing import Any

from coordinator.apis import handles
from coordinator.apis.slices import in_slices
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
    names = body.groups_names
    entries: dict[str, Any] = {}
    results: list[Any] = []

    def delete(start: int, end: int) -> None:
        by_shard: dict[int, list[str]] = {}
        for group_id in names[start:end]:
            if group_id not in entries:  # named twice: one result, as before
                entries[group_id] = Result(group_id=group_id, error_code=ErrorCode.NONE)
                by_shard.setdefault(runtime.partition_of(group_id), []).append(group_id)
        for partition, group_ids in by_shard.items():
            _delete_on(runtime, req, partition, group_ids, entries)

    # a million names must not hold the event loop for seconds
    in_slices(req, len(names), delete, lambda: results.extend(entries.values()))
    return Response(throttle_time_ms=0, results=results)


def _delete_on(runtime: Runtime, req: Request, partition: int, group_ids: list[str], entries: dict[str, Any]) -> None:
    """One write deletes the groups of one partition (of one slice)."""
    written = [entries[g] for g in group_ids]

    def fail(error: ErrorCode) -> None:
        for entry in written:
            if entry.error_code == ErrorCode.NONE:
                entry.error_code = error

    try:
        deleted = runtime.shard_at(partition).write(req, _delete, group_ids, fail)
    except ShardUnavailable as exc:
        for entry in written:
            entry.error_code = exc.error
        return
    for group_id, error in deleted:
        entries[group_id].error_code = error


def _delete(data: Any, group_ids: list[str], fail: Any) -> Any:
    return delete_groups(data, group_ids)._replace(fixup=fail)
