"""The client side of the wire, for a broker that talks to another Kafka cluster (front-end
mode): requests encoded with kio, response frames split into their header and decoded body,
and a response body encoded again behind its original header.

Response frames here are size-prefixed, as read from the socket: size (4 bytes), correlation
id (4), the tagged fields of a flexible header (1 byte when empty), then the body.
"""

from __future__ import annotations

import functools
import struct

from kio.index import load_request_schema
from kio.serial import entity_reader

from broker.shared.protocol.codec import build, encode_entity, response_class

_SIZE = struct.Struct(">i")


def request_frame(api_key: int, version: int, correlation: int, client_id: str,
                  values: dict) -> bytes:
    """A size-prefixed request encoded by kio from its values."""
    cls = load_request_schema(api_key, version)
    header = build(cls.__header_schema__, {"request_api_key": api_key,
                                           "request_api_version": version,
                                           "correlation_id": correlation,
                                           "client_id": client_id})
    payload = encode_entity(header) + encode_entity(build(cls, values))
    return _SIZE.pack(len(payload)) + payload


@functools.cache
def _response_readers(api_key: int, version: int):
    cls = response_class(api_key, version)
    return entity_reader(cls.__header_schema__), entity_reader(cls)


def decode_response(api_key: int, version: int, response) -> tuple[int, object]:
    """(where the body begins, the decoded body) of a size-prefixed response frame."""
    read_header, read_body = _response_readers(api_key, version)
    _, consumed = read_header(response, 4)  # kio answers how many bytes it read
    body, _ = read_body(response, 4 + consumed)
    return 4 + consumed, body


def reencode_response(response, body_at: int, body) -> bytes:
    """The response with `body` encoded in place of its own, behind the same header."""
    payload = encode_entity(body)
    return b"".join((_SIZE.pack(body_at - 4 + len(payload)), response[4:body_at], payload))
