"""Record batches built byte by byte, for what kafka-python's builder refuses to write:
timestamps past 64 bits, attributes a client should not set, a million records in a second."""

import struct

from crc32c import crc32c

HEADER = struct.Struct(">qiibIhiqqqhii")  # the v2 batch header (broker.shared.log.records)
LOG_APPEND_TIME = 0x08


def varint(value: int) -> bytes:
    """A zigzag varint, as Kafka writes record fields."""
    value = (value << 1) ^ (value >> 63)
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def record(index: int, stamp_delta: int = 0, value: bytes = b"v", key: bytes | None = b"k") -> bytes:
    """One record with no headers: offset delta `index`."""
    key_field = varint(-1) if key is None else varint(len(key)) + key
    body = (b"\x00" + varint(stamp_delta) + varint(index) + key_field + varint(len(value))
            + value + b"\x00")
    return varint(len(body)) + body


def tiny_records(count: int, value: bytes = b"x" * 20) -> bytes:
    """`count` keyless records with a small value, timestamp delta 0: about 29 bytes each."""
    tail = varint(-1) + varint(len(value)) + value + b"\x00"
    records = []
    for index in range(count):
        body = b"\x00\x00" + varint(index) + tail
        records.append(varint(len(body)) + body)
    return b"".join(records)


def batch_of(records: bytes, count: int, base_timestamp: int, max_timestamp: int | None = None,
             attributes: int = 0) -> bytes:
    """A v2 batch around `records` (compressed already if `attributes` names a codec), its CRC
    right."""
    max_timestamp = base_timestamp if max_timestamp is None else max_timestamp
    header = HEADER.pack(0, 49 + len(records), -1, 2, 0, attributes, count - 1, base_timestamp,
                         max_timestamp, -1, -1, -1, count)
    whole = bytearray(header + records)
    struct.pack_into(">I", whole, 17, crc32c(bytes(whole[21:])))
    return bytes(whole)
