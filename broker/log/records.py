"""Record batches (magic v2) as they travel on the wire and lie on disk.

Header layout, big-endian (Kafka's DefaultRecordBatch):

    0  base offset int64        21 attributes int16        43 producer id int64
    8  batch length int32       23 last offset delta int32 51 producer epoch int16
    12 leader epoch int32       27 base timestamp int64    53 base sequence int32
    16 magic int8               35 max timestamp int64     57 record count int32
    17 crc uint32 (CRC32C of bytes 21..end)                61 records

A batch is stored exactly as the client sent it; only the base offset, which lies outside the
CRC, is rewritten.  Compressed batches pass through untouched.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from crc32c import crc32c

HEADER_BYTES = 61
LOG_OVERHEAD = 12  # base offset + batch length: the bytes not counted in batch length
_HEADER = struct.Struct(">qiibIhiqqqhii")
_OFFSET_AND_LENGTH = struct.Struct(">qi")
_BASE_OFFSET = struct.Struct(">q")


class BatchError(ValueError):
    """A batch the broker must refuse; `code` names the Kafka error."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code  # "corrupt_message" or "invalid_record"


class Batch(NamedTuple):
    position: int  # where the batch starts in the buffer it was read from
    size: int  # LOG_OVERHEAD + batch length
    base_offset: int
    last_offset_delta: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    attributes: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def last_sequence(self) -> int:
        if self.base_sequence < 0:
            return -1
        return (self.base_sequence + self.last_offset_delta) % 2**31


def read_header(buffer, position: int = 0) -> Batch:
    """Parse the batch header at `position`; the caller made sure 61 bytes are there."""
    (base_offset, length, _epoch, magic, _crc, attributes, last_delta, _base_ts, max_ts,
     producer_id, producer_epoch, base_sequence, count) = _HEADER.unpack_from(buffer, position)
    return Batch(position, LOG_OVERHEAD + length, base_offset, last_delta, max_ts, producer_id,
                 producer_epoch, base_sequence, count, attributes)


def validate(buffer, max_batch_bytes: int) -> Batch:
    """Check that `buffer` holds exactly one sound v2 batch; return its header.

    Raises BatchError("corrupt_message") for wrong lengths or CRC, ("invalid_record") for
    anything Kafka refuses in a v3+ Produce (old magic, several batches, no records), and
    ("message_too_large") above `max_batch_bytes`.
    """
    total = len(buffer)
    if total < HEADER_BYTES:
        raise BatchError("corrupt_message", f"{total} bytes cannot hold a batch header")
    base_offset, length = _OFFSET_AND_LENGTH.unpack_from(buffer, 0)
    magic = buffer[16]
    if magic != 2:
        raise BatchError("invalid_record", f"record batch magic {magic}; only v2 is accepted")
    size = LOG_OVERHEAD + length
    if size < HEADER_BYTES or size > total:
        raise BatchError("corrupt_message", f"batch length {length} does not fit {total} bytes")
    if size < total:
        raise BatchError("invalid_record", "a v3+ produce must carry exactly one record batch")
    if size > max_batch_bytes:
        raise BatchError("message_too_large",
                         f"batch of {size} bytes is larger than message.max.bytes {max_batch_bytes}")
    batch = read_header(buffer, 0)
    if crc32c(memoryview(buffer)[21:size]) != struct.unpack_from(">I", buffer, 17)[0]:
        raise BatchError("corrupt_message", "record batch CRC mismatch")
    if batch.record_count <= 0 or batch.last_offset_delta < 0:
        raise BatchError("invalid_record", f"batch of {batch.record_count} records, last offset "
                                           f"delta {batch.last_offset_delta}")
    return batch


def is_sound(buffer, position: int, available: int) -> Batch | None:
    """The batch at `position` if it is complete and its CRC holds, else None (recovery)."""
    if available - position < HEADER_BYTES:
        return None
    length = _OFFSET_AND_LENGTH.unpack_from(buffer, position)[1]
    size = LOG_OVERHEAD + length
    if size < HEADER_BYTES or position + size > available or buffer[position + 16] != 2:
        return None
    stored = struct.unpack_from(">I", buffer, position + 17)[0]
    if crc32c(memoryview(buffer)[position + 21:position + size]) != stored:
        return None
    return read_header(buffer, position)


def with_base_offset(batch: bytes, base_offset: int) -> bytes:
    """The same batch with its base offset rewritten (the CRC does not cover it)."""
    return _BASE_OFFSET.pack(base_offset) + batch[8:]


def headers_in(buffer, limit: int | None = None):
    """Yield the headers of the complete batches in `buffer` (e.g. a chunk read from disk)."""
    end = len(buffer) if limit is None else limit
    position = 0
    while end - position >= HEADER_BYTES:
        length = _OFFSET_AND_LENGTH.unpack_from(buffer, position)[1]
        if length < HEADER_BYTES - LOG_OVERHEAD or position + LOG_OVERHEAD + length > end:
            return
        yield read_header(buffer, position)
        position += LOG_OVERHEAD + length


def _varint(buffer, position: int) -> tuple[int, int]:
    """A zigzag varint (Kafka's record fields): (value, next position)."""
    shift = result = 0
    while True:
        byte = buffer[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), position
        shift += 7


def record_timestamps(batch) -> list[tuple[int, int]] | None:
    """(offset, timestamp) of each record of an uncompressed batch; None if compressed."""
    header = read_header(batch, 0)
    if header.attributes & 0x07:
        return None
    base_timestamp = struct.unpack_from(">q", batch, 27)[0]
    position, found = HEADER_BYTES, []
    for _ in range(header.record_count):
        length, body = _varint(batch, position)
        timestamp_delta, after = _varint(batch, body + 1)  # past the record's attributes byte
        offset_delta, _ = _varint(batch, after)
        found.append((header.base_offset + offset_delta, base_timestamp + timestamp_delta))
        position = body + length
    return found
