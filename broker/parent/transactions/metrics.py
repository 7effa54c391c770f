"""The transaction coordinator's figures for /metrics (read on the status thread: counts are
plain ints the coordinator bumps, states are counted from a snapshot of its table)."""

from __future__ import annotations

import collections

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from broker.parent.transactions.state import TxnState


class TransactionCollector:
    def __init__(self, coordinator):
        self.coordinator = coordinator

    def collect(self):
        states = collections.Counter(txn.state for txn in list(
            self.coordinator.transactions.values()))
        gauge = GaugeMetricFamily("broker_transactional_ids",
                                  "Transactional ids the coordinator holds, by state",
                                  labels=["state"])
        for state in TxnState:
            if state is not TxnState.DEAD:
                gauge.add_metric([state.value], states.get(state, 0))
        yield gauge
        ended = CounterMetricFamily("broker_transactions_ended",
                                    "Transactions ended, by outcome (timed_out: aborted by the "
                                    "coordinator past transaction.timeout.ms; fenced: aborted "
                                    "because a new producer took the id; hanging: open in a "
                                    "partition outside any transaction, aborted by the "
                                    "coordinator)", labels=["outcome"])
        for outcome, count in sorted(self.coordinator.ended.items()):
            ended.add_metric([outcome], count)
        yield ended
        yield from self._bounds()

    def _bounds(self):
        """Who holds the table, and what its bounds did (holders.py, refusals.py)."""
        bounds, holdings = self.coordinator.bounds, self.coordinator.holdings
        refused = CounterMetricFamily(
            "broker_transactional_ids_refused",
            "InitProducerId requests that found no room for a transactional id "
            "(COORDINATOR_NOT_AVAILABLE), by reason (share: the principal's share, every id "
            "of it in a transaction; full: every id of the table in a transaction)",
            labels=["reason"])
        for reason, count in sorted(bounds.refused.items()):
            refused.add_metric([reason], count)
        yield refused
        forgotten = CounterMetricFamily(
            "broker_transactional_ids_forgotten",
            "Idle transactional ids forgotten, by reason (share: for a new id of the same "
            "principal at its share; full: for a new id in a full table; expired: past "
            "transactional.id.expiration.ms)", labels=["reason"])
        for reason, count in sorted(bounds.forgotten.items()):
            forgotten.add_metric([reason], count)
        yield forgotten
        sizes = list(holdings.held.values())
        yield GaugeMetricFamily("broker_transactional_id_holders",
                                "Principals (addresses for ANONYMOUS) holding transactional ids",
                                value=len(sizes))
        yield GaugeMetricFamily("broker_transactional_ids_largest_holding",
                                "Transactional ids held by the principal holding the most "
                                "(pybroker.max.transactional.ids.per.principal bounds it)",
                                value=max(sizes, default=0))
