"""Produce refusals on the wire: the Kafka error code, and nothing stored; a batch refused
for some of its records names them (record_errors), as Kafka does."""

import time

import pytest
from kio.schema.errors import ErrorCode

from tests.batches import compressed, make_batch
from tests.harness import BrokerProcess
from tests.raw_batches import batch_of, record
from tests.wire import (KafkaSocket, decode_response, fetch_request, metadata_request,
                        produce_errors, produce_request)

pytestmark = pytest.mark.system  # every test here starts a broker


@pytest.fixture(scope="module")
def broker():
    overrides = {"auto.create.topics.enable": "false", "message.max.bytes": "2000"}
    with BrokerProcess(workers=1, overrides=overrides) as running:
        from kafka import KafkaAdminClient
        from kafka.admin import NewTopic

        admin = KafkaAdminClient(bootstrap_servers=running.bootstrap)
        admin.create_topics([NewTopic("t", num_partitions=1, replication_factor=1),
                             NewTopic("table", num_partitions=1, replication_factor=1,
                                      topic_configs={"cleanup.policy": "compact",
                                                     "max.message.bytes": "1048588"})])
        admin.close()
        yield running


def log_end(client, topic: str = "t") -> int:
    client.send(fetch_request(topic, offset=0, correlation_id=99))
    _, response = decode_response(1, 12, client.receive())
    return response.responses[0].partitions[0].high_watermark


def flip_last_byte(batch: bytes) -> bytes:
    return batch[:-1] + bytes([batch[-1] ^ 0xFF])


@pytest.mark.parametrize("records, topic, code", [
    (flip_last_byte(make_batch(2)), "t", ErrorCode.corrupt_message),
    (make_batch(1, value_size=3000), "t", ErrorCode.message_too_large),
    (make_batch(1) + make_batch(1), "t", ErrorCode.invalid_record),
    (make_batch(1), "missing", ErrorCode.unknown_topic_or_partition),
])
def test_refused_batches_leave_the_log_untouched(broker, records, topic, code):
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        before = log_end(client)
        client.send(produce_request(topic, records, correlation_id=5))
        assert produce_errors(client.receive()) == [(code, -1)]
        assert log_end(client) == before
        client.send(produce_request("t", make_batch(1), correlation_id=6))  # still usable
        assert produce_errors(client.receive()) == [(ErrorCode.none, before)]


def test_unknown_topic_is_not_created_when_auto_create_is_off(broker):
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        client.send(metadata_request(12, topics=["missing"]))
        _, response = decode_response(3, 12, client.receive())
        assert [(t.name, int(t.error_code)) for t in response.topics] == \
            [("missing", ErrorCode.unknown_topic_or_partition)]


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
        assert produce_errors(client.receive()) == [(ErrorCode.invalid_required_acks, -1)]


KEYLESS = (0, 7, 13)  # the records of `partly_keyless` without a key


def partly_keyless(codec: int = 0) -> bytes:
    records = b"".join(record(index, key=None if index in KEYLESS else b"k%d" % index)
                       for index in range(20))
    batch = batch_of(records, 20, int(time.time() * 1000))
    return compressed(batch, codec) if codec else batch


@pytest.mark.parametrize("version, codec", [(8, 0), (9, 0), (9, 4), (10, 3)])
def test_a_compacted_topic_names_each_record_without_a_key(broker, version, codec):
    """Kafka's record_errors (KIP-467): each keyless record's index in the batch and Kafka's
    message, INVALID_RECORD, Kafka's summary as error_message; nothing of the batch stored."""
    where = "Compacted topic cannot accept message without key in topic partition table-0"
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        before = log_end(client, "table")
        client.send(produce_request("table", partly_keyless(codec), correlation_id=11,
                                    version=version))
        _, response = decode_response(0, version, client.receive())
        (answer,) = response.responses[0].partition_responses
        assert (answer.error_code, answer.base_offset, answer.log_start_offset) == \
            (ErrorCode.invalid_record, -1, 0)
        assert [(error.batch_index, error.batch_index_error_message)
                for error in answer.record_errors] == [(index, where) for index in KEYLESS]
        assert answer.error_message == (
            "One or more records have been rejected due to 3 record errors in total, and only "
            "showing the first three errors at most: [" + ", ".join(
                f"RecordError(batchIndex={index}, message='{where}')" for index in KEYLESS)
            + "]")
        assert log_end(client, "table") == before


@pytest.mark.parametrize("batching", ["one batch", "a batch each"])
def test_confluent_kafka_fails_exactly_the_records_without_a_key(broker, batching):
    """librdkafka's own test (0011, test_message_single_partition_record_fail): in one batch,
    the keyless records fail with INVALID_RECORD and the others with _INVALID_DIFFERENT_RECORD;
    a batch each, only the keyless ones fail."""
    from confluent_kafka import KafkaError, Producer

    settings = {"bootstrap.servers": broker.bootstrap, "linger.ms": 200,
                "message.timeout.ms": 10000}
    if batching == "a batch each":
        settings["batch.size"] = 1
    producer = Producer(settings)
    outcomes: list = []
    for index in range(100):
        producer.produce("table", value=b"v%d" % index, partition=0,
                         key=None if index % 10 == 0 else b"k%d" % index,
                         on_delivery=lambda error, message: outcomes.append(
                             (message.key() is None, error and error.code())))
    assert producer.flush(30) == 0
    keyless = [code for without_key, code in outcomes if without_key]
    keyed = [code for without_key, code in outcomes if not without_key]
    assert keyless == [KafkaError.INVALID_RECORD] * 10
    expected = KafkaError._INVALID_DIFFERENT_RECORD if batching == "one batch" else None
    assert keyed == [expected] * 90


def test_the_records_listed_are_bounded_and_all_are_counted(broker):
    """5,000 keyless records in one small compressed batch: RECORD_ERRORS of them listed (the
    answer's size and encoding time do not follow what a batch expands to), all counted."""
    from broker.shared.log.record_errors import RECORD_ERRORS

    records = b"".join(record(index, key=None) for index in range(5000))
    batch = compressed(batch_of(records, 5000, int(time.time() * 1000)), 4)
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        client.send(produce_request("table", batch, correlation_id=12))
        _, response = decode_response(0, 9, client.receive())
    (answer,) = response.responses[0].partition_responses
    assert answer.error_code == ErrorCode.invalid_record
    assert [error.batch_index for error in answer.record_errors] == list(range(RECORD_ERRORS))
    assert answer.error_message.startswith(
        "One or more records have been rejected due to 5000 record errors in total")
