"""Cluster mode: every node checks that its peers share its view of the cluster before it coordinates.

Nodes compute partition ownership from their own ``--cluster`` list, so a node given another list than
its running peers (a new node started with a grown list, a stale environment) would coordinate groups a
peer coordinates too: two coordinators for one group, each accepting commits and running its own
generations, and nothing would say so. So each node asks each peer, at its start and every
``CHECK_INTERVAL_S``, for its Metadata of the offsets topic (as a client would) and compares the
brokers and every partition's leader with its own. While a peer that answers disagrees, the node
coordinates no group (NOT_COORDINATOR, as a broker that leads nothing) and says so (ERROR, /readyz, the
``kcoord_cluster_agreed`` gauge); it resumes once every peer that answers agrees. A peer that does not
answer (stopped, starting) is not a disagreement: nodes start in any order. The node with the other
list finds the difference when its peers answer: a node started with a longer list asks the running
ones, which never ask it; nodes of two different lists that name each other both stop, loudly.
"""

import asyncio
import logging
import struct
from collections.abc import Callable
from typing import Any, Final

from coordinator.cluster import OFFSETS_TOPIC, Node
from coordinator.config import Config

log = logging.getLogger(__name__)

CHECK_INTERVAL_S: Final = 5.0
PEER_TIMEOUT_S: Final = 2.0
METADATA_VERSION: Final = 1  # brokers and partition leaders; every Kafka-compatible broker speaks it
MAX_ANSWER_BYTES: Final = 16 << 20


class PeerView:
    """What one peer says of the cluster: its brokers and the leader of each offsets partition."""

    def __init__(self, brokers: set[Node], leaders: dict[int, int]) -> None:
        self.brokers, self.leaders = brokers, leaders


def expected_view(config: Config) -> PeerView:
    """What this node's own Metadata answers (coordinator.apis.k03_metadata), so what agreeing peers answer."""
    return PeerView(set(config.cluster), dict(enumerate(config.leaders())))


def difference(mine: PeerView, theirs: PeerView) -> str | None:
    """What differs, in words, or None when the two views agree."""
    if theirs.brokers != mine.brokers:
        named = ",".join(f"{n.node_id}@{n.host}:{n.port}" for n in sorted(theirs.brokers))
        return f"it names the nodes {named or '(none)'}"
    if len(theirs.leaders) != len(mine.leaders):
        return f"its offsets topic has {len(theirs.leaders)} partitions, not {len(mine.leaders)}"
    moved = sorted(p for p, leader in mine.leaders.items() if theirs.leaders.get(p) != leader)
    if moved:
        return f"it gives partition {moved[0]} (and {len(moved) - 1} more) another leader"
    return None


async def ask(peer: Node, timeout: float = PEER_TIMEOUT_S) -> PeerView:
    """The peer's view, asked over the wire as a client asks (Metadata v1 for the offsets topic)."""
    from kafka.protocol.metadata import MetadataRequest, MetadataResponse  # not on the start's import path

    request: Any = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=OFFSETS_TOPIC)],
                                   allow_auto_topic_creation=False)
    request.with_header(correlation_id=1, client_id="kcoord-peer-check")
    reader, writer = await asyncio.wait_for(asyncio.open_connection(peer.host, peer.port), timeout)
    try:
        writer.write(bytes(request.encode(version=METADATA_VERSION, header=True, framed=True)))
        size = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), timeout))[0]
        if not 8 <= size <= MAX_ANSWER_BYTES:
            raise ValueError(f"answer of {size} bytes")
        frame = await asyncio.wait_for(reader.readexactly(size), timeout)
    finally:
        writer.close()
    answer: Any = MetadataResponse.decode(frame[4:], version=METADATA_VERSION)  # after the correlation id
    leaders = {p.partition_index: p.leader_id for t in answer.topics if t.name == OFFSETS_TOPIC and not t.error_code
               for p in t.partitions}
    return PeerView({Node(b.node_id, b.host, b.port) for b in answer.brokers}, leaders)


class PeerCheck:
    """Runs the check for one node; ``on_change(agreed)`` routes or withholds its groups."""

    def __init__(self, config: Config, on_change: Callable[[bool], None],
                 asker: Callable[[Node], Any] = ask) -> None:
        self.config = config
        self.peers = [n for n in config.cluster if n.node_id != config.node_id]
        self.mine = expected_view(config)
        self.disputes: dict[int, str] = {}  # peer node id -> what differs, while it does
        self.agreed = False
        self._on_change = on_change
        self._ask = asker

    async def run(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(CHECK_INTERVAL_S)

    async def check(self) -> None:
        answers = await asyncio.gather(*(self._ask(p) for p in self.peers), return_exceptions=True)
        for peer, answer in zip(self.peers, answers, strict=True):
            if isinstance(answer, BaseException):
                if isinstance(answer, asyncio.CancelledError):
                    raise answer
                log.debug("cluster: node %d at %s:%d did not answer (%r)", peer.node_id, peer.host, peer.port, answer)
                if isinstance(answer, ConnectionRefusedError) and self.disputes.pop(peer.node_id, None) is not None:
                    # Nothing listens there any more (a timeout may be a busy peer still serving: kept).
                    log.info("cluster: node %d at %s:%d, which disagreed, is stopped", peer.node_id, peer.host,
                             peer.port)
                continue  # stopped or starting: not a disagreement
            try:
                differs = difference(self.mine, answer)
            except Exception as exc:  # an answer that decoded into nonsense (null hosts, say): none
                log.debug("cluster: node %d at %s:%d answered what cannot be compared (%r)", peer.node_id, peer.host,
                          peer.port, exc)
                continue
            if differs is None:
                if self.disputes.pop(peer.node_id, None) is not None:
                    log.info("cluster: node %d at %s:%d agrees with this node's --cluster now", peer.node_id,
                             peer.host, peer.port)
            elif self.disputes.get(peer.node_id) != differs:
                self.disputes[peer.node_id] = differs
                log.error("cluster: node %d at %s:%d does not share this node's view of the cluster (%s): this node "
                          "coordinates no group until it does (two nodes would coordinate the same groups); give "
                          "every node the same --cluster and --offsets-partitions", peer.node_id, peer.host,
                          peer.port, differs)
        agreed = not self.disputes
        if agreed != self.agreed:
            self.agreed = agreed
            self._on_change(agreed)
