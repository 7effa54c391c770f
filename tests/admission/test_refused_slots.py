"""A refused connection holds no slot, whatever refused it and however long the broker keeps
it before closing: legible per-IP refusals (held by the parent), connections refused for their
user after SASL (held by their worker), and PROXY-protocol sockets gone before their header."""

from __future__ import annotations

import struct
import time

import pytest
from kio.schema.errors import ErrorCode

from tests.harness import BrokerProcess, wait_until
from tests.admission.helpers import BALANCER, balancer_socket, v1_header, v2_header
from tests.security.helpers import authenticate, kafka_string, sasl_broker
from tests.wire import KafkaSocket, api_versions_request, peer_closed, raw_request

HELD_MS = 3000  # how long the broker holds a refused connection: longer than any wait below
PROMPT = 0.5  # a reconnect after a reported close is admitted within this


def first_answer(address) -> tuple[int, KafkaSocket]:
    """A connection's ApiVersions error code (0: admitted; POLICY_VIOLATION: refused)."""
    client = KafkaSocket(address)
    client.send(api_versions_request())
    return struct.unpack_from(">h", client.receive(), 4)[0], client


def admitted_within(address, seconds: float) -> KafkaSocket:
    """Reconnect until admitted (each refused connection closed by the client at once)."""
    deadline = time.monotonic() + seconds
    while True:
        code, client = first_answer(address)
        if code == ErrorCode.none:
            return client
        client.close()
        assert code == ErrorCode.policy_violation
        if time.monotonic() > deadline:
            raise AssertionError(f"refused for {seconds}s though the IP holds no connection")
        time.sleep(0.005)


def per_ip_refusals(broker, listener: str = "PLAINTEXT") -> float:
    return broker.metric("broker_connections_rejected_total", listener=listener,
                         reason="per_ip_limit")


@pytest.mark.system
def test_reconnects_are_refused_only_until_the_close_is_reported():
    """Close, reconnect at once, 20 times: a reconnect may be refused while the close is on its
    way from the worker (a few ms), never for the delay the refused ones are held."""
    overrides = {"max.connections.per.ip": "1",
                 "pybroker.connection.refusal.delay.ms": str(HELD_MS)}
    with BrokerProcess(workers=2, overrides=overrides) as broker:
        address = broker.listeners["PLAINTEXT"]
        client = admitted_within(address, PROMPT)
        for _ in range(20):
            client.close()
            client = admitted_within(address, PROMPT)
        client.close()
        assert per_ip_refusals(broker) < 20 * PROMPT / 0.005  # bounded by the polling


@pytest.mark.system
def test_a_refused_connection_held_by_the_broker_leaves_the_slot_free():
    overrides = {"max.connections.per.ip": "1",
                 "pybroker.connection.refusal.delay.ms": str(HELD_MS)}
    with BrokerProcess(workers=2, overrides=overrides) as broker:
        address = broker.listeners["PLAINTEXT"]
        holder = admitted_within(address, PROMPT)
        code, refused = first_answer(address)
        assert code == ErrorCode.policy_violation
        holder.close()
        admitted_within(address, PROMPT).close()  # while the refused one is still held
        assert not peer_closed(refused.sock, wait=0.1)
        refused.close()


def plain_login(address, user: str, password: str, source: str) -> tuple[int, KafkaSocket]:
    """A raw SASL/PLAIN exchange from `source`: (SaslAuthenticate's error code, or -1 if the
    broker closed the connection first; the socket)."""
    client = KafkaSocket(address, source=source)
    try:
        client.send(raw_request(17, 1, 2, kafka_string("PLAIN")))
        client.receive()
        code, _body = authenticate(client, f"\x00{user}\x00{password}".encode())
    except ConnectionError:
        code = -1
    return code, client


@pytest.mark.system
def test_a_connection_refused_for_its_user_frees_its_slots_at_once(pki):
    """alice may hold one connection and 127.0.0.9 two: alice's second is refused and held
    for the failed-authentication delay; meanwhile it is not counted on its listener and
    another user from 127.0.0.9 gets in."""
    source = "127.0.0.9"
    overrides = sasl_broker(pki, **{
        "pybroker.max.connections.per.user.overrides": "alice:1",
        "max.connections.per.ip.overrides": f"{source}:2",
        "connection.failed.authentication.delay.ms": str(HELD_MS)})
    with BrokerProcess(workers=2, overrides=overrides) as broker:
        address = broker.listeners["SASL_PLAINTEXT"]
        code, alice = plain_login(address, "alice", "alice-secret", source)
        assert code == ErrorCode.none
        code, refused = plain_login(address, "alice", "alice-secret", source)
        assert code == ErrorCode.sasl_authentication_failed
        assert broker.metric("broker_connections", listener="SASL_PLAINTEXT") == 1
        code, admin = plain_login(address, "admin", "admin-secret", source)
        assert code == ErrorCode.none, "the refused connection still counts against its IP"
        assert not peer_closed(refused.sock, wait=0.1)  # still held by its worker
        assert peer_closed(refused.sock, wait=HELD_MS / 1000 + 5)
        for client in (alice, refused, admin):
            client.close()
        wait_until(lambda: broker.metric("broker_connections",
                                         listener="SASL_PLAINTEXT") == 0)


def two_behind_a_balancer(**extra: str) -> dict[str, str]:
    """A listener of max.connections 2 behind a PROXY protocol balancer, with a header
    timeout no test waits for."""
    return {"pybroker.proxy.protocol.listeners": "PLAINTEXT",
            "pybroker.proxy.protocol.trusted.cidrs": f"{BALANCER}/32",
            "pybroker.proxy.protocol.timeout.ms": "30000", "max.connections": "2", **extra}


def fill_with_headers_unfinished(broker, header: bytes) -> list[KafkaSocket]:
    """Two balancer sockets that sent the start of `header`: the listener has no room."""
    waiting = [balancer_socket(broker, header[:12]) for _ in range(2)]
    wait_until(lambda: broker.metric("broker_acceptor_blocked_seconds_total",
                                     listener="PLAINTEXT") > 0)
    return waiting


@pytest.mark.system
def test_proxy_sockets_gone_before_their_header_free_the_listeners_room_at_once():
    """Two balancer sockets that leave before their header was whole filled a listener of
    max.connections 2: the next one is served at once, not when something else wakes the
    acceptor."""
    with BrokerProcess(workers=1, overrides=two_behind_a_balancer()) as broker:
        gone = fill_with_headers_unfinished(broker, v1_header("127.0.0.7"))
        for client in gone:
            client.close()
        third = balancer_socket(broker, v2_header("127.0.0.8")
                                + api_versions_request(correlation_id=3))
        third.sock.settimeout(3)
        assert struct.unpack_from(">i", third.receive())[0] == 3
        third.close()


@pytest.mark.system
def test_a_proxy_socket_refused_for_its_client_frees_the_listeners_room_at_once():
    """Two balancer sockets fill a listener of max.connections 2 while their headers are read;
    one header names a client with no connection allowed: refused, its room goes to the next
    socket at once (the other is still waiting for its header)."""
    overrides = two_behind_a_balancer(**{"max.connections.per.ip.overrides": "127.0.0.7:0"})
    with BrokerProcess(workers=1, overrides=overrides) as broker:
        header = v1_header("127.0.0.7")
        waiting = fill_with_headers_unfinished(broker, header)
        waiting[0].send(header[12:])
        wait_until(lambda: per_ip_refusals(broker) == 1)
        third = balancer_socket(broker, v2_header("127.0.0.8")
                                + api_versions_request(correlation_id=3))
        third.sock.settimeout(3)
        assert struct.unpack_from(">i", third.receive())[0] == 3
        for client in waiting + [third]:
            client.close()
