"""A three-node KRaft Apache Kafka 4.4 cluster on 127.0.0.1 (`loadtest.apache_kafka.KafkaCluster`),
the upstream a front-end stands before: replicated three ways with min.insync.replicas 2, it
takes idempotent acks=all records while one node is killed with SIGKILL, and gives every
acknowledged record back exactly once after the node is back."""

import pytest

from loadtest.apache_kafka import KafkaCluster
from tests.harness import wait_until

pytestmark = [pytest.mark.system, pytest.mark.long]  # three JVMs: `make compat`

CLUSTER = {"broker.session.timeout.ms": "3000", "broker.heartbeat.interval.ms": "500"}


def produce_all(bootstrap: str, values: list[str]) -> list[str]:
    """Idempotent acks=all; the values acknowledged without error."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "acks": "all", "linger.ms": 5, "message.timeout.ms": 60000})
    acknowledged = []

    def delivered(error, message):
        if error is None:
            acknowledged.append(message.value().decode())

    for value in values:
        producer.produce("replicated", value.encode(), on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(90) == 0
    return acknowledged


def test_a_node_killed_mid_produce_loses_no_acknowledged_record():
    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient, NewTopic

    with KafkaCluster(3, overrides=CLUSTER) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        admin.create_topics([NewTopic("replicated", 3, 3)])["replicated"].result(30)
        first = produce_all(cluster.bootstrap, [f"a{n}" for n in range(300)])
        cluster.kill(2)
        second = produce_all(cluster.bootstrap, [f"b{n}" for n in range(300)])
        cluster.restart(2)
        assert len(first) == 300 and len(second) == 300
        consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "readers",
                             "auto.offset.reset": "earliest"})
        consumer.subscribe(["replicated"])
        seen: list[str] = []

        def read_all() -> bool:
            seen.extend(m.value().decode() for m in consumer.consume(500, 0.5)
                        if m.error() is None)
            return len(seen) >= 600

        wait_until(read_all, timeout=90, message="the records did not all come back")
        consumer.close()
        assert sorted(seen) == sorted(first + second)
