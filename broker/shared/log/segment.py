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

A Segment object belongs to one thread of one process; several processes open the same
files.  What a segment costs a process: its three descriptors while its set is among the
partition registry's open files (files.py), and 16 bytes per index entry read, both dropped
when the set is evicted.
"""

from __future__ import annotations

import bisect
import os
import struct
from array import array

from broker.shared.log import records
from broker.shared.log.files import MIN_CAPACITY, OpenFiles

INDEX_ENTRY = struct.Struct(">II")
TIME_ENTRY = struct.Struct(">q")
READ_CHUNK = 1 << 20
# A walk over batch headers (finding a position, cutting whole batches) reads this much at a
# time: the index leaves at most log.index.interval.bytes plus one batch to walk, and a batch
# longer than this costs one read for its header alone, never a read of its body.
HEADER_CHUNK = 16 << 10
MAX_RELATIVE_OFFSET = 2**31 - 1  # Kafka's: offsets relative to a segment's base are int32
SWAP_SPINS = 64  # tries at opening a set while a compaction swap runs, before waiting for it


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
    """A process's handle on one segment's files, opened through the partition's OpenFiles
    (`files`): the log, its index and its time index are opened together, as one set, and
    closed together when evicted, then reopened at the next use.

    Opening a set is checked against compaction's swap of a closed segment (three renames,
    see compaction.py): `swaps` reads the partition's swap counter, odd while a swap is in
    progress; a set opened while it was odd or while it moved is opened again, so the three
    files always come from the same side of the swap."""

    def __init__(self, directory: str, base_offset: int, files: OpenFiles | None = None,
                 create: bool = False, swaps=None):
        self.base_offset = base_offset
        self.log_path = os.path.join(directory, segment_name(base_offset, "log"))
        self.index_path = os.path.join(directory, segment_name(base_offset, "index"))
        self.time_path = os.path.join(directory, segment_name(base_offset, "timeindex"))
        self._files = files if files is not None else OpenFiles(MIN_CAPACITY)  # its own
        self._swaps = swaps  # None, or (callable: the swap counter, context: waits for a swap)
        self._log_fd = self._index_fd = self._time_fd = -1
        self._index_offsets = array("q")  # the index entries read so far, absolute offsets
        self._index_positions = array("q")
        self._time_cache: list[int] = []
        if create:
            self._open_set(create=True)

    # --- the file set -----------------------------------------------------------------------

    def _fds(self) -> None:
        """Make sure the set is open (reopening it after an eviction)."""
        if self._log_fd < 0:
            self._open_set()
        else:
            self._files.touch(self)

    def _open_set(self, create: bool = False) -> None:
        if self._swaps is None:
            self._open_files(create)
            return
        counter, waiting = self._swaps
        for _ in range(SWAP_SPINS):
            seen = counter()
            if not seen & 1:
                self._open_files(create)
                if counter() == seen:
                    return
                self.close()
            os.sched_yield()
        with waiting():  # a swap is taking long (or its maker died): wait for the partition lock
            self._open_files(create)

    def _open_files(self, create: bool) -> None:
        files = self._files
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        try:
            self._log_fd = files.open(self, self.log_path, flags)
            self._index_fd = files.open(self, self.index_path, os.O_RDWR | os.O_CREAT)
            try:
                self._time_fd = files.open(self, self.time_path, os.O_RDWR)
            except FileNotFoundError:  # written before the time index: made when rebuilt
                self._time_fd = -1
        except BaseException:
            self.close()
            raise

    def files_evicted(self) -> None:
        """OpenFiles closed the set: forget it and what was read from it (it may be a
        different file when reopened, after a compaction)."""
        self._log_fd = self._index_fd = self._time_fd = -1
        self._index_offsets = array("q")
        self._index_positions = array("q")
        self._time_cache = []

    def close(self) -> None:
        self._files.close(self)
        self.files_evicted()

    def log_fd(self) -> int:
        """The log's descriptor, for a `dup` taken at once (see files.py's rules)."""
        self._fds()
        return self._log_fd

    # --- writing (under the partition lock) -----------------------------------------------

    def write(self, position: int, data: bytes) -> None:
        self._fds()
        written = os.pwrite(self._log_fd, data, position)
        if written != len(data):  # a short write to a regular file means the disk is full
            raise OSError(f"short write to {self.log_path}: {written} of {len(data)} bytes")

    def write_batch(self, position: int, base_offset: int, batch) -> None:
        """Write a batch with its base offset set, in one pwritev: the 8 offset bytes, then
        the rest straight from the request's buffer (the CRC does not cover the offset, so
        nothing of the batch is copied in Python)."""
        self._fds()
        view = memoryview(batch)
        written = os.pwritev(self._log_fd, (records.base_offset_bytes(base_offset), view[8:]),
                             position)
        if written != len(view):
            raise OSError(f"short write to {self.log_path}: {written} of {len(view)} bytes")

    def add_index_entry(self, entry_number: int, offset: int, position: int) -> None:
        relative = offset - self.base_offset
        if not 0 <= relative < 2**32:  # the entry's format; appends roll long before this
            raise ValueError(f"{self.log_path}: offset {offset} does not fit a 32-bit offset "
                             f"relative to the segment base {self.base_offset}")
        self._fds()
        os.pwrite(self._index_fd, INDEX_ENTRY.pack(relative, position),
                  entry_number * INDEX_ENTRY.size)

    def add_time_entry(self, entry_number: int, greatest_timestamp: int) -> None:
        os.pwrite(self._time(), TIME_ENTRY.pack(greatest_timestamp),
                  entry_number * TIME_ENTRY.size)

    def truncate(self, size: int, index_entries: int, time_entries: int | None = None) -> None:
        self._fds()
        os.ftruncate(self._log_fd, size)
        os.ftruncate(self._index_fd, index_entries * INDEX_ENTRY.size)
        del self._index_offsets[index_entries:]
        del self._index_positions[index_entries:]
        if time_entries is not None:
            self.truncate_time(time_entries)

    def flush(self) -> None:
        self._fds()
        os.fsync(self._log_fd)
        os.fsync(self._index_fd)
        if self._time_fd >= 0 or os.path.exists(self.time_path):
            os.fsync(self._time())

    # --- reading --------------------------------------------------------------------------

    def size(self) -> int:
        self._fds()
        return os.fstat(self._log_fd).st_size

    def read(self, position: int, length: int) -> bytes:
        self._fds()
        return os.pread(self._log_fd, length, position)

    def _index(self, valid: int | None) -> int:
        """Read the index entries not cached yet; how many are valid (`valid` bounds them
        for the active segment)."""
        self._fds()
        offsets, positions = self._index_offsets, self._index_positions
        cached = len(offsets)
        wanted = valid if valid is not None else \
            os.fstat(self._index_fd).st_size // INDEX_ENTRY.size
        if wanted > cached:
            raw = os.pread(self._index_fd, (wanted - cached) * INDEX_ENTRY.size,
                           cached * INDEX_ENTRY.size)
            base = self.base_offset
            for relative, position in INDEX_ENTRY.iter_unpack(raw[:len(raw) // 8 * 8]):
                offsets.append(base + relative)
                positions.append(position)
        return min(wanted, len(offsets))

    def index_entries(self, valid: int | None = None) -> list[tuple[int, int]]:
        """The (offset, position) entries; `valid` bounds them for the active segment."""
        count = self._index(valid)
        return list(zip(self._index_offsets[:count], self._index_positions[:count]))

    def truncate_time(self, entries: int) -> None:
        os.ftruncate(self._time(), entries * TIME_ENTRY.size)
        self._time_cache = self._time_cache[:entries]

    def _time(self) -> int:
        """The time index's descriptor, the file made if missing (under the partition lock:
        writers only, or a rebuild)."""
        self._fds()
        if self._time_fd < 0:
            self._time_fd = self._files.open(self, self.time_path, os.O_RDWR | os.O_CREAT)
        return self._time_fd

    def time_entries(self, wanted: int) -> list[int] | None:
        """The first `wanted` time entries, or None if the file holds fewer."""
        cached = len(self._time_cache)
        if wanted > cached:
            self._fds()
            if self._time_fd < 0:
                return None
            raw = os.pread(self._time_fd, (wanted - cached) * TIME_ENTRY.size,
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
        count = self._index(valid_entries)
        slot = bisect.bisect_right(self._index_offsets, offset, 0, count) - 1
        position = self._index_positions[slot] if slot >= 0 else 0
        for at, batch in self.batches_from(position, end):
            if batch.last_offset >= offset:
                return at, batch.base_offset
        return None

    def whole_batches_end(self, start: int, limit: int, valid_entries: int | None = None) -> int:
        """Where the last whole batch from `start` (a batch boundary) ending at or before
        byte `limit` ends: `start` itself if the first batch is longer.  The index skips to
        the last entry at or before `limit`, so only its region's headers are read."""
        count = self._index(valid_entries)
        slot = bisect.bisect_right(self._index_positions, limit, 0, count) - 1
        position = max(start, self._index_positions[slot]) if slot >= 0 else start
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


def write_atomically(path: str, data: bytes) -> None:
    """Replace a small file whole: written aside, fsynced, renamed over (readers see the old
    content or the new one)."""
    temporary = path + ".tmp"
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
