"""One acceptor per listener, on the parent's event loop.

When its listening socket is readable, the acceptor accepts up to the free hand-off capacity
(and at most ACCEPT_BATCH) sockets with the raw `_accept`, counts them in the shared block, and
gives them to the Dispatcher.  When no worker can take a socket, it stops watching the
listening socket (the kernel backlog holds new connections) and records how long it stays
blocked: that time is KIP-402's AcceptorBlockedPercent, exported as
`broker_acceptor_blocked_seconds_total`.  Each acceptor blocks and resumes on its own, so one
listener's condition never stalls another's loop callback.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import time

from broker.config import Listener
from broker.handoff import Dispatcher
from shm.block import SharedBlock

log = logging.getLogger("broker.acceptor")

ACCEPT_BATCH = 64
_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
FD_EXHAUSTION_PAUSE = 0.1


def bind_listener(listener: Listener, backlog: int, receive_buffer: int) -> socket.socket:
    """Bind and listen; port 0 picks an ephemeral port (read it back from getsockname)."""
    family = listener.family()
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if receive_buffer > 0:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.bind((listener.host or ("::" if family == socket.AF_INET6 else "0.0.0.0"),
                   listener.port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class Acceptor:
    """Accepts on one listening socket and hands the sockets to workers."""

    def __init__(self, loop: asyncio.AbstractEventLoop, index: int, listener: Listener,
                 sock: socket.socket, dispatcher: Dispatcher, block: SharedBlock):
        self.loop = loop
        self.index = index
        self.listener = listener
        self.sock = sock
        self.dispatcher = dispatcher
        self.block = block
        self._accepted_cell = block.parent_cell("connections_accepted", index)
        self._blocked_cell = block.parent_cell("acceptor_blocked_ns", index)
        self._watching = False
        self._blocked_since = 0  # monotonic ns, 0 when not blocked
        self._closed = False

    def start(self) -> None:
        self._watch()

    def close(self) -> None:
        """Stop accepting for good and close the listening socket."""
        self._closed = True
        self._unwatch()
        self._end_block()
        self.sock.close()

    def blocked_ns(self) -> int:
        """Total time blocked so far, including a block in progress."""
        total = self.block.words[self._blocked_cell]
        if self._blocked_since:
            total += time.monotonic_ns() - self._blocked_since
        return total

    # --- watching -------------------------------------------------------------------------

    def _watch(self) -> None:
        if not self._watching and not self._closed:
            self.loop.add_reader(self.sock.fileno(), self._on_readable)
            self._watching = True

    def _unwatch(self) -> None:
        if self._watching:
            self.loop.remove_reader(self.sock.fileno())
            self._watching = False

    def _begin_block(self) -> None:
        self._unwatch()
        if not self._blocked_since:
            self._blocked_since = time.monotonic_ns()
        self.dispatcher.on_capacity(self._resume)

    def _end_block(self) -> None:
        if self._blocked_since:
            self.block.words[self._blocked_cell] += time.monotonic_ns() - self._blocked_since
            self._blocked_since = 0

    def _resume(self) -> None:
        self._end_block()
        self._watch()

    # --- accepting ------------------------------------------------------------------------

    def _on_readable(self) -> None:
        room = min(self.dispatcher.free_capacity(), ACCEPT_BATCH)
        if room == 0:
            self._begin_block()
            return
        accepted = []
        accept = self.sock._accept  # returns (fd, address) without building a socket object
        while len(accepted) < room:
            try:
                accepted.append(accept())
            except (BlockingIOError, InterruptedError):
                break
            except OSError as error:
                self._accept_failed(error)
                break
        if accepted:
            self.block.words[self._accepted_cell] += len(accepted)
            self.dispatcher.dispatch(self.index, accepted)
        if len(accepted) == room and self.dispatcher.free_capacity() == 0:
            self._begin_block()

    def _accept_failed(self, error: OSError) -> None:
        if error.errno in _OUT_OF_FDS:
            # Out of descriptors: pause instead of spinning on a readable socket.
            log.error("listener %s: accept failed (%s); pausing %.1fs", self.listener.name,
                      os.strerror(error.errno), FD_EXHAUSTION_PAUSE)
            self._unwatch()
            self.loop.call_later(FD_EXHAUSTION_PAUSE, self._watch)
        elif error.errno not in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
            log.warning("listener %s: accept failed: %s", self.listener.name, error)
