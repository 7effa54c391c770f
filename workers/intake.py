"""Sockets the parent hands to a worker, and the credits and closes it reports back (KIP-402).

The parent never hands more than `pybroker.handoff.queue.size` unregistered sockets to one
worker.  They queue here and at most `pybroker.registrations.per.turn` are registered per loop
turn, so a storm of new connections cannot starve the existing ones.  Each registration returns
its credit, and each closed connection its id, in `Progress` messages: at once when half a
turn's worth of credits is due, else batched within a millisecond.
A socket that never becomes a connection is counted closed and returns both at once.

Registering costs no socket object, no system call of ours and no Task: the listening socket's
options (SO_KEEPALIVE, SO_SNDBUF) were inherited at accept, uvloop takes the bare descriptor
(`Descriptor`), and `Registration` drives `connect_accepted_socket` itself instead of a Task
and its three scheduled steps.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket
import ssl
from typing import TYPE_CHECKING, Callable

from broker.shared import ipc

if TYPE_CHECKING:
    from workers.connection import Connection
    from workers.stats import WorkerStats

log = logging.getLogger("workers.intake")

ACK_DELAY = 0.001  # seconds a few credits or closes may wait to go back together

_PLAINTEXT_HINT = ("; the client spoke plaintext to a TLS listener (security.protocol=PLAINTEXT "
                   "against an SSL listener?)")


def _timed_out(error: BaseException | None) -> bool:
    # The loop aborts a handshake past ssl_handshake_timeout with ConnectionAbortedError
    # ("SSL handshake is taking longer than ..."); a TimeoutError would mean the same.
    return isinstance(error, (TimeoutError, asyncio.TimeoutError)) or (
        isinstance(error, ConnectionAbortedError) and "taking longer" in str(error))


def _handshake_failure(error: BaseException | None) -> str:
    return "tls_handshake_timeout" if _timed_out(error) else "tls_handshake_failed"


def _looks_like_plaintext(error: BaseException | None) -> bool:
    """A Kafka request where a ClientHello belongs: OpenSSL reads its first bytes as a TLS
    record header and finds no known version or content type."""
    text = str(error).upper()
    return isinstance(error, ssl.SSLError) and any(
        sign in text for sign in ("WRONG_VERSION_NUMBER", "UNKNOWN_PROTOCOL", "HTTP_REQUEST",
                                  "PACKET_LENGTH_TOO_LONG", "RECORD_LAYER_FAILURE"))


class Descriptor:
    """An accepted socket's descriptor in the shape `connect_accepted_socket` reads (type,
    family, fileno), without a socket object: building one asks the kernel for its address and
    its `type` and `family` properties build enums.  The transport owns the descriptor once
    registered; uvloop calls `close` after libuv closed it."""

    __slots__ = ("fd", "family")
    type = socket.SOCK_STREAM

    def __init__(self, fd: int, family: int):
        if fd < 0:
            raise ValueError(f"not a descriptor: {fd}")
        self.fd = fd
        self.family = family

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        """The transport closed the descriptor (uvloop's call): nothing is left to close."""
        self.fd = -1

    def close_unregistered(self) -> None:
        """Close the descriptor if no transport closed it (a registration that failed)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


class Registration:
    """`loop.connect_accepted_socket` driven to its end without a Task: the coroutine runs at
    once up to its wait for the connection (or the TLS handshake), and resumes when that wait
    is done; `failed(error)` hears of a registration that did not become a connection."""

    __slots__ = ("_coroutine", "_failed")

    def __init__(self, coroutine, failed: Callable[[BaseException | None], None]):
        self._coroutine = coroutine
        self._failed = failed
        self.step()

    def step(self, _done: asyncio.Future | None = None) -> None:
        try:
            waiting = self._coroutine.send(None)
        except StopIteration:
            return  # the transport and the connection are made
        except asyncio.CancelledError:
            self._failed(None)
            return
        except Exception as error:  # noqa: BLE001 - a socket the loop could not take
            self._failed(error)
            return
        waiting.add_done_callback(self.step)


def _describe(error: BaseException | None) -> str:
    if error is None:
        return "cancelled"
    if _timed_out(error):
        return "not finished in time"
    return str(error) or type(error).__name__


class Intake:
    """Queues handed-off sockets, registers a few per loop turn, batches what the parent hears."""

    def __init__(self, loop: asyncio.AbstractEventLoop, channel: ipc.Channel, stats: WorkerStats,
                 new_connection: Callable[..., Connection], families: list[int], per_turn: int,
                 tls: list[ssl.SSLContext | None] | None = None,
                 handshake_timeout: float = 10.0):
        if per_turn < 1:
            raise ValueError(f"at least one registration per turn, not {per_turn}")
        self._loop = loop
        self._channel = channel
        self._stats = stats
        # (conn id, listener, peer, fd=, tls=) -> its protocol
        self._new_connection = new_connection
        self._families = families  # by listener index
        self._per_turn = per_turn
        self._tls = tls or [None] * len(families)  # by listener index: SSL listeners' contexts
        self._handshake_timeout = handshake_timeout
        self._incoming: collections.deque[tuple[int, ipc.HandedOff]] = collections.deque()
        self._registering = False
        self._stopped = False
        self._credits_to_return = 0
        self._closed_ids: list[int] = []
        self._ack_scheduled = False
        self._ack_timer: asyncio.TimerHandle | None = None

    def accept(self, message: ipc.Handoff, fds: list[int]) -> None:
        """Queue the sockets of one Handoff message and register a turn's worth of them now,
        unless earlier ones still wait (the worker reads one channel message per loop turn)."""
        if len(fds) != len(message.conns):
            log.error("hand-off carried %d fds for %d connections", len(fds), len(message.conns))
        for fd, meta in zip(fds, message.conns):
            if self._stopped:
                os.close(fd)
                self._dropped(meta, "shutdown")
            else:
                self._incoming.append((fd, meta))
        for fd in fds[len(message.conns):]:
            os.close(fd)
        for meta in message.conns[len(fds):]:  # announced but no fd arrived: count it closed
            self._dropped(meta, "error")
        self._schedule_ack()
        if self._incoming and not self._registering:
            self._register_some()

    def use_tls(self, contexts: list[ssl.SSLContext | None]) -> None:
        """New server contexts (certificates re-read): for the handshakes that start now."""
        self._tls = contexts

    def stop(self) -> None:
        """Shutting down: close what waits for registration, and whatever comes later."""
        self._stopped = True
        for fd, meta in self._incoming:
            os.close(fd)
            self._dropped(meta, "shutdown")
        self._incoming.clear()
        self._schedule_ack()

    def closed(self, conn_id: int) -> None:
        """A connection closed: the parent frees its slot."""
        self._closed_ids.append(conn_id)
        self._schedule_ack()

    def _register_some(self) -> None:
        """Register at most `_per_turn` connections, then yield to existing connections."""
        for _ in range(min(self._per_turn, len(self._incoming))):
            fd, meta = self._incoming.popleft()
            self._register(fd, meta)
        self._registering = bool(self._incoming)
        if self._registering:  # the rest in the turns to come
            self._loop.call_soon(self._register_some)

    def _register(self, fd: int, meta: ipc.HandedOff) -> None:
        # SO_KEEPALIVE and SO_SNDBUF came from the listening socket; uvloop sets TCP_NODELAY.
        listener = meta.listener
        descriptor = Descriptor(fd, self._families[listener])
        context = self._tls[listener]
        connection = self._new_connection(meta.conn_id, listener, f"{meta.host}:{meta.port}",
                                          fd=fd, tls=context is not None)
        # Registered with the loop: the hand-off credit goes back now (KIP-402 bounds sockets
        # not yet registered), so slow TLS handshakes never hold the parent's acceptor.
        self._credits_to_return += 1
        self._schedule_ack()
        if context is None:
            registration = self._loop.connect_accepted_socket(lambda: connection, descriptor)
        else:  # the handshake runs on this loop; the connection exists once it is done
            registration = self._loop.connect_accepted_socket(
                lambda: connection, descriptor, ssl=context,
                ssl_handshake_timeout=self._handshake_timeout)
        Registration(registration, lambda error: self._registration_failed(error, meta,
                                                                           descriptor))

    def _registration_failed(self, error: BaseException | None, meta: ipc.HandedOff,
                             descriptor: Descriptor) -> None:
        reason = "error"
        if self._tls[meta.listener] is not None:
            reason = _handshake_failure(error)
            log.info("connection %s from %s:%s: TLS handshake failed (%s)%s", meta.conn_id,
                     meta.host, meta.port, _describe(error), _PLAINTEXT_HINT
                     if _looks_like_plaintext(error) else "")
        else:
            log.info("registering connection %s failed: %r", meta.conn_id, error)
        descriptor.close_unregistered()
        self._stats.closed(meta.listener, reason)
        self._closed_ids.append(meta.conn_id)
        self._schedule_ack()

    def _dropped(self, meta: ipc.HandedOff, reason: str) -> None:  # never registered
        """A handed-off socket that never became a connection: return its credit and slot."""
        self._stats.closed(meta.listener, reason)
        self._credits_to_return += 1
        self._closed_ids.append(meta.conn_id)

    def _schedule_ack(self) -> None:
        """Credits go back at once when many are due (the parent may be out of hand-off room);
        otherwise within ACK_DELAY, batched: one connection at a time then costs the parent a
        wake-up per few connections, not one each (4 of a worker's 29 us per connection, measured)."""
        if self._credits_to_return >= max(1, self._per_turn // 2):
            if self._ack_timer is not None:
                self._ack_timer.cancel()
                self._ack_timer = None
            if not self._ack_scheduled:
                self._ack_scheduled = True
                self._loop.call_soon(self._send_ack)
        elif self._ack_timer is None and not self._ack_scheduled:
            self._ack_timer = self._loop.call_later(ACK_DELAY, self._send_ack)

    def _send_ack(self) -> None:
        """One Progress message: credits and closed ids, batched."""
        self._ack_scheduled = False
        self._ack_timer = None
        if not self._credits_to_return and not self._closed_ids:
            return
        try:
            self._channel.send(ipc.Progress(registered=self._credits_to_return,
                                            closed=self._closed_ids))
        except OSError:
            pass  # the parent is gone; the worker's on_broken shuts it down
        self._credits_to_return = 0
        self._closed_ids = []
