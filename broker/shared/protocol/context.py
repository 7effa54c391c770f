"""What a handler needs to answer one request: the request's identity and how to encode a reply.

Shared by the workers' handlers and the parent's admin service.
"""

from __future__ import annotations

import datetime

from broker.shared.protocol.codec import (build, encode_entity, frame, response_class,
                                          response_header_is_flexible)
from broker.shared.protocol.errors import ErrorCode

NO_THROTTLE = datetime.timedelta(0)


class RequestContext:
    """One request being served: who asked, in which version, and how to answer."""

    __slots__ = ("correlation", "api_key", "version", "listener_index", "header", "user", "host",
                 "size")

    def __init__(self, correlation, api_key: int, version: int, listener_index: int, header,
                 user: str = "ANONYMOUS", host: str = "", size: int = 0):
        self.correlation = correlation
        self.size = size  # the request's bytes after its length prefix (Kafka's sizeInBytes)
        self.user = user  # the principal's name: the quota `user` entity (KIP-55), for ACLs
        self.host = host  # the client's IP address, for ACLs
        self.api_key = api_key
        self.version = version
        self.listener_index = listener_index
        self.header = header

    def respond(self, values: dict) -> bytes:
        """Encode a response of this API and version from a dict (fields it lacks are dropped)."""
        body = encode_entity(build(response_class(self.api_key, self.version), values))
        return self.frame(body)

    def frame(self, body: bytes) -> bytes:
        return frame(self.correlation,
                     response_header_is_flexible(self.api_key, self.version), body)


def error_code(name: str | None):
    """kio's ErrorCode member for a Kafka error name such as "corrupt_message"."""
    return ErrorCode.none if name is None else ErrorCode[name]
