"""The bounded hand-off of accepted sockets from the parent's acceptors to worker processes.

Each worker may hold at most `pybroker.handoff.queue.size` sockets that were sent to it and
not yet registered (KIP-402's per-processor queue).  `Dispatcher.dispatch` spreads a batch of
accepted sockets round-robin, skipping full or dead workers, and sends each worker its share
in one SCM_RIGHTS message.  A worker returns credit with `Registered` messages; when every
worker is full, acceptors pause until credit comes back (see broker.acceptor).
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Callable

from broker import ipc

log = logging.getLogger("broker.handoff")


@dataclass(eq=False)
class WorkerHandle:
    """The parent's view of one worker process."""

    slot: int
    name: str
    pid: int = 0
    pidfd: int = -1
    channel: socket.socket | None = None
    ready: bool = False
    outstanding: int = 0  # sockets sent and not yet acknowledged as registered
    handed: list[int] = field(default_factory=list)  # sockets sent, per listener index
    started_at: float = 0.0
    abort_sent_at: float = 0.0

    def accepts(self, capacity: int) -> bool:
        return self.ready and self.channel is not None and self.outstanding < capacity


class Dispatcher:
    """Round-robin over the workers with free hand-off capacity."""

    def __init__(self, workers: list[WorkerHandle], capacity: int,
                 next_conn_id: Callable[[], int], on_lost: Callable[[int, int], None]):
        self.workers = workers
        self._on_lost = on_lost
        self.capacity = capacity
        self._next = 0
        self._next_conn_id = next_conn_id
        self._waiters: list[Callable[[], None]] = []

    def free_capacity(self) -> int:
        return sum(self.capacity - worker.outstanding
                   for worker in self.workers if worker.accepts(self.capacity))

    def dispatch(self, listener: int, accepted: list[tuple[int, tuple]]) -> None:
        """Send (fd, peer address) pairs to workers and close the parent's copies.

        The acceptor never accepts more than `free_capacity()`, so every socket finds a
        worker; should one not, it is closed and reported through `on_lost`.
        """
        batches: dict[WorkerHandle, tuple[list, list]] = {}
        leftover = []
        count = len(self.workers)
        for fd, address in accepted:
            for _ in range(count):
                worker = self.workers[self._next % count]
                self._next += 1
                if worker.accepts(self.capacity):
                    worker.outstanding += 1
                    conns, fds = batches.setdefault(worker, ([], []))
                    conns.append((self._next_conn_id(), listener, address[0], address[1]))
                    fds.append(fd)
                    break
            else:
                leftover.append(fd)
        for worker, (conns, fds) in batches.items():
            self._send(worker, listener, conns, fds)
        if leftover:
            for fd in leftover:
                os.close(fd)
            self._on_lost(listener, len(leftover))

    def _send(self, worker: WorkerHandle, listener: int, conns: list, fds: list[int]) -> None:
        sent = 0
        try:
            for start in range(0, len(fds), ipc.MAX_FDS_PER_MESSAGE):
                chunk = slice(start, start + ipc.MAX_FDS_PER_MESSAGE)
                ipc.send_handoff(worker.channel, conns[chunk], fds[chunk])
                sent += len(fds[chunk])
        except OSError as error:
            # The worker's socket is gone or full; the sockets not sent are closed here and
            # counted as closed, since the acceptor already counted them as accepted.
            log.warning("hand-off of %d sockets to %s failed: %s", len(fds) - sent, worker.name,
                        error)
            worker.outstanding -= len(fds) - sent
            self._on_lost(listener, len(fds) - sent)
        finally:
            worker.handed[listener] += sent
            for fd in fds:
                os.close(fd)

    # --- credit ---------------------------------------------------------------------------

    def credit(self, worker: WorkerHandle, count: int) -> None:
        worker.outstanding = max(0, worker.outstanding - count)
        self.wake()

    def on_capacity(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the next time capacity may have come back."""
        self._waiters.append(callback)

    def wake(self) -> None:
        if not self._waiters or self.free_capacity() == 0:
            return
        waiters, self._waiters = self._waiters, []
        for callback in waiters:
            callback()
