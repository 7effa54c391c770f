"""Descriptors are a bounded resource: a broker whose partitions outnumber its open-files limit
serves them all, shuts down cleanly and restarts on the same data; a worker out of descriptors
answers a retriable error and lives on.

Each process holds at most a quarter of its limit in log files (broker/shared/log/files.py)
and, in a worker, as many again in Fetch answers' file regions; the rest is for connections.
"""

import datetime
import os
import socket

import pytest
from kio.schema.errors import ErrorCode

from tests.batches import make_batch
from tests.harness import BrokerProcess, wait_until
from tests.wire import request
from tests.helpers import timed_create_topic
from tests.wire import KafkaSocket, decode_response, frame

pytestmark = pytest.mark.system

LIMIT = 320  # RLIMIT_NOFILE of the broker: five descriptors per partition would need 2,500
PARTITIONS = 500
PER_REQUEST = 250  # partitions per Produce / Fetch / ListOffsets


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def produce_to_each(client: KafkaSocket, topic: str, partitions: range) -> list[int]:
    """One batch of two records to each partition; the error codes."""
    client.send(frame(request(0, 9, {
        "transactional_id": None, "acks": 1, "timeout": datetime.timedelta(seconds=10),
        "topic_data": [{
            "name": topic, "partition_data": [{"index": index, "records": make_batch(2)}
                                              for index in partitions]}]})))
    _, answer = decode_response(0, 9, client.receive())
    return [int(part.error_code) for topic in answer.responses
            for part in topic.partition_responses]


def fetch(client: KafkaSocket, topic: str, partitions: range) -> dict[int, tuple[int, int]]:
    """partition -> (error code, records bytes) of a Fetch from offset 0 of each."""
    client.send(frame(request(1, 12, {
        "replica_id": -1, "max_wait": datetime.timedelta(0), "min_bytes": 1,
        "max_bytes": 64 << 20, "isolation_level": 0, "session_id": 0, "session_epoch": -1,
        "rack_id": "", "cluster_id": None, "forgotten_topics_data": [],
        "topics": [{"topic": topic, "partitions": [{
            "partition": index, "current_leader_epoch": -1, "fetch_offset": 0,
            "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": 1 << 20}
            for index in partitions]}]})))
    _, answer = decode_response(1, 12, client.receive())
    return {part.partition_index: (int(part.error_code), len(part.records or b""))
            for topic in answer.responses for part in topic.partitions}


def offsets_by_time(client: KafkaSocket, topic: str, partitions: range) -> list[tuple[int, int]]:
    """(error code, offset) of the first record stamped at or after time 0, per partition."""
    client.send(frame(request(2, 7, {
        "replica_id": -1, "isolation_level": 0, "topics": [{"name": topic, "partitions": [{
            "partition_index": index, "current_leader_epoch": -1, "timestamp": 0}
            for index in partitions]}]})))
    _, answer = decode_response(2, 7, client.receive())
    return [(int(part.error_code), part.offset) for topic in answer.topics
            for part in topic.partitions]


def slices():
    return [range(start, min(PARTITIONS, start + PER_REQUEST))
            for start in range(0, PARTITIONS, PER_REQUEST)]


def test_more_partitions_than_descriptors_serve_stop_cleanly_and_restart(tmp_path):
    data_dir = str(tmp_path)
    overrides = {"auto.create.topics.enable": "false"}
    batch_size = len(make_batch(2))
    with BrokerProcess(workers=2, data_dir=data_dir, open_files=LIMIT,
                       overrides=overrides) as broker:
        assert timed_create_topic(broker, "wide", PARTITIONS)[0] == ErrorCode.none
        with KafkaSocket(broker.listeners["PLAINTEXT"], timeout=60) as client:
            for partitions in slices():
                assert set(produce_to_each(client, "wide", partitions)) == {ErrorCode.none}
            for partitions in slices():
                assert fetch(client, "wide", partitions) == {
                    index: (ErrorCode.none, batch_size) for index in partitions}
                assert offsets_by_time(client, "wide", partitions) == [(ErrorCode.none, 0)] * len(partitions)
        pids = [broker.pid, *broker.worker_pids.values()]
        assert max(open_descriptors(pid) for pid in pids) < LIMIT // 2
        wait_until(lambda: broker.metric("broker_log_file_evictions_total") > 0,  # the budget
                   message="evictions counted (workers publish once a second)")  # did its work
        assert broker.metric("broker_log_descriptor_failures_total") == 0
        assert broker.stop(timeout=120) == 0  # a first flush of every new partition
        assert "log maintenance stopped" not in "\n".join(broker.lines)
    assert os.path.exists(os.path.join(data_dir, "logs", ".pybroker-clean-shutdown"))

    with BrokerProcess(workers=2, data_dir=data_dir, open_files=LIMIT,
                       overrides=overrides) as again:
        with KafkaSocket(again.listeners["PLAINTEXT"], timeout=60) as client:
            for partitions in slices():
                assert fetch(client, "wide", partitions) == {
                    index: (0, batch_size) for index in partitions}
                assert set(produce_to_each(client, "wide", partitions)) == {ErrorCode.none}
        assert again.stop(timeout=120) == 0


def test_a_worker_out_of_descriptors_answers_a_retriable_error_and_lives(tmp_path):
    """Idle connections take every descriptor of the one worker: a produce to partitions it
    never opened is answered KAFKA_STORAGE_ERROR (not a closed connection, not a dead
    worker), and succeeds once connections go."""
    limit = 200
    overrides = {"auto.create.topics.enable": "false"}
    with BrokerProcess(workers=1, data_dir=str(tmp_path), open_files=limit,
                       overrides=overrides) as broker:
        assert timed_create_topic(broker, "late", 40)[0] == ErrorCode.none
        (worker,) = broker.worker_pids.values()
        address = broker.listeners["PLAINTEXT"]
        client = KafkaSocket(address, timeout=30)
        idle = []
        try:
            while open_descriptors(worker) < limit and len(idle) < 2 * limit:
                idle.append(socket.create_connection(address))
                wait_until(lambda: open_descriptors(worker) >= limit or broker.metric(
                    "broker_connections", listener="PLAINTEXT") >= len(idle) + 1,
                    message="a connection registered, or the worker full")
            codes = produce_to_each(client, "late", range(40))
            assert ErrorCode.kafka_storage_error in codes
            assert set(codes) <= {0, ErrorCode.kafka_storage_error}
            wait_until(lambda: broker.metric("broker_log_descriptor_failures_total") > 0,
                       message="the failed opens counted (workers publish once a second)")
        finally:
            for sock in idle:
                sock.close()
        wait_until(lambda: open_descriptors(worker) < limit - 60, timeout=15,
                   message="the idle connections' descriptors released")
        assert set(produce_to_each(client, "late", range(40))) == {ErrorCode.none}
        assert broker.worker_pids == {name: worker for name in broker.worker_pids}  # same one
        assert any("out of descriptors" in line for line in broker.lines)
        client.close()
