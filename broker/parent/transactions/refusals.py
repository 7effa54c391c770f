"""What an operator sees when the transactional id table or a holder's share is at its bound:
the counts behind /metrics, a log line (at most one every LOG_INTERVAL seconds) naming who
holds the table, and `transactional_id_refused` events written once a second.

A client retrying InitProducerId many times a second costs one event a second per (listener,
address, principal, reason), and the keys of a second are bounded (MAX_KEYS, the rest under
`<other>`), as the authorization audit's denials are.
"""

from __future__ import annotations

import logging
import time

from broker.parent.transactions.holders import FULL, MAX_NAME_CHARS, SHARE, Holder, Holdings
from broker.shared.events import EventLog, TransactionalIdRefused

log = logging.getLogger("broker.parent.transactions")

LOG_INTERVAL = 10.0  # seconds between two log lines about the bounds
MAX_KEYS = 1000  # distinct (listener, address, principal, reason) refused per second
LARGEST = 5  # holders named by the log line
OTHER = "<other>"
EXPIRED = "expired"


class BoundReport:
    def __init__(self, holdings: Holdings, events: EventLog | None = None,
                 listeners: tuple[str, ...] = ()):
        self.holdings = holdings
        self.refused = {SHARE: 0, FULL: 0}  # /metrics
        self.forgotten = {SHARE: 0, FULL: 0, EXPIRED: 0}  # /metrics: idle ids made room
        self._events = events
        self._listeners = listeners
        self._table: dict[tuple, list[int]] = {}  # key -> [count, held]
        self._since = {"refused": 0, "forgotten": 0}  # since the last log line
        self._logged = float("-inf")  # monotonic time of the last log line

    def forgot(self, holder: Holder, reason: str, transactional_id: str) -> None:
        """An idle id was forgotten to make room for `holder`'s new one."""
        self.forgotten[reason] += 1
        self._since["forgotten"] += 1
        self._maybe_log(holder, reason, transactional_id)

    def refuse(self, holder: Holder, reason: str, listener: int, host: str) -> None:
        """`holder`, asking from `host` on `listener`, got no id."""
        self.refused[reason] += 1
        self._since["refused"] += 1
        self._count(holder, reason, listener, host)
        self._maybe_log(holder, reason)

    def expired(self, count: int) -> None:
        self.forgotten[EXPIRED] += count

    # --- the log line ------------------------------------------------------------------------

    def _maybe_log(self, holder: Holder, reason: str, forgotten: str | None = None) -> None:
        now = time.monotonic()
        if now - self._logged < LOG_INTERVAL:
            return
        self._logged = now
        log.log(logging.INFO if forgotten else logging.WARNING, "%s",
                self.describe(holder, reason, forgotten))
        self._since = {"refused": 0, "forgotten": 0}

    def describe(self, holder: Holder, reason: str, forgotten: str | None = None) -> str:
        """One line: what happened to `holder` (refused, or `forgotten` made room for it),
        and who holds the table."""
        holdings = self.holdings
        bound = (f"its share (pybroker.max.transactional.ids.per.principal={holdings.share})"
                 if reason == SHARE else
                 f"a full table (pybroker.max.transactional.ids={holdings.total})")
        if forgotten is None:
            what = f"{holder} refused a transactional id: {bound}, every id in a transaction"
        else:
            what = (f"idle transactional id {forgotten[:MAX_NAME_CHARS]!r} forgotten for a "
                    f"new one of {holder}: {bound}")
        largest = ", ".join(f"{who} {held} ({holdings.busy(who)} busy)"
                            for who, held in holdings.largest(LARGEST))
        return (f"{what}; {holdings.count} of {holdings.total} ids held by "
                f"{len(holdings.held)} holders, the most by {largest}; since the last such "
                f"line {self._since['refused']} refused, {self._since['forgotten']} forgotten")

    # --- the event log -----------------------------------------------------------------------

    def _count(self, holder: Holder, reason: str, listener: int, host: str) -> None:
        if self._events is None:
            return
        key = (listener, host, holder.user[:MAX_NAME_CHARS], reason)
        if key not in self._table and len(self._table) >= MAX_KEYS:
            key = (listener, OTHER, OTHER, reason)
        entry = self._table.setdefault(key, [0, 0])
        entry[0] += 1
        entry[1] = self.holdings.held.get(holder, 0)

    def flush(self, second: int | None = None) -> None:
        """Write this second's refusals to the event log (called once a second)."""
        if not self._table or self._events is None:
            return
        second = int(time.time()) if second is None else second
        table, self._table = self._table, {}
        for (listener, host, user, reason), (count, held) in table.items():
            self._events.emit(TransactionalIdRefused(
                ts=second * 1000, second=second, listener=self._listener_name(listener),
                ip=host, principal=f"User:{user}", reason=reason, held=held, count=count))

    def _listener_name(self, index: int) -> str:
        return self._listeners[index] if index < len(self._listeners) else str(index)
