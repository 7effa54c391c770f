"""Real clients produce and consume through the broker started as a subprocess."""

import asyncio
import time

import pytest

pytestmark = pytest.mark.system  # every test here uses a broker

COUNT = 300


def expected(topic):
    return [(b"k%d" % i, b"%s-%d" % (topic.encode(), i), [("h", b"%d" % i)]) for i in range(COUNT)]


def test_kafka_python_idempotent_producer_and_assigned_consumer(broker):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    topic = "kp"
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)  # idempotent, acks=all by default
    futures = [producer.send(topic, key=k, value=v, headers=h) for k, v, h in expected(topic)]
    producer.flush(30)
    assert [f.get(10).offset for f in futures] == list(range(COUNT))
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False)
    partition = TopicPartition(topic, 0)
    consumer.assign([partition])
    consumer.seek_to_beginning(partition)
    messages, deadline = [], time.monotonic() + 20
    while len(messages) < COUNT and time.monotonic() < deadline:  # not 3 s idle after the last
        messages += consumer.poll(timeout_ms=500).get(partition, [])
    assert consumer.end_offsets([partition]) == {partition: COUNT}  # nothing more to read
    consumer.close()
    assert [m.offset for m in messages] == list(range(COUNT))
    assert [(m.key, m.value, m.headers) for m in messages] == expected(topic)


def test_aiokafka_producer_and_assigned_consumer(broker):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition

    topic = "ai"

    async def round_trip():
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        await producer.start()
        try:
            sent = [await producer.send(topic, v, key=k, headers=h) for k, v, h in expected(topic)]
            offsets = [(await s).offset for s in sent]
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            partition = TopicPartition(topic, 0)
            consumer.assign([partition])
            await consumer.seek_to_beginning(partition)
            got, deadline = [], time.monotonic() + 20
            while len(got) < COUNT and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=500)
                for messages in batches.values():
                    got.extend(messages)
        finally:
            await consumer.stop()
        return offsets, got

    offsets, got = asyncio.run(round_trip())
    assert offsets == list(range(COUNT))
    assert [m.offset for m in got] == list(range(COUNT))
    assert [(m.key, m.value, list(m.headers)) for m in got] == expected(topic)


@pytest.mark.parametrize("compression", ["lz4", "zstd", "gzip", "snappy"])
def test_confluent_kafka_compressed_acks_all(broker, compression):
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

    topic = f"ck-{compression}"
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all",
                         "compression.type": compression, "linger.ms": 20})
    delivered = []
    for key, value, headers in expected(topic):
        producer.produce(topic, key=key, value=value, headers=headers,
                         on_delivery=lambda err, msg: delivered.append((err, msg.offset())))
    assert producer.flush(30) == 0
    assert [err for err, _ in delivered] == [None] * COUNT
    assert sorted(offset for _, offset in delivered) == list(range(COUNT))
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "unused",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    got, deadline = [], time.monotonic() + 20
    while len(got) < COUNT and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None:
            assert message.error() is None, message.error()
            got.append(message)
    consumer.close()
    assert [m.offset() for m in got] == list(range(COUNT))
    assert [(m.key(), m.value(), m.headers()) for m in got] == expected(topic)


def test_admin_creates_and_deletes_topics(broker):
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.create_topics([NewTopic("made", num_partitions=3, replication_factor=1)])
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics([NewTopic("made", num_partitions=1, replication_factor=1)])
        assert "made" in admin.list_topics()
        described = admin.describe_topics(["made"])[0]
        assert len(described["partitions"]) == 3
        admin.delete_topics(["made"])
        assert "made" not in admin.list_topics()
    finally:
        admin.close()


def test_list_offsets_earliest_latest_and_by_time(broker):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    topic = "times"
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for i, stamp in enumerate((1_000_000, 2_000_000, 3_000_000)):
        producer.send(topic, value=b"%d" % i, timestamp_ms=stamp)
    producer.flush(10)
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap)
    partition = TopicPartition(topic, 0)
    try:
        assert consumer.beginning_offsets([partition]) == {partition: 0}
        assert consumer.end_offsets([partition]) == {partition: 3}
        found = consumer.offsets_for_times({partition: 1_500_000})[partition]
        assert (found.offset, found.timestamp) == (1, 2_000_000)
        assert consumer.offsets_for_times({partition: 9_000_000})[partition] is None
    finally:
        consumer.close()
