from pathlib import Path

import pytest

import coordinator.runtime
from coordinator.runtime import Runtime
from protocol.partitioning import partition_for
from tests.coordinator.harness import config


def test_a_groups_partition_is_kafkas_and_the_cache_stays_bounded(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coordinator.runtime, "PARTITION_CACHE", 100)
    hashed: list[str] = []

    def counted(group_id: str, partitions: int) -> int:
        hashed.append(group_id)
        return partition_for(group_id, partitions)

    monkeypatch.setattr(coordinator.runtime, "partition_for", counted)
    runtime = Runtime(config(tmp_path, partitions=50))
    for i in range(1000):
        group = f"group-{i}"
        assert runtime.partition_of(group) == partition_for(group, 50)
        assert runtime.partition_of(group) == partition_for(group, 50)  # from the cache
        assert len(runtime._partitions) <= 100
    assert len(hashed) == 1000  # each hashed once


def test_every_partition_this_node_owns_gets_a_compactor(tmp_path: Path) -> None:
    """Compaction (and with it retention's tombstones, a full disk's recovery) runs per partition: every
    shard needs its compactor, standalone as in cluster mode."""
    from coordinator.cluster import Node

    standalone = Runtime(config(tmp_path / "alone", partitions=3))
    standalone.open()
    assert [c.shard for c in standalone.compactors] == standalone.shards and len(standalone.shards) == 3
    nodes = (Node(0, "127.0.0.1", 29301), Node(1, "127.0.0.1", 29302))
    node0 = Runtime(config(tmp_path / "node0", partitions=4, cluster=nodes, node_id=0, port=29301,
                           advertised_host="127.0.0.1", advertised_port=29301))
    node0.open()
    assert [c.shard for c in node0.compactors] == node0.shards and len(node0.shards) == 2
    for runtime in (standalone, node0):
        if runtime._lock is not None:
            import os
            os.close(runtime._lock)


def test_a_standalone_start_on_a_processes_data_dir_is_refused(tmp_path: Path) -> None:
    """Back from --processes 2 to one process with the same --data-dir: the offsets are in DATA_DIR/node-i;
    a standalone start there served every group without them. Refused, as cluster mode and back is."""
    import os

    from coordinator.cluster import Node
    from coordinator.runtime import ConfigMismatch

    nodes = (Node(0, "127.0.0.1", 29301), Node(1, "127.0.0.1", 29302))
    for i in (0, 1):
        node = Runtime(config(tmp_path / "data" / f"node-{i}", partitions=4, cluster=nodes, node_id=i,
                              port=29301 + i, advertised_host="127.0.0.1", advertised_port=29301 + i))
        node.open()
        if node._lock is not None:
            os.close(node._lock)
    standalone = Runtime(config(tmp_path / "data", partitions=4))
    with pytest.raises(ConfigMismatch):
        standalone.open()
