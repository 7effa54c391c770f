"""The parent's events of every wall-clock second (the event log's).

For the second that just ended: how long each acceptor was blocked and why
(`acceptor_blocked`), the open connections per listener and the memory pool's figures
(`broker_stats`), and, when a pool depletion has just ended, its length (`pool_depleted`);
the second's authorization denials and refused transactional ids.
"""

from __future__ import annotations

import time

from broker.parent.ledger import ConnectionLedger
from broker.parent.transactions.refusals import BoundReport
from broker.shared import events
from broker.shared.config import BrokerConfig
from broker.shared.access import Access
from broker.shared.events import EventLog, SecondTicker
from broker.shared.pool import SharedPool


class EventTicker:
    def __init__(self, loop, config: BrokerConfig, log: EventLog, ledger: ConnectionLedger,
                 pool: SharedPool | None, access: Access | None = None,
                 transaction_bounds: BoundReport | None = None):
        self.config = config
        self.access = access  # its denials of the second are written out with the rest
        self.transaction_bounds = transaction_bounds  # and the refused transactional ids
        self.log = log
        self.ledger = ledger
        self.pool = pool
        self._ticker = SecondTicker(loop, self._second)
        self._depleted_seen = 0  # pool depleted ns already reported
        self._depletion: tuple[int, float] | None = None  # (start epoch ms, depleted ns then)

    def start(self) -> None:
        self._ticker.start()

    def stop(self) -> None:
        self._ticker.stop()

    def _second(self, second: int) -> None:
        second_ms = second * 1000
        emit = self.log.emit
        # A listener's ports (front-end mode: one per upstream node) block together: each
        # reason's episodes and time are the longest of them, not their sum.
        blocked: dict[tuple[str, str], list[int]] = {}
        for acceptor in self.ledger.acceptors + self.ledger.node_acceptors:
            for reason, (episodes, nanoseconds) in acceptor.take_blocked().items():
                seen = blocked.setdefault((acceptor.listener.name, reason), [0, 0])
                seen[0], seen[1] = max(seen[0], episodes), max(seen[1], nanoseconds)
        for (listener, reason), (episodes, nanoseconds) in blocked.items():
            emit(events.AcceptorBlocked(ts=second_ms, listener=listener, reason=reason,
                                        episodes=episodes, blocked_ms=nanoseconds / 1e6))
        stats = events.BrokerStats(ts=second_ms, active={
            listener.name: count for listener, count in
            zip(self.config.listeners, self.ledger.quotas.per_listener)})
        if self.pool is not None:
            self._pool_figures(stats, time.time())
        emit(stats)
        if self.access is not None:
            self.access.flush(second)
        if self.transaction_bounds is not None:
            self.transaction_bounds.flush(second)
        self.log.flush()

    def _pool_figures(self, stats: events.BrokerStats, now: float) -> None:
        """Pool figures for the second, and a pool_depleted event when a depletion ended."""
        pool = self.pool
        depleted = pool.depleted_ns()
        stats.pool_used, stats.pool_limit = pool.used(), pool.limit
        stats.pool_waiting = pool.waiting()
        stats.depleted_ms = (depleted - self._depleted_seen) / 1e6
        self._depleted_seen = depleted
        if stats.pool_waiting and self._depletion is None:
            self._depletion = (int(now * 1000), depleted - stats.depleted_ms * 1e6)
        elif not stats.pool_waiting and self._depletion is not None:
            started, base = self._depletion
            self.log.emit(events.PoolDepleted(started=started,
                                              duration_ms=(depleted - base) / 1e6))
            self._depletion = None
