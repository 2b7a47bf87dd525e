"""FindCoordinator (key 10), v0-v6.

v0: one group key. v1: key type (0 group, 1 transaction) + error message + throttle time. v2: same.
v3: first flexible version. v4: batched ``CoordinatorKeys``, one answer per key. v5: may return
TRANSACTION_ABORTABLE. v6: key type 2 (share groups).
kcoord coordinates every group itself, so a group key is answered with this node (in cluster mode, the
node owning the group's offsets partition: coordinator.cluster); it hosts no
transaction or share coordinator, so those keys get COORDINATOR_NOT_AVAILABLE / INVALID_REQUEST.
Like Kafka, FindCoordinator never reports loading: clients learn that from the group APIs.
"""

from collections.abc import Callable
from typing import Any

from coordinator.apis import handles
from coordinator.request import Lazy, Request
from coordinator.runtime import Runtime
from protocol.errors import ErrorCode
from protocol.registry import register

SPEC = register(10, "FindCoordinator", 0, 6)
Response = SPEC.response.cls

GROUP, TRANSACTION, SHARE = 0, 1, 2


def resolve(key_type: int) -> tuple[ErrorCode, str | None]:
    """This node for group keys; kcoord hosts no transaction or share coordinator."""
    if key_type == GROUP:
        return ErrorCode.NONE, None
    if key_type == TRANSACTION:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE, "kcoord does not host a transaction coordinator"
    if key_type == SHARE:
        return ErrorCode.INVALID_REQUEST, "kcoord does not host a share coordinator"
    return ErrorCode.INVALID_REQUEST, f"unknown coordinator key type {key_type}"


def answer(version: int, keys: list[str], error: ErrorCode, message: str | None, node: tuple[int, str, int],
           coordinator_of: Callable[[str], tuple[int, str, int]] | None = None) -> Any:
    """Every key with the same outcome (v0-v3 carry one key): ``node``, or on success each key's
    ``coordinator_of(key)`` when given (cluster mode)."""
    if error is not ErrorCode.NONE:
        node, coordinator_of = (-1, "", -1), None  # on error: Node.noNode()
    if version < 4:
        node_id, host, port = coordinator_of(keys[0]) if coordinator_of is not None else node
        # Kafka fills a v1-v3 success with the error's name, "NONE"; clients print it.
        return Response(throttle_time_ms=0, error_code=error,
                        error_message="NONE" if error is ErrorCode.NONE else message,
                        node_id=node_id, host=host, port=port)
    nodes = [coordinator_of(key) for key in keys] if coordinator_of is not None else [node] * len(keys)
    return Response(throttle_time_ms=0, coordinators=[
        Response.Coordinator(key=key, node_id=node_id, host=host, port=port, error_code=error, error_message=message)
        for key, (node_id, host, port) in zip(keys, nodes, strict=True)])


def error_response(body: Any, version: int, error: ErrorCode) -> Any:
    keys = list(body.coordinator_keys) if version >= 4 else [body.key]
    return answer(version, keys, error, error.name, (-1, "", -1))


@handles(SPEC, error_response=error_response)
def find_coordinator(runtime: Runtime, req: Request, body: Any) -> Any:
    config = runtime.config
    host, port = config.advertised
    key_type = body.key_type if req.version >= 1 else GROUP
    error, message = resolve(key_type)
    keys = list(body.coordinator_keys) if req.version >= 4 else [body.key]
    # cluster mode: each group's coordinator is the node owning its offsets partition, as in Kafka
    coordinator_of = (lambda key: config.owner(runtime.partition_of(key))) if config.cluster else None
    if req.large:  # thousands of keys: the answer is built where it is encoded, off the event loop
        return Lazy(answer, req.version, keys, error, message, (config.node_id, host, port), coordinator_of)
    return answer(req.version, keys, error, message, (config.node_id, host, port), coordinator_of)
