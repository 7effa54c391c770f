"""The request guard: every array count is checked against the bytes left, before kio decodes.

kio's native reader reserves room for an array's elements before reading them
(`Vec::with_capacity(count)`): a count of 2**32 - 2 in a 24-byte frame makes it ask for 32 GiB,
and a failed allocation aborts the whole process (SIGABRT, which no `except` catches).  Strings
and bytes are safe: kio checks their length against the buffer before slicing.

`walker(entity class)` compiles, once per request schema, a Python function that reads exactly
the fields kio will read, in the same order and with the same encodings (legacy or compact,
nullable or not, tagged fields, nullable nested entities), and raises `GuardError` when an
array claims more elements than the remaining bytes could hold (count x the least number of
bytes one element takes on the wire; every element takes at least one).  A frame that passes
can make kio allocate at most a few times its own size.  It also refuses a null where the
schema allows no null array, as Kafka's readers do (kio would hand the handler None).

It also counts the elements of every array, so a request whose answer would take too long to
build (one element each) is refused before it is decoded: `TooManyEntries`.

It stays cheap by reading only what it must: runs of fixed-size fields are jumped over in
one step, arrays of fixed-size elements in one step, and the walk stops as soon as nothing
left to read can hold an array (kio checks everything else itself).  It is generated as
Python source (one function per entity) because a walk through closures costs several times
more per field.
"""

from __future__ import annotations

import dataclasses
import struct
import types
import typing

from kio.serial._introspect import (EntityField, EntityTupleField, PrimitiveTupleField,
                                    classify_field, get_field_tag, get_schema_field_type,
                                    is_optional)

FIXED_SIZES = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "error_code": 2,
               "int32": 4, "uint32": 4, "timedelta_i32": 4, "int64": 8, "uint64": 8,
               "float64": 8, "timedelta_i64": 8, "datetime_i64": 8, "uuid": 16}
LENGTH_PREFIXED = ("string", "bytes", "records")


class GuardError(ValueError):
    """The frame holds a count or length that its bytes cannot back."""


class TooManyEntries(GuardError):
    """The frame is sound but holds more array elements in all than one request may."""


class Limits:
    """The bound on array elements per request (pybroker.request.max.entries), set once per
    process from its config: the answer to each element is encoded with kio at about 15 us,
    so this bounds how long one request can hold an event loop."""

    max_entries = 100_000


limits = Limits()


def read_uvarint(buffer, position: int) -> tuple[int, int]:
    """An unsigned varint of at most 5 bytes (kio's limit): (value, next position)."""
    result = shift = 0
    for _ in range(5):
        byte = buffer[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, position
        shift += 7
    raise GuardError("varint longer than 5 bytes")


def _too_many(count: int, minimum: int, remaining: int):
    raise GuardError(f"array of {count} elements of at least {minimum} bytes in {remaining} "
                     f"bytes")


# --- the schema, as the walker sees it ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Field:
    kind: str  # "fixed", "string", "bytes", "entity", "array"
    size: int = 0  # fixed: its size
    compact: bool = False  # string, bytes, array: compact (flexible) encoding
    nullable: bool = False  # entity: preceded by an int8 null marker; array: may be null
    entity: type | None = None  # entity, or array of entities
    element: "_Field | None" = None  # array: its element


def _field(cls, field: dataclasses.Field, tagged: bool) -> _Field:
    flexible = cls.__flexible__
    shape = classify_field(field)
    if isinstance(shape, (EntityField, EntityTupleField)):
        entity = _Field("entity", entity=shape.type_,
                        nullable=isinstance(shape, EntityField) and is_optional(field))
    else:
        kafka_type = get_schema_field_type(field)
        if kafka_type in FIXED_SIZES:
            entity = _Field("fixed", size=FIXED_SIZES[kafka_type])
        elif kafka_type in LENGTH_PREFIXED:
            entity = _Field("string" if kafka_type == "string" else "bytes", compact=flexible)
        else:
            raise TypeError(f"{cls.__name__}.{field.name}: unknown kafka type {kafka_type}")
    if isinstance(shape, (EntityTupleField, PrimitiveTupleField)):
        nullable = typing.get_origin(field.type) in (typing.Union, types.UnionType) \
            and type(None) in typing.get_args(field.type)
        return _Field("array", compact=flexible, element=entity, nullable=nullable)
    return entity


def _fields(cls) -> tuple[list[_Field], dict[int, _Field]]:
    """(fields in wire order, tagged fields by tag) of an entity class."""
    plain, tagged = [], {}
    for field in dataclasses.fields(cls):
        tag = get_field_tag(field)
        if tag is None:
            plain.append(_field(cls, field, False))
        else:
            tagged[int(tag)] = _field(cls, field, True)
    return plain, tagged


def _has_array(field: _Field) -> bool:
    if field.kind == "array":
        return True
    return field.kind == "entity" and _entity_has_array(field.entity)


_ARRAYS: dict[type, bool] = {}


def _entity_has_array(cls) -> bool:
    if cls not in _ARRAYS:
        plain, tagged = _fields(cls)
        _ARRAYS[cls] = any(map(_has_array, plain)) or any(map(_has_array, tagged.values()))
    return _ARRAYS[cls]


def _fixed_size(field: _Field) -> int | None:
    """Bytes the field always takes, or None if that depends on its content."""
    if field.kind == "fixed":
        return field.size
    if field.kind == "entity" and not field.nullable and not field.entity.__flexible__:
        sizes = [_fixed_size(item) for item in _fields(field.entity)[0]]
        return None if None in sizes else sum(sizes)
    return None


def _least_size(field: _Field) -> int:
    """The fewest bytes the field can take on the wire."""
    if field.kind == "fixed":
        return field.size
    if field.kind in ("string", "array"):
        return 1 if field.compact else (2 if field.kind == "string" else 4)
    if field.kind == "bytes":
        return 1 if field.compact else 4
    if field.nullable:
        return 1
    plain, _ = _fields(field.entity)
    return sum(map(_least_size, plain)) + (1 if field.entity.__flexible__ else 0)


# --- code generation ----------------------------------------------------------------------------


class _Compiler:
    """Writes one walker function per (entity, whether its end position is needed)."""

    def __init__(self):
        self.names: dict[tuple[type, bool], str] = {}
        self.sources: list[str] = []

    def function(self, cls, need_end: bool) -> str:
        key = (cls, need_end)
        if key not in self.names:
            name = f"w{len(self.names)}_{cls.__name__}_{'full' if need_end else 'tail'}"
            self.names[key] = name
            self.sources.append(self._entity(cls, need_end, name))
        return self.names[key]

    def _entity(self, cls, need_end: bool, name: str) -> str:
        plain, tagged = _fields(cls)
        lines = [f"def {name}(b, p, e, k):"]
        tail_has_array = [False] * (len(plain) + 1)
        tagged_arrays = cls.__flexible__ and any(map(_has_array, tagged.values()))
        tail_has_array[len(plain)] = tagged_arrays
        for index in range(len(plain) - 1, -1, -1):
            tail_has_array[index] = tail_has_array[index + 1] or _has_array(plain[index])
        jump = 0
        for index, field in enumerate(plain):
            if not need_end and not tail_has_array[index]:
                break  # nothing from here on can hold an array
            size = _fixed_size(field)
            if size is not None:
                jump += size
                continue
            if jump:
                lines.append(f"    p += {jump}")
                jump = 0
            after = need_end or tail_has_array[index + 1]
            lines += self._read(field, after, "    ")
        else:
            if jump:
                lines.append(f"    p += {jump}")
            if cls.__flexible__ and (need_end or tagged_arrays):
                lines += self._tagged(tagged, "    ")
        lines.append("    return p")
        return "\n".join(lines)

    def _read(self, field: _Field, need_end: bool, pad: str) -> list[str]:
        """Lines that advance p over `field` (or only to its last array, if not need_end)."""
        if field.kind in ("string", "bytes"):
            return self._length_prefixed(field, pad)
        if field.kind == "entity":
            call = f"p = {self.function(field.entity, need_end)}(b, p, e, k)"
            if not field.nullable:
                return [pad + call]
            return [pad + "m = b[p]", pad + "p += 1", pad + "if m != 255:", pad + "    " + call]
        return self._array(field, need_end, pad)

    @staticmethod
    def _length_prefixed(field: _Field, pad: str) -> list[str]:
        if field.compact:  # uvarint n: null if 0, else n - 1 bytes follow
            return [pad + "n = b[p]",
                    pad + "if n < 128:",
                    pad + "    p += n or 1",
                    pad + "else:",
                    pad + "    n, p = uvarint(b, p)",
                    pad + "    if n: p += n - 1"]
        width, reader = (2, "i16") if field.kind == "string" else (4, "i32")
        return [pad + f"n = {reader}(b, p)[0]",
                pad + f"p += {width} + (n if n > 0 else 0)",
                pad + "if n < -1: raise GuardError('negative length')"]

    def _array(self, field: _Field, need_end: bool, pad: str) -> list[str]:
        element = field.element
        least = _least_size(element)
        if field.compact:  # uvarint n: null if 0, else n - 1 elements
            lines = [pad + "n = b[p]",
                     pad + "if n < 128: p += 1",
                     pad + "else: n, p = uvarint(b, p)",
                     pad + "n -= 1"]
        else:  # int32 n: null if -1
            lines = [pad + "n = i32(b, p)[0]",
                     pad + "p += 4",
                     pad + "if n < -1: raise GuardError('negative array length')"]
        if not field.nullable:  # kio would hand the handler None; Kafka refuses the request
            lines.append(pad + "if n == -1: raise GuardError('null for an array that may not "
                               "be null')")
        lines += [pad + "if n > 0:",
                  pad + f"    if n * {least} > e - p: too_many(n, {least}, e - p)",
                  pad + "    k[0] += n"]
        size = _fixed_size(element)
        if size is not None:
            lines.append(pad + f"    p += n * {size}")
        elif need_end or _has_array(element):
            lines.append(pad + "    for _ in range(n):")
            lines += self._read(element, True, pad + "        ")
        else:
            lines.append(pad + "    return p")  # nothing after needs walking
        return lines

    def _tagged(self, tagged: dict[int, _Field], pad: str) -> list[str]:
        """kio reads each known tag's field by its schema and refuses unknown tags."""
        lines = [pad + "n = b[p]",
                 pad + "if n < 128: p += 1",
                 pad + "else: n, p = uvarint(b, p)",
                 pad + "for _ in range(n):",
                 pad + "    t, p = uvarint(b, p)",
                 pad + "    _, p = uvarint(b, p)"]
        for position, (tag, field) in enumerate(sorted(tagged.items())):
            keyword = "if" if position == 0 else "elif"
            lines.append(pad + f"    {keyword} t == {tag}:")
            size = _fixed_size(field)
            lines += ([pad + f"        p += {size}"] if size is not None
                      else self._read(field, True, pad + "        "))
        lines += [pad + ("    else:" if tagged else "    if True:"),
                  pad + "        raise GuardError(f'unknown tagged field {t}')"]
        return lines


_WALKERS: dict[tuple[type, bool], object] = {}


def walker(cls, to_end: bool = False):
    """The compiled guard of a request (or any entity) class: `walk(buffer, offset)` raises
    GuardError when the body at `offset` could make kio allocate beyond the frame, and
    TooManyEntries when its arrays hold more than `max_entries` elements in all.

    With `to_end` it walks every field and returns the offset after the entity, where kio's
    reader ends too (the tests hold the two against each other on every schema).
    """
    found = _WALKERS.get((cls, to_end))
    if found is not None:
        return found
    compiler = _Compiler()
    entry = compiler.function(cls, need_end=to_end)
    namespace = {"uvarint": read_uvarint, "too_many": _too_many, "GuardError": GuardError,
                 "i16": struct.Struct(">h").unpack_from, "i32": struct.Struct(">i").unpack_from}
    source = "\n\n".join(compiler.sources)
    exec(source, namespace)  # noqa: S102 - our own source, generated from kio's schema classes
    body_walker = namespace[entry]

    def walk(buffer, offset: int, max_entries: int = 2**62) -> int:
        entries = [0]
        try:
            end = body_walker(buffer, offset, len(buffer), entries)
        except (IndexError, struct.error):
            raise GuardError("the frame ends inside a field") from None
        if entries[0] > max_entries:
            raise TooManyEntries(f"{entries[0]} array elements; at most {max_entries} are "
                                 f"served in one request (pybroker.request.max.entries)")
        return end

    walk.source = source
    _WALKERS[(cls, to_end)] = walk
    return walk
