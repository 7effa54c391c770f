"""An append-only file of JSON lines (msgspec structs), replayed at start-up: the durable form
of the parent's coordinators (committed offsets, transactions).

A change is one `write` of all its lines (O_APPEND) before it is acknowledged, so it survives
the death of any worker and `kill -9` of the broker; fsync after every write when asked
(`log.flush.interval.messages=1`), else at close.  Only a crash mid-write can leave a bad line,
and only as the last one: it is skipped on replay and cut off, so the next write does not glue
onto it.  The owner decides when the file holds too many superseded lines and rewrites it with
the live ones (temporary file, fsync, rename).  Only the parent writes these files.
"""

from __future__ import annotations

import logging
import os
from typing import Callable, Iterable, Iterator

import msgspec

log = logging.getLogger("broker.parent.record_file")


class RecordFile:
    def __init__(self, path: str, record_type: type, fsync_every_write: bool = False):
        self.path = path
        self.fsync = fsync_every_write
        self.lines = 0  # lines in the file, superseded ones included
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder(record_type)
        self._fd = -1

    def replay(self) -> Iterator:
        """Every readable record, oldest first; then the file is open for appending."""
        try:
            with open(self.path, "rb") as handle:
                for number, line in enumerate(handle, 1):
                    self.lines += 1
                    try:
                        yield self._decoder.decode(line)
                    except msgspec.DecodeError:
                        log.warning("%s:%d: unreadable record skipped", self.path, number)
        except FileNotFoundError:
            pass
        self._cut_torn_tail()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _cut_torn_tail(self) -> None:
        try:
            with open(self.path, "rb+") as handle:
                data = handle.read()
                if data and not data.endswith(b"\n"):
                    handle.truncate(data.rfind(b"\n") + 1)
        except FileNotFoundError:
            pass

    def append(self, records: list) -> int:
        """Persist `records`, returning the bytes written (raises OSError if the write
        fails: the caller applies nothing, and the file is cut back to where it was, so no
        torn line is left for the next write to be glued to)."""
        if not records:
            return 0
        data = memoryview(b"".join(self._encoder.encode(record) + b"\n" for record in records))
        written = len(data)
        start = os.fstat(self._fd).st_size
        try:
            while data:  # a full disk may take part of it without raising
                data = data[os.write(self._fd, data):]
            if self.fsync:
                os.fsync(self._fd)
        except OSError:
            os.ftruncate(self._fd, start)
            raise
        self.lines += len(records)
        return written

    def rewrite(self, records: Iterable) -> None:
        """Replace the file by `records` (the live state), atomically."""
        temporary = self.path + ".tmp"
        count = 0
        with open(temporary, "wb") as handle:
            for record in records:
                handle.write(self._encoder.encode(record) + b"\n")
                count += 1
            handle.flush()
            os.fsync(handle.fileno())
        fresh = os.open(temporary, os.O_WRONLY | os.O_APPEND)  # first: a failure changes nothing
        os.replace(temporary, self.path)
        os.close(self._fd)
        self._fd = fresh
        log.info("rewrote %s: %d lines -> %d", self.path, self.lines, count)
        self.lines = count

    def flush(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1


class LatestRecords:
    """A RecordFile of keyed records where the latest record of a key wins and a record that
    is not `alive` forgets its key: `saved` holds the live ones.  The file is rewritten with
    the live records once it is more than twice their size (and past `rewrite_min_bytes`), so
    it stays within about twice what it holds, each rewrite paid for by as many writes."""

    def __init__(self, path: str, record_type: type, key: Callable, alive: Callable,
                 fsync_every_write: bool = False, rewrite_min_bytes: int = 1 << 20):
        self.file = RecordFile(path, record_type, fsync_every_write)
        self.key = key
        self.alive = alive
        self.rewrite_min_bytes = rewrite_min_bytes
        self.saved: dict = {}
        self._sizes: dict = {}  # bytes of each live record
        self._live_bytes = 0  # their sum
        encoder = msgspec.json.Encoder()
        for record in self.file.replay():
            self._apply(record, len(encoder.encode(record)) + 1)
        self._file_bytes = os.path.getsize(path)

    @property
    def path(self) -> str:
        return self.file.path

    def _apply(self, record, size: int) -> None:
        key = self.key(record)
        self._live_bytes -= self._sizes.pop(key, 0)
        self.saved.pop(key, None)
        if self.alive(record):
            self.saved[key] = record
            self._sizes[key] = size
            self._live_bytes += size

    def write(self, record) -> None:
        """Persist `record` (raises OSError: then nothing changed)."""
        size = self.file.append([record])
        self._file_bytes += size
        self._apply(record, size)
        if self._file_bytes > max(self.rewrite_min_bytes, 2 * self._live_bytes):
            self._rewrite()

    def _rewrite(self) -> None:
        """The live records only; a failed rewrite leaves the file as it was."""
        try:
            self.file.rewrite(list(self.saved.values()))
        except OSError as error:
            log.error("rewriting %s failed: %s", self.file.path, error)
            return
        self._file_bytes = self._live_bytes

    def close(self) -> None:
        self.file.close()
