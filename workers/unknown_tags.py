"""Unknown tagged fields (KIP-482), skipped as the protocol says.

A client newer than this broker may send tagged fields its schema does not know; Kafka skips
them.  kio's native reader refuses them instead (KeyError "Unknown tagged field tag").
`without_unknown_tags` rewrites such a request frame with those fields left out and each
tagged section re-counted, walking the frame by the request's kio schema, so kio can read it.
Only frames kio refused take this path: the hot path pays nothing.  A frame the walk cannot
follow raises ValueError (the caller closes the connection as for any malformed request).
"""

from __future__ import annotations

import dataclasses

from kio.index import load_request_schema
from kio.serial._introspect import (EntityField, EntityTupleField, PrimitiveTupleField,
                                    classify_field)

from broker.shared.protocol.guard import read_uvarint  # a count the guard bounds too
from broker.shared.protocol.varint import uvarint

_FIXED = {"int8": 1, "bool": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
          "int64": 8, "float64": 8, "uuid": 16, "error_code": 2, "timedelta_i32": 4,
          "timedelta_i64": 8, "datetime_i64": 8}
_COMPACT = ("string", "bytes", "records")


def is_unknown_tag(error: BaseException) -> bool:
    return isinstance(error, KeyError) and "Unknown tagged field" in str(error)


def without_unknown_tags(request, api_key: int, version: int) -> bytes:
    """The request frame (after the size prefix) without the tagged fields kio does not know."""
    body_class = load_request_schema(api_key, version)
    data, out = bytes(request), bytearray()
    try:
        # Request header v2: api key, version, correlation id, then a legacy (int16-sized)
        # client id, then its tagged fields.
        size = int.from_bytes(data[8:10], "big", signed=True)
        position = 10 + max(size, 0)
        out += data[:position]
        position = _tagged(body_class.__header_schema__, data, position, out)
        position = _entity(body_class, data, position, out)
    except (IndexError, KeyError, TypeError) as error:
        raise ValueError(f"cannot follow the frame: {error!r}") from None
    return bytes(out + data[position:])


def _entity(cls, data: bytes, position: int, out: bytearray) -> int:
    for field in dataclasses.fields(cls):
        if field.name.startswith("__") or "tag" in field.metadata:
            continue
        position = _field(field, data, position, out)
    return _tagged(cls, data, position, out) if cls.__flexible__ else position


def _field(field, data: bytes, position: int, out: bytearray) -> int:
    kind = classify_field(field)
    if isinstance(kind, EntityField):
        return _entity(kind.type_, data, position, out)
    if isinstance(kind, (EntityTupleField, PrimitiveTupleField)):
        count, end = read_uvarint(data, position)  # a compact array: n + 1, 0 for null
        out += data[position:end]
        position = end
        for _ in range(max(count - 1, 0)):
            if isinstance(kind, EntityTupleField):
                position = _entity(kind.type_, data, position, out)
            else:
                position = _primitive(field.metadata["kafka_type"], data, position, out)
        return position
    return _primitive(field.metadata["kafka_type"], data, position, out)


def _primitive(kafka_type: str, data: bytes, position: int, out: bytearray) -> int:
    if kafka_type in _FIXED:
        end = position + _FIXED[kafka_type]
    elif kafka_type in _COMPACT:
        length, end = read_uvarint(data, position)  # n + 1, 0 for null
        end += max(length - 1, 0)
    elif kafka_type in ("uvarint", "varint", "varlong"):
        end = read_uvarint(data, position)[1]
    else:
        raise KeyError(f"kafka type {kafka_type}")
    if end > len(data):
        raise IndexError("a field runs past the frame")
    out += data[position:end]
    return end


def _tagged(cls, data: bytes, position: int, out: bytearray) -> int:
    known = {field.metadata["tag"] for field in dataclasses.fields(cls) if "tag" in field.metadata}
    count, position = read_uvarint(data, position)
    kept = []
    for _ in range(count):
        tag, position = read_uvarint(data, position)
        size, position = read_uvarint(data, position)
        if position + size > len(data):
            raise IndexError("a tagged field runs past the frame")
        if tag in known:
            kept.append(uvarint(tag) + uvarint(size) + data[position:position + size])
        position += size
    out += uvarint(len(kept)) + b"".join(kept)
    return position
