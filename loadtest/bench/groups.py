"""groups: a third confluent-kafka consumer joining a stable group of two (heartbeats every
100 ms): seconds until all three hold their partitions; OffsetCommit round-trip p50/p99 on one
connection for --seconds (no baseline)."""

from __future__ import annotations

import struct
import time

from loadtest.bench.common import Broker


def commit_frame(correlation: int) -> bytes:
    """OffsetCommit v8 of one partition's offset for a group without members."""
    from kafka.protocol.consumer.group import OffsetCommitRequest

    topic = OffsetCommitRequest.OffsetCommitRequestTopic
    request = OffsetCommitRequest[8](
        group_id="bench-commits", generation_id_or_member_epoch=-1, member_id="",
        group_instance_id=None, topics=[topic(name="bench-groups", partitions=[
            topic.OffsetCommitRequestPartition(partition_index=0, committed_offset=correlation,
                                               committed_leader_epoch=-1,
                                               committed_metadata=None)])])
    request.with_header(correlation_id=correlation, client_id="bench")
    body = bytes(request.encode(header=True))
    return struct.pack(">i", len(body)) + body


def group_figures(seconds: float) -> dict[str, dict]:
    """A third member joining a stable group of two (confluent-kafka, heartbeats every
    100 ms) until all three hold partitions; and OffsetCommit round trips on one connection."""
    from confluent_kafka import Consumer

    from tests.wire import KafkaSocket, create_topic

    broker = Broker(2, {"group.initial.rebalance.delay.ms": "0"})
    figures = {}
    consumers = []
    try:
        create_topic(broker.process.bootstrap, "bench-groups", 6)

        def member():
            consumer = Consumer({"bootstrap.servers": broker.process.bootstrap,
                                 "group.id": "bench-group", "heartbeat.interval.ms": 100,
                                 "session.timeout.ms": 6000, "enable.auto.commit": False})
            consumer.subscribe(["bench-groups"])
            consumers.append(consumer)
            return consumer

        def settled(count: int, deadline: float) -> bool:
            while time.monotonic() < deadline:
                for consumer in consumers:
                    consumer.poll(0.01)
                if len(consumers) == count and all(len(c.assignment()) == 6 // count
                                                   for c in consumers):
                    return True
            return False

        member(), member()
        ok = settled(2, time.monotonic() + 30)
        started = time.monotonic()
        member()
        ok = settled(3, time.monotonic() + 30) and ok
        figures["group join"] = {"seconds": time.monotonic() - started, "errors": int(not ok)}
        times = []
        with KafkaSocket(broker.process.listeners["PLAINTEXT"]) as client:
            deadline = time.monotonic() + seconds
            correlation = 0
            while time.monotonic() < deadline:
                correlation += 1
                frame = commit_frame(correlation)
                began = time.perf_counter()
                client.send(frame)
                client.receive()
                times.append(time.perf_counter() - began)
        times.sort()
        figures["offset commit"] = {"p50_ms": times[len(times) // 2] * 1e3,
                                    "p99_ms": times[int(len(times) * 0.99)] * 1e3,
                                    "count": len(times), "errors": 0}
    finally:
        for consumer in consumers:
            consumer.close()
        broker.close()
    return figures
