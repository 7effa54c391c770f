"""Client quotas and KIP-219 throttling with real clients, broker-wide across workers."""

import asyncio
import collections
import threading
import time

import pytest

from tests.batches import make_batch
from tests.harness import BrokerProcess
from tests.wire import (KafkaSocket, alter_client_quota, create_topic, decode_response,
                        fetch_request, frame, produce_errors, produce_request)

pytestmark = pytest.mark.system  # every test here starts a broker

MB = 1_000_000
QUOTA = {"pybroker.quota.burst.windows": "1"}  # a 1-window burst keeps 10 s measurements tight


def log_end(bootstrap, topic) -> int:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, client_id="probe")
    try:
        return consumer.end_offsets([TopicPartition(topic, 0)])[TopicPartition(topic, 0)]
    finally:
        consumer.close()


def measured_rate(bootstrap, topic, produce_forever, record_bytes=1000) -> float:
    """Bytes per second appended between 2 s and 12 s while `produce_forever(stop)` runs."""
    stop = threading.Event()
    thread = threading.Thread(target=produce_forever, args=(stop,))
    thread.start()
    try:
        time.sleep(2.0)  # past the initial burst
        start, started = log_end(bootstrap, topic), time.monotonic()
        time.sleep(10.0)  # the measured window itself
        end, ended = log_end(bootstrap, topic), time.monotonic()
    finally:
        stop.set()
        thread.join(60)
    return (end - start) * record_bytes / (ended - started)


@pytest.fixture(scope="module")
def broker():
    with BrokerProcess(workers=2, overrides=QUOTA) as running:
        address = running.listeners["PLAINTEXT"]
        for client in ("confluent", "aio", "kpy"):
            assert alter_client_quota(address, {"client-id": client}, "producer_byte_rate", MB) == 0
            create_topic(running.bootstrap, f"q-{client}")
        yield running


def test_confluent_kafka_is_held_to_its_byte_rate_without_timeouts(broker):
    from confluent_kafka import Producer

    errors = []
    # Batches of 100 KB: one batch past the quota is how far a throttle can overshoot.
    producer = Producer({"bootstrap.servers": broker.bootstrap, "client.id": "confluent",
                         "acks": 1, "linger.ms": 5, "batch.size": 100000,
                         "queue.buffering.max.kbytes": 2097151, "message.timeout.ms": 120000})

    def produce_forever(stop):  # offers 10 MB/s
        while not stop.is_set():
            for _ in range(100):
                try:
                    producer.produce("q-confluent", b"x" * 1000,
                                     on_delivery=lambda err, msg: err and errors.append(err))
                except BufferError:
                    producer.poll(0.01)
            producer.poll(0)
            time.sleep(0.01)

    rate = measured_rate(broker.bootstrap, "q-confluent", produce_forever)
    assert 0.9 * MB <= rate <= 1.1 * MB, rate
    assert errors == []  # no request timed out while held back
    producer.purge()  # the backlog offered beyond the quota is not this test's business
    producer.flush(10)
    assert broker.metric("broker_throttle_time_seconds_total", quota="producer_byte_rate") > 1


def test_aiokafka_is_held_to_its_byte_rate(broker):
    from aiokafka import AIOKafkaProducer

    failures = []

    def produce_forever(stop):
        async def run():
            producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, client_id="aio",
                                        request_timeout_ms=60000, linger_ms=5)
            await producer.start()
            try:
                pending = []
                while not stop.is_set():
                    pending.append(await producer.send("q-aio", b"x" * 1000))
                    if len(pending) >= 2000:
                        done = await asyncio.gather(*pending, return_exceptions=True)
                        failures.extend(r for r in done if isinstance(r, Exception))
                        pending = []
            finally:
                await producer.stop()

        asyncio.run(run())

    rate = measured_rate(broker.bootstrap, "q-aio", produce_forever)
    assert 0.9 * MB <= rate <= 1.1 * MB, rate
    assert failures == []


def test_kafka_python_honours_the_throttle_without_double_throttling(broker):
    from kafka import KafkaProducer

    def produce_forever(stop):
        # At most 1,000 records (1 MB) in flight: the backlog drains within the close's
        # timeout (a close that times out leaves a producer whose finalizer raises).
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, client_id="kpy", acks=1,
                                 linger_ms=5, request_timeout_ms=60000, max_block_ms=60000)
        pending = collections.deque()
        try:
            while not stop.is_set():
                pending.append(producer.send("q-kpy", b"x" * 1000))
                if len(pending) > 1000:
                    pending.popleft().get(timeout=60)
        finally:
            producer.close(timeout=15)

    # Were the client's own back-off and the broker's mute added up, the rate would halve.
    rate = measured_rate(broker.bootstrap, "q-kpy", produce_forever)
    assert 0.9 * MB <= rate <= 1.1 * MB, rate


def test_one_client_id_on_two_workers_gets_one_quota():
    with BrokerProcess(workers=2, overrides=QUOTA) as broker:
        address = broker.listeners["PLAINTEXT"]
        assert alter_client_quota(address, {"client-id": "test"}, "producer_byte_rate", 200_000) == 0
        create_topic(broker.bootstrap, "shared-quota")
        batch = make_batch(10, value_size=1000)  # ~10 KB per request

        def produce_forever(stop):
            def one_connection():  # consecutive connections land on different workers
                with KafkaSocket(address, timeout=30) as client:
                    while not stop.is_set():
                        client.send(produce_request("shared-quota", batch))
                        assert produce_errors(client.receive())[0][0] == 0

            threads = [threading.Thread(target=one_connection) for _ in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)

        rate = measured_rate(broker.bootstrap, "shared-quota", produce_forever,
                             record_bytes=len(batch) / 10)
        assert 0.85 * 200_000 <= rate <= 1.15 * 200_000, rate


def test_a_consumer_over_its_quota_gets_empty_throttled_fetches(tmp_path):
    overrides = dict(QUOTA, **{"pybroker.quota.max.throttle.ms": "400"})
    with BrokerProcess(workers=1, overrides=overrides, data_dir=str(tmp_path)) as broker:
        address = broker.listeners["PLAINTEXT"]
        create_topic(broker.bootstrap, "read")
        with KafkaSocket(address) as client:
            for n in range(20):
                client.send(produce_request("read", make_batch(5, value_size=1000), correlation_id=n))
                assert produce_errors(client.receive())[0][0] == 0
        assert alter_client_quota(address, {"client-id": "test"}, "consumer_byte_rate", 1000) == 0
        with KafkaSocket(address) as client:
            client.send(fetch_request("read", offset=0))
            _, first = decode_response(1, 12, client.receive())
            assert first.responses[0].partitions[0].records  # data, and a throttle earned
            assert 0 < first.throttle_time.total_seconds() <= 0.4
            started = time.monotonic()
            client.send(fetch_request("read", offset=0))
            _, second = decode_response(1, 12, client.receive())
            assert time.monotonic() - started >= 0.3  # read only after the mute
            assert second.responses == () and second.throttle_time.total_seconds() > 0
        assert "throttled client-id=test quota=consumer_byte_rate" in "\n".join(broker.lines)
    with BrokerProcess(workers=1, overrides=overrides, data_dir=str(tmp_path)) as restarted:
        from kafka.protocol.admin.client_quotas import DescribeClientQuotasRequest

        component = DescribeClientQuotasRequest.ComponentData
        request = DescribeClientQuotasRequest[1](strict=False, components=[
            component(entity_type="client-id", match_type=0, match="test")])
        request.with_header(correlation_id=1, client_id="admin")
        with KafkaSocket(restarted.listeners["PLAINTEXT"]) as client:
            client.send(frame(bytes(request.encode(header=True))))
            _, response = decode_response(48, 1, client.receive())
        assert [(e.entity[0].entity_name, e.values[0].key, e.values[0].value)
                for e in response.entries] == [("test", "consumer_byte_rate", 1000.0)]


def test_default_and_user_quotas_follow_kafkas_precedence(tmp_path):
    with BrokerProcess(workers=1, overrides=QUOTA, data_dir=str(tmp_path)) as broker:
        address = broker.listeners["PLAINTEXT"]
        assert alter_client_quota(address, {"client-id": None}, "producer_byte_rate", 50) == 0
        assert alter_client_quota(address, {"user": "ANONYMOUS", "client-id": "test"},
                                  "producer_byte_rate", 10_000_000) == 0
        assert alter_client_quota(address, {"client-id": "x"}, "nonsense", 1) == 42
        assert alter_client_quota(address, {"client-id": "x"}, "producer_byte_rate", -1) == 42
        create_topic(broker.bootstrap, "p")
        with KafkaSocket(address) as client:  # client id "test": the user+client level wins
            for n in range(5):
                client.send(produce_request("p", make_batch(10, value_size=1000), correlation_id=n))
                assert produce_errors(client.receive())[0][0] == 0
        assert broker.metric("broker_throttle_time_seconds_total", quota="producer_byte_rate") == 0


def test_request_percentage_throttles_a_busy_client():
    with BrokerProcess(workers=1, overrides=QUOTA) as broker:
        address = broker.listeners["PLAINTEXT"]
        assert alter_client_quota(address, {"client-id": "test"}, "request_percentage", 0.5) == 0
        create_topic(broker.bootstrap, "busy")
        with KafkaSocket(address, timeout=30) as client:  # client id "test": 0.5 % of a worker
            deadline = time.monotonic() + 20
            while broker.metric("broker_throttle_time_seconds_total",
                                quota="request_percentage") == 0:
                assert time.monotonic() < deadline, "never throttled"
                client.send(produce_request("busy", make_batch(50, value_size=1000)))
                assert produce_errors(client.receive())[0][0] == 0
        # The busiest named entities are visible with their measured rate, in percent: just
        # past a violation it is near the 0.5 % quota (it decays as the window grows, so the
        # bound leaves room; a unit error would be off by orders of magnitude).
        assert 0.25 < broker.metric("broker_quota_rate", quota="request_percentage",
                                    entity="client-id=test") < 50
