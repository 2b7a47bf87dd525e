"""The gateway's cluster view: which node coordinates a group, and which listener lists it, as
brokers come and go (coordinator/gateway/cluster.py)."""

import socket

from coordinator.config import Config
from coordinator.gateway.cluster import Cluster
from protocol.partitioning import partition_for

PARTITIONS = 50


def listed_once(cluster: Cluster, brokers: list[int]) -> bool:
    """ListGroups asked of every broker a client knows, merged: every partition's groups exactly once."""
    return all(sum(cluster.lists_partition(node, p) for node in brokers) == 1 for p in range(PARTITIONS))


def test_groups_stay_on_live_brokers_and_are_listed_once_as_brokers_come_and_go() -> None:
    """A review's find: a broker that left kept its listener, and with it a third of the groups, which
    then no admin client's listing (it asks the brokers Metadata names) showed."""
    sockets: list[socket.socket] = []
    cluster = Cluster(Config(upstream=(("127.0.0.1", 1),), offsets_partitions=PARTITIONS),
                      lambda sock, node: sockets.append(sock))
    groups = [f"group-{i}" for i in range(60)]
    try:
        for brokers in ([1, 2, 3], [1, 2], [1, 2, 4], [4]):
            cluster.learn([(n, f"h{n}", 9092) for n in brokers])
            owners = {g: cluster.coordinator_of(g) for g in groups}
            assert {o[0] for o in owners.values() if o is not None} == set(brokers)
            assert all(cluster.lists_partition(owners[g][0], partition_for(g, PARTITIONS))  # type: ignore[index]
                       for g in groups)
            assert listed_once(cluster, brokers)
            assert all(cluster.lists_partition(None, p) for p in range(PARTITIONS))  # the bootstrap listener
        assert sorted(cluster.listeners) == [1, 2, 3, 4]  # left brokers keep their listeners
    finally:
        for sock in sockets:
            sock.close()
