"""Real client addresses behind a load balancer: a broker whose listener
expects the PROXY protocol, reached by sockets that act as a trusted balancer (HAProxy's v1
and v2 headers, from 127.0.0.2), by untrusted peers, by peers that send no header or too
slowly, and through a real HAProxy (send-proxy-v2) by kafka-python."""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import tempfile

import pytest
from kio.schema.errors import ErrorCode

from broker.shared.config import ConfigError, load_config
from tests.admission.helpers import BALANCER, balancer_socket, v1_header, v2_header
from tests.harness import BrokerProcess, wait_until
from tests.helpers import free_port
from tests.wire import (KafkaSocket, api_versions_request, create_topic, decode_response,
                        peer_closed)


@pytest.mark.parametrize("settings, message", [
    ({"pybroker.proxy.protocol.listeners": "OUTSIDE",
      "pybroker.proxy.protocol.trusted.cidrs": "10.0.0.0/8"}, "no listener named OUTSIDE"),
    ({"pybroker.proxy.protocol.listeners": "PLAINTEXT"}, "needs pybroker.proxy.protocol"),
    ({"pybroker.proxy.protocol.listeners": "plaintext",
      "pybroker.proxy.protocol.trusted.cidrs": "10.0.0.0/33"}, "'10.0.0.0/33' is not a CIDR"),
])
def test_bad_proxy_settings_stop_the_start_with_one_line(settings, message):
    with pytest.raises(ConfigError, match=message):
        load_config(dict(settings, listeners="PLAINTEXT://127.0.0.1:0"))


@pytest.fixture(scope="module")
def proxied():
    """The broker, and a real HAProxy in front of it whose port the broker advertises."""
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not os.path.exists(haproxy):
        pytest.fail("HAProxy is needed: `make haproxy` installs Debian's package")
    front = free_port()
    overrides = {"pybroker.proxy.protocol.listeners": "PLAINTEXT",
                 "pybroker.proxy.protocol.trusted.cidrs": f"{BALANCER}/32",
                 "pybroker.proxy.protocol.timeout.ms": "500",
                 "advertised.listeners": f"PLAINTEXT://127.0.0.1:{front}",
                 # Judged on the balancer's address, everything would be refused.
                 "max.connections.per.ip.overrides": f"{BALANCER}:0,127.0.0.5:1,127.0.0.15:1"}
    with BrokerProcess(workers=2, overrides=overrides) as broker, \
            tempfile.TemporaryDirectory(prefix="pybroker-haproxy-") as directory:
        config = os.path.join(directory, "haproxy.cfg")
        with open(config, "w") as handle:
            handle.write(f"""global
    log stderr format raw local0 warning
defaults
    mode tcp
    timeout connect 5s
    timeout client 60s
    timeout server 60s
frontend kafka
    bind 127.0.0.1:{front}
    default_backend broker
backend broker
    source {BALANCER}
    server broker 127.0.0.1:{broker.port} send-proxy-v2
""")
        proc = subprocess.Popen([haproxy, "-db", "-f", config], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_until(lambda: _listening(front), timeout=10, message="HAProxy did not start")
            yield broker, front
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def answers(client: KafkaSocket, correlation: int = 5) -> bool:
    try:
        client.send(api_versions_request(correlation_id=correlation))
        return struct.unpack_from(">i", client.receive())[0] == correlation
    except OSError:
        return False


def rejected(broker, reason: str) -> float:
    return broker.metric("broker_connections_rejected_total", listener="PLAINTEXT",
                         reason=reason)


@pytest.mark.system
@pytest.mark.parametrize("header, client", [(v1_header, "127.0.0.5"), (v2_header, "127.0.0.15")])
def test_limits_count_the_client_the_header_names_not_the_balancer(proxied, header, client):
    """`client` may hold one connection (each format its own: a close is released by the
    parent a moment after the client's close returns)."""
    broker, _front = proxied
    before = rejected(broker, "per_ip_limit")
    first = balancer_socket(broker, header(client) + api_versions_request(correlation_id=1))
    try:  # the header and the first request in one segment: the request is the worker's
        assert decode_response(18, 3, first.receive())[1].error_code == ErrorCode.none
        second = balancer_socket(broker, header(client))  # over its limit
        assert peer_closed(second.sock, wait=5)
        other = balancer_socket(broker, header("127.0.0.6"))
        assert answers(other)
        other.close()
        wait_until(lambda: rejected(broker, "per_ip_limit") == before + 1)
    finally:
        first.close()


@pytest.mark.system
def test_untrusted_peers_missing_and_slow_headers_are_closed_and_counted(proxied):
    broker, _front = proxied
    counts = {reason: rejected(broker, reason)
              for reason in ("proxy_untrusted", "proxy_invalid", "proxy_timeout")}
    direct = KafkaSocket(broker.listeners["PLAINTEXT"])  # from 127.0.0.1: not a balancer
    direct.send(v1_header("127.0.0.6") + api_versions_request())
    assert peer_closed(direct.sock, wait=5)
    missing = balancer_socket(broker, api_versions_request())  # Kafka bytes, no header
    assert peer_closed(missing.sock, wait=5)
    slow = balancer_socket(broker, v1_header("127.0.0.6")[:10])  # never finished
    assert peer_closed(slow.sock, wait=5)
    for client in (direct, missing, slow):
        client.close()
    wait_until(lambda: all(rejected(broker, reason) == count + 1
                           for reason, count in counts.items()))
    assert broker.proc.poll() is None and broker.metric("broker_worker_restarts_total") == 0


@pytest.mark.system
def test_kafka_python_produces_and_consumes_through_haproxy(proxied):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    broker, front = proxied
    bootstrap = f"127.0.0.1:{front}"
    accepted = broker.metric("broker_connections_accepted_total", listener="PLAINTEXT")
    create_topic(bootstrap, "behind-haproxy")
    producer = KafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=10000)
    try:
        for index in range(20):
            producer.send("behind-haproxy", b"record-%d" % index).get(timeout=20)
    finally:
        producer.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, consumer_timeout_ms=10000,
                             auto_offset_reset="earliest")
    try:
        consumer.assign([TopicPartition("behind-haproxy", 0)])
        values = [record.value for _, record in zip(range(20), consumer)]
    finally:
        consumer.close()
    assert values == [b"record-%d" % index for index in range(20)]
    # Every connection came from the balancer's address, which may have none of its own
    # (max.connections.per.ip.overrides 127.0.0.2:0): each was admitted as its client.
    assert broker.metric("broker_connections_accepted_total", listener="PLAINTEXT") > accepted


@pytest.mark.system
def test_sockets_waiting_for_their_header_count_against_max_connections():
    """Two balancer sockets that never finish their header fill a listener of
    max.connections 2: a third waits in the kernel's backlog, and is served once the two
    time out."""
    overrides = {"pybroker.proxy.protocol.listeners": "PLAINTEXT",
                 "pybroker.proxy.protocol.trusted.cidrs": f"{BALANCER}/32",
                 "pybroker.proxy.protocol.timeout.ms": "1500", "max.connections": "2"}
    with BrokerProcess(workers=1, overrides=overrides) as broker:
        slow = [balancer_socket(broker, v1_header("127.0.0.7")[:12]) for _ in range(2)]
        wait_until(lambda: broker.metric("broker_acceptor_blocked_seconds_total",
                                         listener="PLAINTEXT") > 0)  # both held: no room
        third = balancer_socket(broker, v2_header("127.0.0.8")
                                + api_versions_request(correlation_id=3))
        third.sock.settimeout(0.7)
        with pytest.raises(socket.timeout):  # not accepted: no room
            third.sock.recv(8)
        third.sock.settimeout(10)
        assert struct.unpack_from(">i", third.receive())[0] == 3  # after the two timed out
        for client in slow:
            assert peer_closed(client.sock, wait=5)
            client.close()
        third.close()
        assert rejected(broker, "proxy_timeout") == 2
