"""What real applications need from a broker: CreatePartitions, DeleteRecords,
OffsetDelete, DescribeLogDirs and DescribeProducers, with confluent-kafka's and kafka-python's
admin clients, and consumers that see the result."""

from __future__ import annotations

import time

import pytest

from tests.harness import wait_until
from tests.helpers import produce

pytestmark = pytest.mark.system  # every test here uses a broker


# A group forms without Kafka's 3 s wait for more members: the admin APIs are under test.
BROKER_OVERRIDES = {"group.initial.rebalance.delay.ms": "0"}


def test_partitions_added_while_a_group_consumes_are_assigned_after_the_refresh(broker):
    from confluent_kafka import Consumer, KafkaException
    from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("grow", 1, 1)])["grow"].result(timeout=20)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "growers",
                         "auto.offset.reset": "earliest",
                         "topic.metadata.refresh.interval.ms": 1000})
    consumer.subscribe(["grow"])
    produce(broker.bootstrap, "grow", ["grow-0"])
    seen, deadline = set(), time.monotonic() + 30
    while not seen and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            seen.add((message.partition(), message.value()))
    admin.create_partitions([NewPartitions("grow", 3)])["grow"].result(timeout=20)
    with pytest.raises(KafkaException, match="INVALID_PARTITIONS"):
        admin.create_partitions([NewPartitions("grow", 2)])["grow"].result(timeout=20)
    produce(broker.bootstrap, "grow", ["grow-0", "grow-1"], partitions=(2,))
    while len(seen) < 3 and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            seen.add((message.partition(), message.value()))
    assert seen == {(0, b"grow-0"), (2, b"grow-0"), (2, b"grow-1")}
    assert {p.partition for p in consumer.assignment()} == {0, 1, 2}
    consumer.close()


def test_delete_records_offset_delete_log_dirs_and_producers(broker):
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic
    from kafka import TopicPartition as KafkaPartition
    from kafka.admin import KafkaAdminClient

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("trim", 1, 1)])["trim"].result(timeout=20)
    produce(broker.bootstrap, "trim", [f"trim-{i}" for i in range(10)],
            **{"enable.idempotence": True})
    [deleted] = admin.delete_records([TopicPartition("trim", 0, 6)]).values()
    assert deleted.result(timeout=20).low_watermark == 6
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "trimmers",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe(["trim"])
    offsets, deadline = [], time.monotonic() + 30
    while len(offsets) < 4 and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            offsets.append(message.offset())
    assert offsets == [6, 7, 8, 9]  # from the new log start, as earliest now means
    assert consumer.get_watermark_offsets(TopicPartition("trim", 0), timeout=10) == (6, 10)
    consumer.commit(asynchronous=False)

    kafka_admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)

    def delete_offsets() -> str:  # the partition's error class, by name
        answer = kafka_admin.delete_group_offsets("trimmers", [KafkaPartition("trim", 0)])
        return answer[KafkaPartition("trim", 0)].__name__

    assert delete_offsets() == "GroupSubscribedToTopicError"  # a member still reads it
    consumer.close()  # the group is empty now: its offsets may go
    wait_until(lambda: delete_offsets() == "NoError", timeout=10)
    assert kafka_admin.list_group_offsets("trimmers") == {"trimmers": {}}  # none left

    [broker_dirs] = kafka_admin.describe_log_dirs()
    sizes = {(t["name"], p["partition_index"]): p["partition_size"]
             for log_dir in broker_dirs["log_dirs"] for t in log_dir["topics"]
             for p in t["partitions"]}
    assert sizes[("trim", 0)] > 0
    producers = kafka_admin.describe_producers([KafkaPartition("trim", 0)])
    [state] = producers[KafkaPartition("trim", 0)].active_producers
    assert state.producer_id >= 0 and state.last_sequence == 9  # ten records, one producer
    kafka_admin.close()
