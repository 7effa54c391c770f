"""Log compaction: a compacted topic keeps, in its closed segments, the latest record of each key.

`clean(partition, ...)` runs in the parent's log maintenance thread (broker.parent.log_manager),
never on a request path.  For one partition of a topic whose cleanup.policy has `compact`:

  1. the closed segments old enough (their file untouched for min.compaction.lag.ms) and
     wholly below the last stable offset (an open transaction's records may still be aborted,
     as Kafka's cleaner stops at the first unstable offset) are read and a map built, records
     of aborted transactions left out (they supersede nothing, and are dropped in step 2): a 16-byte digest of each key -> the offset of its latest record there
     (as Kafka's offset map: memory per key is fixed, whatever the keys' size; at most
     MAX_KEYS keys, the segments past that left for the next round);
  2. each of those segments is rewritten without the records a later one of the same key
     supersedes, and without tombstones (null values) older than delete.retention.ms.  Offsets
     do not change: a batch keeps its base offset, last offset delta, producer fields and
     codec (a compressed batch is decompressed, within pybroker.max.decompressed.batch.bytes,
     and compressed again the same way); a batch left empty goes.  A segment that loses
     nothing is not rewritten;
  3. the rewritten segment (log, offset index, time index) is written to `cleaning/`, fsynced,
     then swapped in under the partition lock: a marker `cleaning/<base>.swap` is written (the
     commit point), the three files renamed over the old ones, the marker removed, and the
     partition's segments version bumped so every process reopens it.  The renames happen
     between two bumps of the partition's swap counter: a reader in another process opening
     that segment's files meanwhile (they are opened as a set, see segment.py) opens them
     again, so it never pairs the new log with the old index;  `finish_swaps`, called
     by recovery, completes a swap whose marker exists and discards cleaned files without one,
     so a `kill -9` at any point leaves either the old segment or the new one, whole.

The rate of bytes written is bounded (log.cleaner.io.max.bytes.per.second) by sleeping between
segments.

As Kafka's cleaner, a partition is taken only when enough of it is dirty: the bytes of the
closed segments past its cleaner checkpoint (`<partition>/cleaner-offset`, written after each
round: the end of what the round mapped) over all its cleanable bytes must exceed
min.cleanable.dirty.ratio; or when tombstones a round had to keep are past delete.retention.ms
(the checkpoint also holds when the first of them may go), as Kafka removes them on a quiet
log too.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import time
from dataclasses import dataclass

from crc32c import crc32c

from broker.shared.log import compression, records
from broker.shared.log.segment import Segment, list_bases, segment_name, write_atomically

CLEANING_DIR = "cleaning"
CHECKPOINT_FILE = "cleaner-offset"  # the end of what the last round mapped
MAX_KEYS = 500_000  # keys mapped per round (about 60 MB); more are cleaned over several rounds
_SUFFIXES = ("log", "index", "timeindex")


@dataclass
class CleanResult:
    segments: int = 0  # segments rewritten
    removed: int = 0  # records removed
    written: int = 0  # bytes written


def clean(partition, now_ms: int, min_lag_ms: int, delete_retention_ms: int,
          max_bytes_per_second: float = float("inf"),
          min_dirty_ratio: float | None = None) -> CleanResult:
    """One cleaning round of a partition (see the module docstring); `min_dirty_ratio`
    None cleans whatever the dirty share."""
    result = CleanResult()
    active = partition.active_base
    # As Kafka's cleaner: only segments wholly below the last stable offset (an open
    # transaction's records may yet be aborted), and aborted records never count.
    stable = partition.last_stable_offset
    directory = partition.directory
    bases = list_bases(directory)
    bound = min(active, stable)
    closed = [base for base, following in zip(bases, bases[1:])
              if following <= bound and _age_ms(directory, base, now_ms) >= min_lag_ms]
    if not closed or (min_dirty_ratio is not None
                      and not dirty_ratio(directory, closed) > min_dirty_ratio
                      and not 0 < read_checkpoint(directory)[1] <= now_ms):
        return result
    limit = partition.settings.max_decompressed_bytes
    aborted = Aborted(partition.aborted_ranges())
    latest, mapped = _offset_map(directory, closed, limit, aborted)
    if mapped:  # segments still inside delete.retention.ms may keep tombstones: when to look
        kept = [now_ms + delete_retention_ms - _age_ms(directory, base, now_ms)
                for base in mapped if _age_ms(directory, base, now_ms) < delete_retention_ms]
        following = [base for base in bases if base > mapped[-1]]
        _write_checkpoint(directory, following[0] if following else active,
                          int(min(kept)) + 1 if kept else 0)
    started = time.monotonic()
    for base in mapped:
        horizon = _age_ms(directory, base, now_ms) >= delete_retention_ms
        rewritten = _rewrite(directory, base, latest, horizon, limit, partition.settings,
                             aborted)
        if rewritten is None:
            continue
        removed, size = rewritten
        if _swap(partition, base):
            result.segments += 1
            result.removed += removed
            result.written += size
        elapsed = time.monotonic() - started
        wanted = result.written / max_bytes_per_second
        if wanted > elapsed:
            time.sleep(wanted - elapsed)  # log.cleaner.io.max.bytes.per.second
    try:
        os.rmdir(os.path.join(directory, CLEANING_DIR))  # left only mid-swap
    except OSError:
        pass
    return result


def dirty_ratio(directory: str, closed: list[int]) -> float:
    """The share of the cleanable segments' bytes past the cleaner checkpoint."""
    checkpoint = read_checkpoint(directory)[0]
    clean = dirty = 0
    for base in closed:
        try:
            size = os.path.getsize(os.path.join(directory, segment_name(base, "log")))
        except FileNotFoundError:  # retention took it meanwhile
            continue
        if base < checkpoint:
            clean += size
        else:
            dirty += size
    return dirty / (clean + dirty) if clean + dirty else 0.0


def read_checkpoint(directory: str) -> tuple[int, int]:
    """(the offset the last round mapped up to, unix ms when tombstones it kept may go, 0 if
    none); (0, 0) when never cleaned or unreadable."""
    try:
        with open(os.path.join(directory, CHECKPOINT_FILE), "rb") as handle:
            offset, deadline = (int(word) for word in handle.read(64).split())
        return max(0, offset), max(0, deadline)
    except (OSError, ValueError):
        return 0, 0


def _write_checkpoint(directory: str, offset: int, tombstones_due_ms: int) -> None:
    write_atomically(os.path.join(directory, CHECKPOINT_FILE),
                     b"%d %d\n" % (offset, tombstones_due_ms))


def _age_ms(directory: str, base: int, now_ms: int) -> float:
    try:
        return now_ms - os.path.getmtime(os.path.join(directory, segment_name(base, "log"))) * 1000
    except FileNotFoundError:
        return -1


# --- reading -------------------------------------------------------------------------------

def _batches(directory: str, base: int):
    """(header, bytes) of each sound batch of a closed segment."""
    segment = Segment(directory, base)  # files of its own, closed at the end
    try:
        for position, batch in segment.scan():
            yield batch, segment.read(position, batch.size)
    finally:
        segment.close()


def batch_records(batch_bytes: bytes, batch: records.Batch, limit: int):
    """(offset delta, key, value, record bytes) of each record, the value None for a
    tombstone; BatchError if the batch cannot be read within `limit` decompressed bytes."""
    codec = batch.attributes & records.CODEC_MASK
    body = batch_bytes[records.HEADER_BYTES:batch.size]
    if codec:
        body = bytes(records.decompress(codec, memoryview(body), limit))
    position = 0
    for _ in range(batch.record_count):
        length, start = records._varint(body, position)
        end = start + length
        if length < 6 or end > len(body):
            raise records.BatchError("corrupt_message", "a record runs past its batch")
        point = start + 1  # past the attributes
        _stamp, point = records._varint(body, point)
        delta, point = records._varint(body, point)
        key_length, point = records._varint(body, point)
        key = None if key_length < 0 else body[point:point + key_length]
        point += max(key_length, 0)
        value_length, point = records._varint(body, point)
        value = None if value_length < 0 else body[point:point + value_length]
        yield delta, key, value, body[position:end]
        position = end


class Aborted:
    """Whether a batch belongs to an aborted transaction (the partition's aborted index)."""

    def __init__(self, ranges: dict[int, list[tuple[int, int]]]):
        self.ranges = ranges

    def __call__(self, batch: records.Batch) -> bool:
        if not batch.attributes & records.TRANSACTIONAL or batch.attributes & records.CONTROL:
            return False
        return any(first <= batch.base_offset <= last
                   for first, last in self.ranges.get(batch.producer_id, ()))


def _offset_map(directory: str, closed: list[int], limit: int, aborted=Aborted({})):
    """key -> latest offset over the closed segments, and the segments it covers whole."""
    latest: dict[bytes, int] = {}
    mapped = []
    for base in closed:
        keys_before = len(latest)
        try:
            for batch, data in _batches(directory, base):
                if batch.attributes & records.CONTROL or aborted(batch):
                    continue  # an aborted record supersedes nothing
                try:
                    for delta, key, _value, _raw in batch_records(data, batch, limit):
                        if key is not None:
                            latest[_digest(key)] = batch.base_offset + delta
                except records.BatchError:
                    continue  # unreadable within the bound: that batch is kept as it is
        except FileNotFoundError:  # retention deleted it meanwhile
            break
        if len(latest) > MAX_KEYS:
            if keys_before == 0:
                mapped.append(base)  # one huge segment: cleaned with what was mapped
            break
        mapped.append(base)
    return latest, mapped


# --- rewriting -----------------------------------------------------------------------------

def _rewrite(directory: str, base: int, latest: dict, horizon: bool, limit: int, settings,
             aborted=Aborted({})):
    """Write the cleaned copy of a segment to cleaning/; (records removed, bytes) or None if
    nothing would go."""
    kept_batches, removed = [], 0
    try:
        for batch, data in _batches(directory, base):
            kept, dropped = (None, batch.record_count) if aborted(batch) else \
                _clean_batch(batch, data, latest, horizon, limit)
            removed += dropped
            if kept is not None:
                kept_batches.append((batch, kept))
    except FileNotFoundError:
        return None
    if removed == 0:
        return None
    cleaning = os.path.join(directory, CLEANING_DIR)
    os.makedirs(cleaning, exist_ok=True)
    for suffix in _SUFFIXES:
        _unlink(os.path.join(cleaning, segment_name(base, suffix)))
    try:  # the cleaned copy keeps the segment's age (compaction lag, tombstones' horizon)
        modified = os.path.getmtime(os.path.join(directory, segment_name(base, "log")))
    except FileNotFoundError:
        return None
    segment = Segment(cleaning, base, create=True)
    try:
        position = entries = since = 0
        greatest = -1
        for batch, data in kept_batches:
            if entries == 0 or since >= settings.index_interval_bytes:
                if entries:
                    segment.add_time_entry(entries - 1, greatest)
                segment.add_index_entry(entries, batch.base_offset, position)
                entries, since = entries + 1, 0
            segment.write(position, data)
            position += len(data)
            since += len(data)
            greatest = max(greatest, batch.max_timestamp)
        if entries:
            segment.add_time_entry(entries - 1, greatest)
        segment.truncate(position, entries, entries)
        segment.flush()
    finally:
        segment.close()
    os.utime(os.path.join(cleaning, segment_name(base, "log")), (modified, modified))
    return removed, position


def _clean_batch(batch: records.Batch, data: bytes, latest: dict, horizon: bool, limit: int):
    """(the batch's cleaned bytes or None if nothing is left, records removed)."""
    if batch.attributes & records.CONTROL:
        return data, 0
    try:
        parsed = list(batch_records(data, batch, limit))
    except records.BatchError:
        return data, 0  # kept as it is
    kept = [raw for delta, key, value, raw in parsed
            if key is None or (latest.get(_digest(key), -1) <= batch.base_offset + delta
                               and not (value is None and horizon))]
    if len(kept) == len(parsed):
        return data, 0
    if not kept:
        return None, len(parsed)
    return _rebuilt(data, batch, b"".join(kept), len(kept)), len(parsed) - len(kept)


def _rebuilt(data: bytes, batch: records.Batch, body: bytes, count: int) -> bytes:
    """The batch with these records: same header fields (offsets, times, producer, codec),
    its length, count and CRC recomputed, compressed as it was (snappy framed as it was:
    snappy-java's framing for Java consumers, else raw)."""
    codec = batch.attributes & records.CODEC_MASK
    if codec:
        raw = not data[records.HEADER_BYTES:batch.size].startswith(compression.XERIAL)
        body = compression.compress(codec, body, raw_snappy=raw)
    header = bytearray(data[:records.HEADER_BYTES])
    struct.pack_into(">i", header, 8, records.HEADER_BYTES - records.LOG_OVERHEAD + len(body))
    struct.pack_into(">i", header, 57, count)
    whole = header + body
    struct.pack_into(">I", whole, 17, crc32c(bytes(whole[21:])))
    return bytes(whole)


# --- swapping ------------------------------------------------------------------------------

def _swap(partition, base: int) -> bool:
    """Put the cleaned copy in place under the partition lock; False if the segment went
    meanwhile (retention)."""
    directory = partition.directory
    cleaning = os.path.join(directory, CLEANING_DIR)
    with partition.locked():
        if not os.path.exists(os.path.join(directory, segment_name(base, "log"))):
            for suffix in _SUFFIXES:
                _unlink(os.path.join(cleaning, segment_name(base, suffix)))
            return False
        marker = os.path.join(cleaning, segment_name(base, "swap"))
        with open(marker, "wb") as handle:  # the commit point
            os.fsync(handle.fileno())
        partition.begin_swap()  # a reader opening the segment now waits or opens it again
        try:
            _complete(directory, base)
        finally:
            partition.end_swap()  # and every process reopens the segment
    return True


def _complete(directory: str, base: int) -> None:
    cleaning = os.path.join(directory, CLEANING_DIR)
    for suffix in _SUFFIXES:
        staged = os.path.join(cleaning, segment_name(base, suffix))
        if os.path.exists(staged):
            os.replace(staged, os.path.join(directory, segment_name(base, suffix)))
    _unlink(os.path.join(cleaning, segment_name(base, "swap")))


def finish_swaps(directory: str) -> int:
    """At recovery: complete every swap whose marker exists, drop every other cleaned file;
    returns the swaps completed."""
    cleaning = os.path.join(directory, CLEANING_DIR)
    try:
        names = os.listdir(cleaning)
    except FileNotFoundError:
        return 0
    completed = 0
    for name in names:
        if name.endswith(".swap") and name[:-5].isdigit():
            _complete(directory, int(name[:-5]))
            completed += 1
    shutil.rmtree(cleaning, ignore_errors=True)
    return completed


def _digest(key) -> bytes:
    return hashlib.blake2b(key, digest_size=16).digest()


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
