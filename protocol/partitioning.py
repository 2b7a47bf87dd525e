"""Which ``__consumer_offsets`` partition owns a group: exactly Kafka's
``Utils.abs(groupId.hashCode()) % numPartitions``, so logs can move between kcoord and Kafka."""

_INT_MIN = -(1 << 31)


def java_string_hash(s: str) -> int:
    """Java ``String.hashCode``: ``h = 31*h + unit`` over UTF-16 code units, wrapped to a signed int32."""
    h = 0
    data = s.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def kafka_abs(n: int) -> int:
    """Kafka ``Utils.abs``: like ``abs`` but maps Integer.MIN_VALUE to 0 (neither Java's nor Python's abs)."""
    return 0 if n == _INT_MIN else abs(n)


def partition_for(group_id: str, num_partitions: int) -> int:
    """The offsets-topic partition, and so the shard, that coordinates ``group_id``."""
    if num_partitions < 1:
        raise ValueError("num_partitions must be at least 1")
    return kafka_abs(java_string_hash(group_id)) % num_partitions
