"""``kcoord groups reset-offsets`` targets that read the topic's log (ListOffsets), and the lag
``offsets`` shows, through kcoord in gateway mode in front of the librdkafka mock cluster: the real CLI
in a subprocess, the data produced by a stock producer through kcoord, the offsets stored in kcoord."""

import json
from pathlib import Path
from typing import Any

import confluent_kafka as ck
from kafka import KafkaAdminClient
from kafka.structs import OffsetAndMetadata, TopicPartition

from tests.gateway.conftest import start_gateway
from tests.gateway.mock_cluster import MockCluster
from tests.integration.test_groups_cli import groups, parsed
from tests.kcoord_process import KcoordProcess


def reset(kcoord: KcoordProcess, *args: str) -> Any:
    rows = parsed(groups(kcoord, "reset-offsets", "r", "--topic", "resets", *args))
    return {(row["partition"], row["previous"]): row["offset"] for row in rows}


def test_reset_to_the_log_s_ends_and_shift_within_it(tmp_path: Path) -> None:
    mock = MockCluster(3)
    kcoord = start_gateway(tmp_path, mock.bootstrap)
    admin = KafkaAdminClient(bootstrap_servers=kcoord.bootstrap, request_timeout_ms=10_000)
    try:
        producer = ck.Producer({"bootstrap.servers": kcoord.bootstrap})
        for i in range(10):
            producer.produce("resets", value=b"v%d" % i, partition=0)
        for i in range(4):
            producer.produce("resets", value=b"w%d" % i, partition=1)
        assert producer.flush(30) == 0

        def committed() -> dict[int, int]:
            found = admin.list_group_offsets("r")["r"]
            return {tp.partition: om.offset for tp, om in found.items() if tp.topic == "resets"}

        admin.alter_group_offsets("r", {TopicPartition("resets", 0): OffsetAndMetadata(5, "", -1),
                                        TopicPartition("resets", 1): OffsetAndMetadata(2, "", -1)})
        assert reset(kcoord, "--to-earliest", "--dry-run") == {(0, 5): 0, (1, 2): 0}
        assert committed() == {0: 5, 1: 2}  # a dry run changes nothing
        assert reset(kcoord, "--to-latest") == {(0, 5): 10, (1, 2): 4}
        assert committed() == {0: 10, 1: 4}
        assert reset(kcoord, "--to-earliest", "--partitions", "1") == {(1, 4): 0}
        assert reset(kcoord, "--shift-by", "-3") == {(0, 10): 7, (1, 0): 0}  # not below the log's start
        assert reset(kcoord, "--shift-by", "5") == {(0, 7): 10, (1, 0): 4}  # nor past its end
        assert committed() == {0: 10, 1: 4}
        assert reset(kcoord, "--to-offset", "7") == {(0, 10): 7, (1, 4): 4}  # --to-offset too
        clamped = groups(kcoord, "reset-offsets", "r", "--topic", "resets", "--partitions", "0", "--to-offset", "70")
        assert clamped.returncode == 0 and "resets-0: 70 is past the log's end (10): 10 instead" in clamped.stderr
        # an offset for a partition the topic does not have (kcoord keeps any): the others keep their lag,
        # and a reset naming it is refused rather than left unclamped
        admin.alter_group_offsets("r", {TopicPartition("resets", 0): OffsetAndMetadata(10, "", -1),
                                        TopicPartition("resets", 1): OffsetAndMetadata(1, "", -1),
                                        TopicPartition("resets", 9): OffsetAndMetadata(3, "", -1)})
        lags = groups(kcoord, "offsets", "r")
        assert lags.returncode == 0, lags.stderr
        assert [(r["partition"], r["offset"], r["log_end_offset"], r["lag"]) for r in json.loads(lags.stdout)] == [
            (0, 10, 10, 0), (1, 1, 4, 3), (9, 3, None, None)]
        refused = groups(kcoord, "reset-offsets", "r", "--topic", "resets", "--partitions", "0,9", "--to-offset", "100")
        assert refused.returncode == 1 and "topic resets has no partition 9" in refused.stderr, refused.stderr
        assert committed() == {0: 10, 1: 1, 9: 3}
        # The mock keeps no time index (it answers -1 for any time), which is a time past the last
        # record: the log's end, as Kafka's tool resolves it.
        admin.alter_group_offsets("r", {TopicPartition("resets", 0): OffsetAndMetadata(1, "", -1)})
        assert reset(kcoord, "--to-datetime", "2026-11-28T10:00:00+01:00", "--partitions", "0") == {(0, 1): 10}
    finally:
        admin.close()
        kcoord.kill()
        mock.stop()
