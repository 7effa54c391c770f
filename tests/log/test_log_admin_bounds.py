"""The log admin APIs (workers/apis/log_admin.py) under requests that repeat partitions or name
many: each partition is served once, the answer's size follows the distinct partitions and
their producers (bounded), and the work is sliced so other clients keep being answered.
Also the hand-encoded DescribeProducers answer (workers/producers_response.py) against kio's.
"""

import datetime
import threading
import time

import pytest
from kio.schema.errors import ErrorCode

from broker.shared.log.producers import ProducerState
from broker.shared.protocol.codec import build, encode_entity, response_class
from tests.harness import BrokerProcess
from tests.helpers import new_producers
from tests.wire import request
from tests.wire import KafkaSocket, api_versions_request, create_topic, decode_response, frame
from workers import producers_response

DESCRIBE_PRODUCERS, DELETE_RECORDS, DESCRIBE_LOG_DIRS = 61, 21, 35


# --- the hand-encoded answer ---------------------------------------------------------------


@pytest.mark.parametrize("topics", [
    [],
    [("t", [])],
    [("t", [(0, 0, None, [ProducerState(7, 1, 4, 1_700_000_000_000, -1)]),
            (3, 3, None, []), (1, 89, "ask again: ü", [])])],
    [("a", [(0, 0, None, [ProducerState(2**62, 32767, 2**31 - 1, 1, 2**40),
                          ProducerState(5, 0, -1, 0, 12)])]),
     ("b" * 300, [(2**31 - 1, 29, None, [])])],
])
def test_the_describe_producers_answer_is_the_one_kio_encodes(topics):
    kio_values = {"throttle_time": datetime.timedelta(0), "topics": [
        {"name": name, "partitions": [
            {"partition_index": index, "error_code": ErrorCode(code),
             "error_message": message, "active_producers": [
                 {"producer_id": state.producer_id, "producer_epoch": state.epoch,
                  "last_sequence": state.last_sequence, "last_timestamp": state.last_timestamp,
                  "coordinator_epoch": -1,
                  "current_txn_start_offset": state.current_txn_start_offset}
                 for state in states]}
            for index, code, message, states in partitions]}
        for name, partitions in topics]}
    expected = encode_entity(build(response_class(DESCRIBE_PRODUCERS, 0), kio_values))
    ours = producers_response.body([
        (name, [producers_response.partition(index, code, message, states)
                for index, code, message, states in partitions])
        for name, partitions in topics])
    assert ours == expected


# --- on a real broker ----------------------------------------------------------------------


def describe_producers(client: KafkaSocket, topics: list[tuple[str, list[int]]]):
    client.send(frame(request(DESCRIBE_PRODUCERS, 0, {"topics": [
        {"name": name, "partition_indexes": indexes} for name, indexes in topics]})))
    body = client.receive()
    return len(body), decode_response(DESCRIBE_PRODUCERS, 0, body)[1]


@pytest.mark.system
def test_describe_producers_answers_a_partition_named_99000_times_once_and_quickly():
    """Each entry took the partition's lock and walked its table in the worker's loop, and was
    answered in full: 99,000 entries of a partition with ten producers held another client's
    ApiVersions for ~10 s and made a 37.5 MB answer."""
    with BrokerProcess(workers=1) as broker:
        create_topic(broker.bootstrap, "dup", partitions=2)
        address = broker.listeners["PLAINTEXT"]
        with KafkaSocket(address, timeout=120) as client:
            new_producers([client], "dup", range(1, 11))
            waits, done = [], threading.Event()
            pinger = threading.Thread(target=_ping, args=(address, waits, done))
            pinger.start()
            try:
                time.sleep(0.2)  # the pinger is answered before the big request goes
                size, answer = describe_producers(client, [("dup", [0] * 49_500 + [1]),
                                                           ("dup", [0] * 49_500)])
            finally:
                done.set()
                pinger.join(30)
        print(f"answer {size} bytes; another client's ApiVersions: {len(waits)} answered, the "
              f"longest in {max(waits, default=0) * 1000:.0f} ms")
        assert size < 2048
        [topic] = answer.topics
        assert [part.partition_index for part in topic.partitions] == [0, 1]
        assert sorted(p.producer_id for p in topic.partitions[0].active_producers) == \
            list(range(1, 11))
        assert topic.partitions[1].active_producers == ()
        assert waits and max(waits) < 1.0, max(waits, default=None)


def _ping(address, waits: list, done: threading.Event) -> None:
    """ApiVersions one at a time until `done`, each round trip appended to `waits`."""
    with KafkaSocket(address, timeout=60) as client:
        for n in range(1_000_000):
            if done.is_set():
                return
            start = time.perf_counter()
            client.send(api_versions_request(3, correlation_id=n))
            client.receive()
            waits.append(time.perf_counter() - start)
            time.sleep(0.005)


@pytest.mark.system
def test_one_describe_producers_answer_is_bounded_by_the_request_entry_bound():
    """pybroker.request.max.entries partitions and producers per answer, the first partition
    whole; those past it get THROTTLING_QUOTA_EXCEEDED and are answered when asked again."""
    with BrokerProcess(workers=1, overrides={"pybroker.request.max.entries": "2000"}) as broker:
        create_topic(broker.bootstrap, "many", partitions=4)
        address = broker.listeners["PLAINTEXT"]
        with KafkaSocket(address, timeout=120) as client:
            for index in range(4):
                new_producers([client], "many", range(index * 1000, index * 1000 + 700),
                              partition=index)
            _, answer = describe_producers(client, [("many", [0, 1, 2, 3])])
            parts = answer.topics[0].partitions
            assert [(p.partition_index, p.error_code.value, len(p.active_producers))
                    for p in parts] == [(0, ErrorCode.none, 700), (1, ErrorCode.none, 700),
                                        (2, ErrorCode.throttling_quota_exceeded, 0),
                                        (3, ErrorCode.throttling_quota_exceeded, 0)]
            assert "pybroker.request.max.entries" in parts[2].error_message
            _, again = describe_producers(client, [("many", [2, 3])])
            assert [len(p.active_producers) for p in again.topics[0].partitions] == [700, 700]


@pytest.mark.system
def test_delete_records_serves_each_partition_once_with_the_last_offset_given():
    """As Kafka's map of partitions: one answer per partition, the last offset named wins
    (each entry was applied in turn, an fsync each, and answered)."""
    with BrokerProcess(workers=1) as broker:
        create_topic(broker.bootstrap, "trim", partitions=2)
        address = broker.listeners["PLAINTEXT"]
        with KafkaSocket(address, timeout=60) as client:
            new_producers([client], "trim", range(1, 11))
            entries = [{"partition_index": 0, "offset": offset} for offset in range(1, 9)]
            client.send(frame(request(DELETE_RECORDS, 2, {"timeout": datetime.timedelta(seconds=5), "topics": [
                {"name": "trim", "partitions": entries[:4] + [{"partition_index": 1,
                                                               "offset": 0}]},
                {"name": "trim", "partitions": entries[4:] + [{"partition_index": 0,
                                                               "offset": 6}]}]})))
            answer = decode_response(DELETE_RECORDS, 2, client.receive())[1]
        [topic] = answer.topics
        assert [(p.partition_index, p.low_watermark, p.error_code.value)
                for p in topic.partitions] == [(0, 6, ErrorCode.none), (1, 0, ErrorCode.none)]


@pytest.mark.system
def test_describe_log_dirs_adds_up_the_entries_of_a_topic_named_twice():
    """Kafka takes the set of partitions asked for; the second entry of a topic replaced the
    first here."""
    with BrokerProcess(workers=1) as broker:
        create_topic(broker.bootstrap, "dirs", partitions=3)
        with KafkaSocket(broker.listeners["PLAINTEXT"], timeout=60) as client:
            client.send(frame(request(DESCRIBE_LOG_DIRS, 4, {"topics": [
                {"topic": "dirs", "partitions": [0, 0, 2]},
                {"topic": "dirs", "partitions": [1, 2]}]})))
            answer = decode_response(DESCRIBE_LOG_DIRS, 4, client.receive())[1]
        described = sorted(p.partition_index for result in answer.results
                           for topic in result.topics if topic.name == "dirs"
                           for p in topic.partitions)
        assert described == [0, 1, 2]
