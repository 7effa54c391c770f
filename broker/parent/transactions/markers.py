"""The markers that end a transaction in its partitions, and those still owed.

The parent writes them itself: a COMMIT or ABORT control batch appended to each partition of
the transaction, under the partition's lock, like any append (`write_marker`).  The
coordinator writes the Prepare line before the first marker and the Complete line after the
last (coordinator.py); between the two, `Markers` marks MARKERS_PER_TURN partitions per turn
of the parent's loop, so a transaction over thousands of partitions is marked a slice at a
time while the parent serves others.  A partition that cannot take its marker (offline) keeps
the transaction in its Prepare state: what is owed is written again every round
(`Markers.retry_markers`, a duty of the sweeps) and by the next start-up, as Kafka's marker
channel retries until it is through.

`Markers` is the coordinator's: it reads the coordinator's table (`transactions`), writes one
partition's marker with the `mark` it is given, and calls back `complete`, which writes the
next slice and, once none is owed, the Complete line.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from broker.parent.transactions.state import Transaction, TxnState
from broker.shared.log.partition import AppendResult

log = logging.getLogger("broker.parent.transactions")

# Markers written per turn of the parent's loop (about 5 ms): a transaction over thousands of
# partitions is marked a slice at a time, the rest of the parent serving in between.
MARKERS_PER_TURN = 64

Partition = tuple[str, int]  # topic, index


class Markers:
    """The markers each transaction in a Prepare state still owes, written a slice a turn."""

    def __init__(self, loop: asyncio.AbstractEventLoop, transactions: dict[str, Transaction],
                 mark: Callable[[Transaction, Partition, bool], bool],
                 complete: Callable[[Transaction], None]):
        self.loop = loop
        self.transactions = transactions  # the coordinator's table, read here
        self._mark = mark  # one partition's marker (commit?): False if it must be tried again
        self._complete = complete  # the next slice, then the Complete line
        # Markers owed, by transactional id: partitions not tried yet (a slice a turn) and
        # partitions whose marker failed (tried again every round).
        self._untried: dict[str, list] = {}
        self._failed: dict[str, list] = {}

    def written(self, txn: Transaction) -> bool:
        """Write the next slice of the markers `txn` owes (a first pass over every partition,
        or a retry of those that failed); True once none is owed.  The slice after this one
        is written at the next turn of the loop; failures wait for the next round."""
        commit, key = txn.state is TxnState.PREPARE_COMMIT, txn.transactional_id
        untried = self._untried.pop(key, None)
        if untried is None:
            untried = self._failed.pop(key) if key in self._failed else list(txn.partitions)
        now, later = untried[:MARKERS_PER_TURN], untried[MARKERS_PER_TURN:]
        failed = self._failed.pop(key, []) + [p for p in now if not self._mark(txn, p, commit)]
        if later:
            self._untried[key] = later
            self.loop.call_soon(self._next_slice, key)
        if failed:
            self._failed[key] = failed
        return not (later or failed)

    def owe_completion(self, transactional_id: str) -> None:
        """Every marker is written but the rest of the ending failed: owed, with no marker
        left, so the next round completes it."""
        self._failed[transactional_id] = []

    def _next_slice(self, transactional_id: str) -> None:
        txn = self.transactions.get(transactional_id)
        if txn is not None and txn.state.preparing and transactional_id in self._untried:
            self._complete(txn)

    def retry_markers(self) -> int:
        """Another try at every Prepare state not being marked now (markers that failed, or
        a Prepare line whose markers never began); how many remain owing."""
        for txn in [txn for txn in self.transactions.values() if txn.state.preparing]:
            if txn.transactional_id not in self._untried:
                self._complete(txn)
        for gone in [key for key in self._failed if key not in self.transactions
                     or not self.transactions[key].state.preparing]:
            del self._failed[gone]
        return sum(txn.state.preparing for txn in self.transactions.values())


def write_marker(registry, txn: Transaction, key: Partition, commit: bool) -> bool:
    """Write the marker of `txn` in one partition of `registry`
    (broker.shared.log.topics.TopicRegistry); False if it must be tried again."""
    topic, index = key
    partition = registry.partition(topic, index)
    if partition is None:
        return True  # deleted since: nothing to mark
    try:
        result = partition.append_marker(txn.producer_id, txn.producer_epoch, commit)
    except OSError as error:
        result = AppendResult("kafka_storage_error", message=str(error))
    if result.error is None:
        return True
    log.warning("transaction %s: %s marker in %s-%d refused: %s", txn.transactional_id,
                "commit" if commit else "abort", topic, index, result.message or result.error)
    # A newer epoch already wrote there (the producer was fenced since): nothing owed.
    return result.error == "invalid_producer_epoch"
