"""The transaction coordinator's rounds on the parent's loop.

Every transaction.abort.timed.out.transaction.cleanup.interval.ms a round retries the markers
owed (markers.py), aborts (with a bumped epoch) every transaction open past its timeout, and
aborts hanging transactions: a transactional batch open in a partition that no transaction of
the coordinator covers.  Every transaction.remove.expired.transaction.cleanup.interval.ms it
also forgets the ids idle past transactional.id.expiration.ms.  Each duty fails alone (logged):
the next round tries it again.

`Sweeps` is the coordinator's: it reads the coordinator's table (`transactions`) and the
partitions (`registry`), and changes a transaction only through what it is given: `end` (the
coordinator's state machine ends one, with a bump), `forget` (an idle id's Dead line),
`compact` (the transaction log's rewrite) and the markers' `retry_markers`; it counts what it
ended in the coordinator's `ended` (/metrics) and the ids it expired in `bounds`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from broker.parent.transactions.refusals import BoundReport
from broker.parent.transactions.state import Transaction, TxnState
from broker.shared.clock import now_ms
from broker.shared.log.partition_state import has_open_transaction

log = logging.getLogger("broker.parent.transactions")


class Sweeps:
    """The coordinator's rounds: markers retried, timed-out and hanging transactions aborted,
    idle transactional ids expired."""

    def __init__(self, loop: asyncio.AbstractEventLoop, props, registry,
                 transactions: dict[str, Transaction], ended: dict[str, int],
                 bounds: BoundReport, *, retry_markers: Callable[[], int],
                 end: Callable[..., None], forget: Callable[[Transaction], None],
                 compact: Callable[[], None]):
        self.loop = loop
        self.props = props  # broker.shared.config's properties: the rounds' intervals
        self.registry = registry  # broker.shared.log.topics.TopicRegistry
        self.transactions = transactions  # the coordinator's table, read here
        self.ended = ended  # the coordinator's counts of ended transactions (/metrics)
        self.bounds = bounds
        self.retry_markers = retry_markers
        self._end = end  # (txn, commit=, bump=): Prepare line, markers, Complete line
        self._forget = forget  # an idle id's Dead line
        self._compact = compact
        self._timer: asyncio.TimerHandle | None = None
        self._suspects: set[tuple] = set()  # hanging transactions seen by the last sweep
        self._next_expiry = time.monotonic() + \
            props.transaction_remove_expired_transaction_cleanup_interval_ms / 1000

    def start(self) -> None:
        """Timed-out transactions are looked for every
        transaction.abort.timed.out.transaction.cleanup.interval.ms, expired ids every
        transaction.remove.expired.transaction.cleanup.interval.ms."""
        self._timer = self.loop.call_later(self._interval, self._tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    @property
    def _interval(self) -> float:
        return self.props.transaction_abort_timed_out_transaction_cleanup_interval_ms / 1000

    def _tick(self) -> None:
        duties = [self.retry_markers, self.abort_timed_out, self.abort_hanging]
        if time.monotonic() >= self._next_expiry:
            self._next_expiry = time.monotonic() + \
                self.props.transaction_remove_expired_transaction_cleanup_interval_ms / 1000
            duties.append(self.expire_ids)
        for duty in duties:  # one failing costs only itself: the next round retries it
            try:
                duty()
            except Exception:  # noqa: BLE001
                log.exception("transaction coordinator: %s failed", duty.__name__)
        self._timer = self.loop.call_later(self._interval, self._tick)

    def abort_timed_out(self, now: int | None = None) -> int:
        """Abort (with a bumped epoch) every transaction open longer than its timeout."""
        now = now_ms() if now is None else now
        late = [txn for txn in self.transactions.values() if txn.state is TxnState.ONGOING
                and txn.started_ms + txn.timeout_ms < now]
        for txn in late:
            log.info("transaction %s timed out after %d ms: aborting", txn.transactional_id,
                     txn.timeout_ms)
            self._end(txn, commit=False, bump=True)
            self.ended["timed_out"] += 1
        return len(late)

    def abort_hanging(self) -> int:
        """Abort the transactions open in a partition that no transaction of this coordinator
        covers: a producer that wrote before adding the partition (or never did), a forged
        producer id, one whose marker a lost table forgot.  Left open, one such batch would
        hold the partition's last stable offset, and every read_committed consumer of it,
        for ever (Kafka leaves these "hanging transactions" to an operator's
        `kafka-transactions abort`).  Only one seen by two sweeps in a row is aborted, with
        the producer's own epoch."""
        covered = {txn.producer_id: txn for txn in self.transactions.values()
                   if txn.state is TxnState.ONGOING or txn.state.preparing}
        seen, aborted = set(), 0
        for info in list(self.registry.topics().values()):
            for index, directory in enumerate(info.directories):
                if not has_open_transaction(directory):
                    continue
                partition = self.registry.partition(info.name, index)
                if partition is None:
                    continue
                with partition.locked():
                    ongoing = partition.producers.ongoing()
                for producer_id, epoch, first in ongoing:
                    txn = covered.get(producer_id)
                    if txn is not None and (info.name, index) in txn.partitions:
                        continue
                    suspect = (info.name, index, producer_id, first)
                    seen.add(suspect)
                    if suspect in self._suspects:
                        aborted += self._abort_hanging(partition, producer_id, epoch, first)
        self._suspects = seen
        return aborted

    def _abort_hanging(self, partition, producer_id: int, epoch: int, first: int) -> int:
        result = partition.append_marker(producer_id, epoch, commit=False)
        log.warning("partition %s-%d: transaction of producer %d (epoch %d) open at offset %d "
                    "belongs to no transaction of the coordinator: %s", partition.topic,
                    partition.index, producer_id, epoch, first,
                    "aborted" if result.error is None else f"abort refused: {result.error}")
        if result.error is None:
            self.ended["hanging"] += 1
        return result.error is None

    def expire_ids(self, now: int | None = None) -> int:
        """Forget transactional ids idle for transactional.id.expiration.ms."""
        now = now_ms() if now is None else now
        limit = self.props.transactional_id_expiration_ms
        expired = [txn for txn in self.transactions.values()
                   if txn.state.idle and txn.updated_ms + limit < now]
        for txn in expired:
            self._forget(txn)
        self.bounds.expired(len(expired))
        self._compact()
        return len(expired)
