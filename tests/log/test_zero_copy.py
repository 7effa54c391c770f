"""Zero-copy fetch on a real broker: answers sent from the segment files by
os.sendfile keep their order with other answers, carry exactly the segment's bytes, and
release everything when a client goes away mid-answer or the topic is deleted under it.

The broker's send buffer is small (64 KiB; smaller, delayed ACKs slow loopback to a crawl), so
answers of megabytes are sent in many steps (the sender waits for the socket to drain).
"""

import datetime
import os
import socket
import struct
import time

import pytest
from kio.schema.errors import ErrorCode

from broker.shared.log import records
from tests.batches import make_batch
from tests.harness import BrokerProcess
from tests.wire import request
from tests.wire import (KafkaSocket, api_versions_request, create_topic, decode_response, frame,
                        metadata_request, produce_errors, produce_request)

BATCHES = 24  # of 64 records of 4000 bytes: about 6 MiB per topic
FETCH_VERSION = 12

pytestmark = pytest.mark.system


@pytest.fixture(scope="module")
def broker():
    overrides = {"socket.send.buffer.bytes": "65536", "auto.create.topics.enable": "false",
                 "log.segment.bytes": str(4 << 20)}  # the answers span two segments
    with BrokerProcess(workers=2, overrides=overrides) as running:
        yield running


def fill(broker, topic: str) -> bytes:
    """Create `topic`, append BATCHES batches; the partition's bytes as the log holds them."""
    create_topic(broker.bootstrap, topic)
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        for _ in range(BATCHES):
            client.send(produce_request(topic, make_batch(64, value_size=4000)))
            assert produce_errors(client.receive())[0][0] == ErrorCode.none
    return segment_bytes(broker, topic)


def segment_bytes(broker, topic: str) -> bytes:
    directory = os.path.join(broker.data_dir, "logs", f"{topic}-0")
    names = sorted(name for name in os.listdir(directory) if name.endswith(".log"))
    assert len(names) == 2
    data = b""
    for name in names:
        with open(os.path.join(directory, name), "rb") as handle:
            data += handle.read()
    return data


def fetch_frame(topic: str, offset: int, correlation: int, max_bytes: int = 8 << 20,
                wait_ms: int = 0) -> bytes:
    body = request(1, FETCH_VERSION, {
        "replica_id": -1, "max_wait": datetime.timedelta(milliseconds=wait_ms), "min_bytes": 1,
        "max_bytes": max_bytes, "isolation_level": 0, "session_id": 0, "session_epoch": -1,
        "rack_id": "", "cluster_id": None, "forgotten_topics_data": [],
        "topics": [{"topic": topic, "partitions": [{
            "partition": 0, "current_leader_epoch": -1, "fetch_offset": offset,
            "last_fetched_epoch": -1, "log_start_offset": -1,
            "partition_max_bytes": max_bytes}]}]})
    return frame(body[:4] + struct.pack(">i", correlation) + body[8:])


def fetched_records(body: bytes) -> bytes:
    answer = decode_response(1, FETCH_VERSION, body)[1]
    (topic,) = answer.responses
    (part,) = topic.partitions
    assert part.error_code == ErrorCode.none
    return part.records


def correlation_of(body: bytes) -> int:
    return struct.unpack_from(">i", body)[0]


def open_descriptors(broker) -> int:
    """The workers' open descriptors, but for their event log files (opened at the first
    flush and at each rotation: not what these tests count)."""
    count = 0
    for pid in broker.worker_pids.values():
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                count += "pybroker-events" not in os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                pass  # closed meanwhile
    return count


def descriptors_back_to(broker, before: int, seconds: float = 10) -> int:
    """The workers' open descriptors once they are back to `before` (or the deadline
    passed): the count that was seen, not a fresh one (a worker may hold a descriptor for a
    moment, listing a partition's directory)."""
    deadline = time.monotonic() + seconds
    while (count := open_descriptors(broker)) > before and time.monotonic() < deadline:
        time.sleep(0.05)
    return count


def test_answers_leave_in_request_order_with_the_segment_s_bytes(broker):
    log = fill(broker, "ordered")
    middle = 64 * BATCHES // 2 + 5  # inside a batch: the answer starts with that batch
    start = next(batch.position for batch in records.headers_in(log)
                 if batch.base_offset <= middle < batch.next_offset)
    with KafkaSocket(broker.listeners["PLAINTEXT"], timeout=20) as client:
        client.send(b"".join((fetch_frame("ordered", 0, 1), api_versions_request(correlation_id=2),
                              fetch_frame("ordered", middle, 3), metadata_request(correlation_id=4),
                              fetch_frame("ordered", 0, 5, max_bytes=600_000))))
        answers = [client.receive() for _ in range(5)]
    assert [correlation_of(body) for body in answers] == [1, 2, 3, 4, 5]
    assert fetched_records(answers[0]) == log  # both segments, whole
    assert fetched_records(answers[2]) == log[start:]
    first = fetched_records(answers[4])  # the whole batches within max_bytes: 2 of 257 KB
    assert len(first) <= 600_000 and log.startswith(first)
    assert len(list(records.headers_in(first))) == 2


def test_a_client_gone_mid_answer_leaves_nothing_behind(broker):
    fill(broker, "abandoned")
    for number in range(2):  # both workers open the partition's files (round-robin)
        with KafkaSocket(broker.listeners["PLAINTEXT"], timeout=20) as client:
            client.send(fetch_frame("abandoned", 0, number))
            assert fetched_records(client.receive())
    before = open_descriptors(broker)
    clients = []
    for number in range(20):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the answer stays half-sent
        sock.settimeout(10)
        sock.connect(broker.listeners["PLAINTEXT"])
        sock.sendall(fetch_frame("abandoned", 0, number))
        assert sock.recv(1024)  # the answer has begun
        clients.append(sock)
    assert open_descriptors(broker) >= before + 20
    for sock in clients:  # reset, not a clean close: the sender's next write fails
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    assert descriptors_back_to(broker, before) <= before  # sockets, their dups, the segments' dups
    assert broker.metric("broker_worker_restarts_total") == 0
    with KafkaSocket(broker.listeners["PLAINTEXT"], timeout=20) as client:
        client.send(fetch_frame("abandoned", 0, 99))
        assert len(fetched_records(client.receive())) > 4 << 20


def test_an_answer_outlives_the_deletion_of_its_topic(broker):
    from confluent_kafka.admin import AdminClient

    log = fill(broker, "doomed")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(20)
    sock.connect(broker.listeners["PLAINTEXT"])
    try:
        sock.sendall(fetch_frame("doomed", 0, 1))
        received = sock.recv(4096)
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.delete_topics(["doomed"])["doomed"].result(timeout=20)
        directory = os.path.join(broker.data_dir, "logs", "doomed-0")
        deadline = time.monotonic() + 10
        while os.path.exists(directory) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(directory)
        size = 4 + struct.unpack_from(">i", received)[0]
        while len(received) < size:
            chunk = sock.recv(1 << 20)
            assert chunk, "the broker closed the connection mid-answer"
            received += chunk
    finally:
        sock.close()
    assert fetched_records(received[4:]) == log


def test_a_long_poll_answered_by_new_records_sends_them_from_the_file(broker):
    """The wait ends with an answer of file regions: sent after the wait, in order with the
    requests behind it, and its descriptors released."""
    log = fill(broker, "awaited")
    end = sum(batch.record_count for batch in records.headers_in(log))
    with KafkaSocket(broker.listeners["PLAINTEXT"], timeout=20) as client:
        client.send(fetch_frame("awaited", 0, 0))  # opens the files in this worker
        assert fetched_records(client.receive()) == log
        before = open_descriptors(broker)
        client.send(fetch_frame("awaited", end, 1, wait_ms=10_000) +
                    api_versions_request(correlation_id=2))
        with KafkaSocket(broker.listeners["PLAINTEXT"]) as producer:
            producer.send(produce_request("awaited", make_batch(64, value_size=4000)))
            assert produce_errors(producer.receive())[0][0] == ErrorCode.none
        answers = [client.receive() for _ in range(2)]
    assert [correlation_of(body) for body in answers] == [1, 2]
    added = fetched_records(answers[0])
    assert [batch.base_offset for batch in records.headers_in(added)] == [end]
    assert segment_bytes(broker, "awaited").endswith(added)
    assert descriptors_back_to(broker, before) <= before
