"""Real Kafka clients bootstrap against the broker started as a subprocess."""

import asyncio

import pytest

from tests.harness import BrokerProcess

pytestmark = pytest.mark.system  # every test here starts a broker


# Its tests see a broker with no topic at all (tests/conftest.py `broker`).
FRESH_BROKER = True


def test_kafka_python_consumer_sees_the_cluster(broker):
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, request_timeout_ms=10000)
    try:
        assert consumer.topics() == set()
        brokers = consumer._client.cluster.brokers()
        assert [(b.node_id, b.host, b.port) for b in brokers] == [(0, "127.0.0.1", broker.port)]
    finally:
        consumer.close()


def test_kafka_python_admin_describes_the_cluster(broker):
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10000)
    try:
        cluster = admin.describe_cluster()
        assert cluster["controller_id"] == 0
        assert [(b["broker_id"], b["port"]) for b in cluster["brokers"]] == [(0, broker.port)]
        assert len(cluster["cluster_id"]) == 22
    finally:
        admin.close()


def test_confluent_kafka_lists_topics(broker):
    from confluent_kafka.admin import AdminClient

    metadata = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10)
    assert metadata.topics == {}
    assert list(metadata.brokers) == [0]
    assert metadata.brokers[0].port == broker.port
    assert metadata.controller_id == 0


def test_aiokafka_bootstraps(broker):
    from aiokafka import AIOKafkaConsumer

    async def bootstrap():
        consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap)
        await consumer.start()
        try:
            topics = await consumer.topics()
            brokers = consumer._client.cluster.brokers()
            return topics, [(b.nodeId, b.port) for b in brokers]
        finally:
            await consumer.stop()

    topics, brokers = asyncio.run(bootstrap())
    assert topics == set()
    assert brokers == [(0, broker.port)]


def test_cluster_id_survives_a_restart(tmp_path):
    from confluent_kafka.admin import AdminClient

    ids = []
    for _ in range(2):
        with BrokerProcess(workers=1, data_dir=str(tmp_path)) as running:
            ids.append(AdminClient({"bootstrap.servers": running.bootstrap})
                       .list_topics(timeout=10).cluster_id)
    assert ids[0] == ids[1] and ids[0]
