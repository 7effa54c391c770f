"""A partition's state rebuilt from its files: at start-up, and after a writer died mid-append.

`repair` runs under the partition lock.  It finishes a compaction swap a cleaner left half
done, scans the active (last) segment batch by batch and cuts the first incomplete or
corrupt batch and everything after it, rebuilds the segment's index and time index, replays
the idempotent producers and transactional batches into the producer table, puts the
aborted-transaction index right, and writes the state's words again (the last stable
offset's word before the high watermark, as appends do; `dirty` cleared last).

`inconsistency` is what a clean start-up asks before trusting the state file as it is.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from broker.shared.log import compaction, control_batches, records
from broker.shared.log.partition_state import (STATE_MAGIC, W_ABORTED_COUNT, W_ABORTED_VERSION,
                                               W_ACTIVE_BASE, W_ACTIVE_SIZE, W_APPENDS, W_DIRTY,
                                               W_HIGH_WATERMARK, W_INDEX_ENTRIES, W_LOG_END,
                                               W_LOG_START, W_MAGIC, W_OFFLINE, W_ONGOING_FIRST,
                                               W_SEGMENT_MAX_TS, W_SEGMENTS_VERSION,
                                               W_SINCE_INDEX, W_SWAPS)
from broker.shared.log.producers import Verdict
from broker.shared.log.retention import log_start_on_disk
from broker.shared.log.segment import Segment, list_bases, segment_name

if TYPE_CHECKING:
    from broker.shared.log.partition import Partition


def repair(partition: Partition) -> int:
    """Rebuild the partition's state from its files (its lock held); returns the number of
    bytes cut from the active segment."""
    state = partition.state
    if state[W_MAGIC] != STATE_MAGIC:
        _reset(partition)
    if compaction.finish_swaps(partition.directory):  # a cleaner stopped mid-swap: finish it
        partition.segments.close()
    if state[W_SWAPS] & 1:  # its maker died mid-swap: finished above, readers go on
        state[W_SWAPS] += 1
    bases = list_bases(partition.directory)
    if not bases:
        base = max(0, state[W_LOG_END])
        partition.segments.get(base, create=True)
        bases = [base]
    active_base = bases[-1]
    segment = partition.segments.get(active_base)
    size_before = segment.size()
    position, next_offset, entries, since = 0, active_base, 0, 0
    interval = partition.settings.index_interval_bytes
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
            _replay_idempotent(partition, batch)
        if batch.producer_id >= 0 and batch.attributes & records.TRANSACTIONAL:
            _replay_transactional(partition, segment, batch_position, batch, aborts)
    segment.truncate(position, entries, max(0, entries - 1))
    _repair_aborted(partition, next_offset, aborts)
    state[W_ONGOING_FIRST] = control_batches.ongoing_word(partition.producers)  # before the HW
    state[W_SEGMENT_MAX_TS] = greatest
    # Retention deletes whole segments; DeleteRecords may have moved it further.
    state[W_LOG_START] = min(log_start_on_disk(partition.directory, bases), next_offset)
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


def inconsistency(partition: Partition) -> str | None:
    """Why the state file disagrees with the segments on disk, or None (a clean start-up
    trusts the state only if this holds)."""
    state, directory = partition.state, partition.directory
    if state[W_MAGIC] != STATE_MAGIC:
        return "no valid state"
    bases = list_bases(directory)
    if not bases:
        return "no segment"
    if os.path.isdir(os.path.join(directory, compaction.CLEANING_DIR)):
        return "a compaction was interrupted"
    if state[W_ACTIVE_BASE] != bases[-1] or \
            state[W_LOG_START] != log_start_on_disk(directory, bases):
        return "segments differ from the state"
    size = os.path.getsize(os.path.join(directory, segment_name(bases[-1], "log")))
    if size != state[W_ACTIVE_SIZE]:
        return f"active segment holds {size} bytes, the state says {state[W_ACTIVE_SIZE]}"
    if state[W_LOG_END] < state[W_ACTIVE_BASE] or state[W_HIGH_WATERMARK] != state[W_LOG_END]:
        return "offsets out of order"
    if size and not state[W_INDEX_ENTRIES]:
        return "an active segment without index entries"
    path = os.path.join(directory, control_batches.ABORTED_FILE)
    entries = os.path.getsize(path) // control_batches.ENTRY.size if os.path.exists(path) else 0
    if entries != state[W_ABORTED_COUNT]:
        return "the aborted-transaction index differs from the state"
    if state[W_ONGOING_FIRST] != control_batches.ongoing_word(partition.producers):
        return "the ongoing transactions differ from the state"
    return None


def _reset(partition: Partition) -> None:
    """A state file without the magic (new, or zeroed): every word and the producer table
    start over; the magic last, so a death midway resets again."""
    partition.state_file.zero()
    partition.producers.clear()
    partition.state[W_MAGIC] = STATE_MAGIC


def _replay_idempotent(partition: Partition, batch: records.Batch) -> None:
    """In the log, so appended once: known again to the producer table (unless already)."""
    state, producers = partition.state, partition.producers
    verdict, _ = producers.check(batch.producer_id, batch.producer_epoch,
                                 batch.base_sequence, batch.last_sequence)
    if verdict in (Verdict.APPEND, Verdict.UNKNOWN):
        state[W_APPENDS] += 1
        producers.record(batch.producer_id, batch.producer_epoch, batch.base_sequence,
                         batch.last_sequence, batch.base_offset, state[W_APPENDS])


def _replay_transactional(partition: Partition, segment: Segment, position: int,
                          batch: records.Batch, aborts: list) -> None:
    """Bring the table up to a transactional batch of the active segment, in log order,
    whether or not the writer that appended it got that far.  A data batch opens a
    transaction unless one is open; a marker ends the open one only if it began before the
    marker (else the marker was applied and a later transaction is open).  Aborts are
    collected for the index, which is put right once the log end is known."""
    producers = partition.producers
    producer_id, epoch = batch.producer_id, batch.producer_epoch
    if not batch.attributes & records.CONTROL:
        producers.begin_if_none(producer_id, epoch, batch.base_offset)
        return
    kind = control_batches.control_type(segment.read(position, batch.size))
    if kind is None:
        return
    first = producers.first_offset(producer_id)
    if first is not None and first >= batch.base_offset:
        return
    first = producers.end(producer_id, epoch)
    if first is not None and kind == control_batches.ABORT:
        aborts.append((producer_id, first, batch.base_offset))


def _repair_aborted(partition: Partition, log_end: int, aborts: list) -> None:
    """The index keeps its whole entries whose marker the log still holds, plus the replayed
    aborts it lacks; readers drop what they cached (the version word)."""
    state, index = partition.state, partition.aborted
    kept = index.kept_below(log_end)
    state[W_ABORTED_COUNT] = min(state[W_ABORTED_COUNT], kept)  # never past the cut
    state[W_ABORTED_VERSION] += 1
    index.truncate(kept)
    state[W_ABORTED_COUNT] = kept
    for producer_id, first, last in aborts:
        control_batches.index_abort(state, index, producer_id, first, last)
