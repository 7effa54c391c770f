"""Request routing and the handlers a worker serves: ApiVersions and Metadata for now.

`Router.handle(frame, listener_index)` takes one request frame (the bytes after the size
prefix) and returns the whole size-prefixed response, or raises `InvalidRequest` when the
connection must be closed (Kafka closes on unknown API keys, unsupported versions and requests
it cannot parse).  Only APIs listed in `SERVED_APIS` are advertised in ApiVersions, so the
broker never promises what it cannot answer.
"""

from __future__ import annotations

import datetime
import re
import struct
import uuid
from dataclasses import dataclass

from broker.protocol import errors
from broker.protocol.codec import (REQUEST_PREFIX, build, encode_entity, frame,
                                   request_readers, response_class,
                                   response_header_is_flexible)

API_VERSIONS = 18
METADATA = 3

# API key -> (min version, max version) served.  kio knows every version listed here.
SERVED_APIS = {
    API_VERSIONS: (0, 4),
    METADATA: (0, 13),
}
API_NAMES = {API_VERSIONS: "ApiVersions", METADATA: "Metadata"}
# APIs whose answer depends only on the request bytes after the correlation id (and on static
# configuration): identical requests reuse the validated answer instead of decoding again.
PURE_APIS = frozenset({API_VERSIONS})
_MEMO_LIMIT = 1024

_NO_THROTTLE = datetime.timedelta(0)
_ZERO_UUID = uuid.UUID(int=0)
# Kafka's rule for ApiVersions v3+ client_software_name / client_software_version.
_SOFTWARE_RE = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")
_METADATA_CACHE_LIMIT = 512


class InvalidRequest(Exception):
    """The request cannot be answered; `reason` is one of shm.block.INVALID_REASONS."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


@dataclass(frozen=True)
class BrokerView:
    """What handlers need to know about this broker."""

    node_id: int
    cluster_id: str
    advertised: tuple[tuple[str, int] | None, ...]  # per listener index: (host, port) or None


class Router:
    """Decodes each request with kio and dispatches it by API key."""

    def __init__(self, view: BrokerView):
        self.view = view
        self._handlers = {API_VERSIONS: self._api_versions, METADATA: self._metadata}
        self._routes = {}
        for api_key, (low, high) in SERVED_APIS.items():
            for version in range(low, high + 1):
                header_reader, body_reader = request_readers(api_key, version)
                memo = {} if api_key in PURE_APIS else None
                self._routes[api_key << 16 | version] = (header_reader, body_reader,
                                                         self._handlers[api_key], memo)
        self._api_versions_bodies = {
            version: encode_entity(self._api_versions_response(version, errors.NONE))
            for version in range(SERVED_APIS[API_VERSIONS][1] + 1)
        }
        self._known_software: set[str] = set()
        self._metadata_cache: dict[tuple, bytes] = {}

    # --- dispatch -------------------------------------------------------------------------

    def handle(self, request: bytes, listener_index: int) -> bytes:
        """Answer one request frame; raise InvalidRequest to close the connection."""
        if len(request) < 8:
            raise InvalidRequest("frame_too_small", f"request of {len(request)} bytes has no header")
        api_key, api_version, _ = REQUEST_PREFIX.unpack_from(request, 0)
        route = self._routes.get(api_key << 16 | api_version)
        if route is None:
            return self._unroutable(request, api_key, api_version)
        header_reader, body_reader, handler, memo = route
        if memo is not None:
            key = request[8:]  # the memo is per API version: all but the correlation id
            if type(key) is not bytes:
                key = bytes(key)  # a large frame arrives as a memoryview
            answer = memo.get(key)
            if answer is not None:
                return b"".join((answer[0], request[4:8], answer[1]))
        try:
            header, offset = header_reader(request, 0)
        except Exception as error:  # kio raises several types for malformed input
            raise InvalidRequest("malformed_header", f"bad request header: {error!r}") from None
        try:
            body, _ = body_reader(request, offset)
        except Exception as error:  # as above: any decode failure closes the connection
            raise InvalidRequest("malformed_body",
                                 f"bad {API_NAMES[api_key]} v{api_version} body: {error!r}") from None
        response = handler(request[4:8], api_version, body, listener_index)
        if memo is not None:
            if len(memo) >= _MEMO_LIMIT:
                memo.clear()
            memo[key] = (response[:4], response[8:])
        return response

    def _unroutable(self, request: bytes, api_key: int, api_version: int) -> bytes:
        if api_key == API_VERSIONS and api_version > SERVED_APIS[API_VERSIONS][1]:
            # KIP-511: a newer client gets a v0 body naming the ApiVersions range we serve.
            low, high = SERVED_APIS[API_VERSIONS]
            body = struct.pack(">hihhh", errors.UNSUPPORTED_VERSION, 1, API_VERSIONS, low, high)
            return frame(request[4:8], False, body)
        if api_key in SERVED_APIS:
            raise InvalidRequest("unsupported_version",
                                 f"{API_NAMES[api_key]} v{api_version} is not supported")
        raise InvalidRequest("unknown_api", f"API key {api_key} (v{api_version}) is not served")

    # --- ApiVersions ----------------------------------------------------------------------

    def _api_versions_response(self, version: int, error_code: int):
        cls = response_class(API_VERSIONS, version)
        keys = [{"api_key": key, "min_version": low, "max_version": high}
                for key, (low, high) in sorted(SERVED_APIS.items())]
        if error_code != errors.NONE:
            keys = []
        return build(cls, {"error_code": error_code, "api_keys": keys, "throttle_time": _NO_THROTTLE})

    def _api_versions(self, correlation: bytes, version: int, body, listener_index: int) -> bytes:
        if version >= 3 and not self._valid_software(body):
            invalid = encode_entity(self._api_versions_response(version, errors.INVALID_REQUEST))
            return frame(correlation, False, invalid)
        return frame(correlation, False, self._api_versions_bodies[version])

    def _valid_software(self, body) -> bool:
        name, version = body.client_software_name, body.client_software_version
        key = f"{name}\0{version}"
        if key in self._known_software:
            return True
        if not (_SOFTWARE_RE.fullmatch(name) and _SOFTWARE_RE.fullmatch(version)):
            return False
        if len(self._known_software) < 1024:
            self._known_software.add(key)
        return True

    # --- Metadata -------------------------------------------------------------------------

    def _metadata(self, correlation: bytes, version: int, body, listener_index: int) -> bytes:
        requested = self._requested_topics(version, body)
        key = (version, listener_index, requested)
        cached = self._metadata_cache.get(key)
        if cached is None:
            if len(self._metadata_cache) >= _METADATA_CACHE_LIMIT:
                self._metadata_cache.clear()
            cached = encode_entity(self._metadata_response(version, listener_index, requested))
            self._metadata_cache[key] = cached
        return frame(correlation, response_header_is_flexible(METADATA, version), cached)

    @staticmethod
    def _requested_topics(version: int, body) -> tuple | None:
        """None for "all topics", else a tuple of names (or topic ids for v10+ by-id lookups)."""
        topics = body.topics
        if topics is None or (version == 0 and not topics):
            return None
        return tuple(topic.name if topic.name is not None else getattr(topic, "topic_id", None)
                     for topic in topics)

    def _metadata_response(self, version: int, listener_index: int, requested):
        view = self.view
        endpoint = view.advertised[listener_index]
        brokers = [] if endpoint is None else [
            {"node_id": view.node_id, "host": endpoint[0], "port": endpoint[1], "rack": None}]
        topics = [] if requested is None else [self._unknown_topic(item) for item in requested]
        return build(response_class(METADATA, version), {
            "throttle_time": _NO_THROTTLE,
            "error_code": errors.NONE,
            "brokers": brokers,
            "cluster_id": view.cluster_id,
            "controller_id": view.node_id,
            "topics": topics,
            "cluster_authorized_operations": -2147483648,
        })

    @staticmethod
    def _unknown_topic(item) -> dict:
        if isinstance(item, uuid.UUID):
            return {"error_code": errors.UNKNOWN_TOPIC_ID, "name": None, "topic_id": item,
                    "is_internal": False, "partitions": []}
        return {"error_code": errors.UNKNOWN_TOPIC_OR_PARTITION, "name": item,
                "topic_id": _ZERO_UUID, "is_internal": False, "partitions": []}

