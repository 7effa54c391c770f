"""The Spark reading schema, derived from the event classes in broker/shared/events.py.

One flat struct holds the union of every event type's fields (a field a type lacks is null),
plus `_corrupt`, where Spark puts a line it cannot parse.  Deriving it from the msgspec classes
keeps one definition of the log format: a field added there is read here.
"""

from __future__ import annotations

import types
import typing

import msgspec
from pyspark.sql import types as T

from broker.shared.events import EVENT_TYPES, SCHEMA_VERSION

__all__ = ["CORRUPT", "SCHEMA_VERSION", "TYPE_NAMES", "event_schema"]

CORRUPT = "_corrupt"
TYPE_NAMES = tuple(cls.__struct_config__.tag for cls in EVENT_TYPES)


def _spark_type(annotation) -> T.DataType:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return _spark_type(members[0])
    if origin is dict:
        _key, value = typing.get_args(annotation)
        return T.MapType(T.StringType(), _spark_type(value))  # JSON object keys are strings
    return {int: T.LongType(), float: T.DoubleType(), str: T.StringType(),
            bool: T.BooleanType()}[annotation]


def event_schema() -> T.StructType:
    fields: dict[str, T.DataType] = {"type": T.StringType()}
    for cls in EVENT_TYPES:
        hints = typing.get_type_hints(cls)
        for field in msgspec.structs.fields(cls):
            spark_type = _spark_type(hints[field.name])
            known = fields.setdefault(field.encode_name, spark_type)
            if known != spark_type:
                raise TypeError(f"event field {field.encode_name} has two types: "
                                f"{known} and {spark_type}")
    struct = T.StructType([T.StructField(name, kind, True) for name, kind in fields.items()])
    return struct.add(T.StructField(CORRUPT, T.StringType(), True))
