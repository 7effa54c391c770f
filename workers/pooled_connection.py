"""A client connection when the memory pool is on (KIP-72): one frame at a time, each frame's
bytes taken from the shared pool before its body is read."""

from __future__ import annotations

import logging
import struct
import time

from broker.shared.pool import QueueFull
from workers.connection import Connection, ConnectionHost
from workers.framing import frame_buffer
from workers.router import InvalidRequest

log = logging.getLogger("workers.pooled_connection")

_SIZE = struct.Struct(">i")


class PooledConnection(Connection):
    """A channel when the memory pool is on (KIP-72): one frame at a time, as Kafka reads.

    It reads the 4-byte size alone, takes that many bytes from the shared pool (broker.shared.pool),
    then reads the body into a buffer of exactly that size.  With no memory it stops reading
    (memory-muted) until the pool grants the bytes; memory recovery never touches the mute
    state machine, which alone decides about in-flight and throttled channels.  The bytes go
    back to the pool as soon as the request was handled (after the append, for Produce), or
    when the connection ends mid-request.
    """

    __slots__ = ("_memory", "_size", "_size_view", "_size_got", "memory_wait", "_leased",
                 "_queued_size")

    def __init__(self, host: ConnectionHost, conn_id: int, listener_index: int, peer: str,
                 fd: int = -1, tls: bool = False):
        super().__init__(host, conn_id, listener_index, peer, fd, tls)
        memory = host.memory
        assert memory is not None, "a pooled connection needs the pool's waiters"
        self._memory = memory
        self._size = bytearray(4)
        self._size_view = memoryview(self._size)
        self._size_got = 0
        self.memory_wait = 0  # bytes waited for from the pool, 0 when not waiting
        self._leased = 0  # bytes held from the pool for the frame being read or served
        self._queued_size = 0  # a size read while queued.max.requests was full

    def get_buffer(self, sizehint: int):
        if self._large_view is not None:
            return self._large_view[self._large_got:]
        return self._size_view[self._size_got:]

    def buffer_updated(self, nbytes: int) -> None:
        self.last_active = time.monotonic()
        self.bytes_in += nbytes
        if self._into_frame_buffer(nbytes):
            return
        if not self._size_got:
            self._partial_since = self.last_active
        self._size_got += nbytes
        if self._size_got < 4:
            return
        self._size_got = 0
        size = _SIZE.unpack(self._size)[0]
        try:
            if size < 8:  # nothing fits a request header: refused before any allocation
                raise InvalidRequest("size_negative" if size < 0 else "frame_too_small",
                                     f"frame size {size}")
            self._check_size(size)
        except InvalidRequest as invalid:
            self._reject(invalid)
            return
        if self._queue.full:  # queued.max.requests first: no memory for a queued one
            self._queued_size = size
            self._queue_wait = True
            self._queue.wait(self)
            self._update_reading()
            return
        self._want_memory(size)

    def queue_resumed(self) -> None:
        self._queue_wait = False
        size, self._queued_size = self._queued_size, 0
        if not self.closing and size:
            self._want_memory(size)

    def _want_memory(self, size: int) -> None:
        try:
            granted = self._memory.try_allocate(size, self.listener_index)
        except QueueFull as error:  # the documented bound of waiters: a clear refusal
            log.warning("connection %s from %s: %s on its listener; closing", self.conn_id,
                        self.peer, error)
            self.close("pool_queue_full")
            return
        if granted:
            self._leased = size
            self._begin_body(size)
            self._update_reading()
        else:
            self.memory_wait = size
            self._memory.wait(self)
            self._update_reading()

    def memory_granted(self) -> None:
        """The pool reserved our bytes (called by the host's memory waiters, in grant order)."""
        size, self.memory_wait = self.memory_wait, 0
        self._leased = size
        self._begin_body(size)
        self._update_reading()

    def _begin_body(self, size: int) -> None:
        self._large = frame_buffer(size, size, self.host.frame_maps)  # the pool granted them
        self._large_view = memoryview(self._large)[:size]
        self._large_got, self._large_size = 0, size
        self._partial_since = time.monotonic()  # the receive deadline runs from the grant

    def _finish_large_frame(self) -> None:
        try:
            super()._finish_large_frame()
        finally:
            self._give_back()  # handled (or refused): the frame buffer is no longer needed

    def _give_back(self) -> None:
        if self._leased:
            leased, self._leased = self._leased, 0
            self._memory.release(leased, self.listener_index)

    def connection_lost(self, exc) -> None:
        super().connection_lost(exc)
        self._give_back()  # a disconnect mid-request

    def _update_reading(self) -> None:
        if self.memory_wait and self._reading and self.transport is not None:
            self._reading = False
            self.transport.pause_reading()
            return
        if not self.memory_wait:
            super()._update_reading()

    def waiting_for(self) -> list[str]:
        return super().waiting_for() + (["memory"] if self.memory_wait else [])  # KIP-72

    def is_idle(self) -> bool:
        return (super().is_idle() and not self.memory_wait and self._size_got == 0
                and not self._queued_size)

    def _partial(self) -> bool:
        return self._size_got > 0 or self._large is not None
