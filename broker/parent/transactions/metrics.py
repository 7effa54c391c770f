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
