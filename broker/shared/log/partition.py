"""One partition: `<log dir>/<topic>-<n>/` with its segments and a shared state file.

Every worker process may append to and read from every partition.  Appends are serialised by
an exclusive `flock` on the partition's state file, which every process also maps (its words:
partition_state.py).  `Partition` appends, reads and coordinates; its collaborators hold the
other roles: the open segments (segment_cache.py), the rebuild from the files (recovery.py),
lookups by time (time_lookup.py), retention and DeleteRecords (retention.py), the producer
table (producers.py) and the aborted-transaction index (control_batches.py).

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
of the ongoing transactions (W_ONGOING_FIRST), else the high watermark: read_committed
fetches stop there (`read_regions(..., upper=LSO)`) and learn which transactions below it
were aborted (`aborted_transactions`).  Write order keeps lock-free readers safe:
W_ONGOING_FIRST is set before the high watermark that exposes the opening batch (a reader
loads the high watermark first, then that word, so it never sees the batch without the
transaction); a marker is placed and the high watermark published first, then the table,
then the index entry and its count, and only then W_ONGOING_FIRST moves up: when a reader
sees the LSO past a transaction's start, its index entry is already counted.  A writer killed
after placing a marker but before updating the table leaves `dirty`: the repair replays the
active segment's transactional batches and markers into the table (idempotently: a marker
ends a transaction only if it began before it), adds a missing index entry, and recomputes
W_ONGOING_FIRST; a marker torn off by the repair leaves its transaction open (the
coordinator writes it again).  Not guaranteed: a state reset (bad state magic) or a lost
producer file clears the table, and the replay then knows only the transactions the active
segment shows: one opened before it is forgotten, so the LSO passes it and its abort, if
any, gets no index entry.  After a power loss, what the last fsync kept (the index is
fsynced with the segments; entries past the log end are cut).
"""

from __future__ import annotations

import bisect
import logging
import os
import time
from dataclasses import dataclass

from broker.shared.log import control_batches, records, recovery, retention
from broker.shared.log.files import OpenFiles, default_capacity, is_exhaustion
from broker.shared.log.partition_state import (
    W_ABORTED_COUNT, W_ABORTED_VERSION, W_ACTIVE_BASE, W_ACTIVE_SIZE, W_APPENDS, W_DIRTY,
    W_FLUSHED_BASE, W_HIGH_WATERMARK, W_INDEX_ENTRIES, W_LAST_FLUSH, W_LOG_END, W_LOG_START,
    W_OFFLINE, W_ONGOING_FIRST, W_PRODUCERS_GENERATION, W_SEGMENT_MAX_TS, W_SEGMENT_STARTED,
    W_SEGMENTS_VERSION, W_SINCE_INDEX, W_SWAPS, W_UNFLUSHED, StateFile)
from broker.shared.log.producers import ProducerState, ProducerTable, Verdict
from broker.shared.log.record_errors import FaultRoom
from broker.shared.log.segment import MAX_RELATIVE_OFFSET, Segment
from broker.shared.log.segment_cache import SegmentCache
from broker.shared.log.settings import LogSettings
from broker.shared.log.time_lookup import TimeLookup

log = logging.getLogger("broker.shared.log")


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
        files = files if files is not None else OpenFiles(default_capacity())
        self.state_file = StateFile(directory, files)
        self.state = self.state_file.words
        # Bound here, not wrapped: an append takes the lock with no frame in between.
        self.locked = self.state_file.locked
        self.producers = ProducerTable(directory, settings.producer_expiration_ms,
                                       settings.max_producers, self.state,
                                       W_PRODUCERS_GENERATION)
        self.aborted = control_batches.AbortedIndex(directory, files)
        self.segments = SegmentCache(directory, files, self.state_file)
        self._segment = self.segments.get  # the handle on the segment at a base
        self.on_offline = None  # called once marked offline (the registry bumps the epoch)

    def close(self) -> None:
        self.segments.close()
        self.producers.close()
        self.aborted.close()
        self.state_file.close()

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

    def begin_swap(self) -> None:
        """Compaction, under the lock, before renaming a segment's files: readers opening
        them wait (the counter is odd) or open them again."""
        self.state[W_SWAPS] += 1

    def end_swap(self) -> None:
        self.state[W_SWAPS] += 1
        self.segments_changed()

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

    # --- transactions ---------------------------------------------------------------------

    def append_marker(self, producer_id: int, producer_epoch: int, commit: bool,
                      coordinator_epoch: int = 0) -> AppendResult:
        """End the producer's transaction here (WriteTxnMarkers): append its COMMIT or ABORT
        control batch at the log end, then close the transaction in the producer table and,
        for an ABORT, add it to the aborted-transaction index.  A producer with no transaction
        open here still gets its marker (as Kafka), but no index entry.  A marker older than
        the epoch the table knows is refused: "invalid_producer_epoch"."""
        marker = control_batches.marker_batch(producer_id, producer_epoch, commit,
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
            control_batches.index_abort(self.state, self.aborted, producer_id, first,
                                     marker_offset)
        ongoing = self.state[W_ONGOING_FIRST]
        # It was the earliest: the next one is now.  Or the table had forgotten it (a reset
        # after a crash mid-rewrite): the word may be stale, and this marker heals it.
        if ongoing and (first is None or ongoing == first + 1):
            self.state[W_ONGOING_FIRST] = control_batches.ongoing_word(self.producers)

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

    def producer_states(self) -> list[ProducerState]:
        """DescribeProducers' view, with each producer's current_txn_start_offset (-1:
        none): the producers not expired that wrote here or have a transaction open."""
        with self.locked():
            return self.producers.states()

    # --- flushing -------------------------------------------------------------------------

    def flush(self, always: bool = False) -> None:
        """fsync what was appended since the last flush (`always`: the state too, even with
        nothing appended: a clean shutdown)."""
        with self.locked():
            self._flush_locked(always)

    def _flush_locked(self, always: bool = False) -> None:
        if not self.state[W_UNFLUSHED] and not always:
            return
        self.segments.refresh()
        # Every segment written since the last flush: several may have rolled meanwhile.
        for base in self.segments.bases:
            if base >= self.state[W_FLUSHED_BASE]:
                self._segment(base).flush()
        if self.state[W_ACTIVE_BASE] != self.state[W_FLUSHED_BASE] or always:
            _fsync_directory(self.directory)  # new segment files are durable names too
        self.state[W_UNFLUSHED] = 0
        self.state[W_FLUSHED_BASE] = self.state[W_ACTIVE_BASE]
        self.state[W_LAST_FLUSH] = time.time_ns()
        self.state_file.flush()  # msync: the state (log end) as durable as the data
        self.producers.flush()
        self.aborted.flush()

    def unflushed_messages(self) -> int:
        return self.state[W_UNFLUSHED]

    def last_flush_ns(self) -> int:
        """When the last fsync of this partition ended (time.time_ns; 0: none yet)."""
        return self.state[W_LAST_FLUSH]

    # --- recovery (recovery.py) -----------------------------------------------------------

    def recover(self) -> int:
        """Rebuild the state from the files (start-up, or after a writer died mid-append).

        The active (last) segment is scanned batch by batch; the first incomplete or corrupt
        batch and everything after it is cut.  Returns the number of bytes cut.
        """
        with self.locked():
            return self._repair()

    def _repair(self) -> int:
        return recovery.repair(self)

    def consistent(self) -> str | None:
        """Why the state file disagrees with the segments on disk, or None (a clean start-up
        trusts the state only if this holds)."""
        return recovery.inconsistency(self)

    # --- the log start (retention.py) -----------------------------------------------------

    def enforce_retention(self, retention_bytes: int, retention_ms: int, now: float) -> int:
        """Delete whole non-active segments past either limit; return how many were deleted."""
        with self.locked():
            return retention.delete_expired_segments(self.state, self.directory,
                                                     retention_bytes, retention_ms, now)

    def delete_records(self, offset: int) -> tuple[int, str | None]:
        """DeleteRecords (retention.delete_records): (log start offset, Kafka error name or
        None)."""
        with self.locked():
            return retention.delete_records(self.state, self.directory, offset)

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
        segments = self.segments
        segments.refresh()
        regions, room, bases = [], max_bytes, segments.bases
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

    # --- lookups by time (time_lookup.py) -------------------------------------------------

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or past the log start offset stamped
        at or after `timestamp` (TimeLookup.offset_for_timestamp)."""
        return TimeLookup(self.state, self.segments, self.locked).offset_for_timestamp(
            timestamp, self.settings.max_decompressed_bytes)

    def max_timestamp_offset(self) -> tuple[int, int] | None:
        """(offset, timestamp) of the record with the largest timestamp (ListOffsets -3,
        KIP-734)."""
        return TimeLookup(self.state, self.segments, self.locked).max_timestamp_offset(
            self.settings.max_decompressed_bytes)


def _region(segment: Segment, position: int, length: int) -> tuple[Segment, int, int]:
    return segment, position, length


def _read_piece(segment: Segment, position: int, length: int) -> bytes:
    return segment.read(position, length)


def _in_transaction(batch: records.Batch) -> bool:
    """A transactional data batch (not a marker) of a producer: it belongs to the producer's
    transaction on the partition, opening one if none is open."""
    return (batch.producer_id >= 0 and bool(batch.attributes & records.TRANSACTIONAL)
            and not batch.attributes & records.CONTROL)


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
