"""A worker's side of the event log: per-second request aggregates, closes, throttles, mutes.

Requests are far too many to log one by one, so each read's requests are added to a table
keyed by (listener, API, client id) - count, bytes, latency sum and a latency sketch - that
`tick` writes out as `requests` events (broker/shared/events.py).  The hot path is a few integer
operations: a connection keeps a reference to its current entry.  The worker calls `tick` on
every wall-clock second (broker.shared.events.SecondTicker), so a table holds the requests
answered in the second that just ended.  A read of pipelined requests counts each API with its
number of requests, the read's latency for all of them, and the bytes read and written since
the connection's previous read split by count.  A connection's client id is the one of its
first request (Kafka clients keep theirs for the life of a connection).  The table holds at
most MAX_KEYS entries a second; the rest are added under the client id "<other>".
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from broker.shared import events
from broker.shared.events import EventLog
from workers.counts import AGGREGATE_SKETCH, aggregate, new_aggregate

if TYPE_CHECKING:
    from array import array

MAX_KEYS = 2000
OTHER = "<other>"


class WorkerEvents:
    def __init__(self, log: EventLog, listeners: list[str], planes: list[str],
                 api_names: dict[int, str], slow_ms: int):
        self.log = log
        self.listeners = listeners  # names by listener index
        self.planes = planes  # "data" or "control" by listener index
        self.api_names = api_names
        self.slow_us = slow_ms * 1000
        self._table: dict[tuple, list] = {}
        self._muted = 0
        self._unmuted = 0

    # --- hot path: once per read of requests ----------------------------------------------

    def requests(self, conn, api_keys: list[int], elapsed_ns: int, parked: bool = False) -> None:
        """A read's requests, answered `elapsed_ns` after they arrived, with the bytes the
        connection moved since its last read.  A parked request (a long-poll Fetch, a
        JoinGroup) waited on purpose: never a slow_request."""
        us = elapsed_ns // 1000
        bytes_in, bytes_out = conn.bytes_in, conn.bytes_out
        moved_in, moved_out = bytes_in - conn.bytes_in_logged, bytes_out - conn.bytes_out_logged
        conn.bytes_in_logged, conn.bytes_out_logged = bytes_in, bytes_out
        count, api_key = len(api_keys), api_keys[0]
        # A read usually holds one request, or one API many times (a pipeline): its entry is
        # the connection's of this second, the additions are in C (workers.counts).
        if count == 1 or api_keys.count(api_key) == count:
            cached = conn.aggregate
            if cached is not None and cached[1] == api_key and cached[0] is self._table:
                aggregate(cached[2], count, moved_in, moved_out, us)
            else:
                aggregate(self._entry(conn, api_key), count, moved_in, moved_out, us)
        else:
            for api_key in set(api_keys):
                share = api_keys.count(api_key)
                aggregate(self._entry(conn, api_key), share, moved_in * share // count,
                          moved_out * share // count, us)
        if us >= self.slow_us and not parked:
            self._slow(conn, api_keys[-1], us, moved_in)

    def _entry(self, conn, api_key: int) -> array:
        """The table entry of the connection's (API, client) this second."""
        key = (conn.listener_index, api_key, conn.client_id)
        entry = self._table.get(key)
        if entry is None:
            if len(self._table) >= MAX_KEYS:
                key = (key[0], key[1], OTHER)
                entry = self._table.get(key)
            if entry is None:
                entry = self._table[key] = new_aggregate()
        conn.aggregate = (self._table, api_key, entry)
        return entry

    def _slow(self, conn, api_key: int, us: int, bytes_in: int) -> None:
        listener = conn.listener_index
        self.log.emit(events.SlowRequest(
            listener=self.listeners[listener], plane=self.planes[listener],
            api=self.api_names.get(api_key, str(api_key)), client_id=conn.client_id,
            peer=conn.peer, latency_ms=us / 1000, bytes_in=bytes_in))

    # --- other events ---------------------------------------------------------------------

    def connection_closed(self, conn, reason: str, lifetime_s: float) -> None:
        self.log.emit(events.ConnectionClosed(
            listener=self.listeners[conn.listener_index], ip=conn.peer.rpartition(":")[0],
            conn_id=conn.conn_id, reason=reason, client_id=conn.client_id,
            principal=conn.principal, lifetime_ms=int(lifetime_s * 1000), bytes_in=conn.bytes_in, bytes_out=conn.bytes_out))

    def authentication_failed(self, conn, mechanism: str, user: str | None) -> None:
        self.log.emit(events.AuthenticationFailed(
            listener=self.listeners[conn.listener_index], ip=conn.peer.rpartition(":")[0],
            mechanism=mechanism, user=user))

    def throttled(self, quota: str, client_id: str | None, seconds: float,
                  user: str = "ANONYMOUS", dry_run: bool = False) -> None:
        self.log.emit(events.Throttle(client_id=client_id, user=user, quota=quota,
                                      throttle_ms=int(seconds * 1000), dry_run=dry_run))

    def memory_muted(self, change: int) -> None:
        if change > 0:
            self._muted += change
        else:
            self._unmuted -= change

    # --- once a second --------------------------------------------------------------------

    def flush_requests(self, second: int) -> None:
        for (listener, api_key, client_id), entry in self._table.items():
            self.log.emit(events.Requests(
                ts=second * 1000, second=second, listener=self.listeners[listener],
                plane=self.planes[listener], api=self.api_names.get(api_key, str(api_key)),
                client_id=client_id, count=entry[0], bytes_in=entry[1], bytes_out=entry[2],
                latency_us_sum=entry[3],
                latency={bucket: n for bucket, n in enumerate(entry[AGGREGATE_SKETCH:]) if n}))
        self._table = {}

    def tick(self, second: int) -> None:
        """Write the requests answered during `second` (epoch seconds) and the mutes."""
        self.flush_requests(second)
        if self._muted or self._unmuted:
            self.log.emit(events.MemoryMutes(ts=second * 1000, muted=self._muted,
                                             unmuted=self._unmuted))
            self._muted = self._unmuted = 0
        self.log.flush()

    def close(self) -> None:
        self.tick(int(time.time()))
        self.log.close()
