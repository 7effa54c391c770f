"""What a handler answers, and what the router makes of it for the connection.

A handler returns the framed answer as bytes when it costs nothing beyond its handling time
(most requests), None when no answer is due, an asyncio Future of either when the answer has
to wait (a long poll, a request walked in slices), or an `Answer` when it also carries a cost:
bytes charged to a byte-rate quota, time spent in another process, or an encoding that
depends on the throttle.

The router (workers.router) alone turns what handlers return into what a connection sends:
bytes, None, a FileResponse (file regions), a `Throttled` answer, or a Future of one of these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


class Answer:
    """An answer and what it costs the client (KIP-219 throttling is the router's).

    `payload`: the framed answer with throttle_time_ms 0 (bytes or a FileResponse), or None.
    `quota`, `amount`: the byte-rate quota to charge (broker.shared.client_quotas PRODUCE or
    FETCH) and how much; a charge of 0 still asks what the client owes.
    `busy`: seconds the answer took elsewhere (the parent), charged to request_percentage.
    `owed`: seconds of throttle the client already owed when the handler looked (a fetch
    answered empty for it): the answer is throttled at least that long.
    `encode`: the answer with a given throttle in milliseconds, for answers whose
    throttle_time_ms the router cannot write in place (Produce keeps it after its topics).
    A throttle the handler wrote itself (KIP-599's retry-after of CreateTopics) stays when it
    is the longer one."""

    __slots__ = ("payload", "quota", "amount", "busy", "owed", "encode")

    def __init__(self, payload, quota: int | None = None, amount: int = 0, busy: float = 0.0,
                 owed: float = 0.0, encode: Callable[[int], object] | None = None):
        if amount < 0 or busy < 0 or owed < 0:
            raise ValueError(f"an answer costs nothing negative: amount {amount}, busy {busy}, "
                             f"owed {owed}")
        self.payload = payload
        self.quota = quota
        self.amount = amount
        self.busy = busy
        self.owed = owed
        self.encode = encode


@dataclass(frozen=True)
class Throttled:
    """An answer (or None for acks=0) that earned a throttle of `ms` milliseconds."""

    frame: bytes | None
    ms: int
    delay: bool  # an old version: the broker delays the answer itself


class ForwardRequest:
    """A request the parent serves, as a router without a way to the parent answers it (a
    router used in-process, by tests and fuzz targets)."""

    __slots__ = ("frame",)

    def __init__(self, frame):
        self.frame = bytes(frame)
