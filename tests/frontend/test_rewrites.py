"""Front-end mode in process: answers that name upstream nodes rewritten to the front-end's
ports, a Produce's acks found in its frame, the edge's ACLs splitting a Fetch, and a
listener's node ports pausing together counted once."""

from __future__ import annotations

import datetime
import struct
import uuid

import pytest
from kio.schema.errors import ErrorCode

from broker.shared.access import Access
from broker.shared.acl import Acl, Operation, PatternType, Permission, ResourceType
from broker.shared.protocol.client_codec import decode_response, request_frame
from broker.shared.protocol.codec import build, encode_entity, frame, request_readers, response_class
from broker.shared.protocol.context import NO_THROTTLE, RequestContext
from workers import upstream_rewrite as rewrite
from workers.apis import edge_acls

SECOND = datetime.timedelta(seconds=1)
FRONT = {1: ("front", 9101), 2: ("front", 9102)}  # node 3 has no front-end port


def address(node_id: int):
    return FRONT.get(node_id)


def answer(api_key: int, version: int, values: dict, flexible: bool = True) -> bytes:
    return frame(b"\0\0\0\7", flexible, encode_entity(build(response_class(api_key, version),
                                                            values)))


def test_metadata_names_the_front_end_and_leaves_out_nodes_without_a_port():
    upstream = answer(3, 12, {"throttle_time": NO_THROTTLE, "cluster_id": "c", "controller_id": 2,
                              "topics": [], "brokers": [
                                  {"node_id": n, "host": "kafka", "port": 9000 + n, "rack": None}
                                  for n in (1, 2, 3)]})
    _, body = decode_response(3, 12, rewrite.metadata(upstream, 12, address))
    assert [(b.node_id, b.host, b.port) for b in body.brokers] == [(1, "front", 9101),
                                                                   (2, "front", 9102)]
    assert body.controller_id == 2 and body.cluster_id == "c"


@pytest.mark.parametrize("version", [3, 6])
def test_find_coordinator_names_the_front_end(version):
    if version < 4:
        values = {"error_code": ErrorCode.none, "error_message": None, "node_id": 2,
                  "host": "kafka", "port": 9002}
    else:
        values = {"coordinators": [
            {"key": key, "node_id": node, "host": "kafka", "port": 9000 + node,
             "error_code": ErrorCode.none, "error_message": None}
            for key, node in (("g1", 2), ("g2", 3))]}
    _, body = decode_response(10, version, rewrite.find_coordinator(
        answer(10, version, {"throttle_time": NO_THROTTLE, **values}), version, address))
    if version < 4:
        assert (body.node_id, body.host, body.port) == (2, "front", 9102)
    else:
        first, second = body.coordinators
        assert (first.node_id, first.host, first.port) == (2, "front", 9102)
        assert second.node_id == -1 and second.error_code == ErrorCode.coordinator_not_available


def test_produce_node_endpoints_are_rewritten_and_plain_answers_untouched():
    values = {"throttle_time": NO_THROTTLE, "responses": [], "node_endpoints": []}
    plain = answer(0, 10, values)
    assert rewrite.node_endpoints(0)(plain, 10, address) is plain
    moved = answer(0, 10, dict(values, node_endpoints=[
        {"node_id": 1, "host": "kafka", "port": 9001, "rack": None}]))
    _, body = decode_response(0, 10, rewrite.node_endpoints(0)(moved, 10, address))
    assert [(e.node_id, e.host, e.port) for e in body.node_endpoints] == [(1, "front", 9101)]


@pytest.mark.parametrize("version,transactional_id", [(3, None), (3, "tx"), (9, None),
                                                       (12, "a-transaction")])
def test_acks_are_found_after_the_transactional_id(version, transactional_id):
    request = request_frame(0, version, 1, "c", {"transactional_id": transactional_id,
                                                 "acks": 0, "timeout": SECOND, "topic_data": []})
    frame_body = request[4:]
    _, body_at = request_readers(0, version)[0](frame_body, 0)
    at = rewrite.acks_at(frame_body, body_at, version)
    assert struct.unpack_from(">h", frame_body, at)[0] == 0
    assert struct.unpack_from(">i", frame_body, at + 2)[0] == 1000  # the timeout follows


def fetch_request(version: int, topics: list[str]):
    values = {"replica_id": -1, "max_wait": datetime.timedelta(milliseconds=500), "min_bytes": 1, "max_bytes": 1 << 20,
              "isolation_level": 0, "session_id": 0, "session_epoch": -1,
              "topics": [{"topic": name, "partitions": [
                  {"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0,
                   "last_fetched_epoch": -1, "log_start_offset": -1,
                   "partition_max_bytes": 1 << 20}]} for name in topics],
              "forgotten_topics_data": [], "rack_id": ""}
    request = request_frame(1, version, 9, "c", values)[4:]
    _, body_at = request_readers(1, version)[0](request, 0)
    return request, body_at, request_readers(1, version)[1](request, body_at)[0]


def reader_access() -> Access:
    access = Access(True)
    access.update([Acl(int(ResourceType.TOPIC), "mine", int(PatternType.LITERAL), "User:alice",
                       "*", int(Operation.READ), int(Permission.ALLOW))])
    return access


def test_a_fetch_naming_a_refused_topic_is_split_and_merged_back():
    request, body_at, body = fetch_request(12, ["mine", "theirs"])
    ctx = RequestContext(request[4:8], 1, 12, 0, None, "alice", "127.0.0.1", len(request))
    verdict = edge_acls.check(reader_access(), ctx, body)
    assert type(verdict) is edge_acls.Split
    sent = edge_acls.request_with(request, body_at, verdict.body)
    assert [t.topic for t in request_readers(1, 12)[1](sent, body_at)[0].topics] == ["mine"]
    upstream = answer(1, 12, {"throttle_time": NO_THROTTLE, "error_code": ErrorCode.none, "session_id": 5,
                              "responses": [{"topic": "mine", "partitions": [
                                  {"partition_index": 0, "error_code": ErrorCode.none,
                                   "high_watermark": 3, "last_stable_offset": 3,
                                   "log_start_offset": 0, "aborted_transactions": None,
                                   "preferred_read_replica": -1, "records": b"batch"}]}]})
    _, merged = decode_response(1, 12, edge_acls.merged(upstream, 1, 12, verdict))
    codes = {t.topic: t.partitions[0].error_code for t in merged.responses}
    assert codes == {"mine": ErrorCode.none,
                     "theirs": ErrorCode.topic_authorization_failed}
    assert merged.responses[0].partitions[0].records == b"batch" and merged.session_id == 5


def test_a_fetch_of_refused_topics_only_is_answered_at_the_edge():
    request, _, body = fetch_request(12, ["theirs"])
    ctx = RequestContext(request[4:8], 1, 12, 0, None, "bob", "127.0.0.1", len(request))
    local = edge_acls.check(reader_access(), ctx, body)
    _, refused = decode_response(1, 12, local)
    assert refused.responses[0].partitions[0].error_code == ErrorCode.topic_authorization_failed


def test_metadata_by_id_refuses_what_the_principal_may_not_describe():
    access = reader_access()
    topic_id = uuid.uuid4()
    request = request_frame(3, 12, 1, "c", {"topics": [{"topic_id": topic_id, "name": None}],
                                            "allow_auto_topic_creation": False,
                                            "include_topic_authorized_operations": True})[4:]
    _, body_at = request_readers(3, 12)[0](request, 0)
    body = request_readers(3, 12)[1](request, body_at)[0]
    ctx = RequestContext(request[4:8], 3, 12, 0, None, "bob", "127.0.0.1", len(request))
    verdict = edge_acls.check(access, ctx, body)
    upstream = answer(3, 12, {"throttle_time": NO_THROTTLE, "cluster_id": "c", "controller_id": 1,
                              "brokers": [], "topics": [
                                  {"error_code": ErrorCode.none, "name": "theirs",
                                   "topic_id": topic_id, "is_internal": False, "partitions": [],
                                   "topic_authorized_operations": 248}]})
    _, filtered = decode_response(3, 12, edge_acls.filtered(upstream, 3, 12, verdict))
    (topic,) = filtered.topics
    assert topic.error_code == ErrorCode.topic_authorization_failed and topic.partitions == ()


def test_a_listeners_ports_pausing_together_count_the_pause_once():
    from broker.parent.acceptor import ListenerPauses

    pauses = ListenerPauses()
    first = pauses.add(1.0)
    second = pauses.add(1.0)  # another port of the listener, paused at the same moment
    third = pauses.add(1.5)  # reaches half a second past the others
    assert abs(first - 1e9) < 1e7 and second < 1e7 and abs(third - 0.5e9) < 1e7


@pytest.mark.parametrize("version,key_type,code", [
    (0, 0, ErrorCode.group_authorization_failed), (3, 1,
                                                   ErrorCode.transactional_id_authorization_failed),
    (3, 2, ErrorCode.cluster_authorization_failed), (6, 2,
                                                     ErrorCode.cluster_authorization_failed)])
def test_find_coordinator_refusals_encode_in_every_version(version, key_type, code):
    values = ({"key_type": key_type, "coordinator_keys": ["k"]} if version >= 4
              else {"key": "k", "key_type": key_type})
    request = request_frame(10, version, 1, "c", values)[4:]
    _, body_at = request_readers(10, version)[0](request, 0)
    body = request_readers(10, version)[1](request, body_at)[0]
    ctx = RequestContext(request[4:8], 10, version, 0, None, "bob", "127.0.0.1", len(request))
    _, refused = decode_response(10, version, edge_acls.check(reader_access(), ctx, body))
    found = refused.coordinators[0].error_code if version >= 4 else refused.error_code
    assert found == code
