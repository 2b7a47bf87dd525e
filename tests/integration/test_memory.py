"""What a long-running server gives back: memory held for groups and offsets that are gone must not
pile up as groups come and go (an operator's soak of 200k short-lived groups was the find)."""

from pathlib import Path

from kafka import KafkaAdminClient, KafkaConsumer
from kafka.structs import OffsetAndMetadata, TopicPartition

from tests.conftest import Report
from tests.integration.test_flow_control import memory_kib
from tests.integration.test_metrics import scrape, value
from tests.kcoord_process import KcoordProcess

TOPICS_PER_ROUND = 30_000


def test_offsets_of_deleted_groups_on_topics_never_seen_again_do_not_pile_up(tmp_path: Path, report: Report) -> None:
    """Each round a group commits to topics no other round uses (test runs, tenants, per-job topics come
    and go), then is deleted. A shard shares one (topic, partition) key between its groups' offsets, and
    that table kept every key it had made up to a million per partition: 200k such topics across a
    server held ~80 MB after every offset was gone (~400 B a key), on 50 partitions up to ~20 GB."""
    server = KcoordProcess(tmp_path / "data", "--offsets-partitions", "1").start()
    assert server.proc is not None
    admin = KafkaAdminClient(bootstrap_servers=server.bootstrap)
    rss_kib = []
    try:
        for round_ in range(5):
            group = f"churn-{round_}"
            consumer = KafkaConsumer(bootstrap_servers=server.bootstrap, group_id=group, enable_auto_commit=False)
            consumer.commit({TopicPartition(f"round-{round_}-topic-{i}", 0): OffsetAndMetadata(i, "", -1)
                             for i in range(TOPICS_PER_ROUND)})
            consumer.close()
            assert admin.delete_groups([group]) == {group: "OK"}
            samples = scrape(server)
            assert value(samples, "kcoord_offsets") == 0
            rss_kib.append(memory_kib(server.proc.pid, "VmRSS"))
    finally:
        admin.close()
        server.stop()
    grown_mib = (rss_kib[-1] - rss_kib[1]) / 1024  # from the second round on: the first one sizes the heap
    report.figure("RSS grown over 3 rounds of 30k topics, each deleted", grown_mib, "MiB")
    # Before: ~12 MiB a round (30k keys of ~400 B), so ~35 MiB; now the table is cut back to what live
    # offsets use, and what the previous round freed is reused.
    assert grown_mib < 12, rss_kib
