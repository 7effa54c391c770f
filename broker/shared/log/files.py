"""The log files one thread of a process holds open: a bounded, least-recently-used set.

Descriptors are a resource of the process, shared with its connections, and partitions can
outnumber them: every segment, state and index file kept open for ever would make the count
grow with the partitions until an `open` (of a log file, of `.topics.lock`, of an accepted
socket) fails.  So every descriptor of the log store is opened through an `OpenFiles`, which
holds at most `capacity` of them: opening one more first closes those of the owner used least
recently.  An owner (a segment's file set, a partition's state file, an aborted-transaction
index) reopens what it lost at its next use, so eviction costs a reopen, never an error.

Rules that make that safe:
- An `OpenFiles` belongs to one thread (each of the parent's threads has a registry of its
  own; a worker has one): nothing here locks.
- A descriptor is used at once, never kept across another `open` of the same `OpenFiles`
  (the open may evict it); what must outlive that (an answer sent later from the file) takes a
  `dup` of its own, outside the budget.
- An owner holding a lock on its descriptor (`flock` is tied to the open file, closing it
  drops the lock) is pinned while it holds it; pinned owners are never evicted.

When the process itself is out of descriptors (EMFILE, ENFILE: its connections took them),
half of the unpinned owners are closed and the open tried once more; if it still fails,
`OutOfDescriptors` is raised: callers answer a retriable error (KAFKA_STORAGE_ERROR) and never
mark a partition offline for it.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import time
from collections import OrderedDict

log = logging.getLogger("broker.shared.log")

MIN_CAPACITY = 8  # a partition's state, a segment's three files, an index, and room to move
SHARE_OF_LIMIT = 4  # by default log files take a quarter of the process's open-files limit
_LOG_EVERY_S = 10.0  # at most one "out of descriptors" line per this many seconds
_EXHAUSTED = (errno.EMFILE, errno.ENFILE)


class OutOfDescriptors(OSError):
    """The process has no descriptor left for a log file, even after closing idle ones (or
    no mapping left for a partition's state: vm.max_map_count); retriable."""


def default_capacity(limit: int | None = None) -> int:
    """A quarter of the process's open-files limit (the rest is for connections, the
    answers being sent from files, and the process's own needs), at least MIN_CAPACITY."""
    if limit is None:
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if limit == resource.RLIM_INFINITY:
            limit = 1 << 20
    return max(MIN_CAPACITY, limit // SHARE_OF_LIMIT)


class OpenFiles:
    """At most `capacity` open log descriptors, grouped by owner, least recently used first.

    An owner is any object with a `files_evicted()` method, which forgets the descriptors
    (they are closed here) and whatever it derived from them."""

    def __init__(self, capacity: int):
        if capacity < MIN_CAPACITY:
            raise ValueError(f"OpenFiles needs a capacity of at least {MIN_CAPACITY}, "
                             f"got {capacity}")
        self.capacity = capacity
        self._owners: OrderedDict[int, tuple[object, list[int]]] = OrderedDict()
        self._pinned: dict[int, int] = {}  # id(owner) -> pins
        self.held = 0
        self.opened = 0  # running totals, for the metrics
        self.evicted = 0
        self.failures = 0
        self._logged_at = 0.0

    # --- what owners call --------------------------------------------------------------

    def open(self, owner, path: str, flags: int, mode: int = 0o644) -> int:
        """Open `path` for `owner`, closing least recently used owners first if full."""
        key = id(owner)
        self._make_room(key, 1)
        try:
            fd = os.open(path, flags, mode)
        except OSError as error:
            if error.errno not in _EXHAUSTED:
                raise
            fd = self._open_after_shedding(key, path, flags, mode, error)
        entry = self._owners.get(key)
        if entry is None:
            self._owners[key] = (owner, [fd])
        else:
            entry[1].append(fd)
            self._owners.move_to_end(key)
        self.held += 1
        self.opened += 1
        return fd

    def touch(self, owner) -> None:
        """`owner` is in use: it is the last to be evicted."""
        key = id(owner)
        if key in self._owners:
            self._owners.move_to_end(key)

    def close(self, owner) -> None:
        """Close every descriptor `owner` holds (it goes away, or its files were replaced)."""
        entry = self._owners.pop(id(owner), None)
        if entry is not None:
            self._close_fds(entry[1])

    def pin(self, owner) -> None:
        key = id(owner)
        self._pinned[key] = self._pinned.get(key, 0) + 1

    def unpin(self, owner) -> None:
        key = id(owner)
        left = self._pinned.get(key, 0) - 1
        if left > 0:
            self._pinned[key] = left
        else:
            self._pinned.pop(key, None)

    def close_all(self) -> None:
        for owner, fds in list(self._owners.values()):
            self._close_fds(fds)
            owner.files_evicted()
        self._owners.clear()

    # --- eviction ----------------------------------------------------------------------

    def _make_room(self, opener: int, wanted: int) -> None:
        if self.held + wanted <= self.capacity:
            return
        for key in list(self._owners):
            if self.held + wanted <= self.capacity:
                return
            if key != opener and key not in self._pinned:
                self._evict(key)

    def _evict(self, key: int) -> None:
        owner, fds = self._owners.pop(key)
        self._close_fds(fds)
        self.evicted += 1
        owner.files_evicted()

    def _open_after_shedding(self, opener: int, path: str, flags: int, mode: int,
                             error: OSError) -> int:
        """The process is out of descriptors: close half of the idle owners, try once more."""
        idle = [key for key in self._owners if key != opener and key not in self._pinned]
        for key in idle[:max(1, len(idle) // 2)]:
            self._evict(key)
        try:
            return os.open(path, flags, mode)
        except OSError as again:
            if again.errno not in _EXHAUSTED:
                raise
            self.failures += 1
            now = time.monotonic()
            if now - self._logged_at >= _LOG_EVERY_S:
                self._logged_at = now
                log.error("out of descriptors opening %s (%s; %d log files open here): "
                          "answered as a storage error until connections free some",
                          path, os.strerror(again.errno), self.held)
            raise OutOfDescriptors(again.errno, f"out of descriptors: {error.strerror}",
                                   path) from None

    def _close_fds(self, fds: list[int]) -> None:
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.held -= len(fds)


def is_exhaustion(error: BaseException) -> bool:
    """Whether an error means the process ran out of a resource (descriptors, mappings),
    not that the files are bad: a retriable error, never a reason to mark data offline."""
    return isinstance(error, OSError) and error.errno in (errno.EMFILE, errno.ENFILE,
                                                            errno.ENOMEM)
