"""Frames too large for the worker's scratch buffer, read into a buffer of their own.

A connection reads into the worker's shared scratch buffer, except the rest of a frame over
its host's `large_frame_bytes` that did not arrive whole: that is read straight into a buffer
of its own (`frame_buffer`), whose memory follows what arrives, never the size a client
claims.  Every size is checked against `socket.request.max.bytes` (or, before a SASL client
authenticated, `sasl.server.max.receive.size`) before anything is allocated.

`LargeFrames` is the part of workers.connection.Connection that does this; the connection
serves the frame (`_serve`) once it is whole.
"""

from __future__ import annotations

import logging
import mmap

from workers.frame_maps import FrameMaps, new_mapping
from workers.router import InvalidRequest

log = logging.getLogger("workers.framing")

# Frames up to this size get a plain buffer of their size; larger ones an anonymous mapping.
MAPPED_FRAME_BYTES = 256 * 1024


def frame_buffer(size: int, arrived: int, maps: FrameMaps | None = None):
    """A writable buffer for a frame of `size` bytes (its first `size` bytes are the frame's),
    read into as its bytes arrive; memory follows what arrived (`arrived` so far), never the
    size a client claims.

    Above MAPPED_FRAME_BYTES it is an anonymous mapping (from `maps`, which keeps served ones
    for reuse, or a new one): the kernel gives it pages only as bytes land in them, and
    nothing is zero-filled or copied to grow it (a doubling bytearray cost a fifth of a
    worker's produce CPU, by py-spy).  Below, a bytearray that starts at what arrived
    and doubles (LargeFrames._grow_frame_buffer): a mapping per small frame would cost more
    than the copies."""
    if size > MAPPED_FRAME_BYTES:
        try:
            return maps.take(size) if maps is not None else new_mapping(size)
        except OSError as error:  # e.g. vm.max_map_count reached: the doubling buffer will do
            log.warning("no mapping for a %d-byte frame (%s): reading it into a growing buffer",
                        size, error)
    return bytearray(min(size, arrived))


# A TLS record header read as a Kafka size: 0x16 (handshake), 0x03 (major version) - the
# "size = 369295616" every Kafka operator meets once.  A TLS listener never reads one here.
_TLS_HANDSHAKE_RECORD = 0x1603


class LargeFrames:
    """The large-frame receive buffer of a connection (a mixin of Connection: its host,
    `_max_bytes`, `last_active` and `_serve` are the connection's)."""

    __slots__ = ("_large", "_large_view", "_large_got", "_large_size")

    _large: bytearray | mmap.mmap | None
    _large_view: memoryview | None
    _large_got: int
    _large_size: int

    def _start_large_frame(self, data: bytes, body_start: int, size: int) -> None:
        """Receive the rest of a big frame straight into a buffer of its own (frame_buffer)."""
        got = len(data) - body_start
        self._large = frame_buffer(size, max(got, self._large_bytes), self.host.frame_maps)
        self._large_view = memoryview(self._large)[:size]
        self._large_view[:got] = data[body_start:]
        self._large_got, self._large_size = got, size
        self._partial_since = self.last_active

    def _finish_large_frame(self) -> None:
        """The big frame is complete: serve it as the next request in order (nothing was read
        after it: its buffer took every byte until it was whole)."""
        request = self._large_view.toreadonly()
        buffer = self._large
        self._large = self._large_view = None
        self._large_got = self._large_size = 0
        try:
            self._serve(b"", request)
        finally:
            del request
            if type(buffer) is mmap.mmap and self.host.frame_maps is not None:
                self.host.frame_maps.give_back(buffer)  # reused once no view of it is left

    def _into_frame_buffer(self, nbytes: int) -> bool:
        """Bytes read into a frame's own buffer (False if none): serve the frame once whole."""
        if self._large_view is None:
            return False
        self._large_got += nbytes
        if self._large_got == self._large_size:
            self._finish_large_frame()
        return True

    def _grow_frame_buffer(self) -> None:
        """A small frame's buffer is full but the frame is not: double it (at most to the
        frame's size).  A mapped one is never full before its frame is whole."""
        grown = bytearray(min(2 * len(self._large), self._large_size))
        grown[:self._large_got] = self._large_view[:self._large_got]
        self._large_view.release()
        self._large, self._large_view = grown, memoryview(grown)

    def _check_size(self, size: int) -> None:
        if size < 0:
            raise InvalidRequest("size_negative", f"negative frame size {size}")
        if size > self._max_bytes:
            hint = ""
            if size >> 16 == _TLS_HANDSHAKE_RECORD:  # 0x16 0x03: bytes of a TLS ClientHello
                hint = "; this is a TLS handshake: the client speaks SSL to a plaintext listener"
            limit = "socket.request.max.bytes" if self._max_bytes == self.host.max_request_bytes \
                else "sasl.server.max.receive.size (not authenticated yet)"
            raise InvalidRequest("size_too_large", f"frame size {size} larger than {limit} "
                                                   f"{self._max_bytes}{hint}")
