"""Produce refusals on the wire: the Kafka error code, and nothing stored."""

import pytest

from tests.batches import make_batch
from tests.harness import BrokerProcess
from tests.wire import (KafkaSocket, decode_response, fetch_request, metadata_request,
                        produce_errors, produce_request)

pytestmark = pytest.mark.system  # every test here starts a broker

CORRUPT_MESSAGE, MESSAGE_TOO_LARGE, UNKNOWN_TOPIC, INVALID_RECORD = 2, 10, 3, 87


@pytest.fixture(scope="module")
def broker():
    overrides = {"auto.create.topics.enable": "false", "message.max.bytes": "2000"}
    with BrokerProcess(workers=1, overrides=overrides) as running:
        from kafka import KafkaAdminClient
        from kafka.admin import NewTopic

        admin = KafkaAdminClient(bootstrap_servers=running.bootstrap)
        admin.create_topics([NewTopic("t", num_partitions=1, replication_factor=1)])
        admin.close()
        yield running


def log_end(client) -> int:
    client.send(fetch_request("t", offset=0, correlation_id=99))
    _, response = decode_response(1, 12, client.receive())
    return response.responses[0].partitions[0].high_watermark


def flip_last_byte(batch: bytes) -> bytes:
    return batch[:-1] + bytes([batch[-1] ^ 0xFF])


@pytest.mark.parametrize("records, topic, code", [
    (flip_last_byte(make_batch(2)), "t", CORRUPT_MESSAGE),
    (make_batch(1, value_size=3000), "t", MESSAGE_TOO_LARGE),
    (make_batch(1) + make_batch(1), "t", INVALID_RECORD),
    (make_batch(1), "missing", UNKNOWN_TOPIC),
])
def test_refused_batches_leave_the_log_untouched(broker, records, topic, code):
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        before = log_end(client)
        client.send(produce_request(topic, records, correlation_id=5))
        assert produce_errors(client.receive()) == [(code, -1)]
        assert log_end(client) == before
        client.send(produce_request("t", make_batch(1), correlation_id=6))  # still usable
        assert produce_errors(client.receive()) == [(0, before)]


def test_unknown_topic_is_not_created_when_auto_create_is_off(broker):
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        client.send(metadata_request(12, topics=["missing"]))
        _, response = decode_response(3, 12, client.receive())
        assert [(t.name, int(t.error_code)) for t in response.topics] == [("missing", UNKNOWN_TOPIC)]


def test_acks_0_gets_no_response_and_a_failure_closes_the_connection(broker):
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        before = log_end(client)
        client.send(produce_request("t", make_batch(3), acks=0, correlation_id=7))
        assert log_end(client) == before + 3  # the next answer is the fetch's, not the produce's
        client.send(produce_request("missing", make_batch(1), acks=0, correlation_id=8))
        assert client.is_closed_by_peer()
    assert broker.metric("broker_invalid_requests_total", reason="produce_failed") == 1


def test_invalid_acks_is_refused(broker):
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        client.send(produce_request("t", make_batch(1), acks=2, correlation_id=9))
        assert produce_errors(client.receive()) == [(21, -1)]  # INVALID_REQUIRED_ACKS
