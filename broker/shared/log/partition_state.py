"""A partition's state file: its words, their mapping in every process, and its flock.

`<partition dir>/state` is memory-mapped by each process and holds (8-byte words, native
endian):

    0 magic               4 high watermark          8 bytes since the last index entry
    1 dirty (writer pid)  5 active segment base     9 segments version (bumped on roll/delete)
    2 log start offset    6 active segment size     10 messages not yet fsynced
    3 log end offset      7 active index entries    11 last fsync, unix ns
    12 appends            13 offline (non-zero: recovery failed; nothing is served)
    14 greatest timestamp of the active segment (see segment.py's time index)
    15 base of the active segment at the last flush
    16 when the active segment got its first batch, unix ms (segment.ms counts from it)
    17 least first offset of an ongoing transaction + 1 (0: none; see partition.py)
    18 entries in the aborted-transaction index   19 its version (bumped when a repair cuts it)
    20 compaction swaps: odd while one renames a segment's files (readers open sets around it)
    21 the producer file's generation: bumped before its size changes (others map it again)
    (the idempotent-producer table is a file of its own: producers.py; the aborted-transaction
    index too: transactions.py)

Appends are serialised by an exclusive `flock` on the file (`StateFile.locked`); the order in
which they write the words is what lets readers go without it (partition.py).
"""

from __future__ import annotations

import fcntl
import os
import sys
from contextlib import contextmanager

from broker.shared.log.files import OpenFiles, OutOfDescriptors, is_exhaustion
from broker.shared.log.mapping import Mapping

STATE_FILE = "state"
STATE_MAGIC = int.from_bytes(b"PYBRKPS1", "little")
(W_MAGIC, W_DIRTY, W_LOG_START, W_LOG_END, W_HIGH_WATERMARK, W_ACTIVE_BASE, W_ACTIVE_SIZE,
 W_INDEX_ENTRIES, W_SINCE_INDEX, W_SEGMENTS_VERSION, W_UNFLUSHED, W_LAST_FLUSH) = range(12)
W_APPENDS = 12
W_OFFLINE = 13  # non-zero: the partition could not be recovered and serves nothing
W_SEGMENT_MAX_TS = 14  # greatest timestamp in the active segment (its time index's open region)
W_FLUSHED_BASE = 15  # base of the active segment at the last flush: later ones need an fsync
W_SEGMENT_STARTED = 16  # unix ms of the active segment's first append (0: unknown)
W_ONGOING_FIRST = 17  # 1 + the least first offset of an ongoing transaction (0: none)
W_ABORTED_COUNT = 18  # entries of the aborted-transaction index readers may read
W_ABORTED_VERSION = 19  # bumped when a repair cuts the index: readers drop what they cached
W_SWAPS = 20  # compaction swaps, odd while one is renaming files (see Segment)
W_PRODUCERS_GENERATION = 21  # bumped before the producer file changes size (see producers.py)
STATE_WORDS = 32
STATE_BYTES = 8 * STATE_WORDS


class StateFile:
    """One process's view of a partition's state file: `words` (mapped: no descriptor held
    for them) and the file's flock, taken through a descriptor among the registry's open
    files (`files`: it may be evicted between locks, and is reopened at the next)."""

    def __init__(self, directory: str, files: OpenFiles):
        self.path = os.path.join(directory, STATE_FILE)
        self._files = files
        self._fd = files.open(self, self.path, os.O_RDWR | os.O_CREAT)
        self._lock_depth = 0
        try:
            if os.fstat(self._fd).st_size < STATE_BYTES:
                os.ftruncate(self._fd, STATE_BYTES)
            self._map = Mapping(self._fd, STATE_BYTES)
        except BaseException as error:
            files.close(self)
            if is_exhaustion(error):  # vm.max_map_count reached: as retriable as EMFILE
                raise OutOfDescriptors(error.errno, f"cannot map {self.path}: "
                                                    f"{error.strerror}") from None
            raise
        self.words = self._map.words

    def close(self) -> None:
        self._map.close()
        self._files.close(self)
        self._fd = -1

    def files_evicted(self) -> None:
        """The registry's OpenFiles closed the file (its mapping stays)."""
        self._fd = -1

    def flush(self) -> None:
        """msync: the words as durable as what the caller fsynced before."""
        self._map.flush()

    def zero(self) -> None:
        """Every word zero (the magic too: the caller sets it once the rest is reset) but the
        producer file's generation, which only ever grows: others may hold a map of it."""
        words = self.words
        generation = words[W_PRODUCERS_GENERATION]
        for word in range(STATE_WORDS):
            words[word] = 0
        words[W_PRODUCERS_GENERATION] = generation

    @contextmanager
    def locked(self):
        """The partition's exclusive lock (held by the open file: pinned among the open files
        until released)."""
        fd = self._lock_fd()
        self._files.pin(self)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._lock_depth += 1
            try:
                yield
            finally:
                self._lock_depth -= 1
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            self._files.unpin(self)

    @contextmanager
    def writer_waited(self):
        """Until the holder of the exclusive lock is done (a shared lock waits for it),
        unless this thread holds it."""
        if self._lock_depth:
            yield
            return
        fd = self._lock_fd()
        self._files.pin(self)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            self._files.unpin(self)

    def _lock_fd(self) -> int:
        if self._fd < 0:
            self._fd = self._files.open(self, self.path, os.O_RDWR)
        else:
            self._files.touch(self)
        return self._fd


def has_open_transaction(directory: str) -> bool:
    """Whether the partition in `directory` has a transaction open (W_ONGOING_FIRST), read
    without opening a handle on it: a sweep over every partition stays cheap."""
    try:
        fd = os.open(os.path.join(directory, STATE_FILE), os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        word = os.pread(fd, 8, 8 * W_ONGOING_FIRST)
    finally:
        os.close(fd)
    return len(word) == 8 and int.from_bytes(word, sys.byteorder, signed=True) != 0
