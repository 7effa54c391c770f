"""ListOffsets by time on one partition: the first record stamped at or after a timestamp, and
the record with the largest timestamp (-3, KIP-734).

Each segment's time index (segment.py) holds, per index region, the greatest timestamp from
the segment's start to the region's end; the active segment's open region keeps its maximum
in the state (W_SEGMENT_MAX_TS).  Those values never decrease, so a lookup bisects them and
reads one region of one segment.  A segment written before the time index existed gets one
at its first lookup (under the partition lock).
"""

from __future__ import annotations

import bisect

from broker.shared.log import records
from broker.shared.log.partition_state import (W_ACTIVE_BASE, W_ACTIVE_SIZE, W_HIGH_WATERMARK,
                                               W_INDEX_ENTRIES, W_LOG_START, W_SEGMENT_MAX_TS)
from broker.shared.log.segment import Segment
from broker.shared.log.segment_cache import SegmentCache


class TimeLookup:
    """The time lookups of one partition: its state words, its segments, its lock (`locked`,
    a context manager: held to rebuild a missing time index)."""

    def __init__(self, state, segments: SegmentCache, locked):
        self.state = state
        self.segments = segments
        self.locked = locked

    def offset_for_timestamp(self, timestamp: int,
                             max_decompressed_bytes: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or past the log start offset stamped
        at or after `timestamp`.

        The time index leads to the one region of one segment where the answer lies; inside
        the batch the records are read one by one (a compressed batch decompressed, bounded by
        `max_decompressed_bytes`), as Kafka does.  In the segment the log starts in (after
        DeleteRecords), the search starts at the log start's batch and may go on to the
        segment's end, as Kafka's does.
        """
        high, first = self.state[W_HIGH_WATERMARK], self.state[W_LOG_START]
        self.segments.refresh()
        for base in self.segments.bases:
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
                                                  timestamp, max_decompressed_bytes, first)
                if found is not None:
                    return found
                if batch.base_offset >= first:  # records that do not parse: the batch's own
                    return batch.base_offset, batch.max_timestamp
        return None

    def max_timestamp_offset(self, max_decompressed_bytes: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the record with the largest timestamp: the first batch
        whose max timestamp is the greatest, then inside it the first record carrying that
        timestamp."""
        high = self.state[W_HIGH_WATERMARK]
        self.segments.refresh()
        greatest = max((((self._time_maxima(base) or [-1])[-1], base)
                        for base in self.segments.bases), default=(-1, 0))
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
                                                  batch.max_timestamp, max_decompressed_bytes)
                return found if found is not None and found[1] == batch.max_timestamp \
                    else (batch.last_offset, batch.max_timestamp)
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

    def _time_maxima(self, base: int) -> list[int]:
        """A segment's time index: the greatest timestamp up to the end of each region."""
        segment = self.segments.get(base)
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
        segment = self.segments.get(base)
        active = base == self.state[W_ACTIVE_BASE]
        entries = segment.index_entries(self.state[W_INDEX_ENTRIES] if active else None)
        region = bisect.bisect_left(maxima, timestamp)
        if region + 1 < len(entries):  # the region ends where the next one starts
            return segment, entries[region][1], entries[region + 1][1]
        return segment, entries[region][1], self.state[W_ACTIVE_SIZE] if active else segment.size()
