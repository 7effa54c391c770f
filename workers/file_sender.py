"""Sending one FileResponse to a plaintext socket, its file regions by `os.sendfile`.

The bytes of a zero-copy Fetch answer go from the page cache to the socket without entering
Python.  uvloop has no `loop.sendfile` and refuses `add_writer` on a descriptor a transport
owns, so the sender writes to a dup of the socket's descriptor and waits for writability on
that dup.  The dup also means a descriptor number the transport closes (and the kernel hands to
a new connection) is never written to.

Order with the transport's own writes: the sender starts only once the transport's write
buffer is empty (earlier answers sent), and the connection writes nothing while it sends: the
request stays in flight (RESPONSE_PENDING), like a long poll, until `future` is done.
Cancelling `future` (the connection went away) stops the sender and releases everything.
"""

from __future__ import annotations

import asyncio
import os

from workers.fetch_response import FileRegion, FileResponse


class SegmentGone(OSError):
    """A region's file ended before its bytes did (truncated under the answer): the frame
    cannot be completed, so the connection must close."""


class FileSender:
    """Sends `response` on the socket behind `transport`; `future` is done when all is sent."""

    def __init__(self, loop: asyncio.AbstractEventLoop, transport: asyncio.Transport,
                 socket_fd: int, response: FileResponse):
        self.future = loop.create_future()
        self.unsent = response.size  # bytes not yet taken by the socket
        self._loop = loop
        self._transport = transport
        self._response = response
        self._fd = os.dup(socket_fd)
        self._watching = False
        self._index = 0  # the piece being sent
        self._offset = 0  # bytes of it already sent
        self.future.add_done_callback(self._release)

    def start(self) -> None:
        self._step()

    def _step(self) -> None:
        if self.future.done():
            return
        if self._transport.get_write_buffer_size():  # earlier answers leave first
            self._watch()
            return
        try:
            self._send()
        except BlockingIOError:  # the socket's buffer is full: wait until it drains
            self._watch()
        except OSError as error:  # the client went away, or the segment shrank
            self.future.set_exception(error)
        else:
            self.future.set_result(None)

    def _send(self) -> None:
        """Send until everything is sent (returns) or the socket is full (raises)."""
        pieces, fd = self._response.pieces, self._fd
        while self._index < len(pieces):
            piece = pieces[self._index]
            if type(piece) is FileRegion:
                length = piece.length
                sent = os.sendfile(fd, piece.fd, piece.position + self._offset,
                                   length - self._offset)
                if sent == 0:
                    raise SegmentGone(f"segment ended {length - self._offset} bytes early")
            else:
                length = len(piece)
                sent = os.write(fd, memoryview(piece)[self._offset:])
            self._offset += sent
            self.unsent -= sent
            if self._offset == length:
                self._index += 1
                self._offset = 0

    def _watch(self) -> None:
        if not self._watching:
            self._watching = True
            self._loop.add_writer(self._fd, self._step)

    def _release(self, _future) -> None:
        if self._watching:
            self._loop.remove_writer(self._fd)
            self._watching = False
        os.close(self._fd)
        self._response.close()
