"""Produce and consume load with confluent-kafka (librdkafka), for `make bench`.

    python -m loadtest.kafka_load produce BOOTSTRAP TOPIC SECONDS RECORD_BYTES [CONFIG_JSON]
    python -m loadtest.kafka_load consume BOOTSTRAP TOPIC RECORDS
    python -m loadtest.kafka_load transactions BOOTSTRAP TOPIC SECONDS RECORD_BYTES PER_TXN
    python -m loadtest.kafka_load latency BOOTSTRAP TOPIC SECONDS RATE RECORD_BYTES

Each prints one JSON line.  Produce uses acks=1 and no compression; consume reads the
partitions from the beginning until it has RECORDS records; transactions produces PER_TXN
records per transaction (idempotent, acks=all, as a transactional producer must) and times
each commit; latency sends RATE records a second (acks=all, idempotent, linger 0) for a
warm-up second, then SECONDS, and gives percentiles of send-to-acknowledgement time.
"""

from __future__ import annotations

import json
import sys
import time


def produce(bootstrap: str, topic: str, seconds: float, size: int,
            extra: dict | None = None) -> dict:
    """`extra`: more client settings (security.protocol, ssl.ca.location, ...)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "1", "compression.type": "none",
                         "linger.ms": 5, "batch.size": 1 << 20, "enable.idempotence": False,
                         "queue.buffering.max.kbytes": 1 << 20, **(extra or {})})
    value = b"x" * size
    delivered, failed = [0], [0]

    def on_delivery(error, _message):
        if error is None:
            delivered[0] += 1
        else:
            failed[0] += 1

    started = time.monotonic()
    sent = 0
    while time.monotonic() - started < seconds:
        for _ in range(1000):
            try:
                producer.produce(topic, value, on_delivery=on_delivery)
                sent += 1
            except BufferError:
                producer.poll(0.001)
        producer.poll(0)
    remaining = producer.flush(30)
    elapsed = time.monotonic() - started
    return {"records": delivered[0], "failed": failed[0] + remaining, "seconds": elapsed,
            "bytes": delivered[0] * size, "sent": sent}


def transactions(bootstrap: str, topic: str, seconds: float, size: int, per_txn: int) -> dict:
    """Transactions of `per_txn` records for `seconds`: records/s and commit latencies."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": "none",
                         "linger.ms": 5, "transactional.id": f"bench-{time.time_ns()}"})
    producer.init_transactions(30)
    value = b"x" * size
    commits, records, failed = [], 0, 0
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        producer.begin_transaction()
        for _ in range(per_txn):
            producer.produce(topic, value)
        before = time.monotonic()
        try:
            producer.commit_transaction(30)  # flushes the records, then EndTxn
        except Exception:  # noqa: BLE001 - counted: the bench reports errors
            failed += per_txn
            producer.abort_transaction(30)
            continue
        commits.append(time.monotonic() - before)
        records += per_txn
    elapsed = time.monotonic() - started
    return {"records": records, "failed": failed, "seconds": elapsed, "bytes": records * size,
            "commits": commits}


def latency(bootstrap: str, topic: str, seconds: float, rate: float, size: int) -> dict:
    """Records paced at `rate` a second: percentiles of their acknowledgement time, in ms,
    after a warm-up second."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "enable.idempotence": True, "linger.ms": 0})
    value = b"x" * size
    times: list[float] = []
    failed = [0]
    started = time.monotonic()
    warm_until = started + 1.0

    def on_delivery(error, _message, sent: float):
        if error is not None:
            failed[0] += 1
        elif sent >= warm_until:
            times.append(time.monotonic() - sent)

    sent = 0
    while True:
        now = time.monotonic()
        if now - warm_until > seconds:
            break
        due = started + sent / rate
        if now < due:
            producer.poll(min(due - now, 0.001))
            continue
        producer.produce(topic, value, on_delivery=lambda e, m, t=now: on_delivery(e, m, t))
        sent += 1
        producer.poll(0)
    producer.flush(30)
    times.sort()

    def at(share: float) -> float:
        return times[min(len(times) - 1, int(len(times) * share))] * 1000 if times else 0.0

    return {"records": len(times), "failed": failed[0], "p50": at(0.5), "p99": at(0.99),
            "p999": at(0.999)}


def consume(bootstrap: str, topic: str, records: int) -> dict:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench",
                         "enable.auto.commit": False, "fetch.max.bytes": 50 << 20,
                         "max.partition.fetch.bytes": 8 << 20,
                         # librdkafka pauses fetching this long when its queue is full (1 s by
                         # default): a broker that answers faster than Python reads would be
                         # charged whole seconds of idling
                         "fetch.queue.backoff.ms": 5})
    metadata = consumer.list_topics(topic, timeout=10).topics[topic]
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in metadata.partitions])
    got = size = 0
    started = time.monotonic()
    deadline = started + 120
    while got < records and time.monotonic() < deadline:
        for message in consumer.consume(10000, 0.5):
            if message.error() is None:
                got += 1
                size += len(message.value())
    elapsed = time.monotonic() - started
    consumer.close()
    return {"records": got, "bytes": size, "seconds": elapsed, "missing": records - got}


def main(argv: list[str]) -> int:
    if argv[0] == "produce":
        extra = json.loads(argv[5]) if len(argv) > 5 else None
        print(json.dumps(produce(argv[1], argv[2], float(argv[3]), int(argv[4]), extra)))
    elif argv[0] == "consume":
        print(json.dumps(consume(argv[1], argv[2], int(argv[3]))))
    elif argv[0] == "latency":
        print(json.dumps(latency(argv[1], argv[2], float(argv[3]), float(argv[4]),
                                 int(argv[5]))))
    elif argv[0] == "transactions":
        print(json.dumps(transactions(argv[1], argv[2], float(argv[3]), int(argv[4]),
                                      int(argv[5]))))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
