"""Decoding requests and encoding responses with kio, plus the framing around them.

kio decodes in native code (well under a microsecond for a request header) but encodes in
Python at a few microseconds per nested entity, so responses that repeat are encoded once and
cached as bytes by their handlers; this module only builds and frames them.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import struct
import types
import typing

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from broker.shared.protocol.guard import limits, walker

INT32 = struct.Struct(">i")
REQUEST_PREFIX = struct.Struct(">hhi")  # api key, api version, correlation id


@functools.cache
def request_readers(api_key: int, api_version: int):
    """(header reader, body reader) for a request version kio knows, else KeyError.

    The body reader runs the request guard first (broker.shared.protocol.guard): kio's native reader
    would abort the process on an array count the frame cannot back.  The header needs none:
    it holds no array.
    """
    try:
        cls = load_request_schema(api_key, api_version)
    except Exception:  # kio raises its own index errors for unknown keys and versions
        raise KeyError((api_key, api_version)) from None
    return entity_reader(cls.__header_schema__), guarded_reader(cls)


def guarded_reader(cls):
    """kio's reader of `cls`, behind the guard that keeps hostile counts away from it."""
    check, read = walker(cls), entity_reader(cls)

    def read_body(buffer, offset: int):
        check(buffer, offset, limits.max_entries)
        return read(buffer, offset)

    return read_body


@functools.cache
def response_class(api_key: int, api_version: int):
    return load_response_schema(api_key, api_version)


def response_header_is_flexible(api_key: int, api_version: int) -> bool:
    """Response header v1 (with tagged fields) or v0; ApiVersions always uses v0."""
    header = response_class(api_key, api_version).__header_schema__
    return "v1" in header.__module__


@functools.cache
def nested_types(cls) -> dict[str, type]:
    """Field name -> entity class, for fields holding a nested entity or a tuple of them."""
    nested = {}
    for name, hint in typing.get_type_hints(cls).items():
        if typing.get_origin(hint) in (typing.Union, types.UnionType):  # e.g. tuple[X, ...] | None
            hint = next((arg for arg in typing.get_args(hint) if arg is not type(None)), hint)
        if dataclasses.is_dataclass(hint):
            nested[name] = hint
        elif typing.get_origin(hint) is tuple:
            inner = typing.get_args(hint)[0]
            if dataclasses.is_dataclass(inner):
                nested[name] = inner
    return nested


def build(cls, values: dict):
    """Construct kio entity `cls` from a dict, dropping keys this version does not have.

    A dict becomes the nested entity, lists of dicts tuples of it, so one handler can describe its answer
    once for every version of an API.
    """
    names = {field.name for field in dataclasses.fields(cls)}
    nested = nested_types(cls)
    kwargs = {}
    for key, value in values.items():
        if key not in names:
            continue
        if key in nested and isinstance(value, dict):
            value = build(nested[key], value)
        elif key in nested and value is not None:
            value = tuple(build(nested[key], item) if isinstance(item, dict) else item
                          for item in value)
        kwargs[key] = value
    return cls(**kwargs)


def encode_entity(entity) -> bytes:
    buffer = io.BytesIO()
    entity_writer(type(entity))(buffer, entity)
    return buffer.getvalue()


def frame(correlation, flexible_header: bool, body: bytes) -> bytes:
    """A size-prefixed response: size, correlation id, [empty tagged fields], body.

    `correlation` is the 4 request bytes holding it, as bytes or a memoryview.
    """
    if flexible_header:
        return b"".join((INT32.pack(5 + len(body)), correlation, b"\0", body))
    return b"".join((INT32.pack(4 + len(body)), correlation, body))


@functools.cache
def throttle_field_at(api_key: int, api_version: int) -> int:
    """Where in a size-prefixed answer its throttle_time_ms lies when the body begins with it
    (most answers since KIP-219), else 0: size, correlation id, [tagged fields], throttle."""
    fields = dataclasses.fields(response_class(api_key, api_version))
    if not fields or fields[0].name != "throttle_time":
        return 0
    return 8 + response_header_is_flexible(api_key, api_version)
