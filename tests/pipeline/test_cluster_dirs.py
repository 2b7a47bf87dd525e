"""The jobs over a cluster's data directories (README: "given every node's directory"): two real kcoord
nodes, stock clients committing to groups of both, then one snapshot over both directories and one
reshard of both into a standalone directory, each answering what the cluster answered."""

from pathlib import Path
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from tests.integration.test_cluster import Cluster, groups_of
from tests.pipeline.conftest import Offsets, offset_fetch
from tests.pipeline.test_jobs import job, served, snapshot_rows


def test_a_clusters_node_directories_read_as_one_log(spark: Any, tmp_path: Path) -> None:
    cluster = Cluster(tmp_path).start()
    groups = groups_of(0, 4, "n") + groups_of(1, 4, "n")
    try:
        for i, group in enumerate(groups):
            consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap, group_id=group, enable_auto_commit=False,
                                     request_timeout_ms=10_000)
            try:
                for rnd in range(2):
                    consumer.commit({TopicPartition("t", p): OffsetAndMetadata(10 * rnd + p + i, f"é {rnd}", -1)
                                     for p in range(3)}, timeout_ms=10_000)
            finally:
                consumer.close()
        admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=10_000)
        try:
            assert admin.delete_groups([groups[0], groups[-1]]) == {groups[0]: "OK", groups[-1]: "OK"}
            expected: dict[str, Offsets] = {g: found for g in groups if (found := offset_fetch(admin, g))}
        finally:
            admin.close()
        for node in cluster.nodes:
            assert node.stop() == 0
    finally:
        for node in cluster.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.kill()
    assert set(expected) == set(groups[1:-1])  # groups of both nodes
    dirs = [a for node in cluster.nodes for a in ("--data-dir", str(node.data_dir))]
    code, err = job(spark, "snapshot", *dirs, "--out", str(tmp_path / "snap"))
    assert code == 0, err
    assert snapshot_rows(spark, tmp_path / "snap") == expected
    code, err = job(spark, "reshard", *dirs, "--out", str(tmp_path / "three"), "--partitions", "3")
    assert code == 0, err
    assert served(tmp_path / "three", 3, groups)[0] == {g: expected.get(g, {}) for g in groups}
