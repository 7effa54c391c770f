"""Where a partition's log starts: retention by size and age, DeleteRecords, and the file that
keeps DeleteRecords' start offset.

Both delete whole non-active segments only.  The log start offset is the first segment's
base, unless DeleteRecords moved it past that: then it is also written to LOG_START_FILE
(atomically), so a restart keeps it, as Kafka's log-start-offset checkpoint does.

The functions here take the partition's state words and run under its lock (the caller's).
"""

from __future__ import annotations

import os

from broker.shared.log.partition_state import (W_ACTIVE_BASE, W_HIGH_WATERMARK, W_LOG_START,
                                               W_SEGMENTS_VERSION)
from broker.shared.log.segment import list_bases, segment_name, write_atomically

LOG_START_FILE = "log-start-offset"  # DeleteRecords' log start offset, when past the first base


def delete_expired_segments(state, directory: str, retention_bytes: int, retention_ms: int,
                            now: float) -> int:
    """Delete whole non-active segments past either limit (-1: none), oldest first; return
    how many were deleted.  A segment's age is its log file's modification time."""
    deleted = 0
    bases = list_bases(directory)
    active = state[W_ACTIVE_BASE]
    sizes = {base: os.path.getsize(os.path.join(directory, segment_name(base, "log")))
             for base in bases}
    total = sum(sizes.values())
    for base, following in zip(bases, bases[1:]):
        if base == active:
            break
        path = os.path.join(directory, segment_name(base, "log"))
        too_big = 0 <= retention_bytes <= total - sizes[base]
        too_old = retention_ms >= 0 and now - os.path.getmtime(path) > retention_ms / 1000
        if not (too_big or too_old):
            break
        total -= sizes[base]
        _delete_segment(state, directory, base, following)
        deleted += 1
    return deleted


def delete_records(state, directory: str, offset: int) -> tuple[int, str | None]:
    """DeleteRecords: move the log start offset up to `offset` (-1: the high watermark),
    deleting the segments wholly below it.  (log start offset, Kafka error name or None);
    an offset past the high watermark is OFFSET_OUT_OF_RANGE, one below the start is a
    success that changes nothing."""
    high = state[W_HIGH_WATERMARK]
    offset = high if offset == -1 else offset
    if not 0 <= offset <= high:
        return state[W_LOG_START], "offset_out_of_range"
    if offset <= state[W_LOG_START]:
        return state[W_LOG_START], None
    write_atomically(os.path.join(directory, LOG_START_FILE), b"%d\n" % offset)
    bases = list_bases(directory)
    active = state[W_ACTIVE_BASE]
    for base, following in zip(bases, bases[1:]):
        if base == active or following > offset:
            break
        _delete_segment(state, directory, base, following)
    state[W_LOG_START] = offset
    state[W_SEGMENTS_VERSION] += 1
    return offset, None


def log_start_on_disk(directory: str, bases: list[int]) -> int:
    """The log start offset the files say: the first base, or DeleteRecords' if later."""
    try:
        with open(os.path.join(directory, LOG_START_FILE), "rb") as handle:
            recorded = int(handle.read().strip() or 0)
    except (FileNotFoundError, ValueError):
        recorded = 0
    return max(bases[0], recorded)


def _delete_segment(state, directory: str, base: int, following: int) -> None:
    """Remove a whole non-active segment; the log starts at `following` at the earliest."""
    state[W_LOG_START] = max(following, state[W_LOG_START])
    state[W_SEGMENTS_VERSION] += 1
    for suffix in ("log", "index", "timeindex"):
        try:
            os.unlink(os.path.join(directory, segment_name(base, suffix)))
        except FileNotFoundError:  # a segment older than the time index
            pass
