"""compression.type on topics and on the broker: batches stored in the topic's codec (a batch
in another codec recompressed at append, as Kafka does), read back whole by real consumers,
idempotent producers unaffected, and a batch grown past max.message.bytes refused."""

import time

import pytest
from kio.schema.errors import ErrorCode

from broker.shared.log import records
from tests.batches import compressed, make_batch
from tests.harness import BrokerProcess
from tests.wire import KafkaSocket, decode_response, fetch_request, produce_batch

pytestmark = pytest.mark.system  # every test here starts a broker

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
TOPICS = {  # name: (its own configs, the codec its batches are stored in; None: as produced)
    "as-produced": ({"compression.type": "producer"}, None),
    "zstd": ({"compression.type": "zstd", "max.message.bytes": str(4 << 20)}, ZSTD),
    "gzip": ({"compression.type": "gzip", "compression.gzip.level": "9"}, GZIP),
    "snappy": ({"compression.type": "snappy"}, SNAPPY),
    "uncompressed": ({"compression.type": "uncompressed", "max.message.bytes": "20000"}, NONE),
    "broker-default": ({}, LZ4),  # the broker's compression.type
}


@pytest.fixture(scope="module")
def broker():
    with BrokerProcess(workers=1, overrides={"compression.type": "lz4"}) as running:
        from kafka import KafkaAdminClient
        from kafka.admin import NewTopic

        admin = KafkaAdminClient(bootstrap_servers=running.bootstrap)
        admin.create_topics([NewTopic(name, 1, 1, topic_configs=own)
                             for name, (own, _codec) in TOPICS.items()]
                            + [NewTopic("zstd-3", 3, 1, topic_configs={"compression.type": "zstd"})])
        admin.close()
        yield running


def stored(client, topic: str, offset: int) -> bytes:
    """The batch stored at `offset`, as a Fetch answers it."""
    client.send(fetch_request(topic, offset=offset, correlation_id=2))
    _, response = decode_response(1, 12, client.receive())
    data = response.responses[0].partitions[0].records
    header = next(records.headers_in(data))
    assert header.base_offset == offset
    return bytes(data[:header.size])


def records_of(batch: bytes) -> bytes:
    header = records.read_header(batch, 0)
    body, codec = batch[records.HEADER_BYTES:header.size], header.attributes & 7
    return bytes(records.decompress(codec, body, 1 << 26)) if codec else body


@pytest.mark.parametrize("topic", list(TOPICS))
@pytest.mark.parametrize("codec", [NONE, LZ4, ZSTD, GZIP])
def test_batches_are_stored_in_the_topics_codec(broker, topic, codec):
    """The stored batch's codec is the topic's; its records, count, timestamps and producer
    fields are the produced ones; a Fetch reads it whole (CRC and all)."""
    plain = make_batch(5, producer_id=-1)
    sent = compressed(plain, codec) if codec else plain
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        code, offset = produce_batch(client, topic, sent)
        assert code == ErrorCode.none
        batch = stored(client, topic, offset)
    header, original = records.read_header(batch, 0), records.read_header(sent, 0)
    expected = TOPICS[topic][1]
    assert header.attributes & 7 == (codec if expected is None else expected)
    assert records.is_sound(batch, 0, len(batch)) == header
    assert records_of(batch) == plain[records.HEADER_BYTES:]
    assert header._replace(base_offset=0, size=0, attributes=0) == \
        original._replace(size=0, attributes=0)


def test_a_topics_codec_can_be_changed_and_is_described(broker):
    from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry,
                                       ConfigResource)

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource("topic", "as-produced")
    described = admin.describe_configs([resource])[resource].result(timeout=20)
    assert described["compression.type"].value == "producer"
    assert described["compression.zstd.level"].value == "3"
    resource = ConfigResource("topic", "as-produced", incremental_configs=[
        ConfigEntry("compression.type", "zstd", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("compression.zstd.level", "19",
                    incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(timeout=20)
    try:
        with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
            deadline = time.monotonic() + 10  # every process applies it at its next look
            while True:
                code, offset = produce_batch(client, "as-produced", make_batch(3))
                assert code == ErrorCode.none
                if records.read_header(stored(client, "as-produced", offset), 0).attributes \
                        & 7 == ZSTD or time.monotonic() > deadline:
                    break
            assert records.read_header(stored(client, "as-produced", offset), 0).attributes \
                & 7 == ZSTD
    finally:
        resource = ConfigResource("topic", "as-produced", incremental_configs=[
            ConfigEntry("compression.type", "producer",
                        incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([resource])[resource].result(timeout=20)


@pytest.mark.parametrize("topic, producer_codec", [("zstd", "none"), ("gzip", "lz4")])
def test_consumers_read_every_record_back_whole(broker, topic, producer_codec):
    """Keys, values, headers and timestamps, through a real producer and consumer."""
    from confluent_kafka import Consumer, Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20,
                         "compression.type": producer_codec})
    stamp = int(time.time() * 1000) - 5000
    prefix = producer_codec.encode() + b"-"  # this test's records among the topic's
    sent = [(prefix + b"%d" % index, b"value %d " % index * 20, [("h", b"%d" % index)],
             stamp + index) for index in range(300)]
    for key, value, headers, when in sent:
        producer.produce(topic, key=key, value=value, headers=headers, timestamp=when,
                         partition=0)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"read-{topic}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.assign([_partition(topic)])
    got = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(got) < len(sent):
        message = consumer.poll(0.5)
        if message is not None and not message.error() and message.key() is not None \
                and message.key().startswith(prefix):
            got.append((message.key(), message.value(), message.headers(),
                        message.timestamp()[1]))
    consumer.close()
    assert got == sent


def _partition(topic: str):
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    return TopicPartition(topic, 0, OFFSET_BEGINNING)


def test_an_idempotent_producer_keeps_its_sequence_through_recompression(broker):
    """The recompressed batch keeps producer id, epoch and sequence: a retry gets its first
    offset back, a gap is refused, and a real idempotent producer delivers every record once."""
    from confluent_kafka import Producer

    batch = make_batch(4, producer_id=777, epoch=0, sequence=0)
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        code, offset = produce_batch(client, "zstd", batch)
        assert code == ErrorCode.none
        # A duplicate: no error, and the offset the first one got.
        assert produce_batch(client, "zstd", batch, correlation_id=3) == (ErrorCode.none, offset)
        gap = make_batch(1, producer_id=777, epoch=0, sequence=9)
        assert produce_batch(client, "zstd", gap, correlation_id=4)[0] == \
            ErrorCode.out_of_order_sequence_number
        header = records.read_header(stored(client, "zstd", offset), 0)
    assert (header.producer_id, header.producer_epoch, header.base_sequence,
            header.attributes & 7) == (777, 0, 0, ZSTD)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True,
                         "compression.type": "lz4", "linger.ms": 5})
    delivered = []
    for index in range(2000):
        producer.produce("zstd", value=b"%d" % index, partition=0,
                         on_delivery=lambda error, message: delivered.append(
                             (error, message.offset())))
    assert producer.flush(30) == 0
    assert [error for error, _ in delivered] == [None] * 2000
    offsets = [where for _, where in delivered]
    assert offsets == list(range(offsets[0], offsets[0] + 2000))


def test_a_large_batch_is_recompressed_in_slices(broker):
    """Records past one slice of recompression (the request waits in the worker's queue)."""
    plain = make_batch(3000, value_size=1000)
    assert len(plain) > 3 * records.COMPRESS_SLICE
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        code, offset = produce_batch(client, "zstd", plain)
        assert code == ErrorCode.none
        batch = stored(client, "zstd", offset)
    assert records.read_header(batch, 0).attributes & 7 == ZSTD and len(batch) < len(plain)
    assert records_of(batch) == plain[records.HEADER_BYTES:]


def test_a_request_over_many_partitions_is_recompressed_a_slice_at_a_time(broker):
    """Three partitions' batches, more than one slice of records in all (the request waits in
    the worker's queue): each appended in the topic's codec, the request answered whole."""
    from kafka.protocol.producer.produce import ProduceRequest

    from tests.wire import frame

    sent = [make_batch(200, value_size=1000, key_prefix=b"p%d-" % index) for index in range(3)]
    data = ProduceRequest.TopicProduceData
    request = ProduceRequest[9](transactional_id=None, acks=1, timeout_ms=5000, topic_data=[
        data(name="zstd-3", partition_data=[data.PartitionProduceData(index=index, records=batch)
                                            for index, batch in enumerate(sent)])])
    request.with_header(correlation_id=5, client_id="test")
    assert sum(map(len, sent)) > records.COMPRESS_SLICE
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        client.send(frame(bytes(request.encode(header=True))))
        _, response = decode_response(0, 9, client.receive())
        answers = [(answer.index, int(answer.error_code), answer.base_offset)
                   for answer in response.responses[0].partition_responses]
        assert [index for index, _, _ in answers] == [0, 1, 2]
        assert all(code == ErrorCode.none for _, code, _ in answers), answers
        for (index, _, offset), batch in zip(answers, sent):
            client.send(fetch_request("zstd-3", offset=offset, partition=index,
                                      correlation_id=6))
            _, fetched = decode_response(1, 12, client.receive())
            data_read = fetched.responses[0].partitions[0].records
            stored_batch = bytes(data_read[:next(records.headers_in(data_read)).size])
            assert records.read_header(stored_batch, 0).attributes & 7 == ZSTD
            assert records_of(stored_batch) == batch[records.HEADER_BYTES:]


def test_a_batch_grown_past_max_message_bytes_is_refused(broker):
    """A compressed batch within the topic's max.message.bytes whose records, stored
    uncompressed, would not be: MESSAGE_TOO_LARGE, as Kafka checks a recompressed batch."""
    dense = compressed(make_batch(100, value_size=1000), ZSTD)
    assert len(dense) < 20000 < len(records_of(dense))
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        assert produce_batch(client, "uncompressed", dense) == (ErrorCode.message_too_large, -1)
        assert produce_batch(client, "uncompressed", compressed(make_batch(3), ZSTD))[0] == ErrorCode.none
