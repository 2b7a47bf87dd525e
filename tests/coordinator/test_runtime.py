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
