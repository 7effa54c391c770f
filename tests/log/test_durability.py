"""Acknowledged messages survive a killed worker and restarts; torn tails are repaired."""

import os
import signal
import threading
import time

import pytest
from kio.schema.errors import ErrorCode

from tests.batches import make_batch
from tests.harness import BrokerProcess, wait_until
from tests.helpers import produce_acked
from tests.wire import (KafkaSocket, create_topic, decode_response, fetch_request, produce_errors,
                        produce_request)

pytestmark = pytest.mark.system  # every test here starts a broker


def fetch_all(address, topic: str, start: int = 0) -> list[tuple[int, bytes]]:
    """(offset, key) of every record in partition 0 from `start`, through raw Fetch requests."""
    from kafka.record.default_records import DefaultRecordBatch

    found, offset = [], start
    with KafkaSocket(address) as client:
        while True:
            client.send(fetch_request(topic, offset=offset))
            _, response = decode_response(1, 12, client.receive())
            part = response.responses[0].partitions[0]
            data = part.records or b""
            if not data:
                return found
            position = 0
            while position < len(data):
                length = int.from_bytes(data[position + 8:position + 12], "big") + 12
                batch = DefaultRecordBatch(data[position:position + length])
                for record in batch:
                    if record.offset >= offset:
                        found.append((record.offset, record.key))
                position += length
            offset = found[-1][0] + 1


def test_several_producers_on_two_workers_share_one_partition(tmp_path):
    with BrokerProcess(workers=2, data_dir=str(tmp_path)) as broker:
        address = broker.listeners["PLAINTEXT"]
        results = {}

        def producer(name):
            results[name] = produce_acked(address, "shared", 150, name.encode())

        create_topic(broker.bootstrap, "shared")
        produce_acked(address, "shared", 1, b"warm")
        threads = [threading.Thread(target=producer, args=(f"p{i}",)) for i in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        offsets = sorted(o for acked in results.values() for o in acked)
        assert offsets == list(range(1, 901))
        records = fetch_all(address, "shared")
        assert [offset for offset, _ in records] == list(range(901))
        for name, acked in results.items():  # each producer's records sit at its acked offsets
            by_offset = dict(records)
            assert [by_offset[o] for o in acked] == [name.encode() + b"%d-0" % i for i in range(150)]


def test_acked_messages_survive_a_killed_worker_and_a_restart(tmp_path):
    broker = BrokerProcess(workers=2, data_dir=str(tmp_path)).start()
    try:
        address = broker.listeners["PLAINTEXT"]
        create_topic(broker.bootstrap, "durable")
        acked = produce_acked(address, "durable", 200, b"a")
        victim = broker.worker_pids["data-0"]
        os.kill(victim, signal.SIGKILL)
        broker.wait_for_line(rf"pid {victim}\) was killed by SIGKILL")
        acked += produce_acked(address, "durable", 50, b"b")  # served by the survivor
    finally:
        assert broker.stop() == 0
    with BrokerProcess(workers=2, data_dir=str(tmp_path)) as restarted:
        records = fetch_all(restarted.listeners["PLAINTEXT"], "durable")
    assert [offset for offset, _ in records] == list(range(250))
    assert sorted(acked) == list(range(250))


def test_acked_messages_survive_a_killed_broker(tmp_path):
    broker = BrokerProcess(workers=1, data_dir=str(tmp_path)).start()
    create_topic(broker.bootstrap, "crash")
    acked = produce_acked(broker.listeners["PLAINTEXT"], "crash", 100, b"c")
    for pid in [broker.pid, *broker.worker_pids.values()]:
        os.kill(pid, signal.SIGKILL)
    broker.proc.wait()
    with BrokerProcess(workers=1, data_dir=str(tmp_path)) as restarted:
        restarted.wait_for_line(r"log recovery: 1 partitions checked \(unclean shutdown before\)")
        records = fetch_all(restarted.listeners["PLAINTEXT"], "crash")
    assert [offset for offset, _ in records] == acked == list(range(100))


def test_a_torn_last_batch_is_cut_at_start_up(tmp_path):
    with BrokerProcess(workers=1, data_dir=str(tmp_path)) as broker:
        create_topic(broker.bootstrap, "torn")
        produce_acked(broker.listeners["PLAINTEXT"], "torn", 20, b"t")
    directory = os.path.join(tmp_path, "logs", "torn-0")
    segment = max(name for name in os.listdir(directory) if name.endswith(".log"))
    with open(os.path.join(directory, segment), "ab") as log_file:
        log_file.write(make_batch(5)[:50])  # the start of a batch, as a crash mid-write leaves it
    os.unlink(os.path.join(tmp_path, "logs", ".pybroker-clean-shutdown"))
    with BrokerProcess(workers=1, data_dir=str(tmp_path)) as restarted:
        restarted.wait_for_line(r"partition torn-0: cut 50 bytes")
        address = restarted.listeners["PLAINTEXT"]
        assert [offset for offset, _ in fetch_all(address, "torn")] == list(range(20))
        assert produce_acked(address, "torn", 1, b"after") == [20]


def test_long_poll_wakes_on_a_produce_through_another_worker(tmp_path):
    with BrokerProcess(workers=2, data_dir=str(tmp_path)) as broker:
        address = broker.listeners["PLAINTEXT"]
        create_topic(broker.bootstrap, "poll")
        produce_acked(address, "poll", 1, b"x")
        waiter = KafkaSocket(address, timeout=10)
        producer_conn = KafkaSocket(address)  # round-robin: the other worker
        started = time.monotonic()
        waiter.send(fetch_request("poll", offset=1, max_wait_ms=5000, correlation_id=1))
        wait_until(lambda: broker.metric("broker_delayed_fetches") == 1)
        producer_conn.send(produce_request("poll", make_batch(2), correlation_id=2))
        assert produce_errors(producer_conn.receive()) == [(ErrorCode.none, 1)]
        _, response = decode_response(1, 12, waiter.receive())
        waited = time.monotonic() - started
        assert response.responses[0].partitions[0].records  # the new batch
        assert waited < 2.0
        # An empty wait ends at max_wait, and the worker serves other requests meanwhile.
        started = time.monotonic()
        waiter.send(fetch_request("poll", offset=3, max_wait_ms=800, correlation_id=3))
        producer_conn.send(fetch_request("poll", offset=0, correlation_id=4))
        assert decode_response(1, 12, producer_conn.receive())[0] == 4
        _, response = decode_response(1, 12, waiter.receive())
        assert not response.responses[0].partitions[0].records
        assert 0.7 <= time.monotonic() - started < 3
        assert broker.metric("broker_delayed_fetches") == 0
        waiter.close()
        producer_conn.close()
        wait_until(lambda: broker.metric("broker_connections", listener="PLAINTEXT") == 0)


def test_the_parent_applies_retention_on_its_schedule(tmp_path):
    from kafka import KafkaConsumer, TopicPartition

    overrides = {"log.segment.bytes": "2000", "log.retention.bytes": "4000",
                 "log.retention.check.interval.ms": "200"}
    with BrokerProcess(workers=1, data_dir=str(tmp_path), overrides=overrides) as broker:
        create_topic(broker.bootstrap, "short")
        produce_acked(broker.listeners["PLAINTEXT"], "short", 100, b"r")
        consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap)
        partition = TopicPartition("short", 0)
        try:
            start = wait_until(lambda: consumer.beginning_offsets([partition])[partition], timeout=10)
            assert consumer.end_offsets([partition]) == {partition: 100}
        finally:
            consumer.close()
        broker.wait_for_line(r"partition short-0: retention deleted \d+ segments")
        address = broker.listeners["PLAINTEXT"]
        assert [offset for offset, _ in fetch_all(address, "short", start)] == list(range(start, 100))
        with KafkaSocket(address) as client:  # below the log start: out of range
            client.send(fetch_request("short", offset=0))
            _, response = decode_response(1, 12, client.receive())
            assert int(response.responses[0].partitions[0].error_code) == \
                ErrorCode.offset_out_of_range


def test_fsync_on_every_append_and_on_a_timer(tmp_path):
    overrides = {"log.flush.interval.messages": "1", "log.flush.interval.ms": "100"}
    with BrokerProcess(workers=1, data_dir=str(tmp_path), overrides=overrides) as broker:
        create_topic(broker.bootstrap, "synced")
        assert produce_acked(broker.listeners["PLAINTEXT"], "synced", 5, b"s") == list(range(5))
    from broker.shared.log.partition_state import W_UNFLUSHED
    from broker.shared.log.settings import LogSettings
    from broker.shared.log.topics import Epoch, TopicRegistry

    registry = TopicRegistry((os.path.join(tmp_path, "logs"),), LogSettings(), Epoch())
    try:
        assert registry.partition("synced", 0).state[W_UNFLUSHED] == 0
    finally:
        registry.close()
