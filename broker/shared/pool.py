"""KIP-72's request memory pool, shared by every worker process through the shared block.

`queued.max.request.bytes` is split into a shared part and optional per-listener reservations
(`pybroker.queued.max.request.bytes.reserved`, e.g. `INTERNAL:8388608`).  A request's memory is
taken once its 4-byte size is known and before its body is read:

  * from its listener's reservation if the whole size fits there (strict);
  * else from the shared part as long as any is left (non-strict, as Kafka: the shared part may
    go negative by less than one request, so the bytes held never exceed
    `queued.max.request.bytes + socket.request.max.bytes`);
  * else the request queues: a FIFO ring per listener of (ticket, worker slot, size).  While
    anyone queues, newcomers queue behind them (no barging): the longest waiter, large or
    small, is served first, so nobody starves.  A ring holds `pybroker.pool.max.waiters`
    requests; one that finds its listener's ring full is refused (its connection is closed,
    reason `pool_queue_full`): more waiters than that means more connections than memory by
    far.

Releasing memory grants it to the queue heads in order (reservations first, then the shared
part to the oldest ticket) and wakes only the workers whose requests were granted, through
their wake sockets (abstract Unix datagram sockets): no polling, no thundering herd.  Workers
also look at their grants once a second, so a lost wake-up delays a grant, never loses it.

**Crash safety.**  The pool's state (available bytes, tickets, ring heads and tails, each
worker's leases and grants) lives in two copies in the shared block, and a word says which is
current.  A change happens under `pool_lock` (a POSIX record lock the kernel drops if its holder
dies): copy the current copy to the other, change the other, then make it current with one
aligned 8-byte store.  A process killed anywhere before that store changed nothing; after it,
everything.  Ring entries are written beyond the tail before the tail moves, so they never need
undoing.  The parent returns a dead worker's leases and drops its queued requests.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time

from shm.block import SharedBlock, pool_state_words

TICKET, SLOT, SIZE = range(3)
# Scalar fields of a pool state copy, then per-listener and per-(slot, listener) fields.
SHARED, TICKETS, WAITING, SINCE, DEPLETED = range(5)
_SCALARS = 5


class QueueFull(Exception):
    """pybroker.pool.max.waiters requests already wait for memory on this listener."""


def wake_address(block: SharedBlock, slot: int) -> bytes:
    """The abstract socket name a worker listens on for grants."""
    return b"\0" + os.path.basename(block.path).encode() + b"-pool-%d" % slot


def initialise_pool(block: SharedBlock, limit: int, reserved: dict[int, int]) -> None:
    """Parent, once: fill the pool."""
    pool = SharedPool(block, -1, limit, reserved)
    with pool._changing():
        pool._set(SHARED, limit - sum(reserved.values()))
        for listener, size in reserved.items():
            pool._set(pool._reserved(listener), size)
    pool.close()


class SharedPool:
    """One process's handle on the pool; `slot` is the worker's slot (the parent may pass -1)."""

    def __init__(self, block: SharedBlock, slot: int, limit: int, reserved: dict[int, int]):
        self.block = block
        self.slot = slot
        self.limit = limit
        self.reserved = reserved  # listener index -> reserved bytes
        self.words = block.words
        self._listeners = block.listeners
        self._copy_words = pool_state_words(block.slots, block.listeners)
        self._current = block.parent_cell("pool_current")
        self._copies = block.parent_cell("pool_state", 0, 0)
        self._base = self._current_base()  # where fields are read (the change's copy inside)
        self._waker = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._waker.setblocking(False)

    def close(self) -> None:
        self._waker.close()

    # --- the state and its changes ----------------------------------------------------------

    def _current_base(self) -> int:
        return self._copies + self.words[self._current] * self._copy_words

    @contextlib.contextmanager
    def _changing(self):
        """Under the lock, on a fresh copy of the state, made current only at the end."""
        words = self.words
        with self.block.pool_lock():
            current = words[self._current]
            source = self._copies + current * self._copy_words
            target = self._copies + (1 - current) * self._copy_words
            words[target:target + self._copy_words] = words[source:source + self._copy_words]
            self._base = target
            try:
                yield
            except BaseException:
                self._base = source  # nothing is committed
                raise
            words[self._current] = 1 - current  # the commit: one aligned store
            self._base = target

    def _get(self, field: int) -> int:
        return self.words[self._base + field]

    def _set(self, field: int, value: int) -> None:
        self.words[self._base + field] = value

    def _add(self, field: int, change: int) -> None:
        self.words[self._base + field] += change

    def _reserved(self, listener: int) -> int:
        return _SCALARS + listener

    def _head(self, listener: int) -> int:
        return _SCALARS + self._listeners + listener

    def _tail(self, listener: int) -> int:
        return _SCALARS + 2 * self._listeners + listener

    def _lease(self, slot: int, listener: int) -> int:
        return _SCALARS + 3 * self._listeners + slot * self._listeners + listener

    def _grant_count(self, slot: int, listener: int) -> int:
        return self._lease(self.block.slots + slot, listener)

    # --- allocating -----------------------------------------------------------------------

    def try_allocate(self, size: int, listener: int) -> bool:
        """Take `size` bytes for a request on `listener`, or queue it (False).  Raises
        QueueFull when the listener's queue is full (pybroker.pool.max.waiters)."""
        with self._changing():
            if self._take(size, listener, queued=self._get(WAITING) > 0):
                self._add(self._lease(self.slot, listener), size)
                return True
            self._enqueue(size, listener)
            return False

    def _take(self, size: int, listener: int, queued: bool) -> bool:
        if listener in self.reserved and self._get(self._reserved(listener)) >= size:
            self._add(self._reserved(listener), -size)
            return True
        if not queued and self._get(SHARED) > 0:
            self._add(SHARED, -size)
            return True
        return False

    def _enqueue(self, size: int, listener: int) -> None:
        words, block = self.words, self.block
        head, tail = self._get(self._head(listener)), self._get(self._tail(listener))
        if tail - head >= self.block.pool_ring:
            raise QueueFull(f"{self.block.pool_ring} requests already wait for memory "
                            f"(pybroker.pool.max.waiters)")
        entry = block.parent_cell("pool_ring", listener, tail % self.block.pool_ring, 0)
        self._add(TICKETS, 1)
        words[entry + TICKET] = self._get(TICKETS)  # beyond the tail: invisible until commit
        words[entry + SLOT] = self.slot
        words[entry + SIZE] = size
        self._set(self._tail(listener), tail + 1)
        if self._get(WAITING) == 0:
            self._set(SINCE, time.monotonic_ns())
        self._add(WAITING, 1)

    # --- releasing ------------------------------------------------------------------------

    def release(self, size: int, listener: int) -> None:
        """Give back a request's bytes; grant them to waiters and wake their workers."""
        with self._changing():
            self._add(self._lease(self.slot, listener), -size)
            self._refill(size, listener)
            woken = self._grant()
        self._wake(woken)

    def _refill(self, size: int, listener: int) -> None:
        if listener in self.reserved:
            cell = self._reserved(listener)
            back = min(size, self.reserved[listener] - self._get(cell))
            self._add(cell, back)
            size -= back
        self._add(SHARED, size)

    def _grant(self) -> set[int]:
        """Serve queue heads while memory allows; return the worker slots to wake."""
        woken: set[int] = set()
        while True:
            served = self._grant_reserved(woken)
            oldest = self._oldest_head()
            if oldest is not None and self._get(SHARED) > 0:
                listener, entry = oldest
                self._add(SHARED, -self.words[entry + SIZE])
                self._pop(listener, entry, woken)
                served = True
            if not served:
                return woken

    def _grant_reserved(self, woken: set[int]) -> bool:
        served = False
        for listener in self.reserved:
            cell = self._reserved(listener)
            while True:
                entry = self._queue_head(listener)
                if entry is None or self.words[entry + SIZE] > self._get(cell):
                    break
                self._add(cell, -self.words[entry + SIZE])
                self._pop(listener, entry, woken)
                served = True
        return served

    def _queue_head(self, listener: int) -> int | None:
        head = self._get(self._head(listener))
        if head == self._get(self._tail(listener)):
            return None
        return self.block.parent_cell("pool_ring", listener, head % self.block.pool_ring, 0)

    def _oldest_head(self) -> tuple[int, int] | None:
        best = None
        for listener in range(self._listeners):
            entry = self._queue_head(listener)
            if entry is not None and (best is None or self.words[entry] < self.words[best[1]]):
                best = (listener, entry)
        return best

    def _pop(self, listener: int, entry: int, woken: set[int]) -> None:
        slot, size = self.words[entry + SLOT], self.words[entry + SIZE]
        self._add(self._head(listener), 1)
        self._add(self._lease(slot, listener), size)
        self._add(self._grant_count(slot, listener), 1)
        self._one_less_waiting()
        woken.add(slot)

    def _one_less_waiting(self) -> None:
        self._add(WAITING, -1)
        if self._get(WAITING) == 0:
            self._add(DEPLETED, time.monotonic_ns() - self._get(SINCE))
            self._set(SINCE, 0)

    def _wake(self, slots: set[int]) -> None:
        for slot in slots:
            if slot == self.slot:
                continue  # the caller handles its own grants after release()
            try:
                self._waker.sendto(b"\0", wake_address(self.block, slot))
            except OSError:
                pass  # not listening (restarting) or already has a wake-up pending

    # --- reading (the current copy, no lock) ---------------------------------------------

    def _read(self, field: int) -> int:
        return self.words[self._current_base() + field]

    def grants(self, listener: int) -> int:
        return self._read(self._grant_count(self.slot, listener))

    def waiting(self) -> int:
        return self._read(WAITING)

    def leased(self, slot: int, listener: int) -> int:
        return self._read(self._lease(slot, listener))

    def used(self) -> int:
        """Bytes held now, by every worker (the pool may be over by less than one request)."""
        base = self._current_base()
        reserved = sum(self.words[base + self._reserved(listener)] for listener in self.reserved)
        return self.limit - self.words[base + SHARED] - reserved

    def depleted_ns(self) -> int:
        """Total time some request waited for memory, including a wait in progress."""
        total, since = self._read(DEPLETED), self._read(SINCE)
        return total + (time.monotonic_ns() - since if since else 0)

    # --- the parent, after a worker died --------------------------------------------------

    def reclaim(self, slot: int) -> int:
        """Return a dead worker's leases, drop its queued requests; return the bytes freed."""
        freed = 0
        with self._changing():
            for listener in range(self._listeners):
                self._drop_queued(listener, slot)
                leased = self._get(self._lease(slot, listener))
                if leased:
                    freed += leased
                    self._refill(leased, listener)
                    self._set(self._lease(slot, listener), 0)
                self._set(self._grant_count(slot, listener), 0)
            woken = self._grant()
        self._wake(woken)
        return freed

    def _drop_queued(self, listener: int, slot: int) -> None:
        """Rewrite the ring without the dead worker's entries (the parent alone does this; if
        it died, the whole broker did)."""
        block, words = self.block, self.words
        head, tail = self._get(self._head(listener)), self._get(self._tail(listener))
        kept = []
        for position in range(head, tail):
            entry = block.parent_cell("pool_ring", listener, position % self.block.pool_ring, 0)
            item = (words[entry + TICKET], words[entry + SLOT], words[entry + SIZE])
            if item[1] == slot:
                self._one_less_waiting()
            else:
                kept.append(item)
        for offset, item in enumerate(kept):
            entry = block.parent_cell("pool_ring", listener, (head + offset) % self.block.pool_ring, 0)
            words[entry + TICKET], words[entry + SLOT], words[entry + SIZE] = item
        self._set(self._tail(listener), head + len(kept))
