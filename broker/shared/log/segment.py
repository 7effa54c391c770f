"""One log segment: `<base offset>.log` holding batches back to back, `<base>.index` and
`<base>.timeindex`.

The index is sparse, as Kafka's: an 8-byte entry (offset relative to the base, uint32; file
position, uint32) is added each time `log.index.interval.bytes` of batches have been written
since the previous entry.  Entries are only ever appended, under the partition lock, and the
partition's state says how many are valid in the active segment.

The time index has one entry (int64) per index entry whose region is closed: entry i is the
greatest timestamp of every batch from the segment's start to the end of region i (the
batches between index entries i and i + 1).  The values never decrease, so a lookup by
timestamp bisects them and reads one region, not the whole log.  A closed segment has as many
time entries as index entries; the active one has one fewer (its last region is open: the
partition state holds its running maximum).  A segment written before the time index existed,
or one whose time index is short, gets its time index rebuilt from its batches once.

A Segment object belongs to one process; several processes open the same files.
"""

from __future__ import annotations

import bisect
import os
import struct

from broker.shared.log import records

INDEX_ENTRY = struct.Struct(">II")
TIME_ENTRY = struct.Struct(">q")
READ_CHUNK = 1 << 20
# A walk over batch headers (finding a position, cutting whole batches) reads this much at a
# time: the index leaves at most log.index.interval.bytes plus one batch to walk, and a batch
# longer than this costs one read for its header alone, never a read of its body.
HEADER_CHUNK = 16 << 10
MAX_RELATIVE_OFFSET = 2**31 - 1  # Kafka's: offsets relative to a segment's base are int32


def segment_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}.{suffix}"


def list_bases(directory: str) -> list[int]:
    """Base offsets of the segments in a partition directory, ascending."""
    bases = []
    for name in os.listdir(directory):
        if name.endswith(".log") and name[:-4].isdigit():
            bases.append(int(name[:-4]))
    return sorted(bases)


class Segment:
    def __init__(self, directory: str, base_offset: int, create: bool = False):
        self.base_offset = base_offset
        self.log_path = os.path.join(directory, segment_name(base_offset, "log"))
        self.index_path = os.path.join(directory, segment_name(base_offset, "index"))
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        self.log_fd = os.open(self.log_path, flags, 0o644)
        try:
            self.index_fd = os.open(self.index_path, flags | os.O_CREAT, 0o644)
        except OSError:
            os.close(self.log_fd)
            raise
        self._index_cache: list[tuple[int, int]] = []  # (absolute offset, position)
        self.time_path = os.path.join(directory, segment_name(base_offset, "timeindex"))
        self._time_fd = -1  # opened on first use: lookups by time are rare
        self._time_cache: list[int] = []

    def close(self) -> None:
        for fd in (self.log_fd, self.index_fd, self._time_fd):
            if fd < 0:
                continue
            try:
                os.close(fd)
            except OSError:
                pass
        self.log_fd = self.index_fd = self._time_fd = -1

    # --- writing (under the partition lock) -----------------------------------------------

    def write(self, position: int, data: bytes) -> None:
        written = os.pwrite(self.log_fd, data, position)
        if written != len(data):  # a short write to a regular file means the disk is full
            raise OSError(f"short write to {self.log_path}: {written} of {len(data)} bytes")

    def write_batch(self, position: int, base_offset: int, batch) -> None:
        """Write a batch with its base offset set, in one pwritev: the 8 offset bytes, then
        the rest straight from the request's buffer (the CRC does not cover the offset, so
        nothing of the batch is copied in Python)."""
        view = memoryview(batch)
        written = os.pwritev(self.log_fd, (records.base_offset_bytes(base_offset), view[8:]),
                             position)
        if written != len(view):
            raise OSError(f"short write to {self.log_path}: {written} of {len(view)} bytes")

    def add_index_entry(self, entry_number: int, offset: int, position: int) -> None:
        relative = offset - self.base_offset
        if not 0 <= relative < 2**32:  # the entry's format; appends roll long before this
            raise ValueError(f"{self.log_path}: offset {offset} does not fit a 32-bit offset "
                             f"relative to the segment base {self.base_offset}")
        os.pwrite(self.index_fd, INDEX_ENTRY.pack(relative, position),
                  entry_number * INDEX_ENTRY.size)

    def add_time_entry(self, entry_number: int, greatest_timestamp: int) -> None:
        os.pwrite(self._time(), TIME_ENTRY.pack(greatest_timestamp),
                  entry_number * TIME_ENTRY.size)

    def truncate(self, size: int, index_entries: int, time_entries: int | None = None) -> None:
        os.ftruncate(self.log_fd, size)
        os.ftruncate(self.index_fd, index_entries * INDEX_ENTRY.size)
        self._index_cache = self._index_cache[:index_entries]
        if time_entries is not None:
            self.truncate_time(time_entries)

    def flush(self) -> None:
        os.fsync(self.log_fd)
        os.fsync(self.index_fd)
        if self._time_fd >= 0 or os.path.exists(self.time_path):
            os.fsync(self._time())

    # --- reading --------------------------------------------------------------------------

    def size(self) -> int:
        return os.fstat(self.log_fd).st_size

    def read(self, position: int, length: int) -> bytes:
        return os.pread(self.log_fd, length, position)

    def index_entries(self, valid: int | None = None) -> list[tuple[int, int]]:
        """The (offset, position) entries; `valid` bounds them for the active segment."""
        cached = len(self._index_cache)
        wanted = valid if valid is not None else os.fstat(self.index_fd).st_size // INDEX_ENTRY.size
        if wanted > cached:
            raw = os.pread(self.index_fd, (wanted - cached) * INDEX_ENTRY.size,
                           cached * INDEX_ENTRY.size)
            for relative, position in INDEX_ENTRY.iter_unpack(raw[:len(raw) // 8 * 8]):
                self._index_cache.append((self.base_offset + relative, position))
        return self._index_cache[:wanted]

    def truncate_time(self, entries: int) -> None:
        os.ftruncate(self._time(), entries * TIME_ENTRY.size)
        self._time_cache = self._time_cache[:entries]

    def _time(self) -> int:
        if self._time_fd < 0:
            self._time_fd = os.open(self.time_path, os.O_RDWR | os.O_CREAT, 0o644)
        return self._time_fd

    def time_entries(self, wanted: int) -> list[int] | None:
        """The first `wanted` time entries, or None if the file holds fewer."""
        cached = len(self._time_cache)
        if wanted > cached:
            raw = os.pread(self._time(), (wanted - cached) * TIME_ENTRY.size,
                           cached * TIME_ENTRY.size)
            if len(raw) < (wanted - cached) * TIME_ENTRY.size:
                return None
            self._time_cache += [value for (value,) in TIME_ENTRY.iter_unpack(raw)]
        return self._time_cache[:wanted]

    def rebuild_time_index(self, end: int) -> int:
        """Write the time entries of the regions between the index entries from the batches
        up to byte `end` (a closed segment); returns how many were written."""
        entries = self.index_entries()
        boundaries = [position for _offset, position in entries[1:]] + [end]
        greatest, region, written = -1, 0, []
        for position, batch in self.scan():
            while region < len(boundaries) and position >= boundaries[region]:
                written.append(greatest)
                region += 1
            if position >= end:
                break
            greatest = max(greatest, batch.max_timestamp)
        while len(written) < len(entries):
            written.append(greatest)
        os.ftruncate(self._time(), 0)
        os.pwrite(self._time(), b"".join(TIME_ENTRY.pack(value) for value in written), 0)
        self._time_cache = written
        return len(written)

    def batches_from(self, position: int, end: int):
        """Yield (position, header) of the batches from `position` to `end` (headers only)."""
        while position < end:
            chunk = self.read(position, min(HEADER_CHUNK, end - position))
            advanced = 0
            # A batch larger than the chunk is yielded by its header (partial).
            for batch in records.headers_in(chunk, partial=True):
                yield position + batch.position, batch
                advanced = batch.position + batch.size
            if advanced == 0:
                return
            position += advanced

    def find_position(self, offset: int, end: int,
                      valid_entries: int | None = None) -> tuple[int, int] | None:
        """(position, base offset) of the batch holding `offset`, scanning up to byte `end`."""
        entries = self.index_entries(valid_entries)
        slot = bisect.bisect_right(entries, (offset, 2**63)) - 1
        position = entries[slot][1] if slot >= 0 else 0
        for at, batch in self.batches_from(position, end):
            if batch.last_offset >= offset:
                return at, batch.base_offset
        return None

    def whole_batches_end(self, start: int, limit: int, valid_entries: int | None = None) -> int:
        """Where the last whole batch from `start` (a batch boundary) ending at or before
        byte `limit` ends: `start` itself if the first batch is longer.  The index skips to
        the last entry at or before `limit`, so only its region's headers are read."""
        entries = self.index_entries(valid_entries)
        slot = bisect.bisect_right(entries, limit, key=_position) - 1
        position = max(start, entries[slot][1]) if slot >= 0 else start
        for at, batch in self.batches_from(position, limit):
            if at + batch.size > limit:
                break
            position = at + batch.size
        return position

    def scan(self, start: int = 0):
        """Yield (position, header) of the sound batches from `start`; stop at the first bad."""
        position, size = start, self.size()
        while position < size:
            chunk = self.read(position, min(READ_CHUNK, size - position))
            offset_in_chunk = 0
            while True:
                batch = records.is_sound(chunk, offset_in_chunk, len(chunk))
                if batch is None:
                    break
                yield position + offset_in_chunk, batch
                offset_in_chunk += batch.size
            if offset_in_chunk == 0:
                if len(chunk) < READ_CHUNK or size - position <= len(chunk):
                    return
                # A single batch larger than the chunk: read exactly it.
                length = struct.unpack_from(">i", chunk, 8)[0] + records.LOG_OVERHEAD
                if length < records.HEADER_BYTES:
                    return
                whole = self.read(position, length)
                batch = records.is_sound(whole, 0, len(whole))
                if batch is None:
                    return
                yield position, batch
                offset_in_chunk = batch.size
            position += offset_in_chunk


def _position(entry: tuple[int, int]) -> int:
    return entry[1]


def write_atomically(path: str, data: bytes) -> None:
    """Replace a small file whole: written aside, fsynced, renamed over (readers see the old
    content or the new one)."""
    temporary = path + ".tmp"
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
