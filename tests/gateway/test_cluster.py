"""The gateway's cluster view: which node coordinates the groups, which listener lists them and where
each listener relays, as brokers come and go (coordinator/gateway/cluster.py)."""

import socket

import pytest

from coordinator.config import Config
from coordinator.gateway.cluster import Cluster

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
