"""Produce and record timestamps on the wire: the topic's message.timestamp.type decides, never
the client's LogAppendTime attribute, and a timestamp past 64 bits is refused, not a crash."""

import time

import pytest
from kio.schema.errors import ErrorCode

from tests.harness import BrokerProcess
from tests.raw_batches import LOG_APPEND_TIME, HEADER, batch_of, record
from tests.wire import KafkaSocket, decode_response, fetch_request, produce_batch, produce_request

pytestmark = pytest.mark.system  # every test here starts a broker

HOUR_MS = 3_600_000
INT64_MAX, INT64_MIN = 2**63 - 1, -(2**63)


@pytest.fixture(scope="module")
def broker():
    with BrokerProcess(workers=1) as running:
        from kafka import KafkaAdminClient
        from kafka.admin import NewTopic

        bounded = {"message.timestamp.before.max.ms": str(HOUR_MS),
                   "message.timestamp.after.max.ms": str(HOUR_MS)}
        admin = KafkaAdminClient(bootstrap_servers=running.bootstrap)
        admin.create_topics([
            NewTopic("bounded", 1, 1, topic_configs=bounded),
            NewTopic("unbounded", 1, 1),  # the defaults: any timestamp
            NewTopic("stamped", 1, 1, topic_configs={"message.timestamp.type": "LogAppendTime"}),
        ])
        admin.close()
        yield running


def now_ms() -> int:
    return int(time.time() * 1000)


def produce_answered(broker, topic: str, batch: bytes) -> tuple[int, int]:
    """(error code, base offset); the connection must still answer afterwards."""
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        answer = produce_batch(client, topic, batch, correlation_id=3)
        client.send(fetch_request(topic, correlation_id=4))
        decode_response(1, 12, client.receive())
        return answer


def stored_header(broker, topic: str, offset: int):
    """(attributes, base timestamp, max timestamp) of the batch stored at `offset`."""
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        client.send(fetch_request(topic, offset=offset, correlation_id=5))
        _, response = decode_response(1, 12, client.receive())
        fields = HEADER.unpack_from(response.responses[0].partitions[0].records, 0)
        return fields[5], fields[7], fields[8]


def client_stamped(stamps: list[int], max_timestamp: int | None = None) -> bytes:
    """A batch whose client set the LogAppendTime attribute; records stamped `stamps`."""
    base = stamps[0]
    records = b"".join(record(index, stamp - base) for index, stamp in enumerate(stamps))
    return batch_of(records, len(stamps), base,
                    max(stamps) if max_timestamp is None else max_timestamp,
                    attributes=LOG_APPEND_TIME)


def test_a_client_log_append_time_attribute_does_not_bypass_the_bounds(broker):
    """Kafka reads such a batch's max timestamp as every record's, and checks it."""
    assert produce_answered(broker, "bounded", client_stamped([1000, 2000])) == \
        (ErrorCode.invalid_timestamp, -1)


def test_records_stored_as_create_time_are_checked_as_create_time(broker):
    """The max timestamp is within the bounds, the records (what readers see once the
    attribute is cleared) are not."""
    stale = client_stamped([1000, 2000], max_timestamp=now_ms())
    assert produce_answered(broker, "bounded", stale) == (ErrorCode.invalid_timestamp, -1)


def test_a_create_time_topic_stores_a_client_log_append_time_batch_as_create_time(broker):
    now = now_ms()
    code, offset = produce_answered(broker, "bounded",
                                    client_stamped([now - 5, now - 9], now + 1000))
    assert code == ErrorCode.none
    attributes, base, greatest = stored_header(broker, "bounded", offset)
    assert attributes & LOG_APPEND_TIME == 0
    assert (base, greatest) == (now - 5, now - 5)  # the records' greatest, not the client's


def test_log_append_time_set_by_a_client_is_refused_as_kafka_refuses_it(broker):
    now = now_ms()
    assert produce_answered(broker, "stamped", client_stamped([now])) == \
        (ErrorCode.invalid_timestamp, -1)
    no_max = client_stamped([now], max_timestamp=-1)
    assert produce_answered(broker, "unbounded", no_max) == (ErrorCode.invalid_timestamp, -1)


def test_a_log_append_time_topic_still_stamps_plain_batches(broker):
    before = now_ms()
    code, offset = produce_answered(broker, "stamped", batch_of(record(0), 1, 1000))
    assert code == ErrorCode.none
    attributes, _, stamp = stored_header(broker, "stamped", offset)
    assert attributes & LOG_APPEND_TIME and stamp >= before


@pytest.mark.parametrize("base, deltas", [
    (INT64_MAX, [0, 1]),  # the greatest timestamp is 2**63
    (INT64_MIN, [0, -1]),  # the least is -2**63 - 1
    (INT64_MAX - 5, [-2**63, 2**63 - 1]),  # a delta of each extreme
])
def test_a_timestamp_past_64_bits_is_refused_and_the_connection_stays(broker, base, deltas):
    records = b"".join(record(index, delta) for index, delta in enumerate(deltas))
    batch = batch_of(records, len(deltas), base, max_timestamp=base)
    assert produce_answered(broker, "unbounded", batch) == (ErrorCode.invalid_timestamp, -1)


def test_the_extremes_of_64_bits_are_stored(broker):
    records = record(0, INT64_MIN) + record(1, INT64_MAX)
    code, offset = produce_answered(broker, "unbounded", batch_of(records, 2, 0, 0))
    assert code == ErrorCode.none
    assert stored_header(broker, "unbounded", offset)[1:] == (0, INT64_MAX)


def test_compressed_batches_are_held_to_the_same_rules(broker):
    import cramjam

    body = bytes(cramjam.zstd.compress(record(0, 0) + record(1, 1)))
    overflowing = batch_of(body, 2, INT64_MAX, attributes=4)
    assert produce_answered(broker, "unbounded", overflowing) == (ErrorCode.invalid_timestamp, -1)
    body = bytes(cramjam.zstd.compress(record(0, 0)))
    stale = batch_of(body, 1, 1000, now_ms(), attributes=4 | LOG_APPEND_TIME)
    assert produce_answered(broker, "bounded", stale) == (ErrorCode.invalid_timestamp, -1)


def test_a_record_without_a_timestamp_hides_no_other_from_the_bounds(broker):
    """Records stamped -1 (none) are not checked, as in Kafka; the others are, even when -1
    is the least of the batch."""
    now = now_ms()
    stale = batch_of(record(0, 0) + record(1, 1) + record(2, now + 1), 3, -1,
                     max_timestamp=now)  # stamps -1, 0 and now: 0 is neither least nor greatest
    assert produce_answered(broker, "bounded", stale) == (ErrorCode.invalid_timestamp, -1)
    fresh = batch_of(record(0, 0) + record(1, now + 1), 2, -1, max_timestamp=now)
    assert produce_answered(broker, "bounded", fresh)[0] == ErrorCode.none


def refused_records(broker, topic: str, batch: bytes):
    """(error code, error_message, [(batch index, message)]) of a Produce v9 answer."""
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        client.send(produce_request(topic, batch, correlation_id=6))
        _, response = decode_response(0, 9, client.receive())
        (answer,) = response.responses[0].partition_responses
        return answer.error_code, answer.error_message, [
            (error.batch_index, error.batch_index_error_message)
            for error in answer.record_errors]


def test_each_record_out_of_bounds_is_named_as_kafka_names_it(broker):
    """Kafka's record_errors for message.timestamp.before/after.max.ms: the index and
    timestamp of each record out of bounds (the one without a timestamp is not checked)."""
    now = now_ms()
    stamps = [now, now - 2 * HOUR_MS, now, -1, now + 2 * HOUR_MS, now]
    records = b"".join(record(index, stamp - now) for index, stamp in enumerate(stamps))
    code, message, listed = refused_records(broker, "bounded", batch_of(records, 6, now))
    assert (code, message) == (ErrorCode.invalid_timestamp,
                               "One or more records have been rejected due to invalid timestamp")
    assert [index for index, _ in listed] == [1, 4]
    for index, text in listed:
        prefix = f"Timestamp {stamps[index]} of message with offset {index} is out of range. " \
                 f"The timestamp should be within ["
        assert text.startswith(prefix), text
        low, high = map(int, text[len(prefix):-1].split(", "))
        assert high - low == 2 * HOUR_MS and low <= now - HOUR_MS + 60_000


def test_a_client_log_append_time_attribute_fails_every_record(broker):
    code, message, listed = refused_records(broker, "stamped", client_stamped([now_ms()] * 3))
    assert (code, message) == (ErrorCode.invalid_timestamp,
                               "One or more records have been rejected due to invalid timestamp")
    assert listed == [(index, f"Invalid timestamp type in message with offset {index}. Producer "
                              f"should not set timestamp type to LogAppendTime.")
                      for index in range(3)]
