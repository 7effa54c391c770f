"""A consume-transform-produce application, exactly once (tests/transactions/test_transactions.py runs it):
`python -m tests.transform_app BOOTSTRAP SOURCE SINK TOTAL SECONDS`.

It reads SOURCE as group "transform" (read_committed), writes b"T" + value to SINK and commits
its consumer offsets in the same transaction, 100 records per transaction, until the group's
committed offsets cover TOTAL records or SECONDS pass.  After each commit it prints
"committed N" (records committed by this process).  Killed at any moment and started again,
the records in SINK are still each source record exactly once: that is what the test checks.
"""

from __future__ import annotations

import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

BATCH = 100


def main(bootstrap: str, source: str, sink: str, total: int, seconds: float) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "transform",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest",
                         # A killed run's member stays in the group (as in Kafka) until its
                         # session ends: the restarted run's first rebalance waits that long.
                         "session.timeout.ms": 6000})
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "transform-app",
                         "transaction.timeout.ms": 10000, "linger.ms": 5})
    producer.init_transactions(30)
    consumer.subscribe([source])
    metadata = consumer.list_topics(source, timeout=10).topics[source]
    partitions = [TopicPartition(source, p) for p in metadata.partitions]
    deadline, committed = time.monotonic() + seconds, 0
    try:
        while time.monotonic() < deadline and _done(consumer, partitions) < total:
            messages = [m for m in consumer.consume(BATCH, 0.5) if m.error() is None]
            if not messages:
                continue
            producer.begin_transaction()
            for message in messages:
                producer.produce(sink, b"T" + message.value(), partition=message.partition())
            positions = consumer.position(consumer.assignment())
            producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(),
                                                 30)
            producer.commit_transaction(30)
            committed += len(messages)
            print(f"committed {committed}", flush=True)
    except KafkaException as error:
        print(f"failed {error}", flush=True)
        return 1
    finally:
        consumer.close()
    return 0


def _done(consumer, partitions: list) -> int:
    """Records the group has committed (offsets summed over the source's partitions)."""
    if not consumer.assignment():
        return 0
    return sum(max(tp.offset, 0) for tp in consumer.committed(partitions, 10))


if __name__ == "__main__":
    bootstrap, source, sink, total, seconds = sys.argv[1:6]
    sys.exit(main(bootstrap, source, sink, int(total), float(seconds)))
