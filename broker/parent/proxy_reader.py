"""The acceptor's wait for PROXY headers: sockets of a listener behind a load balancer, held in
the parent until their header is whole, then admitted with the client's address.

Reading the header here, before admission, is what lets per-IP limits and rates, the hand-off
(the worker's idea of the peer), ACLs, the event log and the report see the client instead of
the balancer.  A socket is closed, and counted by its acceptor, when its peer is not a trusted
proxy (at once, nothing read: `proxy_untrusted`), when what it sends is not a header
(`proxy_invalid`), or when the header is not whole within the timeout (`proxy_timeout`).

Only header bytes are ever taken from a socket: what is available is peeked, and only the
bytes known to belong to the header (all of them while it is incomplete, exactly its length
once it is whole) are consumed; the client's Kafka bytes stay in the socket for the worker.
Consuming what was peeked also keeps a level-triggered reader from firing again on the same
bytes.  The sockets waiting here count against their listener's room (see the acceptor).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass, field
from typing import Callable

from broker.parent.proxy_header import ProxyHeaderError, TrustedProxies, parse

log = logging.getLogger("broker.parent.proxy_reader")

MAX_HEADER_BYTES = 4096  # a v2 header with TLVs (ALPN, authority, TLS details) fits in this


@dataclass
class _Waiting:
    sock: socket.socket
    peer: tuple
    timer: asyncio.TimerHandle
    taken: bytes = field(default=b"")  # header bytes consumed so far


class ProxyReader:
    """Reads the PROXY headers of one listener's new sockets."""

    def __init__(self, loop: asyncio.AbstractEventLoop, trusted: TrustedProxies,
                 timeout: float, on_header: Callable[[int, tuple], None],
                 on_refused: Callable[[str, str], None], on_gone: Callable[[], None]):
        self.loop = loop
        self.trusted = trusted
        self.timeout = timeout
        self._on_header = on_header  # (fd, client address): admit it
        self._on_refused = on_refused  # (reason, peer ip): count it
        self._on_gone = on_gone  # a peer left before its header: its room is free
        self._waiting: dict[int, _Waiting] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    def start(self, fd: int, peer: tuple) -> None:
        """A socket just accepted: wait for its header (or refuse its peer at once)."""
        sock = socket.socket(fileno=fd)
        if not self.trusted.trusts(peer[0]):
            sock.close()
            self._on_refused("proxy_untrusted", peer[0])
            return
        sock.setblocking(False)
        timer = self.loop.call_later(self.timeout, self._expired, fd)
        self._waiting[fd] = _Waiting(sock, peer, timer)
        self.loop.add_reader(fd, self._readable, fd)

    def close_all(self) -> None:
        for fd in list(self._waiting):
            self._forget(fd).close()

    def _readable(self, fd: int) -> None:
        waiting = self._waiting.get(fd)
        if waiting is None:
            return
        try:
            data = waiting.sock.recv(MAX_HEADER_BYTES - len(waiting.taken), socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the peer went away before its header was whole: nothing to count
            self._forget(fd).close()
            self._on_gone()
            return
        whole = waiting.taken + data
        try:
            header = parse(whole, MAX_HEADER_BYTES)
        except ProxyHeaderError as error:
            log.info("connection from %s:%d: %s; closing", waiting.peer[0], waiting.peer[1],
                     error)
            self._refuse(fd, "proxy_invalid")
            return
        if header is None:  # all of it is header so far: take it, wait for the rest
            waiting.taken += waiting.sock.recv(len(data))
            return
        waiting.sock.recv(header.length - len(waiting.taken))  # peeked: there in full
        sock = self._forget(fd)
        sock.detach()
        self._on_header(fd, header.client or waiting.peer)

    def _expired(self, fd: int) -> None:
        if fd in self._waiting:
            self._refuse(fd, "proxy_timeout")

    def _refuse(self, fd: int, reason: str) -> None:
        peer = self._waiting[fd].peer
        self._forget(fd).close()
        self._on_refused(reason, peer[0])

    def _forget(self, fd: int) -> socket.socket:
        waiting = self._waiting.pop(fd)
        waiting.timer.cancel()
        self.loop.remove_reader(fd)
        return waiting.sock
