"""One partition: `<log dir>/<topic>-<n>/` with its segments and a shared state file.

Every worker process may append to and read from every partition.  Appends are serialised by
an exclusive `flock` on the partition's `state` file; that file is also memory-mapped by each
process and holds (8-byte words, native endian):

    0 magic               4 high watermark          8 bytes since the last index entry
    1 dirty (writer pid)  5 active segment base     9 segments version (bumped on roll/delete)
    2 log start offset    6 active segment size     10 messages not yet fsynced
    3 log end offset      7 active index entries    11 last fsync, unix ns
    12 appends            13 offline (non-zero: recovery failed; nothing is served)
    14 greatest timestamp of the active segment (see segment.py's time index)
    15 base of the active segment at the last flush
    16 when the active segment got its first batch, unix ms (segment.ms counts from it)
    17 least first offset of an ongoing transaction + 1 (0: none; see "Transactions")
    18 entries in the aborted-transaction index   19 its version (bumped when a repair cuts it)
    20 compaction swaps: odd while one renames a segment's files (readers open sets around it)
    21 the producer file's generation: bumped before its size changes (others map it again)
    (the idempotent-producer table is a file of its own: producers.py; the aborted-transaction
    index too: transactions.py)

The log start offset is the first segment's base, unless DeleteRecords moved it past that:
then it is also written to LOG_START_FILE (atomically), so a restart keeps it, as Kafka's
log-start-offset checkpoint does.

Write order inside the lock makes readers safe without taking it: batch bytes, then the index
entry and its count, then size and log end offset, then the high watermark (single node:
high watermark = log end).  A reader loads the high watermark first and only returns batches
below it.  `dirty` is set for the duration of an append: if a worker dies mid-append (kill -9),
the next appender finds it set and repairs the partition from its files before going on.

A partition whose files cannot be repaired (start-up recovery or a repair after a failed
append raises) is marked offline: produce, fetch and offset lookups answer
KAFKA_STORAGE_ERROR, Metadata shows it without a leader, and the rest of the broker serves on.
The next start-up tries to recover it again.

Transactions (KIP-98).  A transactional batch from a producer with no transaction open here
opens one at its base offset (the producer table keeps it); `append_marker` writes the
COMMIT or ABORT control batch that ends it, and an ABORT adds (producer, first offset, marker
offset) to the aborted-transaction index.  The last stable offset is the least first offset
of the ongoing transactions (word 17), else the high watermark: read_committed fetches stop
there (`read_regions(..., upper=LSO)`) and learn which transactions below it were aborted
(`aborted_transactions`).  Write order keeps lock-free readers safe: word 17 is set before
the high watermark that exposes the opening batch (a reader loads the high watermark first,
then word 17, so it never sees the batch without the transaction); a marker is placed and the
high watermark published first, then the table, then the index entry and its count, and
only then word 17 moves up: when a reader sees the LSO past a transaction's start, its index
entry is already counted.  A writer killed after placing a marker but before updating the
table leaves `dirty`: the repair replays the active segment's transactional batches and
markers into the table (idempotently: a marker ends a transaction only if it began before
it), adds a missing index entry, and recomputes word 17; a marker torn off by the repair
leaves its transaction open (the coordinator writes it again).  Not guaranteed: a state reset
(bad state magic) or a lost producer file clears the table, and the replay then knows only
the transactions the active segment shows: one opened before it is forgotten, so the LSO
passes it and its abort, if any, gets no index entry.  After a power loss, what the last
fsync kept (the index is fsynced with the segments; entries past the log end are cut).
"""

from __future__ import annotations

import bisect
import fcntl
import logging
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass

from broker.shared.log import compaction, records, transactions
from broker.shared.log.compression import TopicCodec
from broker.shared.log.files import OpenFiles, OutOfDescriptors, default_capacity, is_exhaustion
from broker.shared.log.mapping import Mapping
from broker.shared.log.producers import ProducerState, ProducerTable, Verdict
from broker.shared.log.record_errors import FaultRoom
from broker.shared.log.segment import MAX_RELATIVE_OFFSET, Segment, list_bases, write_atomically

log = logging.getLogger("broker.shared.log")

STATE_FILE = "state"
LOG_START_FILE = "log-start-offset"  # DeleteRecords' log start offset, when past the first base
STATE_MAGIC = int.from_bytes(b"PYBRKPS1", "little")
(W_MAGIC, W_DIRTY, W_LOG_START, W_LOG_END, W_HIGH_WATERMARK, W_ACTIVE_BASE, W_ACTIVE_SIZE,
 W_INDEX_ENTRIES, W_SINCE_INDEX, W_SEGMENTS_VERSION, W_UNFLUSHED, W_LAST_FLUSH) = range(12)
W_APPENDS = 12
W_OFFLINE = 13  # non-zero: the partition could not be recovered and serves nothing
W_SEGMENT_MAX_TS = 14  # greatest timestamp in the active segment (its time index's open region)
W_FLUSHED_BASE = 15  # base of the active segment at the last flush: later ones need an fsync
W_SEGMENT_STARTED = 16  # unix ms of the active segment's first append (0: unknown)
W_ONGOING_FIRST = 17  # 1 + the least first offset of an ongoing transaction (0: none)
W_ABORTED_COUNT = 18  # entries of the aborted-transaction index readers may read
W_ABORTED_VERSION = 19  # bumped when a repair cuts the index: readers drop what they cached
W_SWAPS = 20  # compaction swaps, odd while one is renaming files (see Segment)
W_PRODUCERS_GENERATION = 21  # bumped before the producer file changes size (see producers.py)
STATE_WORDS = 32
STATE_BYTES = 8 * STATE_WORDS


class PartitionOffline(OSError):
    """The partition's files could not be recovered; it serves nothing until a restart."""


@dataclass(frozen=True)
class LogSettings:
    segment_bytes: int = 1 << 30
    index_interval_bytes: int = 4096
    max_message_bytes: int = 1048588
    flush_interval_messages: int = 2**63 - 1
    timestamps: records.TimestampBounds = records.TimestampBounds()
    producer_expiration_ms: int = 86_400_000  # producer.id.expiration.ms
    max_decompressed_bytes: int = 32 << 20  # pybroker.max.decompressed.batch.bytes
    max_producers: int = 100_000  # pybroker.max.producers.per.partition
    log_append_time: bool = False  # message.timestamp.type=LogAppendTime: stamped at append
    compacted: bool = False  # cleanup.policy has compact: every record needs a key
    segment_ms: int = 604_800_000  # segment.ms: a segment this old rolls at the next append
    compression: TopicCodec | None = None  # compression.type, None for producer (as produced)


@dataclass
class AppendResult:
    error: str | None  # a Kafka error name, None for success
    base_offset: int = -1
    log_start_offset: int = -1
    message: str | None = None
    log_append_time: int = -1  # ms, when the topic stamps batches itself (LogAppendTime)


class Partition:
    """A thread's handle on one partition; cheap to keep, safe to use from any worker.

    What it costs its process: the state file's one-page mapping, the producer table's
    mapping once an idempotent producer wrote here, and the descriptors of its files while
    they are among the registry's open files (`files`, bounded: see files.py)."""

    def __init__(self, directory: str, topic: str, index: int, settings: LogSettings,
                 files: OpenFiles | None = None):
        self.directory = directory
        self.topic = topic
        self.index = index
        self.name = f"{topic}-{index}"  # as Kafka names a topic partition in its messages
        self.settings = settings
        self._files = files if files is not None else OpenFiles(default_capacity())
        self._state_path = os.path.join(directory, STATE_FILE)
        self._state_fd = self._files.open(self, self._state_path, os.O_RDWR | os.O_CREAT)
        self._lock_depth = 0
        try:
            if os.fstat(self._state_fd).st_size < STATE_BYTES:
                os.ftruncate(self._state_fd, STATE_BYTES)
            self._map = Mapping(self._state_fd, STATE_BYTES)  # holds no descriptor
        except BaseException as error:
            self._files.close(self)
            if is_exhaustion(error):  # vm.max_map_count reached: as retriable as EMFILE
                raise OutOfDescriptors(error.errno, f"cannot map {self._state_path}: "
                                                    f"{error.strerror}") from None
            raise
        self.state = self._map.words
        self.producers = ProducerTable(directory, settings.producer_expiration_ms,
                                       settings.max_producers, self.state,
                                       W_PRODUCERS_GENERATION)
        self.aborted = transactions.AbortedIndex(directory, self._files)
        self._segments: dict[int, Segment] = {}
        self._bases: list[int] = []
        self._segments_version = -1
        self.on_offline = None  # called once marked offline (the registry bumps the epoch)

    def close(self) -> None:
        for segment in self._segments.values():
            segment.close()
        self._segments.clear()
        self.producers.close()
        self.aborted.close()
        self._map.close()
        self._files.close(self)
        self._state_fd = -1

    def files_evicted(self) -> None:
        """The registry's OpenFiles closed the state file (its mapping stays)."""
        self._state_fd = -1

    # --- shared state ---------------------------------------------------------------------

    @property
    def high_watermark(self) -> int:
        return self.state[W_HIGH_WATERMARK]

    @property
    def log_start_offset(self) -> int:
        return self.state[W_LOG_START]

    @property
    def log_end_offset(self) -> int:
        return self.state[W_LOG_END]

    @property
    def last_stable_offset(self) -> int:
        """Where read_committed fetches stop: the first offset of the earliest ongoing
        transaction (not below the log start), else the high watermark."""
        high = self.state[W_HIGH_WATERMARK]  # first: see the docstring's write order
        ongoing = self.state[W_ONGOING_FIRST]
        if not ongoing:
            return high
        return min(high, max(ongoing - 1, self.state[W_LOG_START]))

    @property
    def offline(self) -> bool:
        return self.state[W_OFFLINE] != 0

    @property
    def active_base(self) -> int:
        return self.state[W_ACTIVE_BASE]

    def segments_changed(self) -> None:
        """A closed segment's files were replaced (compaction), under the lock: every process
        reopens its segments at its next read."""
        self.state[W_SEGMENTS_VERSION] += 1

    @contextmanager
    def locked(self):
        """The partition's exclusive lock (a flock on the state file, held by the open file:
        pinned among the open files until released)."""
        fd = self._lock_fd()
        self._files.pin(self)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._lock_depth += 1
            try:
                yield
            finally:
                self._lock_depth -= 1
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            self._files.unpin(self)

    def _lock_fd(self) -> int:
        if self._state_fd < 0:
            self._state_fd = self._files.open(self, self._state_path, os.O_RDWR)
        else:
            self._files.touch(self)
        return self._state_fd

    def _swap_count(self) -> int:
        return self.state[W_SWAPS]

    @contextmanager
    def _swap_waited(self):
        """Until a compaction swap in progress is done: its maker holds the lock (a shared
        lock waits for it), unless this thread holds it, and then no swap runs."""
        if self._lock_depth:
            yield
            return
        fd = self._lock_fd()
        self._files.pin(self)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            self._files.unpin(self)

    def begin_swap(self) -> None:
        """Compaction, under the lock, before renaming a segment's files: readers opening
        them wait (the counter is odd) or open them again."""
        self.state[W_SWAPS] += 1

    def end_swap(self) -> None:
        self.state[W_SWAPS] += 1
        self.segments_changed()

    # --- segments ------------------------------------------------------------------------

    def _refresh_segments(self) -> None:
        version = self.state[W_SEGMENTS_VERSION]
        if version == self._segments_version:
            return
        bases = list_bases(self.directory)
        active = self.state[W_ACTIVE_BASE]
        for base in list(self._segments):
            # Gone (retention), or perhaps replaced (compaction): reopened when next read.
            if base not in bases or base != active:
                self._segments.pop(base).close()
        self._bases, self._segments_version = bases, version

    def _segment(self, base: int, create: bool = False) -> Segment:
        segment = self._segments.get(base)
        if segment is None:
            segment = Segment(self.directory, base, self._files, create,
                              (self._swap_count, self._swap_waited))
            self._segments[base] = segment
        return segment

    # --- appending ------------------------------------------------------------------------

    def check(self, batch_bytes, fault_room: FaultRoom | None = None) -> records.BatchCheck:
        """The validation of a batch for this partition (its header now, records by steps);
        `fault_room`: how many faulty records its answer may list (record_errors)."""
        settings = self.settings
        return records.BatchCheck(batch_bytes, settings.max_message_bytes, settings.timestamps,
                                  max_decompressed=settings.max_decompressed_bytes,
                                  keyed=settings.compacted,
                                  log_append_time=settings.log_append_time,
                                  codec=settings.compression, where=self.name,
                                  fault_room=fault_room)

    def append(self, batch_bytes: bytes, checked: records.Batch | None = None) -> AppendResult:
        """Validate (unless `checked` is the header a finished check gave: then `batch_bytes`
        is the batch it stores), assign offsets, write; the result carries Kafka's error name
        on failure."""
        batch = checked
        if batch is None:
            try:
                check = self.check(batch_bytes)
                while not check.step(1 << 62):
                    pass
                batch, batch_bytes = check.batch, check.stored or batch_bytes
            except records.BatchError as error:
                return AppendResult(error.code, message=str(error))
        append_time = -1
        if self.settings.log_append_time:  # the topic's message.timestamp.type
            append_time = int(time.time() * 1000)
            batch_bytes = records.with_log_append_time(batch_bytes, append_time)
            batch = batch._replace(max_timestamp=append_time,
                                   attributes=batch.attributes | records.LOG_APPEND_TIME)
        else:  # the attributes and max timestamp the check decided
            batch_bytes = records.restamped(batch_bytes, batch)
        with self.locked():
            refused = self._writable_locked()
            result = refused or self._append_locked(batch_bytes, batch)
        result.log_append_time = append_time
        return result

    def _writable_locked(self) -> AppendResult | None:
        """Under the lock, before an append: the refusal of an offline partition, after
        repairing one a writer died in (dirty); None when the append may go on."""
        if self.offline:
            return AppendResult("kafka_storage_error", message="the partition is offline")
        if self.state[W_DIRTY]:
            try:
                self._repair()
            except Exception as error:  # files we cannot repair: this partition only pays
                if is_exhaustion(error):  # not the files' fault: dirty stays, a retry repairs
                    return AppendResult("kafka_storage_error", message=str(error))
                self.mark_offline(error)
                return AppendResult("kafka_storage_error", message="the partition is offline")
        return None

    def mark_offline(self, cause: BaseException) -> None:
        """Serve nothing from this partition until a restart recovers it (see the docstring)."""
        log.error("partition %s-%d is offline: %s", self.topic, self.index, cause)
        self.state[W_OFFLINE] = 1
        if self.on_offline is not None:
            self.on_offline()

    def _append_locked(self, batch_bytes: bytes, batch: records.Batch) -> AppendResult:
        state = self.state
        idempotent = batch.producer_id >= 0 and batch.base_sequence >= 0
        if idempotent:
            verdict, original = self.producers.check(batch.producer_id, batch.producer_epoch,
                                                     batch.base_sequence, batch.last_sequence)
            if verdict is Verdict.DUPLICATE:
                return AppendResult(None, original, state[W_LOG_START])
            if verdict is not Verdict.APPEND:
                return AppendResult(verdict.value, message=f"producer {batch.producer_id}: "
                                                           f"{verdict.value}")
        opens = _in_transaction(batch) and self.producers.first_offset(batch.producer_id) is None
        state[W_DIRTY] = os.getpid()
        base_offset = self._place(batch_bytes, batch, opens)
        if idempotent:
            self.producers.record(batch.producer_id, batch.producer_epoch, batch.base_sequence,
                                  batch.last_sequence, base_offset, state[W_APPENDS])
        if opens:
            self.producers.begin_if_none(batch.producer_id, batch.producer_epoch, base_offset)
        self._count_unflushed(batch.record_count)
        state[W_DIRTY] = 0
        return AppendResult(None, base_offset, state[W_LOG_START])

    def _place(self, batch_bytes: bytes, batch: records.Batch, opens_txn: bool = False) -> int:
        """Write a batch at the log end (rolling first if due), index it, publish it; returns
        its base offset.  `opens_txn`: it opens a transaction, which the LSO must hold back
        before the high watermark lets readers see the batch."""
        state = self.state
        base_offset = state[W_LOG_END]
        full = state[W_ACTIVE_SIZE] + batch.size > self.settings.segment_bytes
        # Offsets are kept relative to the segment's base in 32 bits: roll before they overflow.
        far = base_offset + batch.last_offset_delta - state[W_ACTIVE_BASE] > MAX_RELATIVE_OFFSET
        if state[W_ACTIVE_SIZE] and (full or far or self._aged(state)):
            self._roll(base_offset)
        if state[W_ACTIVE_SIZE] == 0 or state[W_SEGMENT_STARTED] == 0:
            state[W_SEGMENT_STARTED] = int(time.time() * 1000)
        segment = self._segment(state[W_ACTIVE_BASE], create=True)
        position = state[W_ACTIVE_SIZE]
        segment.write_batch(position, base_offset, batch_bytes)
        if state[W_SINCE_INDEX] >= self.settings.index_interval_bytes or state[W_INDEX_ENTRIES] == 0:
            if state[W_INDEX_ENTRIES]:  # the previous region closes: its time entry first
                segment.add_time_entry(state[W_INDEX_ENTRIES] - 1, state[W_SEGMENT_MAX_TS])
            segment.add_index_entry(state[W_INDEX_ENTRIES], base_offset, position)
            state[W_INDEX_ENTRIES] += 1
            state[W_SINCE_INDEX] = 0
        state[W_SINCE_INDEX] += batch.size
        if batch.max_timestamp > state[W_SEGMENT_MAX_TS]:
            state[W_SEGMENT_MAX_TS] = batch.max_timestamp
        state[W_ACTIVE_SIZE] = position + batch.size
        next_offset = base_offset + batch.last_offset_delta + 1
        state[W_LOG_END] = next_offset
        if opens_txn and not state[W_ONGOING_FIRST]:
            state[W_ONGOING_FIRST] = base_offset + 1
        state[W_HIGH_WATERMARK] = next_offset
        state[W_APPENDS] += 1
        return base_offset

    def _count_unflushed(self, messages: int) -> None:
        """flush.messages: fsync once that many were appended since the last flush."""
        self.state[W_UNFLUSHED] += messages
        if self.state[W_UNFLUSHED] >= self.settings.flush_interval_messages:
            self._flush_locked()

    # --- transactions ---------------------------------------------------------------------

    def append_marker(self, producer_id: int, producer_epoch: int, commit: bool,
                      coordinator_epoch: int = 0) -> AppendResult:
        """End the producer's transaction here (WriteTxnMarkers): append its COMMIT or ABORT
        control batch at the log end, then close the transaction in the producer table and,
        for an ABORT, add it to the aborted-transaction index.  A producer with no transaction
        open here still gets its marker (as Kafka), but no index entry.  A marker older than
        the epoch the table knows is refused: "invalid_producer_epoch"."""
        marker = transactions.marker_batch(producer_id, producer_epoch, commit,
                                           coordinator_epoch, int(time.time() * 1000))
        header = records.read_header(marker)
        with self.locked():
            refused = self._writable_locked()
            if refused is not None:
                return refused
            known = self.producers.epoch_of(producer_id)
            if known is not None and producer_epoch < known:
                return AppendResult("invalid_producer_epoch",
                                    message=f"producer {producer_id}: marker epoch "
                                            f"{producer_epoch} is older than {known}")
            state = self.state
            state[W_DIRTY] = os.getpid()
            offset = self._place(marker, header)
            self._end_transaction(producer_id, producer_epoch, commit, offset)
            self._count_unflushed(1)
            state[W_DIRTY] = 0
            return AppendResult(None, offset, state[W_LOG_START])

    def _end_transaction(self, producer_id: int, epoch: int, commit: bool,
                         marker_offset: int) -> None:
        """Under the lock, the marker at `marker_offset` placed: close the transaction in the
        table, index it if aborted, then let the LSO move up (see the docstring's order)."""
        first = self.producers.end(producer_id, epoch)
        if first is not None and not commit:
            self._index_abort(producer_id, first, marker_offset)
        ongoing = self.state[W_ONGOING_FIRST]
        # It was the earliest: the next one is now.  Or the table had forgotten it (a reset
        # after a crash mid-rewrite): the word may be stale, and this marker heals it.
        if ongoing and (first is None or ongoing == first + 1):
            self._recompute_ongoing()

    def _index_abort(self, producer_id: int, first: int, marker_offset: int) -> None:
        """Add an aborted transaction to the index (the entry before its count), unless the
        index has it already (a repair's replay)."""
        state = self.state
        count = state[W_ABORTED_COUNT]
        self.aborted.refresh(count, state[W_ABORTED_VERSION])
        if marker_offset > self.aborted.last_offset():  # entries are in marker order
            self.aborted.write(count, producer_id, first, marker_offset)
            state[W_ABORTED_COUNT] = count + 1

    def _recompute_ongoing(self) -> None:
        ongoing = self.producers.ongoing()
        self.state[W_ONGOING_FIRST] = ongoing[0][2] + 1 if ongoing else 0

    def aborted_ranges(self) -> dict[int, list[tuple[int, int]]]:
        """producer id -> (first offset, marker offset) of each of its aborted transactions
        (the cleaner drops their records)."""
        self.aborted.refresh(self.state[W_ABORTED_COUNT], self.state[W_ABORTED_VERSION])
        return self.aborted.ranges()

    def aborted_transactions(self, fetch_offset: int, upper: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions a read_committed fetch of
        [fetch_offset, upper) must be told about: marker at or past `fetch_offset`, first
        offset below `upper`.  Without the lock; read the LSO before calling (every
        transaction that began below it and was aborted is counted by then)."""
        version = self.state[W_ABORTED_VERSION]
        count = self.state[W_ABORTED_COUNT]
        if count == 0:
            return []
        self.aborted.refresh(count, version)
        self.aborted.trim(self.state[W_LOG_START])
        return self.aborted.matching(fetch_offset, upper)

    def _aged(self, state) -> bool:
        """segment.ms: the active segment got its first batch that long ago (by the broker's
        clock, as Kafka without record timestamps: a producer's old timestamps cannot make
        every append roll).  Unknown after a restart: it counts from the next append."""
        started = state[W_SEGMENT_STARTED]
        return started > 0 and time.time() * 1000 - started > self.settings.segment_ms

    def _roll(self, base_offset: int) -> None:
        """Start a new active segment at `base_offset` (the files exist before readers look)."""
        state = self.state
        old = self._segment(state[W_ACTIVE_BASE])
        entries = state[W_INDEX_ENTRIES]
        if entries:  # its last region closes
            old.add_time_entry(entries - 1, state[W_SEGMENT_MAX_TS])
        old.truncate(state[W_ACTIVE_SIZE], entries, entries)
        self._segment(base_offset, create=True)
        state[W_ACTIVE_BASE] = base_offset
        state[W_ACTIVE_SIZE] = 0
        state[W_INDEX_ENTRIES] = 0
        state[W_SINCE_INDEX] = 0
        state[W_SEGMENT_MAX_TS] = -1
        state[W_SEGMENTS_VERSION] += 1

    # --- flushing and retention -----------------------------------------------------------

    def flush(self, always: bool = False) -> None:
        """fsync what was appended since the last flush (`always`: the state too, even with
        nothing appended: a clean shutdown)."""
        with self.locked():
            self._flush_locked(always)

    def _flush_locked(self, always: bool = False) -> None:
        if not self.state[W_UNFLUSHED] and not always:
            return
        self._refresh_segments()
        # Every segment written since the last flush: several may have rolled meanwhile.
        for base in self._bases:
            if base >= self.state[W_FLUSHED_BASE]:
                self._segment(base).flush()
        if self.state[W_ACTIVE_BASE] != self.state[W_FLUSHED_BASE] or always:
            _fsync_directory(self.directory)  # new segment files are durable names too
        self.state[W_UNFLUSHED] = 0
        self.state[W_FLUSHED_BASE] = self.state[W_ACTIVE_BASE]
        self.state[W_LAST_FLUSH] = time.time_ns()
        self._map.flush()  # msync: the state (log end) as durable as the data
        self.producers.flush()
        self.aborted.flush()

    def consistent(self) -> str | None:
        """Why the state file disagrees with the segments on disk, or None (a clean start-up
        trusts the state only if this holds)."""
        state = self.state
        if state[W_MAGIC] != STATE_MAGIC:
            return "no valid state"
        bases = list_bases(self.directory)
        if not bases:
            return "no segment"
        if os.path.isdir(os.path.join(self.directory, compaction.CLEANING_DIR)):
            return "a compaction was interrupted"
        if state[W_ACTIVE_BASE] != bases[-1] or state[W_LOG_START] != self._log_start(bases):
            return "segments differ from the state"
        size = os.path.getsize(os.path.join(self.directory, f"{bases[-1]:020d}.log"))
        if size != state[W_ACTIVE_SIZE]:
            return f"active segment holds {size} bytes, the state says {state[W_ACTIVE_SIZE]}"
        if state[W_LOG_END] < state[W_ACTIVE_BASE] or state[W_HIGH_WATERMARK] != state[W_LOG_END]:
            return "offsets out of order"
        if size and not state[W_INDEX_ENTRIES]:
            return "an active segment without index entries"
        path = os.path.join(self.directory, transactions.ABORTED_FILE)
        entries = os.path.getsize(path) // transactions.ENTRY.size if os.path.exists(path) else 0
        if entries != state[W_ABORTED_COUNT]:
            return "the aborted-transaction index differs from the state"
        ongoing = self.producers.ongoing()
        if state[W_ONGOING_FIRST] != (ongoing[0][2] + 1 if ongoing else 0):
            return "the ongoing transactions differ from the state"
        return None

    def unflushed_messages(self) -> int:
        return self.state[W_UNFLUSHED]

    def last_flush_ns(self) -> int:
        """When the last fsync of this partition ended (time.time_ns; 0: none yet)."""
        return self.state[W_LAST_FLUSH]

    def enforce_retention(self, retention_bytes: int, retention_ms: int, now: float) -> int:
        """Delete whole non-active segments past either limit; return how many were deleted."""
        deleted = 0
        with self.locked():
            bases = list_bases(self.directory)
            active = self.state[W_ACTIVE_BASE]
            sizes = {base: os.path.getsize(os.path.join(self.directory, f"{base:020d}.log"))
                     for base in bases}
            total = sum(sizes.values())
            for base, following in zip(bases, bases[1:]):
                if base == active:
                    break
                path = os.path.join(self.directory, f"{base:020d}.log")
                too_big = 0 <= retention_bytes <= total - sizes[base]
                too_old = retention_ms >= 0 and now - os.path.getmtime(path) > retention_ms / 1000
                if not (too_big or too_old):
                    break
                total -= sizes[base]
                self._delete_segment(base, following)
                deleted += 1
        return deleted

    def delete_records(self, offset: int) -> tuple[int, str | None]:
        """DeleteRecords: move the log start offset up to `offset` (-1: the high watermark),
        deleting the segments wholly below it.  (log start offset, Kafka error name or None);
        an offset past the high watermark is OFFSET_OUT_OF_RANGE, one below the start is a
        success that changes nothing."""
        with self.locked():
            high = self.state[W_HIGH_WATERMARK]
            offset = high if offset == -1 else offset
            if not 0 <= offset <= high:
                return self.state[W_LOG_START], "offset_out_of_range"
            if offset <= self.state[W_LOG_START]:
                return self.state[W_LOG_START], None
            write_atomically(os.path.join(self.directory, LOG_START_FILE), b"%d\n" % offset)
            bases = list_bases(self.directory)
            active = self.state[W_ACTIVE_BASE]
            for base, following in zip(bases, bases[1:]):
                if base == active or following > offset:
                    break
                self._delete_segment(base, following)
            self.state[W_LOG_START] = offset
            self.state[W_SEGMENTS_VERSION] += 1
            return offset, None

    def producer_states(self) -> list[ProducerState]:
        """DescribeProducers' view, with each producer's current_txn_start_offset (-1:
        none): the producers not expired that wrote here or have a transaction open."""
        with self.locked():
            return self.producers.states()

    def _delete_segment(self, base: int, following: int) -> None:
        """Remove a whole non-active segment; the log starts at `following` at the earliest."""
        self.state[W_LOG_START] = max(following, self.state[W_LOG_START])
        self.state[W_SEGMENTS_VERSION] += 1
        for suffix in ("log", "index", "timeindex"):
            try:
                os.unlink(os.path.join(self.directory, f"{base:020d}.{suffix}"))
            except FileNotFoundError:  # a segment older than the time index
                pass

    def _log_start(self, bases: list[int]) -> int:
        """The log start offset the files say: the first base, or DeleteRecords' if later."""
        try:
            with open(os.path.join(self.directory, LOG_START_FILE), "rb") as handle:
                recorded = int(handle.read().strip() or 0)
        except (FileNotFoundError, ValueError):
            recorded = 0
        return max(bases[0], recorded)

    # --- reading --------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, at_least_one: bool = True,
             upper: int | None = None) -> tuple[bytes, int]:
        """The bytes of `read_regions`, copied: (bytes, high mark)."""
        pieces, high = self.read_regions(offset, max_bytes, at_least_one, upper, _read_piece)
        return b"".join(pieces), high

    def read_regions(self, offset: int, max_bytes: int, at_least_one: bool = True,
                     upper: int | None = None, piece=None) -> tuple[list, int]:
        """Where the batches from the one holding `offset` on lie, up to `max_bytes` (but at
        least one whole batch if `at_least_one`), never past the high watermark nor holding
        an offset at or past `upper` (the LSO, for read_committed): (pieces, high mark).
        Only batch headers are read (the index leads to them), so the data itself can go to
        a socket without entering Python.

        Each region becomes `piece(segment, position, length)` as soon as it is found (by
        default the tuple itself): the segment's descriptor is valid then, but opening the
        next segment may evict it (files.py), so a piece that needs the file later takes
        its own `dup` of `segment.log_fd()` there and then."""
        if piece is None:
            piece = _region
        state = self.state
        high = state[W_HIGH_WATERMARK]  # first: every batch below it is whole on disk
        stop = high if upper is None else min(upper, high)
        if offset >= stop:
            return [], high
        self._refresh_segments()
        regions, room, bases = [], max_bytes, self._bases
        slot = max(0, bisect.bisect_right(bases, offset) - 1)
        while slot < len(bases) and offset < stop:
            base = bases[slot]
            active = base == state[W_ACTIVE_BASE]
            valid = state[W_INDEX_ENTRIES] if active else None
            segment = self._segment(base)
            end = state[W_ACTIVE_SIZE] if active else segment.size()
            if slot + 1 == len(bases) or bases[slot + 1] > stop:  # may hold batches past it
                cut = segment.find_position(stop, end, valid)
                end = end if cut is None else cut[0]
            found = segment.find_position(offset, end, valid)
            if found is None:
                slot += 1
                continue
            position = found[0]
            whole = segment.whole_batches_end(position, min(end, position + max(room, 0)), valid)
            if whole == position:
                if at_least_one and not regions:  # bigger than max_bytes: whole (KIP-74)
                    size = records.read_header(segment.read(position, records.HEADER_BYTES)).size
                    regions.append(piece(segment, position, size))
                break
            regions.append(piece(segment, position, whole - position))
            room -= whole - position
            if whole < end or room <= 0:
                break
            slot += 1
            offset = bases[slot] if slot < len(bases) else stop
        return regions, high

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or past the log start offset stamped
        at or after `timestamp`.

        The time index leads to the one region of one segment where the answer lies (see
        segment.py); inside the batch the records are read one by one (a compressed batch
        decompressed, bounded by pybroker.max.decompressed.batch.bytes), as Kafka does.  In
        the segment the log starts in (after DeleteRecords), the search starts at the log
        start's batch and may go on to the segment's end, as Kafka's does.
        """
        high, first = self.state[W_HIGH_WATERMARK], self.state[W_LOG_START]
        self._refresh_segments()
        for base in self._bases:
            region = self._region(base, timestamp)
            if region is None:
                continue
            segment, start, end = region
            if first > base:
                start, end = self._from_log_start(segment, base, start, first)
            for position, batch in segment.batches_from(start, end):
                if batch.base_offset >= high:
                    return None
                if batch.max_timestamp < timestamp or batch.last_offset < first:
                    continue
                found = records.first_record_from(segment.read(position, batch.size),
                                                  timestamp, self.settings.max_decompressed_bytes,
                                                  first)
                if found is not None:
                    return found
                if batch.base_offset >= first:  # records that do not parse: the batch's own
                    return batch.base_offset, batch.max_timestamp
        return None

    def _from_log_start(self, segment: Segment, base: int, start: int,
                        first: int) -> tuple[int, int]:
        """(start, end) of a timestamp search in a segment the log start offset `first` is
        past the base of: from the later of `start` and the batch holding `first`, to the
        segment's end (records at or past `first` stamped late enough may lie beyond the
        region the time index names)."""
        active = base == self.state[W_ACTIVE_BASE]
        end = self.state[W_ACTIVE_SIZE] if active else segment.size()
        found = segment.find_position(first, end, self.state[W_INDEX_ENTRIES] if active else None)
        return (end, end) if found is None else (max(start, found[0]), end)

    def max_timestamp_offset(self) -> tuple[int, int] | None:
        """(offset, timestamp) of the record with the largest timestamp (ListOffsets -3,
        KIP-734): the first batch whose max timestamp is the greatest, then inside it the
        first record carrying that timestamp."""
        high = self.state[W_HIGH_WATERMARK]
        self._refresh_segments()
        greatest = max((((self._time_maxima(base) or [-1])[-1], base) for base in self._bases),
                       default=(-1, 0))
        if greatest[0] < 0:
            return None
        region = self._region(greatest[1], greatest[0])
        if region is None:
            return None
        segment, start, end = region
        for position, batch in segment.batches_from(start, end):
            if batch.base_offset >= high:
                return None
            if batch.max_timestamp >= greatest[0]:
                found = records.first_record_from(segment.read(position, batch.size),
                                                  batch.max_timestamp,
                                                  self.settings.max_decompressed_bytes)
                return found if found is not None and found[1] == batch.max_timestamp \
                    else (batch.last_offset, batch.max_timestamp)
        return None

    def _time_maxima(self, base: int) -> list[int]:
        """A segment's time index: the greatest timestamp up to the end of each region."""
        segment = self._segment(base)
        active = base == self.state[W_ACTIVE_BASE]
        count = self.state[W_INDEX_ENTRIES] if active else len(segment.index_entries())
        if count == 0:
            return []
        maxima = segment.time_entries(count - 1 if active else count)
        if maxima is None:  # written before the time index existed, or cut short
            with self.locked():
                maxima = self._rebuild_time_index(segment, base)
        return maxima + [self.state[W_SEGMENT_MAX_TS]] if active else maxima

    def _rebuild_time_index(self, segment: Segment, base: int) -> list[int]:
        active = base == self.state[W_ACTIVE_BASE]
        end = self.state[W_ACTIVE_SIZE] if active else segment.size()
        segment.rebuild_time_index(end)
        maxima = segment.time_entries(len(segment.index_entries(
            self.state[W_INDEX_ENTRIES] if active else None))) or []
        if active and maxima:  # the open region's maximum lives in the state
            self.state[W_SEGMENT_MAX_TS] = maxima[-1]
            segment.truncate_time(len(maxima) - 1)
            maxima = maxima[:-1]
        return maxima

    def _region(self, base: int, timestamp: int):
        """(segment, start, end): the region (whole batches) holding the first batch stamped
        at or after `timestamp`, or None if no batch of this segment is."""
        maxima = self._time_maxima(base)
        if not maxima or maxima[-1] < timestamp:
            return None
        segment = self._segment(base)
        active = base == self.state[W_ACTIVE_BASE]
        entries = segment.index_entries(self.state[W_INDEX_ENTRIES] if active else None)
        region = bisect.bisect_left(maxima, timestamp)
        if region + 1 < len(entries):  # the region ends where the next one starts
            return segment, entries[region][1], entries[region + 1][1]
        return segment, entries[region][1], self.state[W_ACTIVE_SIZE] if active else segment.size()

    # --- recovery -------------------------------------------------------------------------

    def recover(self) -> int:
        """Rebuild the state from the files (start-up, or after a writer died mid-append).

        The active (last) segment is scanned batch by batch; the first incomplete or corrupt
        batch and everything after it is cut.  Returns the number of bytes cut.
        """
        with self.locked():
            return self._repair()

    def _repair(self) -> int:
        state = self.state
        if state[W_MAGIC] != STATE_MAGIC:
            self._initialise_state()
        if compaction.finish_swaps(self.directory):  # a cleaner stopped mid-swap: finish it
            self._segments_version = -1
            for segment in self._segments.values():
                segment.close()
            self._segments.clear()
        if state[W_SWAPS] & 1:  # its maker died mid-swap: finished above, readers go on
            state[W_SWAPS] += 1
        bases = list_bases(self.directory)
        if not bases:
            base = max(0, state[W_LOG_END])
            self._segment(base, create=True)
            bases = [base]
        active_base = bases[-1]
        segment = self._segment(active_base)
        size_before = segment.size()
        position, next_offset, entries, since, interval = 0, active_base, 0, 0, self.settings.index_interval_bytes
        greatest, aborts = -1, []
        for batch_position, batch in segment.scan():
            if entries == 0 or since >= interval:
                if entries:
                    segment.add_time_entry(entries - 1, greatest)
                segment.add_index_entry(entries, batch.base_offset, batch_position)
                entries, since = entries + 1, 0
            since += batch.size
            greatest = max(greatest, batch.max_timestamp)
            position = batch_position + batch.size
            next_offset = batch.next_offset
            if batch.producer_id >= 0 and batch.base_sequence >= 0:
                verdict, _ = self.producers.check(batch.producer_id, batch.producer_epoch,
                                                  batch.base_sequence, batch.last_sequence)
                # In the log, so appended once: known again (unless already remembered).
                if verdict in (Verdict.APPEND, Verdict.UNKNOWN):
                    state[W_APPENDS] += 1
                    self.producers.record(batch.producer_id, batch.producer_epoch,
                                          batch.base_sequence, batch.last_sequence,
                                          batch.base_offset, state[W_APPENDS])
            if batch.producer_id >= 0 and batch.attributes & records.TRANSACTIONAL:
                self._replay_transactional(segment, batch_position, batch, aborts)
        segment.truncate(position, entries, max(0, entries - 1))
        self._repair_aborted(next_offset, aborts)
        self._recompute_ongoing()  # before the high watermark below, as appends do
        state[W_SEGMENT_MAX_TS] = greatest
        # Retention deletes whole segments; DeleteRecords may have moved it further.
        state[W_LOG_START] = min(self._log_start(bases), next_offset)
        state[W_ACTIVE_BASE] = active_base
        state[W_ACTIVE_SIZE] = position
        state[W_INDEX_ENTRIES] = entries
        state[W_SINCE_INDEX] = since
        state[W_LOG_END] = next_offset
        state[W_HIGH_WATERMARK] = next_offset
        state[W_SEGMENTS_VERSION] += 1
        state[W_DIRTY] = 0
        state[W_OFFLINE] = 0  # recovered: serving again
        return size_before - position

    def _replay_transactional(self, segment: Segment, position: int, batch: records.Batch,
                              aborts: list) -> None:
        """Repair: bring the table up to a transactional batch of the active segment, in log
        order, whether or not the writer that appended it got that far.  A data batch opens a
        transaction unless one is open; a marker ends the open one only if it began before
        the marker (else the marker was applied and a later transaction is open).  Aborts
        are collected for the index, which is put right once the log end is known."""
        producer_id, epoch = batch.producer_id, batch.producer_epoch
        if not batch.attributes & records.CONTROL:
            self.producers.begin_if_none(producer_id, epoch, batch.base_offset)
            return
        kind = transactions.control_type(segment.read(position, batch.size))
        if kind is None:
            return
        first = self.producers.first_offset(producer_id)
        if first is not None and first >= batch.base_offset:
            return
        first = self.producers.end(producer_id, epoch)
        if first is not None and kind == transactions.ABORT:
            aborts.append((producer_id, first, batch.base_offset))

    def _repair_aborted(self, log_end: int, aborts: list) -> None:
        """Repair: the index keeps its whole entries whose marker the log still holds, plus
        the replayed aborts it lacks; readers drop what they cached (the version word)."""
        state = self.state
        kept = self.aborted.kept_below(log_end)
        state[W_ABORTED_COUNT] = min(state[W_ABORTED_COUNT], kept)  # never past the cut
        state[W_ABORTED_VERSION] += 1
        self.aborted.truncate(kept)
        state[W_ABORTED_COUNT] = kept
        for producer_id, first, last in aborts:
            self._index_abort(producer_id, first, last)

    def _initialise_state(self) -> None:
        state = self.state
        generation = state[W_PRODUCERS_GENERATION]  # only ever grows: others may hold a map
        for word in range(STATE_WORDS):
            state[word] = 0
        state[W_PRODUCERS_GENERATION] = generation
        self.producers.clear()
        state[W_MAGIC] = STATE_MAGIC


def _region(segment: Segment, position: int, length: int) -> tuple[Segment, int, int]:
    return segment, position, length


def _read_piece(segment: Segment, position: int, length: int) -> bytes:
    return segment.read(position, length)


def _in_transaction(batch: records.Batch) -> bool:
    """A transactional data batch (not a marker) of a producer: it belongs to the producer's
    transaction on the partition, opening one if none is open."""
    return (batch.producer_id >= 0 and bool(batch.attributes & records.TRANSACTIONAL)
            and not batch.attributes & records.CONTROL)


def has_open_transaction(directory: str) -> bool:
    """Whether the partition in `directory` has a transaction open (state word 17), read
    without opening a handle on it: a sweep over every partition stays cheap."""
    try:
        fd = os.open(os.path.join(directory, STATE_FILE), os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        word = os.pread(fd, 8, 8 * W_ONGOING_FIRST)
    finally:
        os.close(fd)
    return len(word) == 8 and int.from_bytes(word, sys.byteorder, signed=True) != 0


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
