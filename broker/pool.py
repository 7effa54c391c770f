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
    small, is served first, so nobody starves.

Releasing memory grants it to the queue heads in order (reservations first, then the shared
part to the oldest ticket) and wakes only the workers whose requests were granted, through
their wake sockets (abstract Unix datagram sockets): no polling, no thundering herd.

All state lives in cells of the shared block and is read and written under `pool_lock`
(a POSIX record lock the kernel releases if its holder dies).  The parent returns a dead
worker's leases and drops its queued requests.
"""

from __future__ import annotations

import os
import socket
import time

from shm.block import POOL_RING, SharedBlock

TICKET, SLOT, SIZE = range(3)


def wake_address(block: SharedBlock, slot: int) -> bytes:
    """The abstract socket name a worker listens on for grants."""
    return b"\0" + os.path.basename(block.path).encode() + b"-pool-%d" % slot


def initialise_pool(block: SharedBlock, limit: int, reserved: dict[int, int]) -> None:
    """Parent, once: fill the pool."""
    words = block.words
    words[block.parent_cell("pool_shared_available")] = limit - sum(reserved.values())
    for listener, size in reserved.items():
        words[block.parent_cell("pool_reserved_available", listener)] = size


class SharedPool:
    """One process's handle on the pool; `slot` is the worker's slot (the parent may pass -1)."""

    def __init__(self, block: SharedBlock, slot: int, limit: int, reserved: dict[int, int]):
        self.block = block
        self.slot = slot
        self.limit = limit
        self.reserved = reserved  # listener index -> reserved bytes
        self.words = block.words
        self._shared = block.parent_cell("pool_shared_available")
        self._waiting = block.parent_cell("pool_waiting")
        self._ticket = block.parent_cell("pool_ticket")
        self._since = block.parent_cell("pool_depleted_since_ns")
        self._depleted = block.parent_cell("pool_depleted_ns")
        self._waker = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._waker.setblocking(False)

    def close(self) -> None:
        self._waker.close()

    # --- allocating -----------------------------------------------------------------------

    def try_allocate(self, size: int, listener: int) -> bool:
        """Take `size` bytes for a request on `listener`, or queue it (False)."""
        with self.block.pool_lock():
            if self._take(size, listener, queued=self.words[self._waiting] > 0):
                self._lease(self.slot, listener, size)
                return True
            self._enqueue(size, listener)
            return False

    def _take(self, size: int, listener: int, queued: bool) -> bool:
        words = self.words
        if listener in self.reserved:
            cell = self.block.parent_cell("pool_reserved_available", listener)
            if words[cell] >= size:
                words[cell] -= size
                return True
        if not queued and words[self._shared] > 0:
            words[self._shared] -= size
            return True
        return False

    def _lease(self, slot: int, listener: int, size: int) -> None:
        self.words[self.block.worker_cell(slot, "pool_leased", listener)] += size

    def _enqueue(self, size: int, listener: int) -> None:
        words, block = self.words, self.block
        head = words[block.parent_cell("pool_ring_head", listener)]
        tail_cell = block.parent_cell("pool_ring_tail", listener)
        tail = words[tail_cell]
        if tail - head >= POOL_RING:
            raise RuntimeError("memory pool queue is full")  # more waiters than connections
        entry = block.parent_cell("pool_ring", listener, tail % POOL_RING, 0)
        words[self._ticket] += 1
        words[entry + TICKET] = words[self._ticket]
        words[entry + SLOT] = self.slot
        words[entry + SIZE] = size
        words[tail_cell] = tail + 1
        if words[self._waiting] == 0:
            words[self._since] = time.monotonic_ns()
        words[self._waiting] += 1

    # --- releasing ------------------------------------------------------------------------

    def release(self, size: int, listener: int) -> None:
        """Give back a request's bytes; grant them to waiters and wake their workers."""
        with self.block.pool_lock():
            self._lease(self.slot, listener, -size)
            self._refill(size, listener)
            woken = self._grant()
        self._wake(woken)

    def _refill(self, size: int, listener: int) -> None:
        words = self.words
        if listener in self.reserved:
            cell = self.block.parent_cell("pool_reserved_available", listener)
            back = min(size, self.reserved[listener] - words[cell])
            words[cell] += back
            size -= back
        words[self._shared] += size

    def _grant(self) -> set[int]:
        """Serve queue heads while memory allows; return the worker slots to wake."""
        woken: set[int] = set()
        while True:
            served = self._grant_reserved(woken)
            oldest = self._oldest_head()
            if oldest is not None and self.words[self._shared] > 0:
                listener, entry = oldest
                self.words[self._shared] -= self.words[entry + SIZE]
                self._pop(listener, entry, woken)
                served = True
            if not served:
                return woken

    def _grant_reserved(self, woken: set[int]) -> bool:
        served = False
        for listener in self.reserved:
            cell = self.block.parent_cell("pool_reserved_available", listener)
            while True:
                entry = self._head(listener)
                if entry is None or self.words[entry + SIZE] > self.words[cell]:
                    break
                self.words[cell] -= self.words[entry + SIZE]
                self._pop(listener, entry, woken)
                served = True
        return served

    def _head(self, listener: int) -> int | None:
        block = self.block
        head = self.words[block.parent_cell("pool_ring_head", listener)]
        if head == self.words[block.parent_cell("pool_ring_tail", listener)]:
            return None
        return block.parent_cell("pool_ring", listener, head % POOL_RING, 0)

    def _oldest_head(self) -> tuple[int, int] | None:
        best = None
        for listener in range(self.block.listeners):
            entry = self._head(listener)
            if entry is not None and (best is None or self.words[entry] < self.words[best[1]]):
                best = (listener, entry)
        return best

    def _pop(self, listener: int, entry: int, woken: set[int]) -> None:
        words, block = self.words, self.block
        slot, size = words[entry + SLOT], words[entry + SIZE]
        words[block.parent_cell("pool_ring_head", listener)] += 1
        self._lease(slot, listener, size)
        words[block.worker_cell(slot, "pool_grants", listener)] += 1
        self._one_less_waiting()
        woken.add(slot)

    def _one_less_waiting(self) -> None:
        words = self.words
        words[self._waiting] -= 1
        if words[self._waiting] == 0:
            words[self._depleted] += time.monotonic_ns() - words[self._since]
            words[self._since] = 0

    def _wake(self, slots: set[int]) -> None:
        for slot in slots:
            if slot == self.slot:
                continue  # the caller handles its own grants after release()
            try:
                self._waker.sendto(b"\0", wake_address(self.block, slot))
            except OSError:
                pass  # not listening (restarting) or already has a wake-up pending

    # --- reading --------------------------------------------------------------------------

    def grants(self, listener: int) -> int:
        return self.words[self.block.worker_cell(self.slot, "pool_grants", listener)]

    def used(self) -> int:
        """Bytes held now, by every worker (the pool may be over by less than one request)."""
        reserved = sum(self.words[self.block.parent_cell("pool_reserved_available", l)]
                       for l in self.reserved)
        return self.limit - self.words[self._shared] - reserved

    def depleted_ns(self) -> int:
        """Total time some request waited for memory, including a wait in progress."""
        total = self.words[self._depleted]
        since = self.words[self._since]
        return total + (time.monotonic_ns() - since if since else 0)

    # --- the parent, after a worker died --------------------------------------------------

    def reclaim(self, slot: int) -> int:
        """Return a dead worker's leases, drop its queued requests; return the bytes freed."""
        block, words = self.block, self.words
        freed = 0
        with block.pool_lock():
            for listener in range(block.listeners):
                self._drop_queued(listener, slot)
                cell = block.worker_cell(slot, "pool_leased", listener)
                if words[cell]:
                    freed += words[cell]
                    self._refill(words[cell], listener)
                    words[cell] = 0
                words[block.worker_cell(slot, "pool_grants", listener)] = 0
            woken = self._grant()
        self._wake(woken)
        return freed

    def _drop_queued(self, listener: int, slot: int) -> None:
        block, words = self.block, self.words
        head_cell = block.parent_cell("pool_ring_head", listener)
        tail_cell = block.parent_cell("pool_ring_tail", listener)
        kept = []
        for position in range(words[head_cell], words[tail_cell]):
            entry = block.parent_cell("pool_ring", listener, position % POOL_RING, 0)
            item = (words[entry + TICKET], words[entry + SLOT], words[entry + SIZE])
            if item[1] == slot:
                self._one_less_waiting()
            else:
                kept.append(item)
        head = words[head_cell]
        for offset, item in enumerate(kept):
            entry = block.parent_cell("pool_ring", listener, (head + offset) % POOL_RING, 0)
            words[entry + TICKET], words[entry + SLOT], words[entry + SIZE] = item
        words[tail_cell] = head + len(kept)
