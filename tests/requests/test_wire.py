"""Raw-socket behaviour of a running broker: framing limits, ordering, bad input."""

import os
import struct
import time

import pytest
from kio.schema.errors import ErrorCode

from tests.harness import BrokerProcess, wait_until
from tests.wire import (KafkaSocket, api_versions_request, decode_response, frame, metadata_request,
                        peer_closed, raw_request)

pytestmark = pytest.mark.system  # every test here starts a broker

MAX_BYTES = 4096


@pytest.fixture(scope="module")
def broker():
    with BrokerProcess(workers=2, overrides={"socket.request.max.bytes": str(MAX_BYTES),
                                             "auto.create.topics.enable": "false"}) as b:
        yield b


def assert_still_serving(broker):
    """A fresh connection is answered: the worker that closed a bad client is alive."""
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        client.send(api_versions_request(correlation_id=99))
        correlation, response = decode_response(18, 3, client.receive())
        assert correlation == 99 and response.error_code == ErrorCode.none


def invalid_count(broker, reason):
    return broker.metric("broker_invalid_requests_total", reason=reason)


def test_api_versions_lists_only_what_is_served(broker):
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        for version in range(5):
            client.send(api_versions_request(version, correlation_id=version))
            correlation, response = decode_response(18, version, client.receive())
            assert correlation == version
            assert response.error_code == ErrorCode.none
            assert {(k.api_key, k.min_version, k.max_version) for k in response.api_keys} == {
                (0, 3, 10), (1, 4, 16), (2, 1, 11), (3, 0, 13), (10, 0, 6), (18, 0, 4),
                (19, 2, 7), (20, 1, 6), (22, 0, 4), (32, 1, 4), (44, 0, 1), (48, 0, 1),
                (49, 0, 1), (60, 0, 2), (8, 2, 9), (9, 1, 9), (11, 0, 7), (12, 0, 4), (13, 0, 5),
                (14, 0, 5), (15, 0, 6), (16, 0, 5), (42, 0, 2),
                (17, 0, 1), (36, 0, 2), (50, 0, 0), (51, 0, 0),  # SASL and SCRAM
                (29, 1, 3), (30, 1, 3), (31, 1, 3),  # ACLs
                (21, 0, 2), (33, 0, 2), (35, 1, 4), (37, 0, 3), (47, 0, 0), (61, 0, 0),  # 18
                (24, 0, 5), (25, 0, 4), (26, 0, 4), (28, 0, 5), (65, 0, 0), (66, 0, 1),  # 22
                (68, 0, 1), (69, 0, 1),  # KIP-848
                (76, 1, 1), (77, 1, 1), (78, 1, 1), (79, 1, 1), (90, 0, 1), (91, 0, 0),
                (92, 0, 0)}  # KIP-932


def test_unsupported_api_versions_version_gets_a_v0_answer(broker):
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        client.send(raw_request(18, 77, correlation_id=5, rest=b"\x00\x00"))
        correlation, response = decode_response(18, 0, client.receive())
        assert correlation == 5
        assert response.error_code == ErrorCode.unsupported_version
        assert [(k.api_key, k.min_version, k.max_version) for k in response.api_keys] == [(18, 0, 4)]
        client.send(api_versions_request(3, correlation_id=6))  # the connection stays usable
        assert decode_response(18, 3, client.receive())[0] == 6


def test_invalid_client_software_name_gets_invalid_request(broker):
    body = bytes([len("bad name!") + 1]) + b"bad name!" + b"\x021\x00"
    header = struct.pack(">hhih", 18, 3, 8, 1) + b"x" + b"\x00"
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        client.send(frame(header + body))
        correlation, response = decode_response(18, 3, client.receive())
        assert correlation == 8 and response.error_code == ErrorCode.invalid_request
        assert response.api_keys == ()


def test_metadata_names_this_broker_and_unknown_topics(broker):
    host, port = broker.listeners["PLAINTEXT"]
    with KafkaSocket((host, port)) as client:
        for version in (1, 5, 9, 12):
            client.send(metadata_request(version, correlation_id=version, topics=["nope"]))
            correlation, response = decode_response(3, version, client.receive())
            assert correlation == version
            assert [(b.node_id, b.host, b.port) for b in response.brokers] == [(0, host, port)]
            assert [(t.name, t.error_code) for t in response.topics] == \
                [("nope", ErrorCode.unknown_topic_or_partition)]


def test_pipelined_requests_are_answered_in_order(broker):
    requests = b"".join(
        api_versions_request(3, correlation_id=i) if i % 2 else metadata_request(12, correlation_id=i)
        for i in range(200))
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        client.send(requests)
        correlations = [struct.unpack_from(">i", client.receive())[0] for _ in range(200)]
    assert correlations == list(range(200))


def test_requests_split_across_many_writes_are_served(broker):
    data = b"".join(api_versions_request(3, correlation_id=i) for i in range(20))
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        for start in range(0, len(data), 7):
            client.send(data[start:start + 7])
        assert [struct.unpack_from(">i", client.receive())[0] for _ in range(20)] == list(range(20))


@pytest.mark.parametrize("size, reason", [(-1, "size_negative"), (MAX_BYTES + 1, "size_too_large"),
                                          (2**31 - 1, "size_too_large")])
def test_bad_size_prefix_closes_the_connection(broker, size, reason):
    before = invalid_count(broker, reason)
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        client.send(struct.pack(">i", size) + b"\x00" * 16)
        assert client.is_closed_by_peer()
    wait_until(lambda: invalid_count(broker, reason) == before + 1)
    assert_still_serving(broker)


def test_largest_allowed_frame_is_read_and_judged(broker):
    # A frame of exactly socket.request.max.bytes is read in full (large-frame path), then
    # rejected for what it is: an unknown API key.
    before = invalid_count(broker, "unknown_api")
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        body = struct.pack(">hhi", 1000, 0, 1) + os.urandom(MAX_BYTES - 8)
        client.send(frame(body))
        assert client.is_closed_by_peer()
    wait_until(lambda: invalid_count(broker, "unknown_api") == before + 1)


@pytest.mark.parametrize("payload, reason", [
    (raw_request(1000, 0, 1), "unknown_api"),
    (raw_request(3, 99, 1), "unsupported_version"),
    (frame(b"\x00\x12"), "frame_too_small"),
    (frame(struct.pack(">hhih", 18, 3, 1, 200) + b"abc"), "malformed_header"),
    (frame(struct.pack(">hhih", 3, 12, 1, 1) + b"x\x00" + b"\xff" * 3), "malformed_body"),
])
def test_bad_requests_close_the_connection_and_count(broker, payload, reason):
    before = invalid_count(broker, reason)
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        client.send(api_versions_request(3, correlation_id=1) + payload)
        assert struct.unpack_from(">i", client.receive())[0] == 1  # answered before the bad one
        assert client.is_closed_by_peer()
    wait_until(lambda: invalid_count(broker, reason) == before + 1)
    assert_still_serving(broker)


def test_garbage_never_crashes_a_worker(broker):
    pids_before = dict(broker.worker_pids)
    rng = __import__("random").Random(7)
    clients = []
    try:
        # All at once, each held open until the broker closes it or for a second after the
        # last was sent (one at a time, each was held 0.2 s): the waits of the frames that
        # wait for more bytes overlap instead of adding up to 10 s.
        for _ in range(100):
            junk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
            size = rng.choice([len(junk), len(junk) + 10, rng.randrange(-10, 100)])
            clients.append(KafkaSocket(broker.listeners["PLAINTEXT"]))
            clients[-1].send(struct.pack(">i", size) + junk)
        deadline = time.monotonic() + 1.0
        for client in clients:
            peer_closed(client.sock, wait=max(0.001, deadline - time.monotonic()))
    finally:
        for client in clients:
            client.close()
    assert_still_serving(broker)
    assert broker.worker_pids == pids_before
    assert broker.metric("broker_worker_restarts_total") == 0


def _with_unknown_tags(request: bytes) -> bytes:
    """A flexible request frame with an unknown tagged field in its header and its body (the
    body's top-level tagged fields come last: its final byte is their count, 0)."""
    body = request[4:]
    size = struct.unpack_from(">h", body, 8)[0]
    header_end = 10 + max(size, 0)
    assert body[header_end] == 0 and body[-1] == 0  # no tagged fields yet
    tagged = b"\x01\x2a\x03xyz"  # one field, tag 42, three bytes no schema knows
    return frame(body[:header_end] + tagged + body[header_end + 1:-1] + tagged)


def test_unknown_tagged_fields_are_skipped_as_the_protocol_says(broker):
    """A newer client's tagged fields (KIP-482) are skipped, in a request a worker
    serves and in one it forwards to the parent (DescribeConfigs v4)."""
    from tests.wire import describe_configs_request

    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        client.send(_with_unknown_tags(metadata_request(12, correlation_id=5)))
        correlation, response = decode_response(3, 12, client.receive())
        assert correlation == 5 and response.brokers
        client.send(_with_unknown_tags(describe_configs_request(correlation_id=6)))
        correlation, response = decode_response(32, 4, client.receive())
        assert correlation == 6 and response.results[0].configs[0].name == "max.connections"
    assert_still_serving(broker)
