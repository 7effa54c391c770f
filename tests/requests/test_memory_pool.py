"""KIP-72: bytes held for requests stay bounded across all workers; waiting is fair."""

import os
import signal
import socket
import struct
import threading
import time

import pytest
from kio.schema.errors import ErrorCode

from tests.batches import make_batch
from tests.harness import BrokerProcess, wait_until
from tests.wire import (KafkaSocket, api_versions_request, create_topic, produce_errors,
                        produce_request)

pytestmark = pytest.mark.system  # every test here starts a broker

MIB = 1 << 20


def used(broker) -> float:
    return broker.metric("broker_request_memory_used_bytes")


def partial_frame(size: int) -> socket.socket:
    """Bytes of a request whose body never finishes: the broker holds `size` pool bytes."""
    return struct.pack(">i", size) + struct.pack(">hhi", 0, 9, 1)


class Sampler:
    """Samples the pool's used bytes until stopped; keeps the peak."""

    def __init__(self, broker):
        self.broker, self.peak, self.samples = broker, 0.0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, used(self.broker))
            self.samples += 1

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)


def test_200_connections_of_1_mib_produces_stay_within_the_pool():
    overrides = {"queued.max.request.bytes": str(16 * MIB), "socket.request.max.bytes": str(2 * MIB),
                 "message.max.bytes": str(2 * MIB)}
    with BrokerProcess(workers=2, overrides=overrides) as broker:
        create_topic(broker.bootstrap, "big", 4)
        pids = dict(broker.worker_pids)
        batch = make_batch(1, value_size=MIB - 200)
        clients = [KafkaSocket(broker.listeners["PLAINTEXT"], timeout=120) for _ in range(200)]
        with Sampler(broker) as sampler:
            senders = [threading.Thread(target=client.send, args=(
                produce_request("big", batch, partition=i % 4, correlation_id=2 * i)
                + produce_request("big", batch, partition=i % 4, correlation_id=2 * i + 1),))
                for i, client in enumerate(clients)]
            for sender in senders:
                sender.start()
            answers = []
            for i, client in enumerate(clients):
                first, second = client.receive(), client.receive()
                assert struct.unpack_from(">i", first)[0] == 2 * i  # in order per connection
                assert struct.unpack_from(">i", second)[0] == 2 * i + 1
                answers += produce_errors(first) + produce_errors(second)
            for sender in senders:
                sender.join(60)
        assert [code for code, _ in answers] == [ErrorCode.none] * 400
        assert sampler.samples > 10
        assert 0 < sampler.peak <= 18 * MIB
        assert broker.metric("broker_request_memory_depleted_seconds_total") > 0  # it did bind
        assert broker.worker_pids == pids and broker.metric("broker_worker_restarts_total") == 0
        wait_until(lambda: used(broker) == 0)
        for client in clients:
            client.close()


def test_a_large_request_waiting_is_not_starved_by_small_ones():
    overrides = {"queued.max.request.bytes": str(MIB), "socket.request.max.bytes": str(MIB)}
    with BrokerProcess(workers=2, overrides=overrides) as broker:
        address = broker.listeners["PLAINTEXT"]
        holder = socket.create_connection(address)
        holder.sendall(partial_frame(MIB))  # holds the whole pool
        wait_until(lambda: used(broker) == MIB)
        large = KafkaSocket(address, timeout=30)
        body = struct.pack(">hhi", 18, 0, 77) + struct.pack(">h", 1) + b"x" + b"\0" * (MIB - 11)
        threading.Thread(target=large.send, args=(struct.pack(">i", len(body)) + body,)).start()
        wait_until(lambda: broker.metric("broker_muted_channels", reason="memory") == 1)
        stop, small_answers = threading.Event(), []

        def small_traffic():  # small requests keep arriving, on both workers
            while not stop.is_set():
                with KafkaSocket(address, timeout=30) as client:
                    client.send(api_versions_request(3, correlation_id=5))
                    small_answers.append(struct.unpack_from(">i", client.receive())[0])

        threads = [threading.Thread(target=small_traffic) for _ in range(3)]
        for thread in threads:
            thread.start()
        wait_until(lambda: broker.metric("broker_muted_channels", reason="memory") >= 2)
        assert small_answers == []  # nobody jumps the queue while the large request waits
        holder.sendall(b"\0" * (MIB - 8))  # the holder's request completes and frees the pool
        assert struct.unpack_from(">i", large.receive())[0] == 77  # served, not starved
        wait_until(lambda: len(small_answers) > 20)
        stop.set()
        for thread in threads:
            thread.join(30)
        assert broker.metric("broker_request_memory_depleted_seconds_total") > 0
        holder.close()
        large.close()
        wait_until(lambda: used(broker) == 0)


def test_a_disconnect_mid_request_returns_its_bytes():
    overrides = {"queued.max.request.bytes": str(4 * MIB), "socket.request.max.bytes": str(MIB)}
    with BrokerProcess(workers=1, overrides=overrides) as broker:
        sock = socket.create_connection(broker.listeners["PLAINTEXT"])
        sock.sendall(partial_frame(MIB))
        wait_until(lambda: used(broker) == MIB)
        sock.close()
        wait_until(lambda: used(broker) == 0)


def test_a_killed_worker_returns_its_memory_within_a_second():
    overrides = {"queued.max.request.bytes": str(4 * MIB), "socket.request.max.bytes": str(MIB)}
    with BrokerProcess(workers=2, overrides=overrides) as broker:
        address = broker.listeners["PLAINTEXT"]
        held = [socket.create_connection(address) for _ in range(2)]  # one per worker
        for sock in held:
            sock.sendall(partial_frame(MIB))
        wait_until(lambda: used(broker) == 2 * MIB)
        victim = broker.worker_pids["data-0"]
        os.kill(victim, signal.SIGKILL)
        started = time.monotonic()
        wait_until(lambda: used(broker) == MIB, timeout=1.0, interval=0.01)
        assert time.monotonic() - started < 1.0
        for sock in held:
            sock.close()
        wait_until(lambda: used(broker) == 0)


def test_a_reserved_listener_is_served_while_the_shared_pool_is_exhausted():
    overrides = {"listeners": "CLIENT://127.0.0.1:0,INTERNAL://127.0.0.1:0",
                 "listener.security.protocol.map": "CLIENT:PLAINTEXT,INTERNAL:PLAINTEXT",
                 "inter.broker.listener.name": "INTERNAL",
                 "queued.max.request.bytes": str(2 * MIB), "socket.request.max.bytes": str(MIB),
                 "pybroker.queued.max.request.bytes.reserved": "INTERNAL:65536"}
    with BrokerProcess(workers=2, overrides=overrides) as broker:
        hogs = [socket.create_connection(broker.listeners["CLIENT"]) for _ in range(2)]
        for hog in hogs:
            hog.sendall(partial_frame(MIB))  # the shared part is gone
        wait_until(lambda: used(broker) >= 2 * MIB - 65536)
        with KafkaSocket(broker.listeners["CLIENT"], timeout=0.5) as starved:
            starved.send(api_versions_request(3, correlation_id=1))
            with pytest.raises(socket.timeout):
                starved.receive()
        with KafkaSocket(broker.listeners["INTERNAL"], timeout=5) as internal:
            internal.send(api_versions_request(3, correlation_id=2))
            assert struct.unpack_from(">i", internal.receive())[0] == 2
        for hog in hogs:
            hog.close()


@pytest.mark.parametrize("pool", [False, True])
def test_long_polls_wait_in_purgatory_not_in_the_request_queue(pool):
    """queued.max.requests counts requests waiting for the parent; fetches parked in long
    poll do not fill it (Kafka's purgatory), so they never stop the worker reading others."""
    overrides = {"queued.max.requests": "2"}
    if pool:
        overrides.update({"queued.max.request.bytes": str(4 * MIB),
                          "socket.request.max.bytes": str(MIB)})
    with BrokerProcess(workers=1, overrides=overrides) as broker:
        from tests.wire import describe_configs_request, fetch_request

        create_topic(broker.bootstrap, "quiet")
        address = broker.listeners["PLAINTEXT"]
        waiting = [KafkaSocket(address, timeout=10) for _ in range(4)]
        for n, client in enumerate(waiting):
            client.send(fetch_request("quiet", max_wait_ms=5000, correlation_id=n))
        wait_until(lambda: broker.metric("broker_muted_channels", reason="in_flight") == 4)
        assert broker.metric("broker_request_queue_size", plane="data") == 0
        third = KafkaSocket(address, timeout=10)
        started = time.monotonic()
        third.send(api_versions_request(3, correlation_id=9))
        assert struct.unpack_from(">i", third.receive())[0] == 9  # before any fetch answers
        assert time.monotonic() - started < 2
        # Forwarded requests do count: a burst of them from 12 connections is served in turn.
        admins = [KafkaSocket(address, timeout=10) for _ in range(12)]
        for n, client in enumerate(admins):
            client.send(describe_configs_request(correlation_id=100 + n))
        assert [struct.unpack_from(">i", c.receive())[0] for c in admins] == \
            list(range(100, 112))
        assert [struct.unpack_from(">i", c.receive())[0] for c in waiting] == [0, 1, 2, 3]
        wait_until(lambda: broker.metric("broker_muted_channels", reason="queue") == 0)
        assert broker.metric("broker_request_queue_size", plane="data") == 0
        for client in waiting + admins + [third]:
            client.close()


def test_shutdown_does_not_wait_for_connections_that_owe_no_answer():
    """Half-read requests and requests waiting for memory are not acknowledged: SIGTERM closes
    them at once instead of waiting out pybroker.shutdown.timeout.ms."""
    overrides = {"queued.max.request.bytes": str(2 * MIB), "socket.request.max.bytes": str(MIB),
                 "pybroker.shutdown.timeout.ms": "20000"}
    broker = BrokerProcess(workers=1, overrides=overrides).start()
    try:
        address = broker.listeners["PLAINTEXT"]
        holders = [socket.create_connection(address) for _ in range(3)]
        for sock in holders:
            sock.sendall(partial_frame(MIB))
        wait_until(lambda: broker.metric("broker_muted_channels", reason="memory") == 1)
        started = time.monotonic()
        assert broker.stop(timeout=30) == 0
        assert time.monotonic() - started < 5
    finally:
        broker.stop()
        for sock in holders:
            sock.close()


def test_a_half_sent_request_returns_its_pool_bytes_at_its_deadline():
    """The pool granted a frame's bytes but the body never comes: the receive deadline closes
    the connection and the bytes go back (they were held for ever before)."""
    overrides = {"queued.max.request.bytes": str(4 * MIB), "socket.request.max.bytes": str(MIB),
                 "pybroker.request.receive.timeout.ms": "1000"}
    with BrokerProcess(workers=1, overrides=overrides) as broker:
        holders = [socket.create_connection(broker.listeners["PLAINTEXT"]) for _ in range(2)]
        for sock in holders:
            sock.sendall(partial_frame(MIB))
        wait_until(lambda: broker.metric("broker_request_memory_used_bytes") == 2 * MIB)
        wait_until(lambda: broker.metric("broker_request_memory_used_bytes") == 0, timeout=10)
        assert broker.metric("broker_connections_closed_total", listener="PLAINTEXT",
                             reason="receive_timeout") == 2
        for sock in holders:
            sock.close()
