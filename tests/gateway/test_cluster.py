"""The gateway's cluster view: which node coordinates the groups, which listener lists them and where
each listener relays, as brokers come and go (coordinator/gateway/cluster.py)."""

import asyncio
import socket

import pytest

from coordinator.config import Config
from coordinator.gateway import rewrite
from coordinator.gateway.cluster import Cluster
from coordinator.gateway.upstream import UpstreamLink

COORDINATOR = 1_000_000_000


def make_cluster(sockets: list[socket.socket], coordinator_node_id: int = COORDINATOR,
                 coordinator_port: int = 0) -> Cluster:
    config = Config(upstream=(("127.0.0.1", 1),), coordinator_node_id=coordinator_node_id,
                    coordinator_port=coordinator_port)
    return Cluster(config, lambda sock, node: sockets.append(sock))


def test_every_group_is_on_the_coordinator_node_and_listed_once_as_brokers_come_and_go() -> None:
    """The groups' coordinator is a node of its own, whatever brokers the upstream has: a client's group
    requests then go on a connection of their own. Admin clients ask every broker Metadata names (the
    upstream's and the coordinator) for ListGroups and merge the answers: the coordinator's listener
    names the groups, every upstream broker's none, so each group is listed once."""
    sockets: list[socket.socket] = []
    cluster = make_cluster(sockets)
    try:
        cluster.listen_coordinator()
        port = cluster.listeners[COORDINATOR]
        for brokers in ([1, 2, 3], [1, 2], [1, 2, 4], [4]):
            cluster.learn([(n, f"h{n}", 9092) for n in brokers])
            assert cluster.coordinator() == (COORDINATOR, "127.0.0.1", port)
            assert [cluster.lists_groups(n) for n in [*brokers, COORDINATOR]] == [False] * len(brokers) + [True]
            assert cluster.lists_groups(None)  # the bootstrap listener
            assert cluster.target(COORDINATOR) == (f"h{min(brokers)}", 9092)  # relays as the bootstrap one does
            assert cluster.target(None) == (f"h{min(brokers)}", 9092)
        assert sorted(cluster.listeners) == [1, 2, 3, 4, COORDINATOR]  # left brokers keep their listeners
    finally:
        for sock in sockets:
            sock.close()


def test_coordinator_port_and_node_id_options() -> None:
    sockets: list[socket.socket] = []
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    free = probe.getsockname()[1]
    probe.close()
    cluster = make_cluster(sockets, coordinator_node_id=7, coordinator_port=free)
    try:
        assert cluster.coordinator() == (7, "127.0.0.1", free)
    finally:
        for sock in sockets:
            sock.close()


def test_an_upstream_broker_with_the_coordinators_node_id_is_relayed_to(caplog: pytest.LogCaptureFixture) -> None:
    """A collision (an operator's choice of --coordinator-node-id) is logged, and the coordinator's
    listener stands for that broker too, so its partitions stay reachable."""
    sockets: list[socket.socket] = []
    cluster = make_cluster(sockets, coordinator_node_id=2)
    try:
        cluster.listen_coordinator()
        port = cluster.listeners[2]
        cluster.learn([(1, "h1", 9092), (2, "h2", 9093)])
        assert cluster.listeners[2] == port and len(sockets) == 2
        assert cluster.target(2) == ("h2", 9093)
        assert cluster.coordinator() == (2, "127.0.0.1", port)
        assert "has the node id of kcoord's group coordinator" in caplog.text
    finally:
        for sock in sockets:
            sock.close()


def test_an_api_versions_answer_from_a_broker_that_left_while_asked_is_not_kept() -> None:
    """A broker is asked its API versions when it appears in a broker list, and asked again when it comes
    back after leaving one (restarted, perhaps with other software). An answer that arrives after the
    broker left the list (a relayed Metadata answer meanwhile), or moved to another address, is not its
    answer when it is listed again: kept, the broker was not asked again, and its old versions stood."""
    sockets: list[socket.socket] = []
    cluster = make_cluster(sockets)
    old, new = ({0: (0, 9), 1: (4, 15)}, rewrite.NO_FEATURES), ({0: (0, 7), 1: (4, 12)}, rewrite.NO_FEATURES)

    async def scenario() -> None:
        gate = asyncio.Event()
        asked: list[tuple[str, int]] = []

        async def api_versions(link: UpstreamLink) -> tuple[dict[int, tuple[int, int]], rewrite.Features]:
            asked.append(link.addr)
            if len(asked) == 1:
                await gate.wait()  # the first answer comes after the broker list changed
                return old
            return new

        cluster._api_versions = api_versions  # type: ignore[method-assign]
        # (closed ports of the test range: the links fail at once; the answers above stand in for them)
        cluster.learn([(1, "127.0.0.1", 29998), (2, "127.0.0.1", 29999)], ask=False)
        cluster.node_versions[1] = new
        asking = asyncio.create_task(cluster._ask_brokers())
        await asyncio.sleep(0.01)
        cluster.learn([(1, "127.0.0.1", 29998)], ask=False)  # broker 2 leaves while asked
        gate.set()
        await asking
        assert 2 not in cluster.node_versions
        cluster.learn([(1, "127.0.0.1", 29998), (2, "127.0.0.1", 29999)], ask=False)  # and comes back
        await cluster._ask_brokers()
        assert asked == [("127.0.0.1", 29999)] * 2 and cluster.node_versions[2] == new
        assert cluster.upstream_versions == new[0]

        # the same for a broker asked at one address that is listed at another meanwhile
        asked.clear()
        gate.clear()
        cluster.learn([(1, "127.0.0.1", 29998)], ask=False)
        cluster.learn([(1, "127.0.0.1", 29998), (2, "127.0.0.1", 29997)], ask=False)
        asking = asyncio.create_task(cluster._ask_brokers())
        await asyncio.sleep(0.01)
        cluster.learn([(1, "127.0.0.1", 29998), (2, "127.0.0.1", 29996)], ask=False)
        gate.set()
        await asking
        assert 2 not in cluster.node_versions

    try:
        asyncio.run(scenario())
    finally:
        for sock in sockets:
            sock.close()
