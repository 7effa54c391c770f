"""Front-end mode with an authorizer: Kafka's ACL checks made at the edge, before a request
goes upstream, with the front-end's own ACLs (altered on its control plane) and the client's
principal; the upstream sees the front-end's identity and trusts it.

Each request the front-end authorizes is decoded (kio, behind the request guard) and checked
where Kafka's KafkaApis checks it.  What a check decides:

  None      every resource is allowed: the frame goes upstream untouched
  bytes     nothing is allowed: the front-end answers itself, with Kafka's error per resource
  Split     some are: the request goes upstream without the refused entries, and the answer
            comes back with them added (their error) - so a client gets what Kafka would
            give it, entry by entry (Produce, Fetch, ListOffsets, OffsetCommit, CreateTopics,
            DeleteTopics, DescribeConfigs, DeleteGroups, DescribeGroups, TxnOffsetCommit)
  Filter    allowed, and the answer is filtered (Metadata: topics the principal may not
            DESCRIBE left out or refused, authorized operations its own; ListGroups)

Topics are named, never given by id, in the versions offered with an authorizer (`CAPS`):
Produce up to v12, Fetch up to v12, OffsetCommit and OffsetFetch up to v9.  APIs not in
`CHECKS` (cluster administration: ACLs, quotas, SCRAM, log dirs, reassignments, ...) are not
offered with an authorizer: they are the front-end's own (its control plane) or the cluster's
(reached directly by its operators).
"""

from __future__ import annotations

import dataclasses
import uuid

from broker.shared.acl import CLUSTER_NAME, Operation, ResourceType
from broker.shared.protocol.client_codec import decode_response, reencode_response
from broker.shared.protocol.codec import nested_types, build, encode_entity
from broker.shared.protocol.context import NO_THROTTLE, RequestContext
from broker.shared.protocol.errors import ErrorCode
from workers.router import InvalidRequest

CAPS = {0: 12, 1: 12, 8: 9, 9: 9}
# Metadata below v4 has no allow_auto_topic_creation: it would create any topic it names.
FLOORS = {3: 4}
TOPIC, GROUP, TXN, CLUSTER = (ResourceType.TOPIC, ResourceType.GROUP,
                              ResourceType.TRANSACTIONAL_ID, ResourceType.CLUSTER)
TOPIC_DENIED = ErrorCode.topic_authorization_failed
GROUP_DENIED = ErrorCode.group_authorization_failed
TXN_DENIED = ErrorCode.transactional_id_authorization_failed
CLUSTER_DENIED = ErrorCode.cluster_authorization_failed
NO_OPERATIONS = -2147483648
ZERO_UUID = uuid.UUID(int=0)


@dataclasses.dataclass(frozen=True)
class Split:
    """Send `body` instead; add `entries` (dicts) to the answer's `field`."""

    body: object
    field: str
    entries: list


@dataclasses.dataclass(frozen=True)
class Filter:
    """Send the request as it is (or `body` instead, if set); pass the decoded answer
    through `answer(body) -> body` (None: the answer as it comes)."""

    answer: object
    body: object = None


def request_with(request, body_at: int, body) -> bytes:
    """The request frame with `body` encoded in place of its own, behind the same header."""
    return b"".join((bytes(request[:body_at]), encode_entity(body)))


def merged(answer, api_key: int, version: int, verdict: Split) -> bytes:
    """The upstream answer with the refused entries added to the split's field."""
    body_at, body = decode_response(api_key, version, answer)
    entry = nested_types(type(body))[verdict.field]
    extra = tuple(build(entry, values) for values in verdict.entries)
    body = dataclasses.replace(body, **{verdict.field: getattr(body, verdict.field) + extra})
    return reencode_response(answer, body_at, body)


def filtered(answer, api_key: int, version: int, verdict: Filter) -> bytes:
    """The upstream answer as the filter makes it."""
    body_at, body = decode_response(api_key, version, answer)
    return reencode_response(answer, body_at, verdict.answer(body))


def _split(ctx, body, field: str, items, denied: dict, entry, answer_field: str,
           top: dict):
    """Refused entries answered, allowed ones sent: None, a full local answer, or a Split."""
    if not denied:
        return None
    entries = [entry(item, denied[id(item)]) for item in items if id(item) in denied]
    kept = tuple(item for item in items if id(item) not in denied)
    if not kept:
        return ctx.respond({**top, answer_field: entries})
    return Split(dataclasses.replace(body, **{field: kept}), answer_field, entries)


# --- the data path --------------------------------------------------------------------------

def produce(access, ctx, body):
    topics = body.topic_data
    if body.transactional_id is not None and not access.check(
            ctx, Operation.WRITE, TXN, body.transactional_id):
        denied = {id(topic): TXN_DENIED for topic in topics}
    else:
        denied = {id(topic): TOPIC_DENIED for topic in topics
                  if not access.check(ctx, Operation.WRITE, TOPIC, topic.name)}
    if denied and body.acks == 0:  # Kafka closes an acks=0 producer's connection on errors
        raise InvalidRequest("produce_failed", "acks=0 produce the principal may not make")
    return _split(ctx, body, "topic_data", topics, denied, lambda topic, code: {
        "name": topic.name, "partition_responses": [
            {"index": part.index, "error_code": code, "base_offset": -1,
             "log_append_time": None, "log_start_offset": -1, "record_errors": [],
             "error_message": None} for part in topic.partition_data]},
        "responses", {"throttle_time": NO_THROTTLE, "node_endpoints": []})


def fetch(access, ctx, body):
    """READ on every topic named.  Incremental sessions (KIP-227) are turned off - the
    request goes up with session 0 and epoch -1, a full fetch that opens none - since an
    incremental fetch answers for partitions it does not name, which the edge could not
    check."""
    if getattr(body, "session_id", 0) or getattr(body, "session_epoch", -1) != -1:
        body = dataclasses.replace(body, session_id=0, session_epoch=-1)
        sessionless = True
    else:
        sessionless = False
    denied = {id(topic): TOPIC_DENIED for topic in body.topics
              if not access.check(ctx, Operation.READ, TOPIC, topic.topic)}
    if not denied and sessionless:
        return Filter(None, body)  # sent without its session, the answer as it comes
    return _split(ctx, body, "topics", body.topics, denied, lambda topic, code: {
        "topic": topic.topic, "partitions": [
            {"partition_index": part.partition, "error_code": code, "high_watermark": -1,
             "last_stable_offset": -1, "log_start_offset": -1, "aborted_transactions": None,
             "preferred_read_replica": -1, "records": None} for part in topic.partitions]},
        "responses", {"throttle_time": NO_THROTTLE, "error_code": ErrorCode.none,
                      "session_id": 0})


def list_offsets(access, ctx, body):
    denied = {id(topic): TOPIC_DENIED for topic in body.topics
              if not access.check(ctx, Operation.DESCRIBE, TOPIC, topic.name)}
    return _split(ctx, body, "topics", body.topics, denied, lambda topic, code: {
        "name": topic.name, "partitions": [
            {"partition_index": part.partition_index, "error_code": code, "timestamp": -1,
             "offset": -1, "leader_epoch": -1, "old_style_offsets": []}
            for part in topic.partitions]},
        "topics", {"throttle_time": NO_THROTTLE})


def metadata(access, ctx, body):
    """Topics the principal may not DESCRIBE: left out of an all-topics answer, refused by
    name; auto-creation only where it may CREATE; authorized operations its own."""
    topic_ops = getattr(body, "include_topic_authorized_operations", False)
    cluster_ops = getattr(body, "include_cluster_authorized_operations", False)
    by_name = body.topics is not None and any(t.name for t in body.topics)
    send = None
    if by_name and getattr(body, "allow_auto_topic_creation", False) and not (
            access.allowed(ctx, Operation.CREATE, CLUSTER, CLUSTER_NAME)
            or all(access.allowed(ctx, Operation.CREATE, TOPIC, t.name)
                   for t in body.topics if t.name)):
        send = dataclasses.replace(body, allow_auto_topic_creation=False)

    def answer(response):
        topics = []
        for topic in response.topics:
            if topic.name is not None and access.allowed(ctx, Operation.DESCRIBE, TOPIC,
                                                         topic.name):
                if topic_ops:
                    topic = dataclasses.replace(topic, topic_authorized_operations=
                                                access.operations(ctx, TOPIC, topic.name))
                topics.append(topic)
            elif by_name or body.topics:  # named (or by id): refused, as Kafka answers
                access.check(ctx, Operation.DESCRIBE, TOPIC, topic.name or "")  # audited
                refused = {"error_code": TOPIC_DENIED, "partitions": (), "is_internal": False}
                if not by_name:  # asked by id: the name is not told
                    refused["name"] = None
                if hasattr(topic, "topic_authorized_operations"):
                    refused["topic_authorized_operations"] = NO_OPERATIONS
                topics.append(dataclasses.replace(topic, **refused))
        response = dataclasses.replace(response, topics=tuple(topics))
        if cluster_ops and hasattr(response, "cluster_authorized_operations"):
            response = dataclasses.replace(response, cluster_authorized_operations=
                                           access.operations(ctx, CLUSTER, CLUSTER_NAME))
        return response

    return Filter(answer, send)


# --- groups ---------------------------------------------------------------------------------

def _group_error(access, ctx, group: str, operation=Operation.READ):
    return None if access.check(ctx, operation, GROUP, group) else GROUP_DENIED


def join_group(access, ctx, body):
    code = _group_error(access, ctx, body.group_id)
    return code and ctx.respond({"throttle_time": NO_THROTTLE, "error_code": code,
                                 "generation_id": -1, "protocol_type": None,
                                 "protocol_name": None if ctx.version >= 7 else "",
                                 "leader": "", "member_id": "", "members": []})


def sync_group(access, ctx, body):
    code = _group_error(access, ctx, body.group_id)
    return code and ctx.respond({"throttle_time": NO_THROTTLE, "error_code": code,
                                 "protocol_type": None, "protocol_name": None,
                                 "assignment": b""})


def heartbeat(access, ctx, body):
    code = _group_error(access, ctx, body.group_id)
    return code and ctx.respond({"throttle_time": NO_THROTTLE, "error_code": code})


def leave_group(access, ctx, body):
    code = _group_error(access, ctx, body.group_id)
    return code and ctx.respond({"throttle_time": NO_THROTTLE, "error_code": code,
                                 "members": []})


def consumer_group_heartbeat(access, ctx, body):
    code = _group_error(access, ctx, body.group_id)
    if code is None and body.subscribed_topic_names:
        hidden = [name for name in body.subscribed_topic_names
                  if not access.check(ctx, Operation.DESCRIBE, TOPIC, name)]
        code = TOPIC_DENIED if hidden else None
    return code and ctx.respond({"throttle_time": NO_THROTTLE, "error_code": code,
                                 "error_message": None, "member_id": None,
                                 "member_epoch": -1, "heartbeat_interval": NO_THROTTLE,
                                 "assignment": None})


def offset_commit(access, ctx, body):
    return _topic_partitions(access, ctx, body, _group_error(access, ctx, body.group_id),
                             Operation.READ)


def txn_offset_commit(access, ctx, body):
    code = None if access.check(ctx, Operation.WRITE, TXN, body.transactional_id) \
        else TXN_DENIED
    return _topic_partitions(access, ctx, body, code or _group_error(access, ctx,
                                                                     body.group_id),
                             Operation.READ)


def _topic_partitions(access, ctx, body, code, operation):
    """OffsetCommit and TxnOffsetCommit: the group's error for every partition, else
    TOPIC_AUTHORIZATION_FAILED for the topics it may not `operation`."""
    if code is not None:
        denied = {id(topic): code for topic in body.topics}
    else:
        denied = {id(topic): TOPIC_DENIED for topic in body.topics
                  if not access.check(ctx, operation, TOPIC, topic.name)}
    return _split(ctx, body, "topics", body.topics, denied, lambda topic, error: {
        "name": topic.name, "partitions": [
            {"partition_index": part.partition_index, "error_code": error}
            for part in topic.partitions]}, "topics", {"throttle_time": NO_THROTTLE})


def offset_fetch(access, ctx, body):
    """A group the principal may not DESCRIBE refuses the request; named topics it may not
    DESCRIBE refuse it too (Kafka refuses them one by one); all topics (none named) are
    filtered to those it may."""
    groups = body.groups if ctx.version >= 8 else [body]
    for group in groups:
        if not access.check(ctx, Operation.DESCRIBE, GROUP, group.group_id):
            return _offset_fetch_refused(ctx, body, GROUP_DENIED)
        for topic in group.topics or ():
            if not access.check(ctx, Operation.DESCRIBE, TOPIC, topic.name):
                return _offset_fetch_refused(ctx, body, TOPIC_DENIED)
    if all(group.topics is not None for group in groups):
        return None

    def visible(topics):
        return tuple(topic for topic in topics
                     if access.allowed(ctx, Operation.DESCRIBE, TOPIC, topic.name))

    if ctx.version < 8:
        return Filter(lambda response: dataclasses.replace(response,
                                                           topics=visible(response.topics)))
    return Filter(lambda response: dataclasses.replace(response, groups=tuple(
        dataclasses.replace(group, topics=visible(group.topics)) for group in response.groups)))


def _offset_fetch_refused(ctx, body, code) -> bytes:
    if ctx.version >= 8:
        return ctx.respond({"throttle_time": NO_THROTTLE, "groups": [
            {"group_id": group.group_id, "topics": [], "error_code": code}
            for group in body.groups]})
    # The error on every partition named (v1 has no error of its own), and on the answer.
    return ctx.respond({"throttle_time": NO_THROTTLE, "error_code": code, "topics": [
        {"name": topic.name, "partitions": [
            {"partition_index": index, "committed_offset": -1, "committed_leader_epoch": -1,
             "metadata": "", "error_code": code} for index in topic.partition_indexes]}
        for topic in body.topics or ()]})


def describe_groups(access, ctx, body):
    denied = {id(name): GROUP_DENIED for name in body.groups
              if not access.check(ctx, Operation.DESCRIBE, GROUP, name)}
    return _split(ctx, body, "groups", body.groups, denied, lambda name, code: {
        "error_code": code, "group_id": name, "group_state": "", "protocol_type": "",
        "protocol_data": "", "members": [], "authorized_operations": NO_OPERATIONS},
        "groups", {"throttle_time": NO_THROTTLE})


def delete_groups(access, ctx, body):
    denied = {id(name): GROUP_DENIED for name in body.groups_names
              if not access.check(ctx, Operation.DELETE, GROUP, name)}
    return _split(ctx, body, "groups_names", body.groups_names, denied,
                  lambda name, code: {"group_id": name, "error_code": code}, "results",
                  {"throttle_time": NO_THROTTLE})


def list_groups(access, ctx, body):
    if access.allowed(ctx, Operation.DESCRIBE, CLUSTER, CLUSTER_NAME):
        return None
    return Filter(lambda response: dataclasses.replace(response, groups=tuple(
        group for group in response.groups
        if access.allowed(ctx, Operation.DESCRIBE, GROUP, group.group_id))))


def find_coordinator(access, ctx, body):
    key_type = getattr(body, "key_type", 0)  # v0: groups only
    keys = body.coordinator_keys if ctx.version >= 4 else (body.key,)
    if key_type == 2:  # share partitions' coordinators: the brokers' own business
        return _coordinators_refused(ctx, keys, {key: CLUSTER_DENIED for key in keys})
    kind, code = ((GROUP, GROUP_DENIED) if key_type == 0 else (TXN, TXN_DENIED))
    refused = [key for key in keys if not access.check(ctx, Operation.DESCRIBE, kind, key)]
    if not refused:
        return None
    # The keys it may see get a retriable error: the client asks for them again.
    return _coordinators_refused(ctx, keys, {key: code for key in refused})


def _coordinators_refused(ctx, keys, codes: dict) -> bytes:
    if ctx.version < 4:
        return ctx.respond({"throttle_time": NO_THROTTLE, "error_code": codes[keys[0]],
                            "error_message": None, "node_id": -1, "host": "", "port": -1})
    return ctx.respond({"throttle_time": NO_THROTTLE, "coordinators": [
        {"key": key, "node_id": -1, "host": "", "port": -1, "error_message": None,
         "error_code": codes.get(key, ErrorCode.coordinator_not_available)} for key in keys]})


# --- transactions ---------------------------------------------------------------------------

def init_producer_id(access, ctx, body):
    if body.transactional_id is not None:
        allowed = access.check(ctx, Operation.WRITE, TXN, body.transactional_id)
        code = TXN_DENIED
    else:  # idempotence: IDEMPOTENT_WRITE on the cluster, or WRITE on some topic
        allowed = (access.allowed(ctx, Operation.IDEMPOTENT_WRITE, CLUSTER, CLUSTER_NAME)
                   or access.check_any(ctx, Operation.WRITE, TOPIC))
        code = CLUSTER_DENIED
    return None if allowed else ctx.respond({"throttle_time": NO_THROTTLE, "error_code": code,
                                             "producer_id": -1, "producer_epoch": -1})


def add_partitions_to_txn(access, ctx, body):
    """Kafka's all or nothing: the refused topics TOPIC_AUTHORIZATION_FAILED, the others
    OPERATION_NOT_ATTEMPTED (v3 and below: what clients send; v4+ is the brokers' form)."""
    if ctx.version >= 4:
        allowed = access.check(ctx, Operation.CLUSTER_ACTION, CLUSTER, CLUSTER_NAME)
        return None if allowed else ctx.respond({"throttle_time": NO_THROTTLE,
                                                 "error_code": CLUSTER_DENIED,
                                                 "results_by_transaction": []})
    topics = body.v3_and_below_topics
    if not access.check(ctx, Operation.WRITE, TXN, body.v3_and_below_transactional_id):
        codes = {topic.name: TXN_DENIED for topic in topics}
    else:
        codes = {topic.name: TOPIC_DENIED for topic in topics
                 if not access.check(ctx, Operation.WRITE, TOPIC, topic.name)}
        if not codes:
            return None
        codes = {topic.name: codes.get(topic.name, ErrorCode.operation_not_attempted)
                 for topic in topics}
    return ctx.respond({"throttle_time": NO_THROTTLE, "results_by_topic_v3_and_below": [
        {"name": topic.name, "results_by_partition": [
            {"partition_index": index, "partition_error_code": codes[topic.name]}
            for index in topic.partitions]} for topic in topics]})


def add_offsets_to_txn(access, ctx, body):
    code = None if access.check(ctx, Operation.WRITE, TXN, body.transactional_id) \
        else TXN_DENIED
    code = code or _group_error(access, ctx, body.group_id)
    return code and ctx.respond({"throttle_time": NO_THROTTLE, "error_code": code})


def end_txn(access, ctx, body):
    if access.check(ctx, Operation.WRITE, TXN, body.transactional_id):
        return None
    return ctx.respond({"throttle_time": NO_THROTTLE, "error_code": TXN_DENIED,
                        "producer_id": -1, "producer_epoch": -1})


# --- topics and configs ---------------------------------------------------------------------

def create_topics(access, ctx, body):
    if access.allowed(ctx, Operation.CREATE, CLUSTER, CLUSTER_NAME):
        return None
    denied = {id(topic): TOPIC_DENIED for topic in body.topics
              if not access.check(ctx, Operation.CREATE, TOPIC, topic.name)}
    return _split(ctx, body, "topics", body.topics, denied, lambda topic, code: {
        "name": topic.name, "topic_id": ZERO_UUID, "error_code": code, "error_message": None,
        "topic_config_error_code": code, "num_partitions": -1, "replication_factor": -1,
        "configs": None}, "topics", {"throttle_time": NO_THROTTLE})


def delete_topics(access, ctx, body):
    if ctx.version < 6:
        names = body.topic_names
        denied = {id(name): TOPIC_DENIED for name in names
                  if not access.check(ctx, Operation.DELETE, TOPIC, name)}
        return _split(ctx, body, "topic_names", names, denied,
                      lambda name, code: {"name": name, "error_code": code}, "responses",
                      {"throttle_time": NO_THROTTLE})
    denied = {id(topic): TOPIC_DENIED for topic in body.topics
              if topic.name is None or not access.check(ctx, Operation.DELETE, TOPIC,
                                                        topic.name)}
    return _split(ctx, body, "topics", body.topics, denied, lambda topic, code: {
        "name": topic.name, "topic_id": topic.topic_id, "error_code": code,
        "error_message": None}, "responses", {"throttle_time": NO_THROTTLE})


def describe_configs(access, ctx, body):
    denied = {}
    for resource in body.resources:
        if resource.resource_type == 2:  # a topic
            allowed = access.check(ctx, Operation.DESCRIBE_CONFIGS, TOPIC, resource.resource_name)
            code = TOPIC_DENIED
        elif resource.resource_type == 32:  # a group
            allowed = access.check(ctx, Operation.DESCRIBE_CONFIGS, GROUP, resource.resource_name)
            code = GROUP_DENIED
        else:  # a broker, its loggers, client metrics: the cluster's
            allowed = access.check(ctx, Operation.DESCRIBE_CONFIGS, CLUSTER, CLUSTER_NAME)
            code = CLUSTER_DENIED
        if not allowed:
            denied[id(resource)] = code
    return _split(ctx, body, "resources", body.resources, denied, lambda resource, code: {
        "error_code": code, "error_message": None, "resource_type": resource.resource_type,
        "resource_name": resource.resource_name, "configs": []}, "results",
        {"throttle_time": NO_THROTTLE})


def describe_cluster(access, ctx, body):
    if not getattr(body, "include_cluster_authorized_operations", False):
        return None
    return Filter(lambda response: dataclasses.replace(
        response, cluster_authorized_operations=access.operations(ctx, CLUSTER, CLUSTER_NAME)))


CHECKS = {0: produce, 1: fetch, 2: list_offsets, 3: metadata, 8: offset_commit,
          9: offset_fetch, 10: find_coordinator, 11: join_group, 12: heartbeat,
          13: leave_group, 14: sync_group, 15: describe_groups, 16: list_groups,
          19: create_topics, 20: delete_topics, 22: init_producer_id,
          24: add_partitions_to_txn, 25: add_offsets_to_txn, 26: end_txn,
          28: txn_offset_commit, 32: describe_configs, 42: delete_groups,
          60: describe_cluster, 68: consumer_group_heartbeat}


def check(access, ctx: RequestContext, body):
    """What the ACLs make of one decoded request (see the module's docstring)."""
    return CHECKS[ctx.api_key](access, ctx, body)
