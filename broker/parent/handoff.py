"""The bounded hand-off of accepted sockets from the parent's acceptors to worker processes.

Each worker may hold at most `pybroker.handoff.queue.size` sockets that were sent to it and
not yet registered (KIP-402's per-processor queue).  `Dispatcher.dispatch` spreads a batch of
accepted sockets round-robin, skipping full or dead workers, and sends each worker its share
in one SCM_RIGHTS message.  A worker returns credit with `Progress` messages; when every
worker is full, acceptors pause until credit comes back (see broker.parent.acceptor).
"""

from __future__ import annotations

import logging
import os
from typing import Callable

from broker.parent.worker_process import WorkerProcess
from broker.shared import ipc

log = logging.getLogger("broker.parent.handoff")


class Dispatcher:
    """Round-robin over the workers with free hand-off capacity."""

    def __init__(self, workers: list[WorkerProcess], capacity: int,
                 on_lost: Callable[[int, list[int]], None], on_capacity: Callable[[], None]):
        self.workers = workers
        self._on_lost = on_lost  # (listener, conn ids) of sockets that never reached a worker
        self._on_capacity = on_capacity
        self.capacity = capacity
        self._next = 0

    def free_capacity(self) -> int:
        capacity, free = self.capacity, 0
        for worker in self.workers:  # a loop, not sum(generator): asked twice per wake-up
            if worker.accepts(capacity):
                free += capacity - worker.outstanding
        return free

    def dispatch(self, listener: int, accepted: list[tuple[int, tuple, int]]) -> None:
        """Send (fd, peer address, conn id) to workers and close the parent's copies.

        The acceptor never accepts more than `free_capacity()`, so every socket finds a
        worker; should one not, it is closed and reported through `on_lost`.
        """
        batches: dict[WorkerProcess, tuple[list, list]] = {}
        leftover = []
        count = len(self.workers)
        for fd, address, conn_id in accepted:
            for _ in range(count):
                worker = self.workers[self._next % count]
                self._next += 1
                if worker.accepts(self.capacity):
                    worker.outstanding += 1
                    conns, fds = batches.setdefault(worker, ([], []))
                    conns.append(ipc.HandedOff(conn_id, listener, address[0], address[1]))
                    fds.append(fd)
                    break
            else:
                leftover.append((fd, conn_id))
        for worker, (conns, fds) in batches.items():
            self._send(worker, listener, conns, fds)
        if leftover:
            for fd, _ in leftover:
                os.close(fd)
            self._on_lost(listener, [conn_id for _, conn_id in leftover])

    def _send(self, worker: WorkerProcess, listener: int, conns: list, fds: list[int]) -> None:
        """The channel takes the fds: it closes the parent's copies once they are sent."""
        sent = 0
        try:
            for start in range(0, len(fds), ipc.MAX_FDS_PER_MESSAGE):
                chunk = slice(start, start + ipc.MAX_FDS_PER_MESSAGE)
                worker.channel.send(ipc.Handoff(conns[chunk]), fds[chunk])
                worker.conn_ids.update(conn.conn_id for conn in conns[chunk])
                sent += len(fds[chunk])
        except OSError as error:
            # The worker's channel is gone; the sockets not sent are closed here and counted
            # as closed, since the acceptor already counted them as accepted.
            log.warning("hand-off of %d sockets to %s failed: %s", len(fds) - sent, worker.name,
                        error)
            for fd in fds[sent + ipc.MAX_FDS_PER_MESSAGE:]:  # the failed chunk's went with
                os.close(fd)  # the channel, which closes what it was given
            worker.outstanding -= len(fds) - sent
            self._on_lost(listener, [conn.conn_id for conn in conns[sent:]])
        finally:
            worker.handed[listener] += sent

    # --- credit ---------------------------------------------------------------------------

    def credit(self, worker: WorkerProcess, count: int) -> None:
        worker.outstanding = max(0, worker.outstanding - count)
        if count:
            self._on_capacity()
