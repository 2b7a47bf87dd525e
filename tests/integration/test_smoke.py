from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from tests.kcoord_process import KcoordProcess


def test_kafka_python_commit_and_fetch(kcoord: KcoordProcess) -> None:
    consumer = KafkaConsumer(bootstrap_servers=kcoord.bootstrap, group_id="smoke", enable_auto_commit=False)
    try:
        tp = TopicPartition("events", 3)
        consumer.commit({tp: OffsetAndMetadata(42, "hello", -1)})
        got = consumer.committed(tp, metadata=True)
        assert (got.offset, got.metadata) == (42, "hello")
    finally:
        consumer.close()
