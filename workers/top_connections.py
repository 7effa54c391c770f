"""A worker's part of the operator's live view of connections (GET /connections).

The parent asks every worker for its top N connections by one key (ipc.ConnectionsQuery);
the worker answers with at most N rows, whatever the number of connections it holds: one pass
over them with a bounded heap, so the answer's size and the worker's memory for it are bounded
by N (names a client chose are cut at MAX_NAME_CHARS), and the pass is a few microseconds per
connection between two loop callbacks.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterable

from broker.shared import ipc

_SORT_KEYS = {
    "bytes": lambda conn, now: conn.bytes_in + conn.bytes_out,
    "requests": lambda conn, now: conn.requests,
    "throttle": lambda conn, now: conn.throttle_ms,
    "age": lambda conn, now: now - conn.opened_at,
}
assert tuple(_SORT_KEYS) == ipc.CONNECTION_SORT_KEYS


MAX_NAME_CHARS = 255  # a client id (up to 32 KiB on the wire) or a certificate's DN, shortened


def _short(name: str | None) -> str | None:
    return name if name is None or len(name) <= MAX_NAME_CHARS else name[:MAX_NAME_CHARS] + "…"


def _row(conn, now: float) -> ipc.ConnectionRow:
    ip, _, port = conn.peer.rpartition(":")
    return ipc.ConnectionRow(
        conn_id=conn.conn_id, listener=conn.listener_index, ip=conn.ip,
        port=int(port) if port.isdigit() else 0, client_id=_short(conn.client_id),
        principal=_short(conn.principal), age_s=round(now - conn.opened_at, 3),
        bytes_in=conn.bytes_in, bytes_out=conn.bytes_out, requests=conn.requests,
        in_flight=int(conn.owes_answer()), throttle_ms=conn.throttle_ms,
        state=conn.state.name.lower(), waiting_for=conn.waiting_for())


def top_connections(connections: Iterable, query: ipc.ConnectionsQuery) -> ipc.ConnectionsList:
    """The worker's answer: its `query.top` connections with the largest `query.by`."""
    key = _SORT_KEYS.get(query.by, _SORT_KEYS["bytes"])
    now = time.monotonic()
    counted = [0]

    def open_ones():  # counted on the way: no copy of the connection set
        for conn in connections:
            if not conn.closing:
                counted[0] += 1
                yield conn

    chosen = heapq.nlargest(max(0, query.top), open_ones(), key=lambda conn: key(conn, now))
    return ipc.ConnectionsList(query=query.query, total=counted[0],
                               rows=[_row(conn, now) for conn in chosen])
