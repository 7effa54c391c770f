"""The bounded hand-off from the parent's acceptor to worker processes."""

import socket
import struct
import threading

import pytest

from tests.harness import BrokerProcess, wait_until
from tests.wire import api_versions_request

pytestmark = pytest.mark.system  # every test here starts a broker


def open_served_connections(address, count):
    """Open `count` connections at once; each sends ApiVersions and reads its answer."""
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.settimeout(10)
        sock.setblocking(False)
        sock.connect_ex(address)
    for index, sock in enumerate(sockets):
        sock.setblocking(True)
        sock.settimeout(10)
        sock.sendall(api_versions_request(3, correlation_id=index))
    answered = 0
    for index, sock in enumerate(sockets):
        header = b""
        while len(header) < 8:
            header += sock.recv(8 - len(header))
        size, correlation = struct.unpack(">ii", header)
        assert correlation == index
        answered += 1
    return sockets, answered


def test_200_concurrent_connections_over_2_workers_are_all_served():
    with BrokerProcess(workers=2) as broker:
        sockets, answered = open_served_connections(broker.listeners["PLAINTEXT"], 200)
        assert answered == 200
        assert broker.metric("broker_connections", listener="PLAINTEXT") == 200
        assert broker.metric("broker_connections_accepted_total", listener="PLAINTEXT") == 200
        for sock in sockets:
            sock.close()
        wait_until(lambda: broker.metric("broker_connections", listener="PLAINTEXT") == 0,
                   message="broker_connections did not return to 0")
        assert broker.metric("broker_connections_closed_total", listener="PLAINTEXT",
                             reason="client") == 200
        assert broker.metric("broker_requests_total", api="ApiVersions",
                             listener="PLAINTEXT") == 200


def test_a_full_handoff_blocks_the_acceptor_and_it_resumes():
    # One worker with room for a single unregistered socket: a burst must wait in the kernel
    # backlog, the acceptor reports time blocked, and every connection is served in the end.
    overrides = {"pybroker.handoff.queue.size": "1", "pybroker.registrations.per.turn": "1",
                 "socket.listen.backlog.size": "512"}
    with BrokerProcess(workers=1, overrides=overrides) as broker:
        results = []

        def burst():
            sockets, answered = open_served_connections(broker.listeners["PLAINTEXT"], 150)
            results.append(answered)
            for sock in sockets:
                sock.close()

        threads = [threading.Thread(target=burst) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert results == [150, 150]
        assert broker.metric("broker_acceptor_blocked_seconds_total", listener="PLAINTEXT") > 0
        wait_until(lambda: broker.metric("broker_connections", listener="PLAINTEXT") == 0)
