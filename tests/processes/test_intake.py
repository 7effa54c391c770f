"""The worker's intake (workers/intake.py) on a real uvloop loop, without a broker: a socket
handed over as a bare descriptor is registered, served and reported closed exactly once, a
registration that fails returns its credit and slot, and accepted sockets get their options
from the listening socket (broker/parent/acceptor.py `bind_listener`)."""

import asyncio
import functools
import os
import socket
import struct
import time

import pytest
import uvloop

from broker.parent.acceptor import bind_listener
from broker.shared import ipc
from broker.shared.config import Listener
from tests.helpers import FakeWorker
from tests.wire import api_versions_request
from workers.connection import Connection
from workers.intake import Intake


@pytest.fixture(scope="module")
def host():
    """One fake worker for the module (its router takes a while to build)."""
    return FakeWorker()


class RecordingChannel:
    def __init__(self):
        self.sent = []

    def send(self, message, fds=()):
        self.sent.append(message)

    def reported(self) -> tuple[int, list[int]]:
        """Credits returned and ids reported closed, over every Progress sent."""
        progress = [m for m in self.sent if isinstance(m, ipc.Progress)]
        return sum(m.registered for m in progress), [i for m in progress for i in m.closed]


class RecordingStats:
    def __init__(self):
        self.closed_reasons = []

    def closed(self, listener, reason):
        self.closed_reasons.append(reason)


async def _until(condition, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


def _intake(loop, host, channel, stats) -> Intake:
    intake = Intake(loop, channel, stats, new_connection=functools.partial(Connection, host),
                    families=[socket.AF_INET], per_turn=20)
    host.loop = loop
    host.connection_closed = lambda conn, reason: intake.closed(conn.conn_id)
    return intake


def test_accepted_sockets_inherit_keepalive_and_the_send_buffer_of_the_listener():
    listener = bind_listener(Listener("PLAINTEXT", "127.0.0.1", 0), 16, -1, 65536)
    reference = socket.socket()
    reference.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
    with listener, reference, socket.create_connection(listener.getsockname()[:2]):
        listener.setblocking(True)
        accepted, _ = listener.accept()
        with accepted:
            assert accepted.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert accepted.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == \
                reference.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)


def test_a_handed_socket_is_served_and_reported_closed_once(host):
    channel, stats = RecordingChannel(), RecordingStats()
    listener = socket.create_server(("127.0.0.1", 0))

    async def scenario():
        loop = asyncio.get_running_loop()
        intake = _intake(loop, host, channel, stats)
        client = socket.create_connection(listener.getsockname())
        client.setblocking(False)
        fd, address = listener._accept()
        inode = os.fstat(fd).st_ino
        intake.accept(ipc.Handoff([ipc.HandedOff(7, 0, *address)]), [fd])
        await loop.sock_sendall(client, api_versions_request(3, correlation_id=42))
        answer = await asyncio.wait_for(loop.sock_recv(client, 8), 5)
        assert struct.unpack(">ii", answer)[1] == 42
        client.close()
        await _until(lambda: channel.reported() == (1, [7]))
        await asyncio.sleep(0.01)  # nothing more comes
        assert channel.reported() == (1, [7])
        assert stats.closed_reasons == []  # a client's close is the worker's to count
        try:  # the transport closed the descriptor (its number may be another file's by now)
            assert os.fstat(fd).st_ino != inode
        except OSError:
            pass

    with listener:
        uvloop.run(scenario())


def test_a_registration_that_fails_returns_its_credit_and_slot(host):
    channel, stats = RecordingChannel(), RecordingStats()

    async def scenario():
        intake = _intake(asyncio.get_running_loop(), host, channel, stats)
        gone = socket.socket()
        fd = gone.detach()
        os.close(fd)  # the loop cannot take it
        intake.accept(ipc.Handoff([ipc.HandedOff(9, 0, "127.0.0.1", 1)]), [fd])
        await _until(lambda: channel.reported() == (1, [9]))
        assert stats.closed_reasons == ["error"]

    uvloop.run(scenario())


def test_a_connection_keeps_its_state_in_slots(host):
    conn = Connection(host, 1, 0, "127.0.0.1:1", fd=5)
    assert not hasattr(conn, "__dict__")  # an idle connection is a few hundred bytes
    assert conn.fd == 5 and conn.files  # file regions go to its socket as they are
    assert not Connection(host, 2, 0, "127.0.0.1:2", fd=5, tls=True).files
