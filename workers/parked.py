"""A request read whose answer is not ready yet: the per-request state a connection keeps
while it waits (a long poll, a request the parent serves, a request walked in slices, a file
answer being sent, an old client's throttle held back by the broker).

The connection (workers.connection) stays muted until `future` is done, then sends what it
resolved to; only `queued` requests (waiting for the parent) count against
queued.max.requests.
"""

from __future__ import annotations

import asyncio

from workers.file_sender import FileSender


class ParkedRequest:
    __slots__ = ("future", "api_key", "received_at", "queued", "sender")

    def __init__(self, future: asyncio.Future, api_key: int, received_at: float, queued: bool,
                 sender: FileSender | None = None):
        self.future = future
        self.api_key = api_key
        self.received_at = received_at  # monotonic: when its read arrived
        self.queued = queued
        self.sender = sender  # the zero-copy answer being sent, if that is the wait

    @property
    def unsent(self) -> int:
        """Bytes of a file answer the client has not taken yet."""
        return self.sender.unsent if self.sender is not None else 0
