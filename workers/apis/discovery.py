"""ApiVersions, Metadata, DescribeCluster and FindCoordinator: what and where this broker is."""

from __future__ import annotations

import re
import uuid

from broker.log.topics import LEGAL_NAME
from broker.protocol import errors
from broker.protocol.codec import build, encode_entity, frame, response_class
from workers.handlers import NO_THROTTLE, Api, RequestContext

# Kafka's rule for ApiVersions v3+ client_software_name / client_software_version.
_SOFTWARE_RE = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")
_ZERO_UUID = uuid.UUID(int=0)
_NO_AUTHORIZED_OPERATIONS = -2147483648
_METADATA_CACHE_LIMIT = 512


class ApiVersions(Api):
    key, name, versions = 18, "ApiVersions", (0, 4)
    pure = True  # the answer depends only on the request bytes: the router memoizes it

    def __init__(self, apis: list[Api]):
        self._keys = sorted([(api.key, *api.versions) for api in apis] + [(self.key, *self.versions)])
        self._bodies = {version: encode_entity(self._response(version, errors.NONE))
                        for version in range(self.versions[1] + 1)}

    def _response(self, version: int, code):
        keys = [] if code != errors.NONE else [
            {"api_key": key, "min_version": low, "max_version": high} for key, low, high in self._keys]
        return build(response_class(self.key, version),
                     {"error_code": code, "api_keys": keys, "throttle_time": NO_THROTTLE})

    def handle(self, ctx: RequestContext, body) -> bytes:
        if ctx.version >= 3 and not (_SOFTWARE_RE.fullmatch(body.client_software_name)
                                     and _SOFTWARE_RE.fullmatch(body.client_software_version)):
            invalid = encode_entity(self._response(ctx.version, errors.INVALID_REQUEST))
            return frame(ctx.correlation, False, invalid)
        return frame(ctx.correlation, False, self._bodies[ctx.version])  # header v0 always


class Metadata(Api):
    key, name, versions = 3, "Metadata", (0, 13)

    def __init__(self, services):
        self.services = services
        self._cache: dict[tuple, bytes] = {}
        self._cache_epoch = None

    def handle(self, ctx: RequestContext, body) -> bytes:
        registry = self.services.registry
        requested = self._requested(ctx.version, body)
        if requested and self._may_create(ctx, body):
            self._auto_create(requested)
        epoch = registry.epoch.get()
        if epoch != self._cache_epoch or len(self._cache) >= _METADATA_CACHE_LIMIT:
            self._cache.clear()
            self._cache_epoch = epoch
        key = (ctx.version, ctx.listener_index, requested)
        cached = self._cache.get(key)
        if cached is None:
            cached = encode_entity(self._response(ctx, requested))
            self._cache[key] = cached
        return ctx.frame(cached)

    @staticmethod
    def _requested(version: int, body) -> tuple | None:
        """None for "all topics", else the names (or ids, for v10+ lookups by id)."""
        topics = body.topics
        if topics is None or (version == 0 and not topics):
            return None
        return tuple(topic.name if topic.name is not None else getattr(topic, "topic_id", None)
                     for topic in topics)

    def _may_create(self, ctx: RequestContext, body) -> bool:
        allowed = ctx.version < 4 or body.allow_auto_topic_creation
        may_alter = self.services.may_alter  # with a control plane, topics are created there
        return (allowed and self.services.props.auto_create_topics_enable
                and (may_alter is None or may_alter(ctx.listener_index)))

    def _auto_create(self, requested: tuple) -> None:
        registry = self.services.registry
        for name in requested:
            if isinstance(name, str) and registry.get(name) is None:
                registry.create(name, self.services.props.num_partitions)

    def _response(self, ctx: RequestContext, requested):
        view, registry = self.services.view, self.services.registry
        endpoint = view.advertised[ctx.listener_index]
        brokers = [] if endpoint is None else [
            {"node_id": view.node_id, "host": endpoint[0], "port": endpoint[1], "rack": None}]
        topics = registry.topics()
        if requested is None:
            described = [self._topic(info) for info in topics.values()]
        else:
            described = [self._lookup(item) for item in requested]
        return build(response_class(self.key, ctx.version), {
            "throttle_time": NO_THROTTLE, "error_code": errors.NONE, "brokers": brokers,
            "cluster_id": view.cluster_id, "controller_id": view.node_id, "topics": described,
            "cluster_authorized_operations": _NO_AUTHORIZED_OPERATIONS,
        })

    def _lookup(self, item) -> dict:
        registry = self.services.registry
        if isinstance(item, uuid.UUID):
            info = registry.by_id(item)
            if info is None:
                return {"error_code": errors.UNKNOWN_TOPIC_ID, "name": None, "topic_id": item,
                        "is_internal": False, "partitions": []}
            return self._topic(info)
        info = registry.get(item)
        if info is None:
            code = errors.ErrorCode.invalid_topic_exception if not _legal(item) \
                else errors.UNKNOWN_TOPIC_OR_PARTITION
            return {"error_code": code, "name": item, "topic_id": _ZERO_UUID,
                    "is_internal": False, "partitions": []}
        return self._topic(info)

    def _topic(self, info) -> dict:
        node = self.services.view.node_id
        partitions = [{"error_code": errors.NONE, "partition_index": index, "leader_id": node,
                       "leader_epoch": 0, "replica_nodes": (node,), "isr_nodes": (node,),
                       "offline_replicas": ()} for index in range(info.partitions)]
        return {"error_code": errors.NONE, "name": info.name, "topic_id": info.topic_id,
                "is_internal": False, "partitions": partitions,
                "topic_authorized_operations": _NO_AUTHORIZED_OPERATIONS}


def _legal(name: str) -> bool:
    return bool(LEGAL_NAME.match(name)) and name not in (".", "..")


class DescribeCluster(Api):
    """This node as the whole cluster, at the endpoint of the listener asked on."""

    key, name, versions = 60, "DescribeCluster", (0, 2)
    _BROKERS, _CONTROLLERS = 1, 2

    def __init__(self, services):
        self.services = services

    def handle(self, ctx: RequestContext, body) -> bytes:
        view = self.services.view
        endpoint = view.advertised[ctx.listener_index]
        answer = {"throttle_time": NO_THROTTLE, "error_code": errors.NONE, "error_message": None,
                  "endpoint_type": self._BROKERS, "cluster_id": view.cluster_id,
                  "controller_id": view.node_id, "brokers": [],
                  "cluster_authorized_operations": _NO_AUTHORIZED_OPERATIONS}
        if ctx.version >= 1 and body.endpoint_type != self._BROKERS:
            # A broker describes brokers; KRaft controllers answer type 2 (Kafka's rule).
            return ctx.respond(dict(answer, error_code=errors.ErrorCode.unsupported_endpoint_type,
                                    error_message="this node is a broker, not a controller",
                                    endpoint_type=body.endpoint_type))
        if endpoint is not None:
            answer["brokers"] = [{"broker_id": view.node_id, "host": endpoint[0],
                                  "port": endpoint[1], "rack": None, "is_fenced": False}]
        return ctx.respond(answer)


class FindCoordinator(Api):
    """Every group and transaction coordinator is this node (single-node broker)."""

    key, name, versions = 10, "FindCoordinator", (0, 6)

    def __init__(self, services):
        self.services = services

    def handle(self, ctx: RequestContext, body) -> bytes:
        view = self.services.view
        endpoint = view.advertised[ctx.listener_index]
        if endpoint is None:
            code, node, host, port = errors.ErrorCode.coordinator_not_available, -1, "", -1
        else:
            code, node, (host, port) = errors.NONE, view.node_id, endpoint
        answer = {"error_code": code, "error_message": None, "node_id": node, "host": host,
                  "port": port}
        if ctx.version >= 4:
            return ctx.respond({"throttle_time": NO_THROTTLE, "coordinators": [
                dict(answer, key=key) for key in body.coordinator_keys]})
        return ctx.respond(dict(answer, throttle_time=NO_THROTTLE))
