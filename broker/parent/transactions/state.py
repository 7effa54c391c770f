"""A transactional id's state, as Kafka's TransactionMetadata keeps it, the one function
that moves it (an illegal move raises: a bug, never a client's doing), and the clock of its
times.

    Empty ──AddPartitions/AddOffsets──> Ongoing ──EndTxn(commit)──> PrepareCommit ──markers──>
      ^                                    │                                     CompleteCommit
      │                                    └──EndTxn(abort), timeout, fencing──> PrepareAbort
      └──── InitProducerId, the next transaction <── CompleteCommit / CompleteAbort <──markers┘

Complete states take a new transaction like Empty; an id unused for
transactional.id.expiration.ms goes Dead and is forgotten.  A Prepare state is written to the
transaction log before any marker, so a restart finishes what it started.
"""

from __future__ import annotations

import enum

import msgspec

from broker.parent.transactions.holders import Holder


class TxnState(enum.Enum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    DEAD = "Dead"

    @property
    def preparing(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)

    @property
    def idle(self) -> bool:
        """No transaction in progress: a new one may begin, the id may expire."""
        return self in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)


_IDLE = {TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT}
_FROM: dict[TxnState, set[TxnState]] = {  # Kafka's TransactionState.validPreviousStates
    TxnState.EMPTY: _IDLE,
    TxnState.ONGOING: _IDLE | {TxnState.ONGOING},
    TxnState.PREPARE_COMMIT: {TxnState.ONGOING},
    TxnState.PREPARE_ABORT: {TxnState.ONGOING},
    TxnState.COMPLETE_COMMIT: {TxnState.PREPARE_COMMIT},
    TxnState.COMPLETE_ABORT: {TxnState.PREPARE_ABORT},
    TxnState.DEAD: _IDLE,
}


class IllegalTxnTransition(RuntimeError):
    pass


def transition(current: TxnState, target: TxnState) -> TxnState:
    if current not in _FROM[target]:
        raise IllegalTxnTransition(f"transaction state {current.value} -> {target.value}")
    return target


class Transaction(msgspec.Struct):
    """One transactional id: a line of the transaction log and the coordinator's state."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    partitions: list[tuple[str, int]] = []  # in the transaction, in the order added
    groups: list[str] = []  # whose offsets it commits (AddOffsetsToTxn)
    started_ms: int = -1  # when the transaction in progress began (its first partition)
    updated_ms: int = 0
    # The epoch the last bump replaced, when its producer may come back with it (Kafka's
    # lastProducerEpoch: a coordinator's abort, or a bump the producer asked for); -1 not.
    last_epoch: int = -1
    # Who initialized it last: whose share of the table it counts in (a line written before
    # shares existed has none, and counts as one holder of its own).
    holder: Holder = Holder("")
