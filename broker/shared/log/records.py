"""Record batches (magic v2) as they travel on the wire and lie on disk.

Header layout, big-endian (Kafka's DefaultRecordBatch):

    0  base offset int64        21 attributes int16        43 producer id int64
    8  batch length int32       23 last offset delta int32 51 producer epoch int16
    12 leader epoch int32       27 base timestamp int64    53 base sequence int32
    16 magic int8               35 max timestamp int64     57 record count int32
    17 crc uint32 (CRC32C of bytes 21..end)                61 records

A batch is stored as the client sent it; only the base offset, which lies outside the CRC, is
rewritten (and the max timestamp and timestamp type where the topic decides them).  Compressed
batches pass through untouched, unless the topic's compression.type names another codec: then
the records are compressed again in it (BatchCheck, broker.shared.log.compression).  `validate`
refuses what Kafka's LogValidator refuses, naming the records that break a per-record rule
(broker.shared.log.record_errors), and every walk over records is bounded by bytes, never by
the count a header claims.
"""

from __future__ import annotations

import struct
import time
import zlib
from typing import NamedTuple

import cramjam
from crc32c import crc32c

from broker.shared.log.compression import XERIAL, TopicCodec
from broker.shared.log.record_errors import (APPEND_TIME, KEYLESS, OUT_OF_RANGE, FaultRoom,
                                             Faults, Wording, timestamp_window)

HEADER_BYTES = 61
LOG_OVERHEAD = 12  # base offset + batch length: the bytes not counted in batch length
_HEADER = struct.Struct(">qiibIhiqqqhii")
_OFFSET_AND_LENGTH = struct.Struct(">qi")
_BASE_OFFSET = struct.Struct(">q")
_BASE_TIMESTAMP = struct.Struct(">q")
# Attributes (int16 at byte 21).
CODEC_MASK = 0x07
LOG_APPEND_TIME = 0x08
TRANSACTIONAL = 0x10
CONTROL = 0x20
CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
ZSTD = 4
NO_TIMESTAMP = -1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class BatchError(ValueError):
    """A batch the broker must refuse; `code` names the Kafka error."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code  # a Kafka error name, e.g. "corrupt_message" or "invalid_record"


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


class TimestampBounds(NamedTuple):
    """How far a CreateTime record's timestamp may lie behind or ahead of the broker's clock
    (log.message.timestamp.before.max.ms / .after.max.ms)."""

    before_ms: int = 2**63 - 1
    after_ms: int = 2**63 - 1


def validate(buffer, max_batch_bytes: int, bounds: TimestampBounds = TimestampBounds(),
             now_ms: int | None = None, max_decompressed: int = 32 << 20) -> Batch:
    """Check that `buffer` holds exactly one sound v2 batch, as Kafka's LogValidator does;
    return its header (see BatchCheck, which does the same a slice at a time)."""
    check = BatchCheck(buffer, max_batch_bytes, bounds, now_ms, max_decompressed)
    while not check.step(1 << 62):
        pass
    return check.batch


class RecordErrors(BatchError):
    """A batch refused for what some of its records are (Kafka's RecordValidationException):
    `errors` lists (index in the batch, message) of the first of them (record_errors.py)."""

    def __init__(self, code: str, message: str, errors: list[tuple[int, str]]):
        super().__init__(code, message)
        self.errors = errors


COMPRESS_SLICE = 256 << 10  # bytes of records recompressed per step (gzip: a few ms)


class BatchCheck:
    """One produced batch being validated, as Kafka's LogValidator does.

    The constructor checks the header at once: "corrupt_message" for wrong lengths, CRC or an
    unknown codec; "invalid_record" for what a v3+ Produce may not carry (old magic, several
    batches, control batches) or a last offset delta that disagrees with the record count;
    "message_too_large" above `max_batch_bytes`.  `start()` makes the records ready to walk (a
    compressed batch's decompressed, at most `max_decompressed` bytes:
    pybroker.max.decompressed.batch.bytes); `step(n)` then walks at most n more records and
    returns True once all were: offset deltas consecutive, fields within each record, records
    filling the batch exactly, timestamps as the topic's message.timestamp.type wants them (see
    `_stamped`).  Records without a key in a compacted topic and timestamps out of bounds are
    counted as the walk goes and refuse the batch at its end, the first of them listed
    (RecordErrors, as Kafka's record_errors).  `batch` is then the header as it is to be
    stored.  Every walk is bounded by the bytes, never by the count the header claims; the
    decompressed records are held from `start()` until the walk ends, and no longer.

    A batch whose codec is not the topic's (`codec`, its compression.type) is recompressed
    once walked: each further step compresses COMPRESS_SLICE bytes of its records, and the last
    leaves the new batch in `stored` (`batch` its header); the decompressed records are held
    until then.  A batch that grows past `max_batch_bytes` meanwhile is refused
    ("message_too_large", as Kafka checks a recompressed batch).  Raises BatchError.
    """

    def __init__(self, buffer, max_batch_bytes: int, bounds: TimestampBounds = TimestampBounds(),
                 now_ms: int | None = None, max_decompressed: int = 32 << 20,
                 keyed: bool = False, log_append_time: bool = False,
                 codec: TopicCodec | None = None, where: str = "",
                 fault_room: FaultRoom | None = None):
        """`keyed`: a compacted topic's batch, whose every record needs a key.
        `log_append_time`: the topic's message.timestamp.type is LogAppendTime.  `codec`: the
        topic's (None: `producer`).  `where`: the topic partition, for Kafka's messages.
        `fault_room`: how many faulty records the answer may still list (shared by a
        request's batches)."""
        self.batch = batch = _check_framing(buffer, max_batch_bytes)
        self.log_append_time = log_append_time
        _check_header(batch)
        self.buffer = buffer
        self.bounds, self.now_ms = bounds, now_ms
        self.max_batch_bytes = max_batch_bytes
        self.max_decompressed = max_decompressed
        self.decompressed = 0  # bytes the records took once decompressed
        self.base_timestamp = _BASE_TIMESTAMP.unpack_from(buffer, 27)[0]
        self.where = where
        self.target = codec if codec is not None and \
            codec.codec != batch.attributes & CODEC_MASK else None
        self.stored: bytes | None = None  # the recompressed batch, once done
        self.packed = 0  # bytes of records recompressed so far
        self._walk: RecordWalk | None = None
        self._packer: tuple | None = None  # (Packer, records, fed) while recompressing
        window = None
        if not log_append_time and (bounds.before_ms < 2**62 or bounds.after_ms < 2**62):
            if now_ms is None:
                self.now_ms = int(time.time() * 1000)
            window = timestamp_window(bounds, self.now_ms, self.base_timestamp)
        self.fault_room = fault_room
        self.faults = Faults(keyed, window, fault_room or FaultRoom()) \
            if keyed or window is not None else None

    @property
    def compressed(self) -> bool:
        return bool(self.batch.attributes & CODEC_MASK)

    @property
    def recompresses(self) -> bool:
        """Its records are compressed again in the topic's codec once walked."""
        return self.target is not None

    @property
    def started(self) -> bool:
        return self._walk is not None

    @property
    def walked(self) -> int:
        """Records walked so far."""
        return 0 if self._walk is None else self._walk.index

    def start(self, room: int | None = None) -> bool:
        """Make the records ready to walk; a compressed batch's are decompressed within `room`
        bytes (at most `max_decompressed`).  False, holding nothing, when they do not fit a
        `room` smaller than `max_decompressed`: a later start with more room decides."""
        if self._walk is not None:
            return True
        count = self.batch.record_count
        if not self.compressed:
            self._walk = RecordWalk(self.buffer, HEADER_BYTES, self.batch.size, count,
                                    self.faults)
            return True
        limit = self.max_decompressed if room is None else min(room, self.max_decompressed)
        try:
            records = decompress(self.batch.attributes & CODEC_MASK,
                                 memoryview(self.buffer)[HEADER_BYTES:self.batch.size], limit)
        except BatchError:
            if limit < self.max_decompressed:
                return False
            raise
        self.decompressed = len(records)
        self._walk = RecordWalk(records, 0, len(records), count, self.faults)
        return True

    def step(self, most: int) -> bool:
        if self._packer is not None:
            return self._pack_slice()
        self.start()
        walk = self._walk
        try:
            done = walk.step(most)
        except BatchError:
            walk.buffer = None  # a decompressed copy is not kept past the walk
            raise
        if not done:
            return False
        records, walk.buffer = walk.buffer, None
        self.batch = self._stamped(walk.least, walk.greatest)
        if self.target is None:
            return True
        if not self.compressed:  # the records as they came
            records = memoryview(self.buffer)[HEADER_BYTES:self.batch.size]
        self._packer = (self.target.packer(), records, 0)
        return self._pack_slice()

    def _pack_slice(self) -> bool:
        """Compress the next COMPRESS_SLICE bytes of the records; True once the new batch is
        in `stored`."""
        packer, records, fed = self._packer
        packer.feed(records[fed:fed + COMPRESS_SLICE])
        fed = self.packed = min(fed + COMPRESS_SLICE, len(records))
        room = self.max_batch_bytes - HEADER_BYTES
        if fed < len(records) and packer.size <= room:
            self._packer = (packer, records, fed)
            return False
        self._packer = records = None  # held no longer than the pieces that view them
        body = packer.finish() if packer.size <= room else None
        if body is None or sum(map(len, body)) > room:
            raise BatchError("message_too_large",
                             f"the batch is larger than max.message.bytes {self.max_batch_bytes} "
                             f"once compressed with {self.target.name} (compression.type)")
        self.stored = rebuilt(self.buffer, self.batch, body, self.target.codec)
        self.batch = read_header(self.stored, 0)
        return True

    def _stamped(self, least: int, greatest: int) -> Batch:
        """The header to store, given the least and greatest timestamp deltas of the records.

        As Kafka's LogValidator, the topic's type decides, never the client's attribute: a
        client may not set LogAppendTime ("invalid_timestamp" for every record), except on a
        CreateTime topic with a max timestamp, which Kafka reads as every record's timestamp
        and checks against the bounds.  Such a batch is stored as CreateTime, so its records'
        own timestamps are what readers see: they are checked too (Kafka leaves them
        unchecked).  CreateTime stamps must lie within the bounds (each record out of them a
        fault) and within int64 ("invalid_timestamp" for the batch), and the max timestamp is
        set to the records' greatest.  A LogAppendTime topic's batch is stamped at append
        (Partition.append).
        """
        batch = self.batch
        if batch.attributes & LOG_APPEND_TIME:
            if self.log_append_time or batch.max_timestamp == NO_TIMESTAMP:
                self._fault_all(APPEND_TIME)
            elif _bounded(self.bounds) and not \
                    self.now_ms - self.bounds.before_ms <= batch.max_timestamp <= \
                    self.now_ms + self.bounds.after_ms:
                self._fault_all(OUT_OF_RANGE)
            batch = batch._replace(attributes=batch.attributes & ~LOG_APPEND_TIME)
        if self.log_append_time:
            if self.faults is not None:
                self._refuse_faults()
            return batch
        base = self.base_timestamp
        if base + least < INT64_MIN or base + greatest > INT64_MAX:
            raise BatchError("invalid_timestamp",
                             f"a record's timestamp does not fit 64 bits (base timestamp {base}, "
                             f"deltas from {least} to {greatest})")
        if self.faults is not None:
            self._refuse_faults()
        # As Kafka, the header's max timestamp is the records' greatest (setMaxTimestamp).
        return batch._replace(max_timestamp=base + greatest)

    def _fault_all(self, kind: int) -> None:
        """Every record is faulty (its batch's timestamp is)."""
        if self.faults is None:
            self.faults = Faults(False, None, self.fault_room or FaultRoom())
        self.faults.all_records(self.batch.record_count, kind)

    def _refuse_faults(self) -> None:
        """RecordErrors if a record broke a per-record rule."""
        faults = self.faults
        if not faults.found:
            return
        batch = self.batch
        wording = Wording(self.where, batch.base_offset, self.base_timestamp,
                          batch.max_timestamp, self.bounds, self.now_ms)
        raise RecordErrors(*wording.verdict(faults))


def rebuilt(buffer, header: Batch, body: list, codec: int) -> bytes:
    """A batch around `body` (its records compressed in `codec`, in pieces): the header of
    `buffer` with `header`'s attributes (the codec set) and max timestamp, its length and CRC
    recomputed (the pieces copied once, into the batch)."""
    head = bytearray(buffer[:HEADER_BYTES])
    struct.pack_into(">i", head, 8, HEADER_BYTES - LOG_OVERHEAD + sum(map(len, body)))
    struct.pack_into(">h", head, 21, header.attributes & ~CODEC_MASK | codec)
    _BASE_TIMESTAMP.pack_into(head, 35, header.max_timestamp)
    crc = crc32c(memoryview(head)[21:])
    for piece in body:
        crc = crc32c(piece, crc)
    struct.pack_into(">I", head, 17, crc)
    return b"".join((head, *body))


def _check_framing(buffer, max_batch_bytes: int) -> Batch:
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
    if crc32c(memoryview(buffer)[21:size]) != struct.unpack_from(">I", buffer, 17)[0]:
        raise BatchError("corrupt_message", "record batch CRC mismatch")
    return read_header(buffer, 0)


# --- compressed records ------------------------------------------------------------------------


def decompress(codec: int, data, limit: int):
    """The records of a compressed batch, at most `limit` bytes (else BatchError).  Memory
    follows what the records need, never what a bomb could expand to: gzip stops at the limit,
    snappy's lengths are read before anything is expanded, and lz4 and zstd decompress into
    a buffer that stops when full: the size a zstd frame declares, else 8x the compressed
    size, doubled up to the limit."""
    try:
        if codec == 1:
            inflater = zlib.decompressobj(wbits=31)  # a gzip stream
            out = inflater.decompress(data, limit)
            if inflater.unconsumed_tail or not inflater.eof:
                raise ValueError("more than the limit, or a truncated stream")
            return memoryview(out)
        if codec == 2:
            return _snappy(data, limit)
        data = bytes(data)
        first = _declared_zstd_size(data) if codec == ZSTD else None
        return _into_growing_buffer({3: cramjam.lz4, 4: cramjam.zstd}[codec], data, limit, first)
    except (cramjam.DecompressionError, zlib.error, ValueError, KeyError) as error:
        raise BatchError("corrupt_message",
                         f"{CODECS.get(codec, codec)} records do not decompress within "
                         f"{limit} bytes (pybroker.max.decompressed.batch.bytes): {error}") from None


def _into_growing_buffer(module, data: bytes, limit: int, first: int | None = None):
    """Each try that does not fit costs what its buffer holds: doubling keeps them all within
    twice the last (a first guess from the frame makes one try of most batches)."""
    size = min(limit, max(64 * 1024, first or 8 * len(data)))
    while True:
        out = bytearray(size)
        try:
            return memoryview(out)[:module.decompress_into(data, out)]
        except cramjam.DecompressionError:
            if size >= limit:
                raise
            size = min(limit, 2 * size)


_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _declared_zstd_size(data: bytes) -> int | None:
    """The content size the first zstd frame's header declares, if it does (RFC 8878 3.1.1.1;
    librdkafka and one-shot compressors write it, Java's streaming one does not).  Only a
    first guess: a frame that lies about it is refused by the decompression itself."""
    if len(data) < 6 or data[:4] != _ZSTD_MAGIC:
        return None
    descriptor = data[4]
    single_segment = descriptor >> 5 & 1
    field = (single_segment, 2, 4, 8)[descriptor >> 6]  # bytes of Frame_Content_Size
    if not field:
        return None
    at = 5 + (1 - single_segment) + (0, 1, 2, 4)[descriptor & 3]  # window, dictionary id
    if len(data) < at + field:
        return None
    size = int.from_bytes(data[at:at + field], "little")
    return size + 256 if field == 2 else size


def _snappy(data, limit: int):
    """Raw snappy, or snappy-java's framing: a 16-byte header, then [int32 length][block]."""
    data = bytes(data)
    if not data.startswith(XERIAL):  # snappy-java's stream (Kafka's Java producer writes it)
        if cramjam.snappy.decompress_raw_len(data) > limit:
            raise ValueError("too large")
        return memoryview(bytes(cramjam.snappy.decompress_raw(data)))
    out, position, total = [], 16, 0
    while position < len(data):
        if position + 4 > len(data):
            raise ValueError("a snappy-java block length runs past the batch")
        (length,) = struct.unpack_from(">i", data, position)
        block = data[position + 4:position + 4 + length]
        if length < 0 or len(block) != length:
            raise ValueError("a snappy-java block runs past the batch")
        total += cramjam.snappy.decompress_raw_len(block)
        if total > limit:
            raise ValueError("too large")
        out.append(bytes(cramjam.snappy.decompress_raw(block)))
        position += 4 + length
    return memoryview(b"".join(out))


def _check_header(batch: Batch) -> None:
    codec = batch.attributes & CODEC_MASK
    if codec not in CODECS:
        raise BatchError("corrupt_message", f"unknown compression codec {codec}")
    if batch.attributes & CONTROL:
        raise BatchError("invalid_record", "clients may not write control batches")
    if batch.record_count <= 0 or batch.last_offset_delta != batch.record_count - 1:
        # The log end moves by last offset delta + 1: a delta that disagrees with the count
        # would let one batch move it by 2**31.
        raise BatchError("invalid_record",
                         f"inconsistent batch: {batch.record_count} records, last offset delta "
                         f"{batch.last_offset_delta}")


def _bounded(bounds: TimestampBounds) -> bool:
    return bounds.before_ms < 2**62 or bounds.after_ms < 2**62


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


def base_offset_bytes(base_offset: int) -> bytes:
    """A batch's first 8 bytes for `base_offset` (the CRC does not cover them)."""
    return _BASE_OFFSET.pack(base_offset)


def max_timestamp_of(batch) -> int:
    return _BASE_TIMESTAMP.unpack_from(batch, 35)[0]


def with_max_timestamp(batch, max_timestamp: int) -> bytes:
    """The same batch with its header's max timestamp set and the CRC recomputed."""
    rewritten = bytearray(batch)
    _BASE_TIMESTAMP.pack_into(rewritten, 35, max_timestamp)
    struct.pack_into(">I", rewritten, 17, crc32c(memoryview(rewritten)[21:]))
    return bytes(rewritten)


def restamped(batch, header: Batch) -> bytes:
    """The batch as its validation decided to store it (BatchCheck.batch): `header`'s
    attributes and max timestamp, CRC recomputed; the same bytes if they carry them already."""
    attributes = struct.unpack_from(">h", batch, 21)[0]
    if attributes == header.attributes and max_timestamp_of(batch) == header.max_timestamp:
        return batch
    rewritten = bytearray(batch)
    struct.pack_into(">h", rewritten, 21, header.attributes)
    _BASE_TIMESTAMP.pack_into(rewritten, 35, header.max_timestamp)
    struct.pack_into(">I", rewritten, 17, crc32c(memoryview(rewritten)[21:]))
    return bytes(rewritten)


def with_log_append_time(batch, now_ms: int) -> bytes:
    """The batch stamped by the broker (message.timestamp.type=LogAppendTime): the
    LogAppendTime attribute set and the max timestamp the append time, CRC recomputed; its
    records are then read as carrying that timestamp (Kafka's rule)."""
    rewritten = bytearray(batch)
    attributes = struct.unpack_from(">h", rewritten, 21)[0]
    struct.pack_into(">h", rewritten, 21, attributes | LOG_APPEND_TIME)
    _BASE_TIMESTAMP.pack_into(rewritten, 35, now_ms)
    struct.pack_into(">I", rewritten, 17, crc32c(memoryview(rewritten)[21:]))
    return bytes(rewritten)


def headers_in(buffer, limit: int | None = None, partial: bool = False):
    """Yield the headers of the complete batches in `buffer` (e.g. a chunk read from disk).

    With `partial`, also the header of a last batch whose body runs past the end (a batch
    larger than the chunk: its header alone says where it lies).
    """
    end = len(buffer) if limit is None else limit
    position = 0
    while end - position >= HEADER_BYTES:
        length = _OFFSET_AND_LENGTH.unpack_from(buffer, position)[1]
        if length < HEADER_BYTES - LOG_OVERHEAD:
            return
        if position + LOG_OVERHEAD + length > end:
            if partial:
                yield read_header(buffer, position)
            return
        yield read_header(buffer, position)
        position += LOG_OVERHEAD + length


def _varint(buffer, position: int) -> tuple[int, int]:
    """A zigzag varint of at most 10 bytes (Kafka's record fields): (value, next position)."""
    result = shift = 0
    while shift < 70:
        byte = buffer[position]
        position += 1
        if shift == 63 and byte & 0x7E:
            raise BatchError("corrupt_message", "varint longer than 64 bits")
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), position
        shift += 7
    raise BatchError("corrupt_message", "varint longer than 10 bytes")


def walk_records(buffer, position: int, end: int, count: int,
                 stamps: list | None = None) -> tuple[int, int]:
    """Walk the `count` records of an uncompressed batch between `position` and `end`.

    Checks what Kafka's DefaultRecord reader checks: each record's fields fit its length, its
    offset delta is its index, and the records fill the batch exactly.  Returns the least and
    greatest timestamp deltas; with `stamps`, appends (offset delta, timestamp delta) per
    record.  The loop is bounded by the bytes (every record takes at least 7), never by the
    header's count, so a lie in a stored batch cannot drive it.  Raises BatchError.
    """
    walk = RecordWalk(buffer, position, end, count)
    walk.step(count, stamps)
    return walk.least, walk.greatest


class RecordWalk:
    """A walk over the records between `position` and `end`, resumable: `step(n)` walks at
    most n more records and says whether the walk is over (so a large batch can be walked a
    slice per event-loop turn).  With `faults` (record_errors.Faults), the records that break
    a per-record rule are noted there as the walk goes."""

    def __init__(self, buffer, position: int, end: int, count: int,
                 faults: Faults | None = None):
        if count > (end - position) // 7:
            raise BatchError("corrupt_message",
                             f"{count} records cannot fit {end - position} bytes")
        self.buffer, self.position, self.end, self.count = buffer, position, end, count
        self.faults = faults
        self.index, self.least, self.greatest = 0, 2**63, -(2**63)

    def step(self, most: int, stamps: list | None = None) -> bool:
        stop_at = min(self.count, self.index + most)
        if _recordwalk is not None and stamps is None:
            if stop_at > self.index and self.faults is None:
                self.position, least, greatest, _, _ = _recordwalk.walk(
                    self.buffer, self.position, self.end, self.index, stop_at, False, None, 0,
                    False, 0, 0, 0)
                self.least, self.greatest = min(self.least, least), max(self.greatest, greatest)
            elif stop_at > self.index:
                self._step_faults_in_c(stop_at)
        else:
            self.position, self.least, self.greatest = _walk(
                self.buffer, self.position, self.end, self.index, stop_at, self.least,
                self.greatest, stamps, self.faults)
        self.index = stop_at
        if self.index < self.count:
            return False
        if self.position != self.end:
            raise BatchError("corrupt_message",
                             f"{self.end - self.position} bytes after the last record")
        return True

    def _step_faults_in_c(self, stop_at: int) -> None:
        faults = self.faults
        listed = len(faults.listed)
        low, high, none = faults.window or (0, 0, 0)
        self.position, least, greatest, keyless, stamped = _recordwalk.walk(
            self.buffer, self.position, self.end, self.index, stop_at, faults.keyed,
            faults.listed, faults.room.left, faults.window is not None, low, high, none)
        faults.noted(keyless, stamped, len(faults.listed) - listed)
        self.least, self.greatest = min(self.least, least), max(self.greatest, greatest)


try:  # the same walk in C (_recordwalk.c), built by `pip install -e .`; else this module's
    from broker.shared.log import _recordwalk
    _recordwalk.set_error(BatchError)
except ImportError:
    _recordwalk = None


def _walk(buffer, position: int, end: int, first: int, stop_at: int, least: int,
          greatest: int, stamps: list | None,
          faults: Faults | None = None) -> tuple[int, int, int]:
    varint = _varint
    keyed = faults is not None and faults.keyed
    windowed = faults is not None and faults.window is not None
    low, high, none = faults.window if windowed else (0, 0, 0)
    try:
        for index in range(first, stop_at):
            # Varints of one or two bytes are read inline: record and value lengths of small
            # and 1 KiB records; longer ones go through _varint.
            byte = buffer[position]
            if byte < 0x80:
                length, position = (byte >> 1) ^ -(byte & 1), position + 1
            elif buffer[position + 1] < 0x80:
                length = (byte & 0x7F) | buffer[position + 1] << 7
                length, position = (length >> 1) ^ -(length & 1), position + 2
            else:
                length, position = varint(buffer, position)
            stop = position + length
            if length < 6 or stop > end:
                raise BatchError("corrupt_message", f"record {index}: length {length}")
            byte = buffer[position + 1]  # past the attributes
            if byte < 0x80:
                stamp, position = (byte >> 1) ^ -(byte & 1), position + 2
            elif buffer[position + 2] < 0x80:
                stamp = (byte & 0x7F) | buffer[position + 2] << 7
                stamp, position = (stamp >> 1) ^ -(stamp & 1), position + 3
            else:
                stamp, position = varint(buffer, position + 1)
            byte = buffer[position]
            if byte < 0x80:
                delta, position = (byte >> 1) ^ -(byte & 1), position + 1
            elif buffer[position + 1] < 0x80:
                delta = (byte & 0x7F) | buffer[position + 1] << 7
                delta, position = (delta >> 1) ^ -(delta & 1), position + 2
            else:
                delta, position = varint(buffer, position)
            if delta != index:
                raise BatchError("invalid_record", f"record {index} has offset delta {delta}")
            if stamp > greatest:
                greatest = stamp
            if stamp < least:
                least = stamp
            if stamps is not None:
                stamps.append((delta, stamp))
            byte = buffer[position]  # the key: length -1 is null
            if byte < 0x80:
                size, position = (byte >> 1) ^ -(byte & 1), position + 1
            else:
                size, position = varint(buffer, position)
            keyless = size == -1
            if size > 0:
                position += size
            elif size < -1:
                raise BatchError("corrupt_message", f"record {index}: key length {size}")
            byte = buffer[position]  # the value, likewise
            if byte < 0x80:
                size, position = (byte >> 1) ^ -(byte & 1), position + 1
            elif buffer[position + 1] < 0x80:
                size = (byte & 0x7F) | buffer[position + 1] << 7
                size, position = (size >> 1) ^ -(size & 1), position + 2
            else:
                size, position = varint(buffer, position)
            if size > 0:
                position += size
            elif size < -1:
                raise BatchError("corrupt_message", f"record {index}: value length {size}")
            if buffer[position] == 0:  # no headers, the common case
                position += 1
            else:
                position = _skip_headers(buffer, position, stop, index)
            if position != stop:
                raise BatchError("corrupt_message", f"record {index} does not fill its length")
            if keyless and keyed:  # Kafka checks the key first: one fault per record
                faults.note(index, KEYLESS, stamp)
            elif windowed and stamp != none and (stamp < low or stamp > high):
                faults.note(index, OUT_OF_RANGE, stamp)
    except IndexError:
        raise BatchError("corrupt_message", "a record runs past the batch") from None
    return position, least, greatest


def _skip_headers(buffer, position: int, stop: int, index: int) -> int:
    byte = buffer[position]
    if byte < 0x80:
        count, position = (byte >> 1) ^ -(byte & 1), position + 1
    else:
        count, position = _varint(buffer, position)
    if count < 0 or count * 2 > stop - position:
        raise BatchError("corrupt_message", f"record {index}: {count} headers")
    for _ in range(count):
        size, position = _varint(buffer, position)
        if size < 0:
            raise BatchError("corrupt_message", f"record {index}: header key length {size}")
        size, position = _varint(buffer, position + size)
        if size > 0:
            position += size
        elif size < -1:
            raise BatchError("corrupt_message", f"record {index}: header value length {size}")
    return position


def record_timestamps(batch, max_decompressed: int = 32 << 20) -> list[tuple[int, int]] | None:
    """(offset, timestamp) of each record of a stored batch, a compressed one decompressed
    first (at most `max_decompressed` bytes: a bomb is refused, never allocated); None if its
    records do not parse (then only the header can be believed).  A LogAppendTime batch's
    records all carry its max timestamp, as Kafka reads them.  A list as long as the batch:
    lookups use `first_record_from`."""
    try:
        stored = _StoredRecords(batch, max_decompressed)
        stamps: list[tuple[int, int]] = []
        walk_records(stored.body, stored.position, stored.end, stored.header.record_count, stamps)
    except BatchError:
        return None
    return [stored.record(delta, stamp) for delta, stamp in stamps]


def first_record_from(batch, timestamp: int, max_decompressed: int = 32 << 20,
                      from_offset: int = INT64_MIN) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record of a stored batch at or past `from_offset`
    (any offset by default, whatever the header's base) stamped at or after `timestamp`; None if there is none, or its records do not parse
    (read as record_timestamps reads them).  The C walk finds the slice of FIND_SLICE records
    where the first such record lies; only that slice is read record by record, and nothing
    is kept."""
    try:
        stored = _StoredRecords(batch, max_decompressed)
        header = stored.header
        if header.attributes & LOG_APPEND_TIME:
            later = from_offset > header.base_offset  # the records' offsets are needed
            deltas: list[tuple[int, int]] | None = [] if later else None
            walk_records(stored.body, stored.position, stored.end, header.record_count, deltas)
            if header.max_timestamp < timestamp:
                return None
            if not later:
                return stored.record(0, 0)
            return next((stored.record(delta, 0) for delta, _ in deltas
                         if header.base_offset + delta >= from_offset), None)
        walk = RecordWalk(stored.body, stored.position, stored.end, header.record_count)
        while walk.index < walk.count:
            first, position = walk.index, walk.position
            walk.least, walk.greatest = INT64_MAX, INT64_MIN
            walk.step(FIND_SLICE)
            base = stored.base_timestamp
            # A sum below 64 bits wraps up: such a slice may hold the record too.
            if base + walk.greatest >= timestamp or base + walk.least < INT64_MIN:
                stamps: list[tuple[int, int]] = []
                _walk(stored.body, position, stored.end, first, walk.index, INT64_MAX,
                      INT64_MIN, stamps)
                found = next((item for item in (stored.record(*each) for each in stamps)
                              if item[1] >= timestamp and item[0] >= from_offset), None)
                if found is not None:
                    return found
    except BatchError:
        return None
    return None


FIND_SLICE = 4096  # records a lookup reads one by one at most (a few ms in Python)


class _StoredRecords:
    """The records of a stored batch: its header, and where they lie (a compressed batch's
    decompressed first, within a limit)."""

    def __init__(self, batch, max_decompressed: int):
        self.header = header = read_header(batch, 0)
        self.base_timestamp = _BASE_TIMESTAMP.unpack_from(batch, 27)[0]
        end = min(len(batch), header.size)
        codec = header.attributes & CODEC_MASK
        if codec:
            self.body = decompress(codec, memoryview(batch)[HEADER_BYTES:end], max_decompressed)
            self.position, self.end = 0, len(self.body)
        else:
            self.body, self.position, self.end = batch, HEADER_BYTES, end

    def record(self, delta: int, stamp: int) -> tuple[int, int]:
        """(offset, timestamp) of a record, as a reader sees it: a LogAppendTime batch's
        records carry its max timestamp; a sum past 64 bits wraps, as Java's does."""
        header = self.header
        if header.attributes & LOG_APPEND_TIME:
            return header.base_offset + delta, header.max_timestamp
        stamp = (self.base_timestamp + stamp - INT64_MIN) % 2**64 + INT64_MIN
        return header.base_offset + delta, stamp
