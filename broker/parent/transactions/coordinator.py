"""The transaction coordinator (KIP-98), in the parent: the requests, every transactional id's
state and its moves, and the transaction log.  It owns the rest of the package: the markers
that end a transaction in its partitions (markers.py, `Markers`) and the rounds that retry
them, abort timed-out and hanging transactions and expire idle ids (sweeps.py, `Sweeps`) are
objects it holds and hands what they may use; it uses who holds the ids (holders.py), the
refusals' report (refusals.py) and what DescribeTransactions and ListTransactions show
(listing.py); the figures for /metrics (metrics.py) are read from it.

Workers forward InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn,
DescribeTransactions and ListTransactions here (IPC ForwardedRequest, like the group APIs);
TxnOffsetCommit goes to the group coordinator, which asks `offsets_problem` whether the
producer may commit offsets for that group.  Every answer is given at once: the markers are
appended by this process itself, under each partition's lock, like any append.

Durability: every change of a transactional id's state is a line of
`<first log dir>/.pybroker-transactions.jsonl` (broker.parent.record_file), written before the
answer.  EndTxn writes PrepareCommit/PrepareAbort first, then the markers (and the group
offsets' outcome), then CompleteCommit/CompleteAbort; a restart finds any Prepare state left
by a `kill -9` and completes it before a worker serves anything.  A transaction left Ongoing
is aborted once its timeout passes, as any other (sweeps.py).

Fencing, as Kafka: InitProducerId for a known id bumps the epoch (a transaction in progress
is aborted first, its markers written with the bumped epoch, so the old producer's appends are
refused in every partition it wrote to); a request with an older epoch hears PRODUCER_FENCED
(INVALID_PRODUCER_EPOCH for older request versions).  A transaction open longer than its
timeout is aborted with a bumped epoch too.

Bounds Kafka does not have (a client must not exhaust what others need): at most
`pybroker.max.transactional.ids` ids, and of them a share per principal (per client address
for ANONYMOUS), `pybroker.max.transactional.ids.per.principal`; at either bound an idle id is
forgotten to make room, or, with all busy, InitProducerId answers COORDINATOR_NOT_AVAILABLE
(holders.py decides, refusals.py counts, logs and writes the event).  A transaction spans at
most `pybroker.max.partitions.per.transaction` partitions and 1,000 groups, and a complete one
keeps neither (as Kafka's).

Not done (as Kafka before KIP-890's verification): a produce to a partition never added to
the transaction is not refused; its records stay invisible to read_committed consumers until
the producer's next marker there.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets

import msgspec

from broker.parent.forwarded import budget_of, decode_forwarded
from broker.parent.groups.offset_store import OffsetStore
from broker.parent.record_file import RecordFile
from broker.parent.transactions.holders import Holder, Holdings
from broker.parent.transactions.listing import describe, list_transactions
from broker.parent.transactions.markers import Markers, write_marker
from broker.parent.transactions.refusals import BoundReport
from broker.parent.transactions.state import Transaction, TxnState, transition
from broker.parent.transactions.sweeps import Sweeps
from broker.shared.access import Access
from broker.shared.acl import CLUSTER_NAME, Operation, ResourceType
from broker.shared.apis import BY_NAME, TRANSACTION_KEYS
from broker.shared.clock import now_ms
from broker.shared.events import EventLog
from broker.shared.protocol.context import NO_THROTTLE, RequestContext
from broker.shared.protocol.errors import ErrorCode

log = logging.getLogger("broker.parent.transactions")

FILE_NAME = ".pybroker-transactions.jsonl"
COMPACT_MIN = 1000
MAX_GROUPS = 1000  # groups one transaction may commit offsets for (AddOffsetsToTxn)
MAX_EPOCH = 32767  # int16: at the last epoch a producer gets a new id (Kafka's rule)
# The first version of each API that knows PRODUCER_FENCED; older ones hear
# INVALID_PRODUCER_EPOCH (Kafka's KafkaApis does the same translation).
FENCED_FROM = {"InitProducerId": 4, "AddPartitionsToTxn": 2, "AddOffsetsToTxn": 2,
               "EndTxn": 2, "TxnOffsetCommit": 2}


class TransactionCoordinator:
    def __init__(self, loop: asyncio.AbstractEventLoop, props, directory: str, registry,
                 offsets: OffsetStore, access: Access | None = None,
                 fsync_every_write: bool = False, events: EventLog | None = None,
                 listeners: tuple[str, ...] = ()):
        self.loop = loop
        self.props = props
        self.registry = registry  # broker.shared.log.topics.TopicRegistry: the markers' way in
        self.offsets = offsets  # the group coordinator's store: offsets ended with the txn
        self.access = access or Access(False)
        self.transactions: dict[str, Transaction] = {}
        self.ended = {"committed": 0, "aborted": 0, "timed_out": 0, "fenced": 0,
                      "hanging": 0}  # /metrics
        self.file = RecordFile(os.path.join(directory, FILE_NAME), Transaction,
                               fsync_every_write)
        for record in self.file.replay():
            self._replayed(record)
        total = props.pybroker_max_transactional_ids
        self.holdings = Holdings(total, props.pybroker_max_transactional_ids_per_principal
                                 or max(1, total // 10))
        for txn in sorted(self.transactions.values(), key=lambda txn: txn.updated_ms):
            self.holdings.add(txn.transactional_id, txn.holder, txn.state.idle)
        self.bounds = BoundReport(self.holdings, events, listeners)  # metrics, log, events
        self._handlers = {BY_NAME[name].key: handler for name, handler in (
            ("InitProducerId", self._init_producer_id),
            ("AddPartitionsToTxn", self._add_partitions),
            ("AddOffsetsToTxn", self._add_offsets), ("EndTxn", self._end_txn),
            ("DescribeTransactions", self._describe), ("ListTransactions", self._list))}
        assert set(self._handlers) == TRANSACTION_KEYS, "the API table and the coordinator disagree"
        # `_marked` is looked up at each marker: one set on this instance is the one used.
        self.markers = Markers(loop, self.transactions, complete=self._complete,
                               mark=lambda txn, key, commit: self._marked(txn, key, commit))
        self.sweeps = Sweeps(loop, props, registry, self.transactions, self.ended, self.bounds,
                             retry_markers=self.markers.retry_markers, end=self._end,
                             forget=lambda txn: self._record(txn, TxnState.DEAD),
                             compact=self.maybe_compact)

    # --- life cycle --------------------------------------------------------------------------

    def _replayed(self, record: Transaction) -> None:
        if record.state is TxnState.DEAD:
            self.transactions.pop(record.transactional_id, None)
        else:
            self.transactions[record.transactional_id] = record

    def recover(self) -> None:
        """Finish what a crash interrupted: a Prepare state's markers are (re)written."""
        for txn in list(self.transactions.values()):
            if txn.state.preparing:
                log.info("transaction %s: completing %s after a restart", txn.transactional_id,
                         txn.state.value)
                self._complete(txn)
        self.maybe_compact()

    def start(self) -> None:
        """The rounds begin (sweeps.py)."""
        self.sweeps.start()

    def close(self) -> None:
        self.sweeps.stop()
        self.file.close()

    # --- the rounds' duties, each also run on its own (sweeps.py, markers.py) ----------------

    def retry_markers(self) -> int:
        return self.markers.retry_markers()

    def abort_timed_out(self, now: int | None = None) -> int:
        return self.sweeps.abort_timed_out(now)

    def abort_hanging(self) -> int:
        return self.sweeps.abort_hanging()

    def expire_ids(self, now: int | None = None) -> int:
        return self.sweeps.expire_ids(now)

    # --- requests ----------------------------------------------------------------------------

    def handle(self, request: bytes, listener: int, peer: str, user: str = "ANONYMOUS") -> bytes:
        ctx, body = decode_forwarded(request, listener, peer, user)
        return self._handlers[ctx.api_key](ctx, body)

    def _may_write(self, ctx: RequestContext, transactional_id: str) -> bool:
        return self.access.check(ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID,
                                 transactional_id)

    # --- InitProducerId ----------------------------------------------------------------------

    def _init_producer_id(self, ctx: RequestContext, body) -> bytes:
        def answer(code, producer_id=-1, epoch=-1):
            return ctx.respond({"throttle_time": NO_THROTTLE, "error_code": code,
                                "producer_id": producer_id, "producer_epoch": epoch})

        transactional_id = body.transactional_id
        if transactional_id is None:
            return answer(*self._idempotent(ctx, body))
        if not transactional_id:
            return answer(ErrorCode.invalid_request)
        if not self._may_write(ctx, transactional_id):
            return answer(ErrorCode.transactional_id_authorization_failed)
        timeout_ms = int(body.transaction_timeout.total_seconds() * 1000)
        if not 0 < timeout_ms <= self.props.transaction_max_timeout_ms:
            return answer(ErrorCode.invalid_transaction_timeout)
        txn = self.transactions.get(transactional_id)
        expected = getattr(body, "producer_id", -1), getattr(body, "producer_epoch", -1)
        holder = Holder.of(ctx.user, ctx.host)
        try:
            if txn is None and not self._room_for(ctx, holder, new_id=True):
                return answer(ErrorCode.coordinator_not_available)
            if txn is None:
                txn = Transaction(transactional_id, _new_producer_id(), -1, timeout_ms)
            else:
                problem = self._resuming_problem(txn, *expected)
                if problem is None and txn.state.preparing:
                    problem = ErrorCode.concurrent_transactions  # its markers are still owed
                if problem is not None:
                    return answer(self._fenced_for(ctx, problem))
                if txn.holder != holder and not self._room_for(ctx, holder, new_id=False):
                    return answer(ErrorCode.coordinator_not_available)
                if txn.state is TxnState.ONGOING:  # its producer is replaced: abort, fencing
                    self._end(txn, commit=False, bump=True)
                    self.ended["fenced"] += 1
                    if txn.state.preparing:  # a marker is owed: the client asks again
                        return answer(ErrorCode.concurrent_transactions)
                elif expected[1] >= 0 and expected[1] == txn.last_epoch:
                    # A retry (its answer was lost), or the producer whose transaction the
                    # coordinator aborted with a bump: the current epoch is its own.
                    return answer(ErrorCode.none, txn.producer_id, txn.producer_epoch)
            producer_id, epoch = _bumped(txn)
            # A producer that names its epoch may come back with it (above); a new instance
            # (no id given) fences every earlier epoch.
            last = txn.producer_epoch if expected[1] >= 0 and producer_id == txn.producer_id \
                else -1
            self._record(txn, TxnState.EMPTY, producer_id=producer_id, producer_epoch=epoch,
                         timeout_ms=timeout_ms, last_epoch=last, holder=holder)
        except OSError as error:
            log.error("transaction log write failed: %s", error)
            return answer(ErrorCode.coordinator_not_available)
        log.info("transactional id %s: producer %d epoch %d", transactional_id, txn.producer_id,
                 txn.producer_epoch)
        return answer(ErrorCode.none, txn.producer_id, txn.producer_epoch)

    def _room_for(self, ctx: RequestContext, holder: Holder, new_id: bool) -> bool:
        """May `holder` take one more id (a new one, or one another holder initialized)?
        At its share or a full table an idle id is forgotten (as if it had expired) to make
        room (holders.py decides which); with none idle it is refused, and the client hears
        COORDINATOR_NOT_AVAILABLE: retriable, so Java's and librdkafka's producers ask again
        until their initialization times out, while TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        would be fatal to a producer that is allowed the id and only has to wait.
        Raises OSError if the forgotten id's line cannot be written."""
        room = self.holdings.room(holder, new_id)
        if room.refused:
            self.bounds.refuse(holder, room.reason, ctx.listener_index, ctx.host)
            return False
        if room.forget is not None:
            self._record(self.transactions[room.forget], TxnState.DEAD)
            self.bounds.forgot(holder, room.reason, room.forget)
        return True

    def _idempotent(self, ctx: RequestContext, body) -> tuple:
        """An idempotent producer (no transactional id): always a new id, as Kafka (a bump
        of an id the client names would let anyone raise another producer's epoch)."""
        # Kafka: IDEMPOTENT_WRITE on the cluster, or WRITE on some topic (KIP-679).
        if not self.access.allowed(ctx, Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER,
                                   CLUSTER_NAME) and \
                not self.access.check_any(ctx, Operation.WRITE, ResourceType.TOPIC):
            return (ErrorCode.cluster_authorization_failed,)
        return ErrorCode.none, _new_producer_id(), 0

    @staticmethod
    def _resuming_problem(txn: Transaction, producer_id: int, epoch: int):
        """KIP-360: a producer that gives its id and epoch must be the current one, or the
        one the last bump replaced when that bump kept it a way back (Kafka's last epoch:
        the coordinator aborted its transaction, or its own bump's answer was lost)."""
        if producer_id < 0 and epoch < 0:
            return None
        if producer_id != txn.producer_id or epoch not in (txn.producer_epoch, txn.last_epoch):
            return ErrorCode.producer_fenced
        return None

    # --- AddPartitionsToTxn, AddOffsetsToTxn -------------------------------------------------

    def _add_partitions(self, ctx: RequestContext, body) -> bytes:
        if ctx.version <= 3:
            topics = self._add_one(ctx, body.v3_and_below_transactional_id,
                                   body.v3_and_below_producer_id,
                                   body.v3_and_below_producer_epoch, body.v3_and_below_topics)
            return ctx.respond({"throttle_time": NO_THROTTLE,
                                "results_by_topic_v3_and_below": topics})
        if not self.access.allowed(ctx, Operation.CLUSTER_ACTION, ResourceType.CLUSTER,
                                   CLUSTER_NAME):  # v4+ is the brokers' batched form
            return ctx.respond({"throttle_time": NO_THROTTLE, "results_by_transaction": [],
                                "error_code": ErrorCode.cluster_authorization_failed})
        results = [{"transactional_id": txn.transactional_id, "topic_results": self._add_one(
            ctx, txn.transactional_id, txn.producer_id, txn.producer_epoch, txn.topics,
            txn.verify_only)} for txn in body.transactions]
        return ctx.respond({"throttle_time": NO_THROTTLE, "error_code": ErrorCode.none,
                            "results_by_transaction": results})

    def _add_one(self, ctx: RequestContext, transactional_id: str, producer_id: int,
                 epoch: int, topics, verify_only: bool = False) -> list[dict]:
        """One transaction's partitions: every one gets the same verdict unless some are
        refused on their own (authorization, unknown), when the rest are not attempted."""
        wanted = [(topic.name, int(p)) for topic in topics for p in topic.partitions]
        verdicts: dict[tuple[str, int], int] = {}
        if not self._may_write(ctx, transactional_id):
            verdicts = dict.fromkeys(wanted, ErrorCode.transactional_id_authorization_failed)
        else:
            for name, partition in wanted:
                if not self.access.check(ctx, Operation.WRITE, ResourceType.TOPIC, name):
                    verdicts[(name, partition)] = ErrorCode.topic_authorization_failed
                elif self.registry.partition(name, partition) is None:
                    verdicts[(name, partition)] = ErrorCode.unknown_topic_or_partition
            if verdicts:
                verdicts = {key: verdicts.get(key, ErrorCode.operation_not_attempted) for key in wanted}
            elif verify_only:
                verdicts = self._verified(transactional_id, producer_id, epoch, wanted)
            else:
                code = self._begin(ctx, transactional_id, producer_id, epoch,
                                   partitions=wanted)
                verdicts = dict.fromkeys(wanted, code)
        return _by_topic(verdicts, "partition_error_code", "results_by_partition")

    def _verified(self, transactional_id: str, producer_id: int, epoch: int,
                  wanted: list) -> dict:
        """KIP-890's verify-only form: is each partition in the ongoing transaction?"""
        txn = self.transactions.get(transactional_id)
        code = self._producer_problem(txn, producer_id, epoch)
        if code is None and txn.state is not TxnState.ONGOING:
            code = ErrorCode.invalid_txn_state
        if code is not None:
            return dict.fromkeys(wanted, code)
        return {key: ErrorCode.none if key in txn.partitions else ErrorCode.invalid_txn_state for key in wanted}

    def _add_offsets(self, ctx: RequestContext, body) -> bytes:
        if not self._may_write(ctx, body.transactional_id):
            code = ErrorCode.transactional_id_authorization_failed
        elif not self.access.check(ctx, Operation.READ, ResourceType.GROUP, body.group_id):
            code = ErrorCode.group_authorization_failed
        else:
            code = self._begin(ctx, body.transactional_id, body.producer_id,
                               body.producer_epoch, group=body.group_id)
        return ctx.respond({"throttle_time": NO_THROTTLE, "error_code": code})

    def _begin(self, ctx: RequestContext, transactional_id: str, producer_id: int, epoch: int,
               partitions: list = (), group: str | None = None):
        """Add partitions or a group to the producer's transaction (beginning one)."""
        txn = self.transactions.get(transactional_id)
        problem = self._producer_problem(txn, producer_id, epoch)
        if problem is None and txn.state.preparing:
            problem = ErrorCode.concurrent_transactions  # never lasts: ends are completed at once
        if problem is not None:
            return self._fenced_for(ctx, problem)
        fresh = txn.state.idle  # a new transaction begins
        have = [] if fresh else txn.partitions
        groups = [] if fresh else txn.groups
        if group is not None and group not in groups and len(groups) >= MAX_GROUPS:
            return ErrorCode.invalid_request  # a bound on what one transaction's log line carries
        known = set(have)
        added = [key for key in dict.fromkeys(partitions) if key not in known]
        if len(have) + len(added) > self.props.pybroker_max_partitions_per_transaction:
            return ErrorCode.invalid_request  # as Kafka's transaction log refuses a record too large
        new_group = group is not None and group not in groups
        if not (added or new_group or fresh):
            return ErrorCode.none
        try:
            self._record(txn, TxnState.ONGOING, partitions=have + added,
                         groups=groups + [group] if new_group else groups,
                         started_ms=now_ms() if fresh else txn.started_ms)
        except OSError as error:
            log.error("transaction log write failed: %s", error)
            return ErrorCode.coordinator_not_available
        return ErrorCode.none

    def _producer_problem(self, txn: Transaction | None, producer_id: int, epoch: int):
        if txn is None or txn.producer_id != producer_id:
            return ErrorCode.invalid_producer_id_mapping
        if epoch != txn.producer_epoch:
            return ErrorCode.producer_fenced
        return None

    @staticmethod
    def _fenced_for(ctx: RequestContext, code):
        name = BY_NAME_OF_KEY.get(ctx.api_key)
        if code == ErrorCode.producer_fenced and ctx.version < FENCED_FROM.get(name, 0):
            return ErrorCode.invalid_producer_epoch
        return code

    def offsets_problem(self, transactional_id: str, producer_id: int, epoch: int,
                        group: str, version: int):
        """TxnOffsetCommit's check (asked by the group coordinator): the producer is current
        and added the group to its ongoing transaction."""
        txn = self.transactions.get(transactional_id)
        problem = self._producer_problem(txn, producer_id, epoch)
        if problem is None and (txn.state is not TxnState.ONGOING or group not in txn.groups):
            problem = ErrorCode.invalid_txn_state
        if problem == ErrorCode.producer_fenced and version < FENCED_FROM["TxnOffsetCommit"]:
            return ErrorCode.invalid_producer_epoch
        return problem

    # --- EndTxn ------------------------------------------------------------------------------

    def _end_txn(self, ctx: RequestContext, body) -> bytes:
        def answer(code):
            return ctx.respond({"throttle_time": NO_THROTTLE, "error_code": code})

        if not self._may_write(ctx, body.transactional_id):
            return answer(ErrorCode.transactional_id_authorization_failed)
        txn = self.transactions.get(body.transactional_id)
        problem = self._producer_problem(txn, body.producer_id, body.producer_epoch)
        if problem is not None:
            return answer(self._fenced_for(ctx, problem))
        finished = TxnState.COMPLETE_COMMIT if body.committed else TxnState.COMPLETE_ABORT
        if txn.state is finished:
            return answer(ErrorCode.none)  # a retry of an end that was done
        if txn.state.preparing:  # its markers are being written (or wait for a partition)
            deciding = TxnState.PREPARE_COMMIT if body.committed else TxnState.PREPARE_ABORT
            return answer(ErrorCode.concurrent_transactions if txn.state is deciding
                          else ErrorCode.invalid_txn_state)
        if txn.state is not TxnState.ONGOING:
            return answer(ErrorCode.invalid_txn_state)
        try:
            self._end(txn, commit=body.committed)
        except OSError as error:
            log.error("transaction %s: ending failed: %s", txn.transactional_id, error)
            return answer(ErrorCode.coordinator_not_available)
        return answer(ErrorCode.none)

    def _end(self, txn: Transaction, commit: bool, bump: bool = False) -> None:
        """Prepare (logged), markers, complete (logged).  `bump`: the markers carry a new
        epoch, fencing the producer that began the transaction."""
        # A fencing bump keeps the producer id, whatever the epoch (a new id would leave the
        # old one's transaction open in its partitions): at most 32767, as Kafka's fence.
        epoch = min(txn.producer_epoch + 1, MAX_EPOCH) if bump else txn.producer_epoch
        self._record(txn, TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT,
                     producer_epoch=epoch,
                     last_epoch=txn.producer_epoch if bump else txn.last_epoch)
        self._complete(txn)

    def _complete(self, txn: Transaction) -> None:
        """Markers, the group offsets' outcome, then the Complete line.  While a marker is
        owed (a slice for a later turn, or a partition that cannot take it: markers.py) the
        transaction stays in its Prepare state, and this is called again."""
        if not self.markers.written(txn):  # some are owed: a later turn or round completes it
            return
        commit = txn.state is TxnState.PREPARE_COMMIT
        try:
            for group in txn.groups:
                self.offsets.end_transaction(group, txn.producer_id, commit, now_ms())
            # Kafka's complete states hold no partitions or groups: only a transaction in
            # progress keeps them in memory.
            partitions = len(txn.partitions)
            self._record(txn, TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT,
                         partitions=[], groups=[])
        except OSError as error:  # the markers are written; the rest is owed, tried again
            log.error("transaction %s: completing failed: %s", txn.transactional_id, error)
            self.markers.owe_completion(txn.transactional_id)
            return
        self.ended["committed" if commit else "aborted"] += 1
        log.debug("transaction %s (producer %d epoch %d): %s, %d partitions",
                  txn.transactional_id, txn.producer_id, txn.producer_epoch,
                  "committed" if commit else "aborted", partitions)

    def _marked(self, txn: Transaction, key: tuple[str, int], commit: bool) -> bool:
        """The marker of `txn` in one partition (markers.write_marker); False if it must be
        tried again."""
        return write_marker(self.registry, txn, key, commit)

    # --- the log -----------------------------------------------------------------------------

    def _record(self, txn: Transaction, state: TxnState, **changes) -> None:
        """Move `txn` to `state` with `changes` to its fields: written to the transaction log
        first (raises OSError, `txn` unchanged, if that fails)."""
        key = txn.transactional_id
        held = key in self.transactions
        if held:
            transition(txn.state, state)
        written = msgspec.structs.replace(txn, state=state, updated_ms=now_ms(), **changes)
        self.file.append([written])
        if held:
            self.holdings.remove(key, txn.holder, txn.state.idle)
        for field in ("state", "updated_ms", *changes):
            setattr(txn, field, getattr(written, field))
        if state is TxnState.DEAD:
            self.transactions.pop(key, None)
        else:
            self.transactions[key] = txn
            self.holdings.add(key, txn.holder, state.idle)
        self.maybe_compact()  # an O(1) check: a busy producer writes 3 lines a transaction

    def maybe_compact(self) -> None:
        """Rewrite the log with the live lines once it holds twice as many; a failed rewrite
        leaves the file as it was (it is tried again at the next line)."""
        if self.file.lines >= COMPACT_MIN and self.file.lines > 2 * len(self.transactions):
            try:
                self.file.rewrite(list(self.transactions.values()))
            except OSError as error:
                log.error("rewriting %s failed: %s", self.file.path, error)

    # --- DescribeTransactions, ListTransactions (listing.py) ---------------------------------

    def _describe(self, ctx: RequestContext, body) -> bytes:
        return describe(ctx, body, self.transactions, self.access, budget_of(self.props))

    def _list(self, ctx: RequestContext, body) -> bytes:
        return list_transactions(ctx, body, self.transactions, self.access)


BY_NAME_OF_KEY = {spec.key: name for name, spec in BY_NAME.items()}


def _bumped(txn: Transaction) -> tuple[int, int]:
    """The producer id and epoch after a bump: at the last epoch, a new id (Kafka's rule)."""
    if txn.producer_epoch + 1 >= MAX_EPOCH:
        return _new_producer_id(), 0
    return txn.producer_id, txn.producer_epoch + 1


def _new_producer_id() -> int:
    # Random 62-bit ids: unique across workers and restarts without a shared counter (the
    # idempotent producers' rule; a collision is as likely as 2**-31 after 2**16 producers).
    return secrets.randbits(62)


def _by_topic(verdicts: dict, code_field: str, partitions_field: str) -> list[dict]:
    topics: dict[str, list] = {}
    for (name, partition), code in verdicts.items():
        topics.setdefault(name, []).append({"partition_index": partition, code_field: code})
    return [{"name": name, partitions_field: rows} for name, rows in topics.items()]

