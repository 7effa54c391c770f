"""Shadow mode: limits that observe only.  Connections over a shadowed
per-IP limit are admitted and counted as dry runs until the limit is switched to enforce
(dynamically); a client over a shadowed quota is not throttled, its would-be throttle is
counted, and once switched it is throttled."""

from __future__ import annotations

import datetime
import socket
import struct

import pytest
from kio.schema.errors import ErrorCode

from tests.batches import make_batch
from tests.harness import BrokerProcess, wait_until
from tests.wire import (KafkaSocket, alter_client_quota, alter_raw, api_versions_request,
                        create_topic, decode_response, produce_request)

pytestmark = pytest.mark.system
LIMITED = "127.0.0.3"  # the address with a per-IP limit of 1 (the admin helpers use 127.0.0.1)


@pytest.fixture(scope="module")
def broker():
    overrides = {"max.connections.per.ip.overrides": f"{LIMITED}:1",
                 "pybroker.shadow.connections.per.ip": "true",
                 "pybroker.shadow.client.quotas": "true"}
    with BrokerProcess(workers=2, overrides=overrides) as running:
        yield running


def dry_runs(broker, reason: str) -> float:
    return broker.metric("broker_connections_rejected_dry_run_total", listener="PLAINTEXT",
                         reason=reason)


def limited_socket(broker) -> KafkaSocket:
    client = KafkaSocket.__new__(KafkaSocket)
    client.sock = socket.create_connection(broker.listeners["PLAINTEXT"], timeout=5,
                                           source_address=(LIMITED, 0))
    client._buffer = b""
    return client


def first_answer_error(broker) -> int:
    """Connect from the limited address, ask ApiVersions; the error code (0: served)."""
    with limited_socket(broker) as client:
        client.send(api_versions_request(version=0, correlation_id=4))
        return decode_response(18, 0, client.receive())[1].error_code


def test_a_shadowed_per_ip_limit_counts_then_enforces_after_a_dynamic_switch(broker):
    address = broker.listeners["PLAINTEXT"]
    assert alter_raw(address, "0", "pybroker.shadow.connections.per.ip", "maybe") != ErrorCode.none
    before = dry_runs(broker, "per_ip_limit")
    held = [limited_socket(broker) for _ in range(3)]  # the limit is 1
    try:
        for client in held:
            client.send(api_versions_request(correlation_id=8))
            assert struct.unpack_from(">i", client.receive())[0] == 8  # all served
        wait_until(lambda: dry_runs(broker, "per_ip_limit") == before + 2)
        assert broker.metric("broker_connections_rejected_total", listener="PLAINTEXT",
                             reason="per_ip_limit") == 0
        # The switch, from 127.0.0.1 (no limit there); the limited address is refused after.
        assert alter_raw(address, "0", "pybroker.shadow.connections.per.ip", "false") == ErrorCode.none
        assert first_answer_error(broker) == ErrorCode.policy_violation  # enforced now
        assert broker.metric("broker_connections_rejected_total", listener="PLAINTEXT",
                             reason="per_ip_limit") == 1
    finally:
        for client in held:
            client.close()
    wait_until(lambda: first_answer_error(broker) == ErrorCode.none)  # back under the limit


def produce_throttle_ms(client: KafkaSocket, correlation: int) -> int:
    client.send(produce_request("shadowed", make_batch(100, value_size=1000),
                                correlation_id=correlation))
    _, body = decode_response(0, 9, client.receive())
    assert body.responses[0].partition_responses[0].error_code == ErrorCode.none
    return body.throttle_time // datetime.timedelta(milliseconds=1)


def test_a_shadowed_quota_throttles_no_one_and_counts_what_it_would_have(broker):
    address = broker.listeners["PLAINTEXT"]
    create_topic(broker.bootstrap, "shadowed")
    assert alter_client_quota(address, {"client-id": "test"}, "producer_byte_rate", 50_000) == ErrorCode.none
    with KafkaSocket(address) as client:  # 100 KB a request, twice the quota a second
        throttles = [produce_throttle_ms(client, n) for n in range(10)]
        assert throttles == [0] * 10
        assert broker.metric("broker_throttle_time_dry_run_seconds_total",
                             quota="producer_byte_rate") > 0
        assert broker.metric("broker_throttle_time_seconds_total",
                             quota="producer_byte_rate") == 0
        assert alter_raw(address, "0", "pybroker.shadow.client.quotas", "false") == ErrorCode.none
        wait_until(lambda: produce_throttle_ms(client, 99) > 0, timeout=10)
    assert broker.metric("broker_throttle_time_seconds_total", quota="producer_byte_rate") > 0
