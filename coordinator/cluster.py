"""Cluster mode: kcoord as N processes, each a broker of its own coordinating a share of the offsets
topic's partitions, as Kafka spreads group coordinators over its brokers (a group's coordinator is the
leader of its offsets partition). One Python process tops out at about one core; N of them, one per
core, make N cores' worth of commits (bench/README.md measured two at 1.41x one on two cores).

Every node is given the same list of nodes (``--cluster 0@host:9092,1@host:9093``) and its own
``--node-id``; partition p belongs to the node at index ``p % N`` of the ids in ascending order, a
fixed rule every node computes alike, so no node needs to ask another. Nodes share nothing: each has
its own data directory, journal and sync helper, and answers NOT_COORDINATOR for the groups of
partitions it does not own, as a Kafka broker does for partitions it does not lead. The data directory
records the node and the ids it was written for (coordinator.runtime), because a changed list would
move partitions to nodes whose directories do not hold their offsets. Two entries naming one listener
in two spellings (``localhost`` and ``127.0.0.1`` on one port) would make two nodes one: ``shared_listener``
finds them at the start.
"""

import ipaddress
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Final, NamedTuple, TypeGuard

OFFSETS_TOPIC: Final = "__consumer_offsets"  # the topic whose partitions the nodes share
# shared_listener's lookups, all together: a resolver that does not answer (DNS down or unreachable, as
# at a Kubernetes node's start) must not hold the start, which served without DNS before the check
LOOKUP_TIMEOUT_S: Final = 2.0


class Node(NamedTuple):
    """One broker as clients are told of it (Metadata, FindCoordinator)."""

    node_id: int
    host: str
    port: int


def owner_index(partition: int, nodes: int) -> int:
    """Index (in ascending id order) of the node owning ``partition``."""
    return partition % nodes


def owned_partitions(node_ids: list[int], node_id: int, partitions: int) -> list[int]:
    """The partitions ``node_id`` owns among ``partitions`` when the nodes are ``node_ids``."""
    ordered = sorted(node_ids)
    index = ordered.index(node_id)
    return [p for p in range(partitions) if owner_index(p, len(ordered)) == index]


def layout(node_id: int, nodes: tuple[Node, ...]) -> dict[str, object] | None:
    """What a data directory's meta file records of the cluster it serves (None: one node, every partition)."""
    if not nodes:
        return None
    return {"node_id": node_id, "node_ids": sorted(n.node_id for n in nodes)}


def owned_by(recorded: object, partitions: int) -> set[int]:
    """The partitions a recorded layout owns; ValueError if it is not one."""
    if recorded is None:
        return set(range(partitions))
    if not isinstance(recorded, dict):
        raise ValueError(f"cluster is {recorded!r}, not an object")
    node_id, node_ids = recorded.get("node_id"), recorded.get("node_ids")
    if not _node_id(node_id) or not isinstance(node_ids, list) or not all(_node_id(i) for i in node_ids) \
            or node_id not in node_ids:
        raise ValueError(f"cluster {recorded!r} does not name a node among its node ids")
    if len(set(node_ids)) != len(node_ids):  # kcoord records distinct ids (a --cluster repeating one is refused)
        raise ValueError(f"cluster {recorded!r} names a node id twice")
    return set(owned_partitions(node_ids, node_id, partitions))


def _node_id(value: object) -> TypeGuard[int]:
    """A node id as kcoord records one: an int of at least 0 (json's true is a bool, which Python counts as 1)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def describe(recorded: object) -> str:
    if recorded is None:
        return "a single node (every partition)"
    assert isinstance(recorded, dict)
    return f"node {recorded['node_id']} of the cluster of nodes {recorded['node_ids']}"


def layout_refusal(recorded: object, wanted: dict[str, object] | None, partitions: int) -> str | None:
    """Why a data directory written for ``recorded`` cannot serve ``wanted``: another set of partitions
    would strand the offsets of those this node no longer owns, and leave empty the ones it gains
    (they are in another node's directory). None when the two own the same partitions."""
    had, has = owned_by(recorded, partitions), owned_by(wanted, partitions)
    if had == has:
        return None
    parts = []
    if lost := sorted(had - has):
        parts.append(f"the offsets it holds of partitions {_few(lost)} would no longer be served")
    if gained := sorted(has - had):
        parts.append(f"partitions {_few(gained)}, whose offsets it does not hold, would be served empty")
    return (f"was written as {describe(recorded)} and this start makes it {describe(wanted)}: {' and '.join(parts)}. "
            f"kcoord does not move partitions between nodes: start it with the --node-id and --cluster it was "
            f"written for")


def _few(partitions: list[int]) -> str:
    return ", ".join(map(str, partitions[:8])) + (", ..." if len(partitions) > 8 else "")


def unrecorded_refusal(existing: set[int], partitions: int, wanted: dict[str, object] | None) -> str | None:
    """Why a data directory without its meta file, holding the logs of ``existing`` partitions, cannot be
    recorded as ``wanted`` (None: one node). A cluster node's first start makes the directory of every
    partition it owns, right after the meta file: without the file, that set is what tells the layout
    it was written for (a standalone directory's full set tells its partition count the same way)."""
    owned = owned_by(wanted, partitions)
    if stranded := sorted(existing - owned):
        return (f"holds the log of partition {stranded[0]}, which another node of the cluster coordinates "
                f"(--cluster): its offsets would not be served; give this node a directory of its own")
    if wanted is not None and existing and existing != owned:
        return (f"its partitions ({len(existing)}) are not the {len(owned)} this node owns with --offsets-partitions "
                f"{partitions} and this --cluster: it was written for another layout; restore the file (or start it "
                f"as it was)")
    if wanted is None and (share := _share(sorted(existing), partitions)) is not None:
        index, nodes = share
        return (f"holds exactly the partitions the node at index {index} of a cluster of {nodes} nodes owns "
                f"(every {nodes}th from {index}): a cluster node's directory, whose other partitions are in its "
                f"peers' directories and would be served empty here; start it with the --node-id and --cluster it "
                f"was written for, or restore the file")
    return None


def _share(existing: list[int], partitions: int) -> tuple[int, int] | None:
    """(index, nodes) when ``existing`` is every partition one node of a cluster of 2 or more owns, and
    at least two of them (one partition alone is a log placed by hand)."""
    if len(existing) < 2:
        return None
    nodes = existing[1] - existing[0]
    if nodes < 2 or existing[0] >= nodes or existing != list(range(existing[0], partitions, nodes)):
        return None
    return existing[0], nodes


def canonical_address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The address ``host`` spells, in one spelling: an IPv4-mapped IPv6 address (``::ffff:127.0.0.1``) is
    its IPv4 address, as a dual-stack socket bound to it holds that address, and the IPv4 shorthands the
    resolver reads as numbers (``0``, ``127.1``, ``0x7f.0.0.1``: what a bind to them binds) are theirs.
    ValueError for a name."""
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(host)
    except ValueError:
        if not host or ":" in host or any(c.isspace() for c in host):  # inet_aton takes "1.2.3.4 junk"
            raise
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            raise ValueError(f"{host!r} is no IP address") from None
    return getattr(address, "ipv4_mapped", None) or address


def resolve(host: str) -> set[str]:
    """The addresses ``host`` names, each in one spelling (``canonical_address``); OSError when it does
    not resolve, ValueError (UnicodeError) when it cannot be a DNS name (a label over 63 characters)."""
    return {str(canonical_address(str(sockaddr[0]).split("%", 1)[0]))
            for *_, sockaddr in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)}


def _entry(node: Node) -> str:
    """The entry as ``--cluster`` spells it, so the operator finds it in what they wrote."""
    host = f"[{node.host}]" if ":" in node.host else node.host
    return f"{node.node_id}@{host}:{node.port}"


def _lookups(hosts: Iterable[str], lookup: Callable[[str], set[str]], timeout: float) -> dict[str, set[str] | str]:
    """Each host's addresses, or why it has none: looked up at once, each on a daemon thread, and
    waited for ``timeout`` seconds in all (getaddrinfo has no timeout of its own; a hung lookup's
    thread is left behind, and ends with the process)."""
    found: dict[str, set[str] | str] = {}

    def one(host: str) -> None:
        try:
            found[host] = lookup(host)
        except (OSError, ValueError) as exc:
            found[host] = str(exc)

    threads = [threading.Thread(target=one, args=(host,), name=f"resolve {host}", daemon=True) for host in hosts]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return {host: found.get(host, f"no answer within {timeout:g} s") for host in dict.fromkeys(hosts)}


def shared_listener(nodes: Iterable[Node], lookup: Callable[[str], set[str]] = resolve,
                    timeout: float = LOOKUP_TIMEOUT_S) -> tuple[str | None, list[str]]:
    """(why two entries are one listener, or None; a note per host that did not resolve). Two entries
    share a listener when they have the same port and their hosts name a common address. Only hosts
    sharing a port with another entry's (other) host are resolved, each once, all at once within
    ``timeout``: a cluster on distinct ports, or one host, costs no lookup. A host that does not resolve
    (in time) is left unchecked, not refused: in Kubernetes a peer's name is published only once its
    pod runs, and a DNS server not answering must not keep a node from starting."""
    by_port: dict[int, list[Node]] = {}
    for node in nodes:
        by_port.setdefault(node.port, []).append(node)
    shared = {port: same for port, same in by_port.items() if len(same) >= 2}
    hosts = list(dict.fromkeys(node.host for same in shared.values() for node in same))
    answers = _lookups(hosts, lookup, timeout) if hosts else {}
    addresses: dict[str, set[str] | None] = {}
    notes = []
    for port in sorted(shared):
        same_port = shared[port]
        for node in same_port:
            if node.host not in addresses:
                answer = answers[node.host]
                addresses[node.host] = answer if isinstance(answer, set) else None
                if isinstance(answer, str):
                    notes.append(f"--cluster entry {_entry(node)}: {node.host} does not resolve ({answer}): not "
                                 f"checked against the other entries on port {port}")
        for i, first in enumerate(same_port):
            for second in same_port[i + 1:]:
                common = (addresses[first.host] or set()) & (addresses[second.host] or set())
                if common:
                    return (f"--cluster entries {_entry(first)} and {_entry(second)} are one listener (both reach "
                            f"{min(common)} port {port}): two nodes cannot share it; give each node its own "
                            f"address", notes)
    return None, notes
