"""Why a worker stops reading requests it has room for: the two waits of a connection.

RequestQueue   `queued.max.requests`, this worker's share: requests read whose answer waits
               for the parent.  At capacity, connections stop reading and wait here, in order.
MemoryWaiters  the worker's half of KIP-72 (broker.shared.pool is the shared half): a
               connection that read a size the pool could not give yet waits here, per
               listener, in the order it asked, until the pool grants this worker the bytes.

Neither ever blocks the loop: a full queue or an empty pool only pauses the connections that
hit it.  Connections reach both through their host (workers.connection.ConnectionHost).
"""

from __future__ import annotations

import asyncio
import collections
import socket
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from broker.shared.pool import SharedPool
    from workers.worker_events import WorkerEvents
    from workers.stats import WorkerStats


class QueueWaiter(Protocol):
    """A connection waiting for room in the request queue (workers.connection.Connection)."""

    def queue_resumed(self) -> None: ...


class MemoryWaiter(Protocol):
    """A connection waiting for pool memory (workers.pooled_connection.PooledConnection)."""

    closing: bool
    listener_index: int
    memory_wait: int  # the bytes it waits for

    def memory_granted(self) -> None: ...


class RequestQueue:
    """Parked requests of one worker, and the ones that count against `queued.max.requests`.

    As in Kafka, only requests waiting for the parent to serve them are queued (forwarded
    config, quota and group requests); long polls, rebalance waits and delayed throttles wait
    in a purgatory and never stop this worker from reading other clients' requests.
    """

    def __init__(self, capacity: int, stats: WorkerStats):
        if capacity < 1:
            raise ValueError(f"a request queue holds at least one request, not {capacity}")
        self.capacity = capacity
        self.queued = 0
        # Read by connections once per request, so kept as an attribute (no call); it only
        # changes when a request parks or is answered.
        self.full = False
        self._waiters: collections.deque[QueueWaiter] = collections.deque()
        self._stats = stats

    def wait(self, conn: QueueWaiter) -> None:
        """`conn` found the queue full and stopped reading: resume it when there is room."""
        self._waiters.append(conn)
        self._stats.muted("queue", +1)

    def parked(self, queued: bool) -> None:
        """A request whose answer waits; `queued` if it counts against queued.max.requests."""
        self._stats.muted("in_flight", +1)
        if queued:
            self._count(+1)

    def done(self, queued: bool) -> None:
        """A parked request was answered (or its connection went away)."""
        self._stats.muted("in_flight", -1)
        if not queued:
            return
        self._count(-1)
        # A resumed connection may park a request of its own and fill the queue again.
        while self._waiters and not self.full:
            conn = self._waiters.popleft()
            self._stats.muted("queue", -1)
            conn.queue_resumed()

    def _count(self, change: int) -> None:
        self.queued += change
        self.full = self.queued >= self.capacity
        self._stats.queued_requests(self.queued)


class MemoryWaiters:
    """Connections of this worker waiting for pool memory, resumed in grant order.

    The pool grants bytes to queued requests in its own FIFO order (across workers) and counts
    the grants per worker and listener; this worker hands each new grant to its longest waiter
    on that listener.  Grants are taken when the pool wakes this worker (a datagram), after
    each of our releases (which may grant our own waiters), and by the once-a-second tick, so
    a wake-up lost with its sender delays a grant, never loses it.
    """

    def __init__(self, pool: SharedPool, listeners: int, stats: WorkerStats,
                 events: WorkerEvents | None):
        if listeners < 1:
            raise ValueError(f"memory waiters need at least one listener, not {listeners}")
        # Bound once: connections call it for every request they read.
        self.try_allocate = pool.try_allocate
        self._pool = pool
        self._waiters: list[collections.deque[MemoryWaiter]] = [
            collections.deque() for _ in range(listeners)]
        self._grants_seen = [0] * listeners
        self._stats = stats
        self._events = events
        self._wake_socket: socket.socket | None = None

    def listen(self, loop: asyncio.AbstractEventLoop, address: bytes) -> None:
        """Take grants whenever the pool wakes this worker: a datagram to `address`."""
        wake = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        wake.bind(address)
        wake.setblocking(False)
        loop.add_reader(wake.fileno(), self._on_wake, wake)
        self._wake_socket = wake  # open as long as the worker runs

    def wait(self, conn: MemoryWaiter) -> None:
        """`conn` read a size the pool could not give yet: it waits in grant order."""
        self._waiters[conn.listener_index].append(conn)
        self._stats.muted("memory", +1)
        if self._events is not None:
            self._events.memory_muted(+1)
        self.take_grants()  # a grant may have landed between the refusal and now

    def release(self, size: int, listener: int) -> None:
        self._pool.release(size, listener)
        self.take_grants()  # the release may have granted our own waiters

    def _on_wake(self, wake: socket.socket) -> None:
        try:
            while wake.recv(64):
                pass
        except BlockingIOError:
            pass
        self.take_grants()

    def take_grants(self) -> None:
        """Hand granted memory to our waiting connections, in the order they queued."""
        for listener, waiters in enumerate(self._waiters):
            granted = self._pool.grants(listener)
            while self._grants_seen[listener] < granted and waiters:
                self._grants_seen[listener] += 1
                conn = waiters.popleft()
                self._stats.muted("memory", -1)
                if self._events is not None:
                    self._events.memory_muted(-1)
                if conn.closing:  # it went away while queued: the bytes go straight back
                    self._pool.release(conn.memory_wait, listener)
                    conn.memory_wait = 0
                else:
                    conn.memory_granted()
