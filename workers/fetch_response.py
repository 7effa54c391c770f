"""Fetch responses encoded by hand, their record data left on disk as file regions.

kio encodes in Python (tens of microseconds per nested entity) and wants every partition's
records as bytes in memory, which is a copy of all the data a consumer reads.  This module
writes the fields around the records with `struct` and leaves each partition's records as
FileRegions: a descriptor of its own (a dup of the segment's, taken as the region is found),
a position and a length, which the connection sends with `os.sendfile` (workers.file_sender),
as Kafka's `FileRecords.writeTo`.  Those descriptors are bounded per worker (RegionBudget):
past the bound a region is read into the answer instead.  Where the bytes must pass through Python (a TLS listener, a throttled
answer), `FileResponse.materialize()` reads them once.

It serves the Fetch versions the API table does (4-16); the tests compare its output with
kio's, byte for byte, for every version.
"""

from __future__ import annotations

import errno
import os
import struct

from broker.shared.log.files import default_capacity
from broker.shared.protocol.varint import uvarint

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_I64_PAIR = struct.Struct(">qq")
_ZERO_UUID = bytes(16)
FIRST_FLEXIBLE = 12  # Fetch v12: compact arrays, strings and records, tagged fields
FIRST_TOPIC_ID = 13


class FileRegion:
    """`length` bytes at `position` of a file, through a descriptor of its own (`fd`, a dup
    of the segment's) that it closes when closed or dropped.

    The worker holds at most `REGION_BUDGET.limit` of them at once (the answers being
    sent): past it, `file_piece` reads the bytes instead, so answers over many partitions
    cannot take the descriptors connections need."""

    __slots__ = ("fd", "position", "length")

    def __init__(self, fd: int, position: int, length: int):
        self.fd = fd
        self.position = position
        self.length = length
        REGION_BUDGET.held += 1

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            REGION_BUDGET.held -= 1
            os.close(fd)

    def __del__(self) -> None:  # an answer dropped unsent (a parked read, an error) frees it
        self.close()


class RegionBudget:
    """How many FileRegion descriptors the worker holds, and how many it may."""

    def __init__(self, limit: int):
        if limit < 0:
            raise ValueError(f"a region budget cannot be negative: {limit}")
        self.limit = limit
        self.held = 0
        self.read_instead = 0  # regions read as bytes because the budget was spent

    @property
    def room(self) -> bool:
        return self.held < self.limit


REGION_BUDGET = RegionBudget(default_capacity())  # a quarter of the open-files limit


def file_piece(segment, position: int, length: int):
    """A region of a segment as an answer piece: a FileRegion (a dup of its descriptor, taken
    now: the segment's own may be closed by the time the answer is sent), or the bytes
    themselves when the budget is spent or the process is out of descriptors."""
    if REGION_BUDGET.room:
        try:
            return FileRegion(os.dup(segment.log_fd()), position, length)
        except OSError as error:
            if error.errno not in (errno.EMFILE, errno.ENFILE):
                raise
    REGION_BUDGET.read_instead += 1
    return segment.read(position, length)


def piece_size(piece) -> int:
    return piece.length if type(piece) is FileRegion else len(piece)


class FileResponse:
    """A size-prefixed response made of bytes and FileRegions, in order.

    It owns the regions' descriptors: `close()` (or `materialize()`) releases them, and
    whoever holds the response last must call one of the two."""

    __slots__ = ("pieces", "size", "_open")

    def __init__(self, pieces: list, size: int):
        self.pieces = pieces  # bytes and FileRegion, in sending order
        self.size = size  # every byte, the 4-byte size prefix included
        self._open = True

    def materialize(self) -> bytes:
        """The whole response as bytes (the regions read once); the descriptors closed."""
        try:
            parts = []
            for piece in self.pieces:
                if type(piece) is FileRegion:
                    data = os.pread(piece.fd, piece.length, piece.position)
                    if len(data) != piece.length:  # the file shrank under us: never send a lie
                        raise OSError(f"segment data gone: {len(data)} of {piece.length} bytes")
                    parts.append(data)
                else:
                    parts.append(piece)
            return b"".join(parts)
        finally:
            self.close()

    def close(self) -> None:
        if self._open:
            self._open = False
            for piece in self.pieces:
                if type(piece) is FileRegion:
                    piece.close()

class _Writer:
    """Bytes being gathered for one response, cut where a file region goes."""

    __slots__ = ("pieces", "buffer", "size", "flexible")

    def __init__(self, flexible: bool):
        self.pieces: list = []
        self.buffer = bytearray()
        self.size = 0
        self.flexible = flexible

    def count(self, n: int | None) -> None:
        """An array's (or nullable records') length: compact in flexible versions."""
        if self.flexible:
            self.buffer += uvarint(0 if n is None else n + 1)
        else:
            self.buffer += _I32.pack(-1 if n is None else n)

    def string(self, text: str) -> None:
        data = text.encode()
        if self.flexible:
            self.buffer += uvarint(len(data) + 1)
        else:
            self.buffer += _I16.pack(len(data))
        self.buffer += data

    def no_tags(self) -> None:
        if self.flexible:
            self.buffer.append(0)

    def region(self, region: FileRegion) -> None:
        self.size += len(self.buffer)
        self.pieces.append(bytes(self.buffer))
        self.buffer = bytearray()
        self.pieces.append(region)
        self.size += region.length

    def finish(self) -> list:
        if self.buffer:
            self.size += len(self.buffer)
            self.pieces.append(bytes(self.buffer))
        return self.pieces


def encode_fetch(correlation, version: int, throttle_ms: int, error_code: int, session_id: int,
                 topics: list) -> FileResponse | bytes:
    """A Fetch response frame.  `topics` are the handler's answers: dicts with "topic",
    "topic_id" and "partitions", each partition a dict of the response's fields whose
    "records" is bytes or a list of pieces (`file_piece`: FileRegions and bytes); the
    answer takes the FileRegions over.  Without regions the answer is plain bytes."""
    out = _Writer(version >= FIRST_FLEXIBLE)
    try:
        return _encode(out, correlation, version, throttle_ms, error_code, session_id, topics)
    except BaseException:  # the regions taken so far go with it (the others when dropped)
        for piece in out.pieces:
            if type(piece) is FileRegion:
                piece.close()
        raise


def _encode(out: _Writer, correlation, version: int, throttle_ms: int, error_code: int,
            session_id: int, topics: list) -> FileResponse | bytes:
    flexible = out.flexible
    out.buffer += _I32.pack(throttle_ms)
    if version >= 7:
        out.buffer += _I16.pack(error_code) + _I32.pack(session_id)
    out.count(len(topics))
    for topic in topics:
        if version >= FIRST_TOPIC_ID:
            topic_id = topic["topic_id"]
            out.buffer += _ZERO_UUID if topic_id is None else topic_id.bytes
        else:
            out.string(topic["topic"])
        out.count(len(topic["partitions"]))
        for part in topic["partitions"]:
            _partition(out, version, part)
        out.no_tags()
    out.no_tags()
    pieces = out.finish()
    head = _I32.pack(out.size + 4 + flexible) + bytes(correlation) + (b"\0" if flexible else b"")
    if len(pieces) == 1:
        return head + pieces[0]
    pieces[0] = head + pieces[0]
    return FileResponse(pieces, out.size + len(head))


def _partition(out: _Writer, version: int, part: dict) -> None:
    buffer = out.buffer
    buffer += _I32.pack(part["partition_index"]) + _I16.pack(part["error_code"])
    buffer += _I64_PAIR.pack(part["high_watermark"], part["last_stable_offset"])
    if version >= 5:
        buffer += _I64.pack(part["log_start_offset"])
    aborted = part["aborted_transactions"]
    out.count(None if aborted is None else len(aborted))
    for transaction in aborted or ():
        out.buffer += _I64_PAIR.pack(transaction["producer_id"], transaction["first_offset"])
        out.no_tags()
    if version >= 11:
        out.buffer += _I32.pack(part["preferred_read_replica"])
    records = part["records"]
    if records is None:
        out.count(None)
    elif type(records) is bytes:
        out.count(len(records))
        out.buffer += records
    else:
        out.count(sum(piece_size(piece) for piece in records))
        for piece in records:
            if type(piece) is FileRegion:
                out.region(piece)
            else:
                out.buffer += piece
    out.no_tags()
