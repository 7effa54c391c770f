"""Legible refusals (beyond Kafka, which just closes): a connection refused for its IP's
connection limit has its first request read and, if it is ApiVersions (the first request of
every current client), answered with an error the client logs; the socket is then held,
unread, and closed `delay` later, so the client backs off instead of reconnecting at once.

Bounded everywhere: at most `max_pending` refused sockets are being read at once (past that
they are closed at once, as without this feature); a first request is read for at most
`read_timeout` and `MAX_FIRST_REQUEST_BYTES` (more, or anything else than ApiVersions, and the
socket is closed without an answer); the held sockets go to the acceptor's DelayedCloser,
which has its own bound.  Cost: about 35 us of the parent's loop per refused connection
against 18 us for a plain close (connclient storms: loadtest/bench/protections.py).

The error code is POLICY_VIOLATION (44): what the clients print for it names a broker policy
(kafka-python: PolicyViolationError, librdkafka: "Broker: Policy violation"), which is what a
per-IP limit is; an authorization error would make some clients give up for good.
"""

from __future__ import annotations

import asyncio
import os
import struct
import time
from typing import Callable

from broker.shared.apis import APIS
from broker.shared.protocol.context import RequestContext, error_code

MAX_FIRST_REQUEST_BYTES = 16384
API_VERSIONS = 18
HIGHEST_VERSION = next(api.versions[1] for api in APIS if api.key == API_VERSIONS)
REFUSAL_CODE = "policy_violation"
_PREFIX = struct.Struct(">ihhi")  # size, api key, version, correlation id


def _encoded_refusal() -> tuple[bytes, bytes]:
    """The answer's size prefix and body, encoded once (kio encodes in tens of us)."""
    ctx = RequestContext(b"\0\0\0\0", API_VERSIONS, 0, 0, None)
    own = {"api_key": API_VERSIONS, "min_version": 0, "max_version": HIGHEST_VERSION}
    frame = ctx.respond({"error_code": error_code(REFUSAL_CODE), "api_keys": [own]})
    return frame[:4], frame[8:]


_SIZE, _BODY = _encoded_refusal()


def api_versions_refusal(correlation: bytes) -> bytes:
    """An ApiVersions answer carrying the error, in v0's layout whatever the request's
    version: clients read an ApiVersions error that way (as KIP-511's answer to a version
    too new), and kafka-python cannot read a v3+ error answer at all."""
    return b"".join((_SIZE, correlation, _BODY))


class RefusalAnswers:
    """Reads, answers and holds the first request of refused connections (one listener).

    Raw descriptors, no socket objects and one sweep timer for all (a refusal storm is where
    this runs, so each refused connection should cost little of the parent's loop): a
    descriptor is only read when the loop says it is readable, and the one small answer goes
    into an empty send buffer."""

    def __init__(self, loop: asyncio.AbstractEventLoop, hold: Callable[[int, float], None],
                 delay: float, read_timeout: float = 1.0, max_pending: int = 1000):
        self.loop = loop
        self._hold = hold  # (fd, until): the DelayedCloser closes it then
        self.delay = delay
        self.read_timeout = read_timeout
        self.max_pending = max_pending
        self._reading: dict[int, tuple[bytearray, float]] = {}  # fd -> (bytes, deadline)
        self._sweep: asyncio.TimerHandle | None = None
        self.answered = 0

    def __len__(self) -> int:
        return len(self._reading)

    def start(self, fd: int) -> None:
        """A socket just refused: read its first request, if there is room for that."""
        if len(self._reading) >= self.max_pending:
            os.close(fd)
            return
        self._reading[fd] = (bytearray(), time.monotonic() + self.read_timeout)
        self.loop.add_reader(fd, self._readable, fd)
        if self._sweep is None:
            self._sweep = self.loop.call_later(self.read_timeout, self._give_up)

    def close_all(self) -> None:
        for fd in list(self._reading):
            self._close(fd)
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None

    def _readable(self, fd: int) -> None:
        data = self._reading[fd][0]
        try:
            chunk = os.read(fd, MAX_FIRST_REQUEST_BYTES + 4 - len(data))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._close(fd)
            return
        data += chunk
        if len(data) < _PREFIX.size:
            return
        size, api_key, _version, _correlation = _PREFIX.unpack_from(data)
        if api_key != API_VERSIONS or not 8 <= size <= MAX_FIRST_REQUEST_BYTES:
            self._close(fd)  # nothing a client would read as a refusal
            return
        if len(data) < 4 + size:
            return
        self._forget(fd)
        try:
            os.write(fd, api_versions_refusal(bytes(data[8:12])))
        except OSError:
            os.close(fd)
            return
        self.answered += 1
        self._hold(fd, time.monotonic() + self.delay)

    def _give_up(self) -> None:
        """Close the sockets whose first request did not come in time."""
        self._sweep = None
        now = time.monotonic()
        for fd in [fd for fd, (_data, deadline) in self._reading.items() if deadline <= now]:
            self._close(fd)
        if self._reading:
            self._sweep = self.loop.call_later(self.read_timeout / 2, self._give_up)

    def _close(self, fd: int) -> None:
        self._forget(fd)
        os.close(fd)

    def _forget(self, fd: int) -> None:
        del self._reading[fd]
        self.loop.remove_reader(fd)
