"""ApiVersions, Metadata, DescribeCluster and FindCoordinator: what and where this broker is."""

from __future__ import annotations

import re
import uuid

from broker.shared.acl import CLUSTER_NAME, Operation, ResourceType
from broker.shared.log.topics import is_legal_name
from broker.shared.protocol.codec import build, encode_entity, frame, response_class
from broker.shared.protocol.errors import ErrorCode
from workers.answer_cache import BoundedCache
from workers.router import NO_THROTTLE, Api, InvalidRequest, RequestContext

# The answer's "no error", bound once: an enum member's lookup costs ~70 ns on Python 3.11,
# and the answers below name it once per partition.
NO_ERROR = ErrorCode.none

# Kafka's rule for ApiVersions v3+ client_software_name / client_software_version.
_SOFTWARE_RE = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")
_ZERO_UUID = uuid.UUID(int=0)
_NO_AUTHORIZED_OPERATIONS = -2147483648
_METADATA_CACHE_BYTES = 8 << 20  # encoded answers and the topic names keying them
_METADATA_KEY_BYTES = 16 << 10  # a request naming more topics is answered afresh
AUTO_CREATE_PARTITIONS = 64  # partitions one Metadata request may auto-create (ms each)


class ApiVersions(Api, api="ApiVersions"):
    pure = True  # the answer depends only on the request bytes: the router memoizes it

    def __init__(self, specs):
        """`specs`: the other APIs served (rows of broker.shared.apis)."""
        self._keys = sorted([(spec.key, *spec.versions) for spec in specs]
                            + [(self.key, *self.versions)])
        self._bodies = {version: encode_entity(self._response(version, NO_ERROR))
                        for version in range(self.versions[1] + 1)}

    def _response(self, version: int, code):
        keys = [] if code != NO_ERROR else [
            {"api_key": key, "min_version": low, "max_version": high} for key, low, high in self._keys]
        return build(response_class(self.key, version),
                     {"error_code": code, "api_keys": keys, "throttle_time": NO_THROTTLE})

    def handle(self, ctx: RequestContext, body) -> bytes:
        if ctx.version >= 3 and not (_SOFTWARE_RE.fullmatch(body.client_software_name)
                                     and _SOFTWARE_RE.fullmatch(body.client_software_version)):
            invalid = encode_entity(self._response(ctx.version, ErrorCode.invalid_request))
            return frame(ctx.correlation, False, invalid)
        return frame(ctx.correlation, False, self._bodies[ctx.version])  # header v0 always


class Metadata(Api, api="Metadata"):

    def __init__(self, services):
        self.services = services
        # Answers by (version, listener, topics asked): what decides them, bounded in bytes.
        self._cache = BoundedCache(_METADATA_CACHE_BYTES, _METADATA_KEY_BYTES)
        self._cache_epoch = None

    def handle(self, ctx: RequestContext, body) -> bytes:
        registry, access = self.services.registry, self.services.access
        requested = self._requested(ctx.version, body)
        denied: set = self._undescribable(ctx, requested) if access.enabled and requested else set()
        later = set()
        if requested and self._may_create(ctx, body):
            creatable = [item for item in requested if item not in denied]
            if access.enabled:
                denied |= self._may_not_create(ctx, creatable)
                creatable = [item for item in creatable if item not in denied]
            later = self._auto_create(creatable)
        operations = (getattr(body, "include_topic_authorized_operations", False),
                      getattr(body, "include_cluster_authorized_operations", False))
        if later or denied:  # an answer that changes on the next request: not cached
            return ctx.frame(encode_entity(self._response(ctx, requested, operations, later,
                                                          denied)))
        epoch = (registry.epoch.get(), access.authorizer)
        if epoch != self._cache_epoch:
            self._cache.clear()
            self._cache_epoch = epoch
        key = (ctx.version, ctx.listener_index, requested, operations)
        if access.enabled:  # what a principal sees is its own
            key += (ctx.user, ctx.host)
        cached = self._cache.get(key)
        if cached is None:
            cached = encode_entity(self._response(ctx, requested, operations))
            key_bytes = 0 if requested is None else sum(len(str(item)) + 8 for item in requested)
            self._cache.put(key, cached, key_bytes, len(cached))
        return ctx.frame(cached)

    @staticmethod
    def _requested(version: int, body) -> tuple | None:
        """None for "all topics", else the names (or ids: v12+ looks topics up by id)."""
        topics = body.topics
        if topics is None or (version == 0 and not topics):
            return None
        if version >= 12:  # as Kafka: one topic id makes it a request by id, names ignored
            ids = [topic.topic_id for topic in topics  # (the Java client sends "" beside ids)
                   if topic.topic_id is not None and topic.topic_id != _ZERO_UUID]
            if ids:
                return tuple(dict.fromkeys(ids))
        requested = {}  # each topic once, in the order first asked (Kafka uses a set)
        for topic in topics:
            if topic.name is not None:
                requested[topic.name] = None
            elif version < 12:  # as Kafka: names are nullable on the wire from v10, usable
                raise InvalidRequest("malformed_body",  # as absent only from v12
                                     f"Metadata v{version}: a topic without a name")
            else:
                requested[topic.topic_id or _ZERO_UUID] = None
        return tuple(requested)

    def _undescribable(self, ctx: RequestContext, requested: tuple) -> set:
        """The requested topics the principal may not DESCRIBE (TOPIC_AUTHORIZATION_FAILED);
        an unknown topic id is not among them (UNKNOWN_TOPIC_ID comes first)."""
        registry, access = self.services.registry, self.services.access
        denied = set()
        for item in requested:
            if isinstance(item, uuid.UUID):
                info = registry.by_id(item)
                if info is not None and not access.check(ctx, Operation.DESCRIBE,
                                                         ResourceType.TOPIC, info.name):
                    denied.add(item)
            elif not access.check(ctx, Operation.DESCRIBE, ResourceType.TOPIC, item):
                denied.add(item)
        return denied

    def _may_not_create(self, ctx: RequestContext, names: list) -> set:
        """Unknown topics the principal may not auto-create: CREATE on the cluster or on
        the topic is needed."""
        registry, access = self.services.registry, self.services.access
        missing = [name for name in names if isinstance(name, str) and registry.get(name) is None]
        if not missing or access.allowed(ctx, Operation.CREATE, ResourceType.CLUSTER,
                                         CLUSTER_NAME):
            return set()
        return {name for name in missing
                if not access.check(ctx, Operation.CREATE, ResourceType.TOPIC, name)}

    def _may_create(self, ctx: RequestContext, body) -> bool:
        allowed = ctx.version < 4 or body.allow_auto_topic_creation
        may_alter = self.services.may_alter  # with a control plane, topics are created there
        return (allowed and self.services.props.auto_create_topics_enable
                and (may_alter is None or may_alter(ctx.listener_index)))

    def _auto_create(self, requested: tuple) -> set:
        """Create unknown topics, AUTO_CREATE_PARTITIONS' worth per request at most; return
        the names left for a later request (answered LEADER_NOT_AVAILABLE, as Kafka answers
        a topic whose creation is under way: clients ask again)."""
        registry, partitions = self.services.registry, self.services.props.num_partitions
        budget, later = AUTO_CREATE_PARTITIONS, set()
        for name in requested:
            if not isinstance(name, str) or registry.get(name) is not None \
                    or not is_legal_name(name):
                continue
            if budget <= 0:
                later.add(name)
                continue
            if registry.create(name, partitions) is None:
                budget -= partitions
        return later

    def _response(self, ctx: RequestContext, requested, operations: tuple[bool, bool],
                  later=frozenset(), denied=frozenset()):
        view, registry, access = self.services.view, self.services.registry, self.services.access
        endpoint = view.advertised[ctx.listener_index]
        brokers = [] if endpoint is None else [
            {"node_id": view.node_id, "host": endpoint[0], "port": endpoint[1], "rack": None}]
        topics = registry.topics()
        topic_operations, cluster_operations = operations
        if requested is None:  # all topics: those the principal may not describe are left out
            described = [self._topic(info, ctx, topic_operations) for info in topics.values()
                         if access.allowed(ctx, Operation.DESCRIBE, ResourceType.TOPIC,
                                           info.name)]
        else:
            described = [self._lookup(item, ctx, topic_operations, item in later, item in denied)
                         for item in requested]
        cluster = _NO_AUTHORIZED_OPERATIONS
        if cluster_operations:
            cluster = _cluster_operations(ctx, access)
        return build(response_class(self.key, ctx.version), {
            "throttle_time": NO_THROTTLE, "error_code": NO_ERROR, "brokers": brokers,
            "cluster_id": view.cluster_id, "controller_id": view.node_id, "topics": described,
            "cluster_authorized_operations": cluster,
        })

    def _lookup(self, item, ctx: RequestContext, operations: bool, being_created: bool = False,
                denied: bool = False) -> dict:
        registry = self.services.registry
        if denied:
            return {"error_code": ErrorCode.topic_authorization_failed,
                    "name": None if isinstance(item, uuid.UUID) else item,
                    "topic_id": item if isinstance(item, uuid.UUID) else _ZERO_UUID,
                    "is_internal": False, "partitions": []}
        if isinstance(item, uuid.UUID):
            info = registry.by_id(item)
            if info is None:
                return {"error_code": ErrorCode.unknown_topic_id, "name": None, "topic_id": item,
                        "is_internal": False, "partitions": []}
            return self._topic(info, ctx, operations)
        info = registry.get(item)
        if info is None:
            code = ErrorCode.invalid_topic_exception if not is_legal_name(item) \
                else ErrorCode.leader_not_available if being_created \
                else ErrorCode.unknown_topic_or_partition
            return {"error_code": code, "name": item, "topic_id": _ZERO_UUID,
                    "is_internal": False, "partitions": []}
        return self._topic(info, ctx, operations)

    def _topic(self, info, ctx: RequestContext, operations: bool) -> dict:
        node = self.services.view.node_id
        partitions = [{"error_code": NO_ERROR, "partition_index": index, "leader_id": node,
                       "leader_epoch": 0, "replica_nodes": (node,), "isr_nodes": (node,),
                       "offline_replicas": ()} for index in range(info.partitions)]
        for index in self._offline(info):  # as a partition whose only replica is offline
            partitions[index].update(error_code=ErrorCode.leader_not_available,
                                     leader_id=-1, isr_nodes=(), offline_replicas=(node,))
        return {"error_code": NO_ERROR, "name": info.name, "topic_id": info.topic_id,
                "is_internal": False, "partitions": partitions,
                "topic_authorized_operations": self.services.access.operations(
                    ctx, ResourceType.TOPIC, info.name) if operations
                else _NO_AUTHORIZED_OPERATIONS}

    def _offline(self, info) -> list[int]:
        registry = self.services.registry
        return [index for index in range(info.partitions) if registry.is_offline(info.name, index)]


def _cluster_operations(ctx: RequestContext, access) -> int:
    """cluster_authorized_operations asked for: DESCRIBE on the cluster shows them, else 0."""
    if not access.check(ctx, Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
        return 0
    return access.operations(ctx, ResourceType.CLUSTER, CLUSTER_NAME)


class DescribeCluster(Api, api="DescribeCluster"):
    """This node as the whole cluster, at the endpoint of the listener asked on."""

    _BROKERS, _CONTROLLERS = 1, 2

    def __init__(self, services):
        self.services = services

    def handle(self, ctx: RequestContext, body) -> bytes:
        view = self.services.view
        endpoint = view.advertised[ctx.listener_index]
        cluster = _NO_AUTHORIZED_OPERATIONS
        if body.include_cluster_authorized_operations:
            cluster = _cluster_operations(ctx, self.services.access)
        answer = {"throttle_time": NO_THROTTLE, "error_code": NO_ERROR, "error_message": None,
                  "endpoint_type": self._BROKERS, "cluster_id": view.cluster_id,
                  "controller_id": view.node_id, "brokers": [],
                  "cluster_authorized_operations": cluster}
        if ctx.version >= 1 and body.endpoint_type != self._BROKERS:
            # A broker describes brokers; KRaft controllers answer type 2 (Kafka's rule).
            return ctx.respond(dict(answer, error_code=ErrorCode.unsupported_endpoint_type,
                                    error_message="this node is a broker, not a controller",
                                    endpoint_type=body.endpoint_type))
        if endpoint is not None:
            answer["brokers"] = [{"broker_id": view.node_id, "host": endpoint[0],
                                  "port": endpoint[1], "rack": None, "is_fenced": False}]
        return ctx.respond(answer)


class FindCoordinator(Api, api="FindCoordinator"):
    """Every group and transaction coordinator is this node (single-node broker)."""


    def __init__(self, services):
        self.services = services

    def handle(self, ctx: RequestContext, body) -> bytes:
        view = self.services.view
        endpoint = view.advertised[ctx.listener_index]
        if endpoint is None:
            code, node, host, port = ErrorCode.coordinator_not_available, -1, "", -1
        else:
            code, node, (host, port) = NO_ERROR, view.node_id, endpoint
        answer = {"error_code": code, "error_message": None, "node_id": node, "host": host,
                  "port": port}
        key_type = getattr(body, "key_type", 0)
        if ctx.version >= 4:
            return ctx.respond({"throttle_time": NO_THROTTLE, "coordinators": [
                self._authorized(ctx, dict(answer, key=key), key_type, key)
                for key in body.coordinator_keys]})
        return ctx.respond(dict(self._authorized(ctx, answer, key_type, body.key),
                                throttle_time=NO_THROTTLE))

    _REFUSED = {0: (ResourceType.GROUP, ErrorCode.group_authorization_failed),
                1: (ResourceType.TRANSACTIONAL_ID,
                    ErrorCode.transactional_id_authorization_failed)}

    def _authorized(self, ctx: RequestContext, answer: dict, key_type: int, key: str) -> dict:
        """DESCRIBE on the group or transactional id the coordinator is asked for."""
        resource_type, code = self._REFUSED.get(key_type, (None, None))
        if resource_type is None or self.services.access.check(ctx, Operation.DESCRIBE,
                                                               resource_type, key):
            return answer
        return dict(answer, error_code=code, error_message=None, node_id=-1, host="", port=-1)
