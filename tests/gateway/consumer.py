"""One stock consumer-group member in a process of its own, for gateway tests: ``subscribe()``s to a
topic, prints every message it gets as a JSON line, commits synchronously after each non-empty poll,
and on SIGTERM closes (LeaveGroup). Every client offers only the "roundrobin" assignor, which all three
implement, so a mixed group agrees on one protocol.

    python -m tests.gateway.consumer --client confluent --bootstrap H:P --group G --topic T
"""

import argparse
import asyncio
import json
import signal
import sys
import time
from typing import Any

SESSION_MS = 6000
HEARTBEAT_MS = 1000


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "time": time.time(), **fields}), flush=True)


def run_confluent(args: argparse.Namespace, stop: list[bool]) -> None:
    import confluent_kafka as ck

    consumer = ck.Consumer({"bootstrap.servers": args.bootstrap, "group.id": args.group, "client.id": args.client,
                            "auto.offset.reset": "earliest", "enable.auto.commit": False,
                            "partition.assignment.strategy": "roundrobin", "session.timeout.ms": SESSION_MS,
                            "heartbeat.interval.ms": HEARTBEAT_MS, "topic.metadata.refresh.interval.ms": 2000})
    consumer.subscribe([args.topic], on_assign=lambda c, ps: emit("assigned", partitions=[p.partition for p in ps]))
    while not stop:
        msgs = consumer.consume(100, 0.2)
        got = [m for m in msgs if m.error() is None]
        for m in got:
            value = m.value()
            assert value is not None
            emit("msg", partition=m.partition(), offset=m.offset(), value=value.decode())
        if got:
            try:
                consumer.commit(asynchronous=False)
                emit("committed")
            except ck.KafkaException as exc:  # a rebalance in between: Kafka says the same
                emit("commit_failed", error=str(exc))
    consumer.close()


def run_kafka_python(args: argparse.Namespace, stop: list[bool]) -> None:
    from kafka import KafkaConsumer
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    from kafka.errors import KafkaError

    consumer = KafkaConsumer(bootstrap_servers=args.bootstrap, group_id=args.group, client_id=args.client,
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             session_timeout_ms=SESSION_MS, heartbeat_interval_ms=HEARTBEAT_MS,
                             metadata_max_age_ms=2000, partition_assignment_strategy=(RoundRobinPartitionAssignor,))
    consumer.subscribe([args.topic])
    while not stop:
        batches = consumer.poll(timeout_ms=200)
        n = 0
        for tp, records in batches.items():
            for r in records:
                emit("msg", partition=tp.partition, offset=r.offset, value=r.value.decode())
                n += 1
        if n:
            try:
                consumer.commit()
                emit("committed")
            except KafkaError as exc:
                emit("commit_failed", error=repr(exc))
    consumer.close()


async def run_aiokafka(args: argparse.Namespace, stop: list[bool]) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.errors import KafkaError

    consumer = AIOKafkaConsumer(args.topic, bootstrap_servers=args.bootstrap, group_id=args.group,
                                client_id=args.client, auto_offset_reset="earliest", enable_auto_commit=False,
                                session_timeout_ms=SESSION_MS, heartbeat_interval_ms=HEARTBEAT_MS,
                                metadata_max_age_ms=2000)
    await consumer.start()
    try:
        while not stop:
            batches = await consumer.getmany(timeout_ms=200)
            n = 0
            for tp, records in batches.items():
                for r in records:
                    emit("msg", partition=tp.partition, offset=r.offset, value=r.value.decode())
                    n += 1
            if n:
                try:
                    await consumer.commit()
                    emit("committed")
                except KafkaError as exc:
                    emit("commit_failed", error=repr(exc))
    finally:
        await consumer.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--client", required=True, choices=["confluent", "kafka-python", "aiokafka"])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True)
    args = parser.parse_args()
    stop: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    emit("started", client=args.client)
    if args.client == "confluent":
        run_confluent(args, stop)
    elif args.client == "kafka-python":
        run_kafka_python(args, stop)
    else:
        asyncio.run(run_aiokafka(args, stop))
    emit("closed")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
