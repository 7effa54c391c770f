"""Share groups of KIP-932 with a real client: confluent-kafka's ShareConsumer (librdkafka's
ShareGroupHeartbeat, ShareFetch and ShareAcknowledge v1).  Several members read one partition
and each record goes to one of them; explicit acknowledgement releases (delivered again, its
delivery count up), rejects (never again) and reaches the delivery limit (archived); a lock
that runs out gives the record to another member; a broker restart delivers again what was
acquired and not acknowledged, never what was accepted."""

import threading
import time

import pytest
from kio.schema.errors import ErrorCode

from tests.harness import BrokerProcess, wait_until
from tests.helpers import free_port, produce
from tests.wire import KafkaSocket, create_topic, decode_response, frame, request

pytestmark = pytest.mark.system  # every test here starts a broker

BROKER_OVERRIDES = {"group.share.heartbeat.interval.ms": "300",
                    "group.share.min.heartbeat.interval.ms": "100",
                    "group.share.delivery.count.limit": "2",
                    "group.share.record.lock.duration.ms": "1500",
                    "group.share.min.record.lock.duration.ms": "1000"}


def ask(address, api_key: int, version: int, values: dict):
    with KafkaSocket(address) as sock:
        sock.send(frame(request(api_key, version, values)))
        return decode_response(api_key, version, sock.receive())[1]


def start_at_earliest(broker, group: str, topic: str, partitions: int) -> None:
    """AlterShareGroupOffsets to 0 (what kafka-share-groups --reset-offsets does): the group
    reads the topic from its start, not only what is produced after it joined."""
    answer = ask(broker.listeners["PLAINTEXT"], 91, 0, {"group_id": group, "topics": [
        {"topic_name": topic, "partitions": [{"partition_index": p, "start_offset": 0}
                                             for p in range(partitions)]}]})
    assert answer.error_code == ErrorCode.none
    assert {p.error_code for t in answer.responses for p in t.partitions} == {ErrorCode.none}


def start_offset(broker, group: str, topic: str, partition: int = 0) -> int:
    answer = ask(broker.listeners["PLAINTEXT"], 90, 1, {"groups": [
        {"group_id": group, "topics": [{"topic_name": topic, "partitions": [partition]}]}]})
    return answer.groups[0].topics[0].partitions[0].start_offset


def share_consumer(broker, group: str, explicit: bool = False, **config):
    from confluent_kafka import ShareConsumer

    return ShareConsumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                          "share.acknowledgement.mode": "explicit" if explicit else "implicit",
                          "fetch.wait.max.ms": 100, **config})


def poll_values(consumer, seconds: float, until: int | None = None) -> list:
    """Messages polled for up to `seconds` (or until `until` of them)."""
    got, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline and (until is None or len(got) < until):
        got += [m for m in consumer.poll(0.1) or [] if m.error() is None]
    return got


class Reader(threading.Thread):
    """An implicit-mode share consumer in its own thread (the client is not thread-safe)."""

    def __init__(self, broker, group: str, topic: str, seen: list):
        super().__init__(daemon=True)
        self.broker, self.group, self.topic, self.seen = broker, group, topic, seen
        self.stop_event = threading.Event()
        self.failure = None

    def run(self):
        try:
            consumer = share_consumer(self.broker, self.group, **{"max.poll.records": 5})
            consumer.subscribe([self.topic])
            while not self.stop_event.is_set():
                for message in consumer.poll(0.1) or []:
                    if message.error() is None:
                        self.seen.append((message.value().decode(), self.name))
            consumer.close()
        except BaseException as error:  # reported by the test
            self.failure = error

    def finish(self):
        self.stop_event.set()
        self.join(30)
        assert not self.is_alive() and self.failure is None, self.failure


def test_members_share_one_partition_and_each_record_goes_to_one(broker):
    topic, group = "queue-one", "queue-one-readers"
    create_topic(broker.bootstrap, topic, 1)
    start_at_earliest(broker, group, topic, 1)
    seen: list = []
    readers = [Reader(broker, group, topic, seen) for _ in range(3)]
    for reader in readers:
        reader.start()
    expected = [f"r{n}" for n in range(300)]
    for chunk in range(0, 300, 30):  # while the three are reading
        produce(broker.bootstrap, topic, expected[chunk:chunk + 30])
    wait_until(lambda: len(seen) >= 300, timeout=30, message=f"{len(seen)} of 300 read")
    time.sleep(0.3)  # room for a record delivered twice to show up
    for reader in readers:
        reader.finish()
    assert sorted(value for value, _ in seen) == sorted(expected)
    readers_that_read = {name for _, name in seen}
    assert readers_that_read == {reader.name for reader in readers}, "a member got nothing"
    wait_until(lambda: start_offset(broker, group, topic) == 300, timeout=10)


def test_release_reject_and_the_delivery_limit(broker):
    from confluent_kafka import AcknowledgeType

    topic, group = "queue-acks", "queue-acks-readers"
    create_topic(broker.bootstrap, topic, 1)
    start_at_earliest(broker, group, topic, 1)
    produce(broker.bootstrap, topic, ["accepted", "released", "rejected"])
    consumer = share_consumer(broker, group, explicit=True)
    consumer.subscribe([topic])
    first = poll_values(consumer, 15, until=3)
    assert [(m.value(), m.delivery_count()) for m in first] == [
        (b"accepted", 1), (b"released", 1), (b"rejected", 1)]
    for message, verdict in zip(first, (AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE,
                                        AcknowledgeType.REJECT)):
        consumer.acknowledge(message, verdict)
    consumer.commit_sync()
    again = poll_values(consumer, 10, until=1)
    assert [(m.value(), m.delivery_count()) for m in again] == [(b"released", 2)]
    consumer.acknowledge(again[0], AcknowledgeType.RELEASE)  # its second: the limit
    consumer.commit_sync()
    assert poll_values(consumer, 1.5) == []  # archived: never delivered again
    consumer.close()
    assert start_offset(broker, group, topic) == 3


def test_a_lock_that_runs_out_gives_the_record_to_another_member(broker):
    topic, group = "queue-locks", "queue-locks-readers"
    create_topic(broker.bootstrap, topic, 1)
    start_at_earliest(broker, group, topic, 1)
    produce(broker.bootstrap, topic, ["slow"])
    holder = share_consumer(broker, group, explicit=True)
    holder.subscribe([topic])
    held = poll_values(holder, 15, until=1)
    assert [(m.value(), m.delivery_count()) for m in held] == [(b"slow", 1)]
    other = share_consumer(broker, group)
    other.subscribe([topic])
    taken = poll_values(other, 15, until=1)  # after the holder's 1.5 s lock
    assert [(m.value(), m.delivery_count()) for m in taken] == [(b"slow", 2)]
    holder.acknowledge(held[0])
    outcome = holder.commit_sync()  # too late: another member has it
    assert any(error is not None for error in outcome.values()), outcome
    other.close()
    holder.close()


def test_a_restart_redelivers_what_was_acquired_and_not_what_was_accepted(tmp_path):
    port = free_port()
    overrides = dict(BROKER_OVERRIDES, listeners=f"PLAINTEXT://127.0.0.1:{port}",
                     **{"group.share.record.lock.duration.ms": "30000"})
    broker = BrokerProcess(workers=2, overrides=overrides, data_dir=str(tmp_path)).start()
    try:
        topic, group = "queue-durable", "queue-durable-readers"
        create_topic(broker.bootstrap, topic, 1)
        start_at_earliest(broker, group, topic, 1)
        produce(broker.bootstrap, topic, [f"d{n}" for n in range(6)])
        consumer = share_consumer(broker, group, explicit=True)
        consumer.subscribe([topic])
        got = poll_values(consumer, 15, until=6)
        assert len(got) == 6
        for message in got[:3]:
            consumer.acknowledge(message)
        consumer.commit_sync()  # d0-d2 accepted; d3-d5 held, their locks 30 s
        broker.kill()  # no clean shutdown: the consumer never gets to release anything
        broker.start()
        after = share_consumer(broker, group)
        after.subscribe([topic])
        redelivered = poll_values(after, 15, until=3)
        assert sorted((m.value(), m.delivery_count()) for m in redelivered) == [
            (b"d3", 2), (b"d4", 2), (b"d5", 2)]
        assert poll_values(after, 1) == []
        after.close()
        consumer.close()
    finally:
        broker.stop()
