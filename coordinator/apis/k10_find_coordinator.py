"""FindCoordinator (key 10), v0-v6.

v0: one group key. v1: key type (0 group, 1 transaction) + error message + throttle time. v2: same.
v3: first flexible version. v4: batched ``CoordinatorKeys``, one answer per key. v5: may return
TRANSACTION_ABORTABLE. v6: key type 2 (share groups).
kcoord coordinates every group itself, so a group key is answered with this node; it hosts no
transaction or share coordinator, so those keys get COORDINATOR_NOT_AVAILABLE / INVALID_REQUEST.
Like Kafka, FindCoordinator never reports loading: clients learn that from the group APIs.
"""

from typing import Any

from coordinator.apis import Reply, RequestContext, handles
from coordinator.runtime import Runtime
from protocol.errors import ErrorCode
from protocol.registry import FIND_COORDINATOR, FindCoordinatorResponse

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


@handles(FIND_COORDINATOR)
def find_coordinator(runtime: Runtime, ctx: RequestContext, req: Any) -> Reply:
    host, port = runtime.config.advertised
    node = runtime.config.node_id
    key_type = req.key_type if ctx.api_version >= 1 else GROUP
    error, message = resolve(key_type)
    found = error is ErrorCode.NONE
    # On error the node is Kafka's Node.noNode(): id -1, host "", port -1.
    node_id, node_host, node_port = (node, host, port) if found else (-1, "", -1)
    if ctx.api_version < 4:
        # Kafka fills a v1-v3 success with the error's name, "NONE"; clients print it.
        return Reply(FindCoordinatorResponse(throttle_time_ms=0, error_code=error,
                                             error_message="NONE" if found else message,
                                             node_id=node_id, host=node_host, port=node_port))
    coordinators = [
        FindCoordinatorResponse.Coordinator(key=key, node_id=node_id, host=node_host, port=node_port,
                                            error_code=error, error_message=message)
        for key in req.coordinator_keys
    ]
    return Reply(FindCoordinatorResponse(throttle_time_ms=0, coordinators=coordinators))
