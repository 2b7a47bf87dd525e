"""librdkafka's DeleteConsumerGroupOffsets (OffsetDelete), called through its C API.

confluent-kafka's Python binding (2.16) does not expose it, but the librdkafka inside the wheel has it;
calling it through ctypes exercises librdkafka's own OffsetDelete request and response handling against
kcoord, which is what the test is about. Only the handful of functions needed are declared."""

import ctypes
from pathlib import Path

import confluent_kafka

RD_KAFKA_PRODUCER = 0


class _TopicPartition(ctypes.Structure):
    _fields_ = [("topic", ctypes.c_char_p), ("partition", ctypes.c_int32), ("offset", ctypes.c_int64),
                ("metadata", ctypes.c_void_p), ("metadata_size", ctypes.c_size_t), ("opaque", ctypes.c_void_p),
                ("err", ctypes.c_int), ("_private", ctypes.c_void_p)]


class _TopicPartitionList(ctypes.Structure):
    _fields_ = [("cnt", ctypes.c_int), ("size", ctypes.c_int), ("elems", ctypes.POINTER(_TopicPartition))]


def _library() -> ctypes.CDLL:
    libs = Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs"
    lib = ctypes.CDLL(str(sorted(libs.glob("librdkafka*.so*"))[0]))
    vp, cp, tpl = ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(_TopicPartitionList)
    signatures = {
        "rd_kafka_conf_new": (vp, []),
        "rd_kafka_conf_set": (ctypes.c_int, [vp, cp, cp, cp, ctypes.c_size_t]),
        "rd_kafka_new": (vp, [ctypes.c_int, vp, cp, ctypes.c_size_t]),
        "rd_kafka_destroy": (None, [vp]),
        "rd_kafka_queue_new": (vp, [vp]),
        "rd_kafka_queue_destroy": (None, [vp]),
        "rd_kafka_queue_poll": (vp, [vp, ctypes.c_int]),
        "rd_kafka_event_destroy": (None, [vp]),
        "rd_kafka_event_error": (ctypes.c_int, [vp]),
        "rd_kafka_topic_partition_list_new": (tpl, [ctypes.c_int]),
        "rd_kafka_topic_partition_list_add": (vp, [tpl, cp, ctypes.c_int32]),
        "rd_kafka_topic_partition_list_destroy": (None, [tpl]),
        "rd_kafka_DeleteConsumerGroupOffsets_new": (vp, [cp, tpl]),
        "rd_kafka_DeleteConsumerGroupOffsets_destroy": (None, [vp]),
        "rd_kafka_DeleteConsumerGroupOffsets": (None, [vp, ctypes.POINTER(vp), ctypes.c_size_t, vp, vp]),
        "rd_kafka_event_DeleteConsumerGroupOffsets_result": (vp, [vp]),
        "rd_kafka_DeleteConsumerGroupOffsets_result_groups": (ctypes.POINTER(vp),
                                                              [vp, ctypes.POINTER(ctypes.c_size_t)]),
        "rd_kafka_group_result_error": (vp, [vp]),
        "rd_kafka_group_result_partitions": (tpl, [vp]),
        "rd_kafka_error_code": (ctypes.c_int, [vp]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def delete_consumer_group_offsets(bootstrap: str, group: str, partitions: list[tuple[str, int]],
                                  timeout_ms: int = 30_000) -> tuple[int, list[tuple[str, int, int]]]:
    """``(group error code, [(topic, partition, error code)])`` as librdkafka reports them."""
    lib = _library()
    errstr = ctypes.create_string_buffer(512)
    conf = lib.rd_kafka_conf_new()
    lib.rd_kafka_conf_set(conf, b"bootstrap.servers", bootstrap.encode(), errstr, len(errstr))
    rk = lib.rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, len(errstr))
    if not rk:
        raise RuntimeError(errstr.value.decode())
    queue = lib.rd_kafka_queue_new(rk)
    tps = lib.rd_kafka_topic_partition_list_new(len(partitions))
    for topic, partition in partitions:
        lib.rd_kafka_topic_partition_list_add(tps, topic.encode(), partition)
    request = lib.rd_kafka_DeleteConsumerGroupOffsets_new(group.encode(), tps)
    try:
        lib.rd_kafka_DeleteConsumerGroupOffsets(rk, (ctypes.c_void_p * 1)(request), 1, None, queue)
        event = lib.rd_kafka_queue_poll(queue, timeout_ms)
        if not event:
            raise TimeoutError("no DeleteConsumerGroupOffsets result")
        try:
            if lib.rd_kafka_event_error(event):
                raise RuntimeError(f"request failed: error {lib.rd_kafka_event_error(event)}")
            result = lib.rd_kafka_event_DeleteConsumerGroupOffsets_result(event)
            count = ctypes.c_size_t()
            groups = lib.rd_kafka_DeleteConsumerGroupOffsets_result_groups(result, ctypes.byref(count))
            assert count.value == 1
            error = lib.rd_kafka_group_result_error(groups[0])
            group_error = lib.rd_kafka_error_code(error) if error else 0
            parts = lib.rd_kafka_group_result_partitions(groups[0])
            out = []
            if parts:
                for i in range(parts.contents.cnt):
                    tp = parts.contents.elems[i]
                    out.append((tp.topic.decode(), tp.partition, tp.err))
            return group_error, out
        finally:
            lib.rd_kafka_event_destroy(event)
    finally:
        lib.rd_kafka_DeleteConsumerGroupOffsets_destroy(request)
        lib.rd_kafka_topic_partition_list_destroy(tps)
        lib.rd_kafka_queue_destroy(queue)
        lib.rd_kafka_destroy(rk)
