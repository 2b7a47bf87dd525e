"""JoinGroup (key 11), v0-v9.

v0: group, session timeout, member id, protocol type and protocols. v1: rebalance timeout. v2: throttle
time. v3: same. v4: a new dynamic member first gets MEMBER_ID_REQUIRED with its id (KIP-394). v5: group
instance id (static membership, KIP-345). v6: first flexible version. v7: protocol type in the response,
protocol name nullable (before v7 a missing name is sent as ""). v8: a reason. v9: SkipAssignment for a
static leader rejoining a Stable group.
"""

import ipaddress
import socket
from typing import Any

from coordinator.apis import handles
from coordinator.groups.messages import JoinRequest, JoinResult
from coordinator.request import Request
from coordinator.runtime import Runtime
from protocol.errors import ErrorCode
from protocol.registry import register

SPEC = register(11, "JoinGroup", 0, 9)
Response = SPEC.response.cls
Member = Response.JoinGroupResponseMember


def client_host(peer: str) -> str:
    """Kafka shows a member's host as Java's ``InetAddress.toString()`` of the connection's address:
    ``/127.0.0.1``. Java writes an IPv6 address uncompressed, each of its eight groups in hex without
    leading zeros (``Inet6Address.numericToTextFormat``: ``/0:0:0:0:0:0:0:1``, where Python says ``::1``),
    a scope as its number (``%2``), and an IPv4-mapped one as the IPv4 address it holds (an
    ``Inet4Address``)."""
    host = peer.rsplit(":", 1)[0].strip("[]")
    if ":" not in host:
        return "/" + host
    address, _, scope = host.partition("%")
    try:
        ip = ipaddress.IPv6Address(address)
    except ValueError:
        return "/" + host
    if ip.ipv4_mapped is not None:
        return f"/{ip.ipv4_mapped}"
    text = ":".join(f"{int.from_bytes(ip.packed[i:i + 2], 'big'):x}" for i in range(0, 16, 2))
    if scope and not scope.isdigit():
        try:
            scope = str(socket.if_nametoindex(scope))  # Python names a link-local scope by its interface
        except OSError:
            pass
    return f"/{text}%{scope}" if scope else f"/{text}"


def error_response(body: Any, version: int, error: ErrorCode) -> JoinResult:
    """A join the shard could not take (loading, not this coordinator, a failed write) answers with no
    member id, as Kafka's answer to a failed coordinator operation does."""
    return JoinResult(error, "")


def render(result: JoinResult, version: int) -> Any:
    # From v7 the name is nullable, and Kafka's response sends an empty one as null; before, null as "".
    protocol = (result.protocol or None) if version >= 7 else (result.protocol or "")
    return Response(throttle_time_ms=0, error_code=result.error, generation_id=result.generation,
                    protocol_type=result.protocol_type, protocol_name=protocol, leader=result.leader,
                    skip_assignment=result.skip_assignment, member_id=result.member_id,
                    members=[Member(member_id=m, group_instance_id=i, metadata=meta) for m, i, meta in result.members])


@handles(SPEC, error_response=error_response, render=render)
def join_group(runtime: Runtime, req: Request, body: Any) -> Any:
    config = runtime.group_config
    if not body.group_id:
        return JoinResult(ErrorCode.INVALID_GROUP_ID, body.member_id)
    if not config.min_session_timeout_ms <= body.session_timeout_ms <= config.max_session_timeout_ms:
        return JoinResult(ErrorCode.INVALID_SESSION_TIMEOUT, body.member_id)
    rebalance = body.rebalance_timeout_ms if req.version >= 1 and body.rebalance_timeout_ms >= 0 \
        else body.session_timeout_ms
    join = JoinRequest(
        group_id=body.group_id,
        member_id=body.member_id,
        group_instance_id=body.group_instance_id if req.version >= 5 else None,
        protocol_type=body.protocol_type,
        protocols=[(p.name, p.metadata) for p in body.protocols],
        session_timeout_ms=body.session_timeout_ms,
        rebalance_timeout_ms=rebalance,
        client_id=req.client_id,
        client_host=client_host(req.client_host),
        require_known_member_id=req.version >= 4,
        skip_assignment_supported=req.version >= 9,
    )
    return runtime.groups_for(body.group_id).membership.join(req, join)
