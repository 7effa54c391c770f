"""Legible refusals: a connection over its IP's limit has its first
request answered (ApiVersions: POLICY_VIOLATION, in v0's layout) and is closed a delay later;
what kafka-python and confluent-kafka make of it."""

from __future__ import annotations

import io
import logging
import struct
import time

import pytest
from kio.schema.errors import ErrorCode

from broker.parent.refusal_answer import api_versions_refusal
from tests.harness import BrokerProcess, wait_until
from tests.wire import KafkaSocket, api_versions_request, decode_response, metadata_request


def test_the_refusal_is_an_api_versions_v0_answer_with_the_error():
    frame = api_versions_refusal(b"\x00\x00\x00\x09")
    assert struct.unpack_from(">i", frame)[0] == len(frame) - 4
    correlation, body = decode_response(18, 0, frame[4:])
    assert correlation == 9 and body.error_code == ErrorCode.policy_violation
    assert [key.api_key for key in body.api_keys] == [18]


@pytest.fixture(scope="module")
def limited():
    """127.0.0.1 may hold one connection; the test holds it."""
    overrides = {"max.connections.per.ip.overrides": "127.0.0.1:1",
                 "pybroker.connection.refusal.delay.ms": "1000"}
    with BrokerProcess(workers=2, overrides=overrides) as broker:
        with KafkaSocket(broker.listeners["PLAINTEXT"]) as holder:
            holder.send(api_versions_request())
            holder.receive()
            yield broker


def refused(broker) -> float:
    return broker.metric("broker_connections_rejected_total", listener="PLAINTEXT",
                         reason="per_ip_limit")


@pytest.mark.system
def test_a_refused_api_versions_is_answered_then_closed_after_the_delay(limited):
    before = refused(limited)
    with KafkaSocket(limited.listeners["PLAINTEXT"]) as client:
        client.send(api_versions_request(version=3, correlation_id=21))
        correlation, body = decode_response(18, 0, client.receive())
        answered = time.monotonic()
        assert correlation == 21 and body.error_code == ErrorCode.policy_violation
        client.sock.settimeout(5)
        assert client.sock.recv(16) == b""  # then closed, not at once
        assert time.monotonic() - answered >= 0.8
    with KafkaSocket(limited.listeners["PLAINTEXT"]) as client:  # not ApiVersions: no answer
        client.send(metadata_request())
        client.sock.settimeout(5)
        assert client.sock.recv(16) == b""
    wait_until(lambda: refused(limited) >= before + 2)


@pytest.mark.system
def test_real_clients_log_the_refusal(limited):
    from confluent_kafka import Producer
    from kafka import KafkaProducer
    from kafka.errors import KafkaTimeoutError

    logged = io.StringIO()
    handler = logging.StreamHandler(logged)
    for name in ("kafka", "rdkafka"):
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(logging.INFO)
    try:
        with pytest.raises(KafkaTimeoutError):
            KafkaProducer(bootstrap_servers=limited.bootstrap, bootstrap_timeout_ms=2000)
        producer = Producer({"bootstrap.servers": limited.bootstrap,
                             "logger": logging.getLogger("rdkafka")})
        deadline = time.monotonic() + 10
        while "Policy violation" not in logged.getvalue() and time.monotonic() < deadline:
            producer.poll(0.2)
    finally:
        for name in ("kafka", "rdkafka"):
            logging.getLogger(name).removeHandler(handler)
    text = logged.getvalue()
    assert "[Error 44] PolicyViolationError" in text  # kafka-python
    assert "ApiVersionRequest failed: Broker: Policy violation" in text  # librdkafka
    assert limited.proc.poll() is None
