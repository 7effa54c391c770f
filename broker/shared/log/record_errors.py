"""Kafka's record_errors (KIP-467): which records of a produced batch break a per-record rule,
and the words Kafka answers with.

Kafka's LogValidator checks each record of a batch and refuses the whole batch when any
breaks a rule, listing in the Produce answer (v8+) every such record's index in the batch and
why: a record without a key in a compacted topic (INVALID_RECORD), a CreateTime timestamp
outside message.timestamp.before/after.max.ms, or a LogAppendTime attribute the producer set
(INVALID_TIMESTAMP, which wins when both kinds are there).  A client then fails exactly those
records with that error and the others with one of its own (librdkafka's
_INVALID_DIFFERENT_RECORD; Java's "part of a batch which had one or more invalid records").

The record walk (records.RecordWalk) notes the faults as it goes; `Faults` keeps them for one
batch: all are counted, the first are listed, as many as the request's `FaultRoom` has left
(the answer's size follows the room, whatever a batch of tiny compressed records holds).
"""

from __future__ import annotations

KEYLESS = 1  # a compacted topic's record without a key (the walk's kinds: see _recordwalk.c)
OUT_OF_RANGE = 2  # a CreateTime timestamp outside the topic's bounds
APPEND_TIME = 3  # the producer set LogAppendTime: every record of its batch
RECORD_ERRORS = 1_000  # records listed in one Produce answer, all its partitions (~10 us each)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class FaultRoom:
    """How many more faulty records one Produce answer may list (RECORD_ERRORS at first)."""

    __slots__ = ("left",)

    def __init__(self, left: int = RECORD_ERRORS):
        if left < 0:
            raise ValueError(f"room for {left} record errors")
        self.left = left


class Faults:
    """The faulty records of one batch: `listed` holds (index, kind, timestamp delta) of the
    first, `keyless` and `stamped` count them all by kind (a timestamp fault of any sort is
    `stamped`).

    `keyed`: a record without a key is a fault.  `window`: (low, high, none) in timestamp
    deltas from the batch's base timestamp: a delta outside [low, high] is a fault, unless it
    is `none` (the record has no timestamp, which Kafka does not check)."""

    __slots__ = ("keyed", "window", "room", "listed", "keyless", "stamped")

    def __init__(self, keyed: bool, window: tuple[int, int, int] | None, room: FaultRoom):
        if window is not None and not INT64_MIN <= window[0] <= window[1] <= INT64_MAX:
            raise ValueError(f"timestamp window {window}")
        self.keyed, self.window, self.room = keyed, window, room
        self.listed: list[tuple[int, int, int | None]] = []
        self.keyless = self.stamped = 0

    @property
    def found(self) -> int:
        return self.keyless + self.stamped

    def note(self, index: int, kind: int, delta: int | None) -> None:
        """One more faulty record (the Python walk's way; the C walk lists into `listed`)."""
        if kind == KEYLESS:
            self.keyless += 1
        else:
            self.stamped += 1
        if self.room.left > 0:
            self.room.left -= 1
            self.listed.append((index, kind, delta))

    def noted(self, keyless: int, stamped: int, listed: int) -> None:
        """The C walk found `keyless` and `stamped` more and listed `listed` of them."""
        self.keyless += keyless
        self.stamped += stamped
        self.room.left -= listed

    def all_records(self, count: int, kind: int) -> None:
        """Every one of `count` records is faulty (the batch's timestamp, for its LogAppendTime
        attribute): each as `kind`, but those without a key, which Kafka names for their key
        first."""
        keyless = {index for index, each, _delta in self.listed if each == KEYLESS}
        self.room.left += len(self.listed)
        self.listed = []
        self.stamped = count - self.keyless
        for index in range(min(count, self.room.left)):
            self.listed.append((index, KEYLESS if index in keyless else kind, None))
        self.room.left -= len(self.listed)


def timestamp_window(bounds_ms: tuple[int, int], now_ms: int, base_timestamp: int):
    """(low, high, none) for Faults: the CreateTime stamps within [now - before, now + after],
    as deltas from `base_timestamp` clamped to 64 bits (a clamped end excludes no delta the
    bound would have let in), and the delta of a record without a timestamp (-1); where no
    64-bit delta reaches -1, `low`, which inside the window excuses nothing."""
    before, after = bounds_ms
    low = max(INT64_MIN, now_ms - before - base_timestamp)
    high = min(INT64_MAX, now_ms + after - base_timestamp)
    none = -1 - base_timestamp
    return low, high, none if INT64_MIN <= none <= INT64_MAX else low


def _java_long(value: int) -> int:
    """A sum as Java's long arithmetic leaves it (wrapped to 64 bits)."""
    return (value - INT64_MIN) % 2**64 + INT64_MIN


class Wording:
    """Kafka's words for a batch's faults (LogValidator), given where it goes and when."""

    __slots__ = ("keyless", "base_offset", "base_timestamp", "max_timestamp", "bounds",
                 "now_ms")

    def __init__(self, where: str, base_offset: int, base_timestamp: int, max_timestamp: int,
                 bounds: tuple[int, int], now_ms: int):
        self.keyless = f"Compacted topic cannot accept message without key in topic partition " \
                       f"{where}"  # the same words for each such record
        self.base_offset = base_offset
        self.base_timestamp, self.max_timestamp = base_timestamp, max_timestamp
        self.bounds, self.now_ms = bounds, now_ms

    def message(self, index: int, kind: int, delta: int | None) -> str:
        """One record's: `delta` its timestamp's, None for the batch's max timestamp."""
        offset = self.base_offset + index  # the record's offset as the producer sent it
        if kind == KEYLESS:
            return self.keyless
        if kind == APPEND_TIME:
            return f"Invalid timestamp type in message with offset {offset}. Producer should " \
                   f"not set timestamp type to LogAppendTime."
        stamp = self.max_timestamp if delta is None else self.base_timestamp + delta
        before, after = self.bounds
        # Java's arithmetic: with an unset bound (Long.MAX_VALUE) Kafka prints the wrapped sum.
        return f"Timestamp {stamp} of message with offset {offset} is out of range. The " \
               f"timestamp should be within [{_java_long(self.now_ms - before)}, " \
               f"{_java_long(self.now_ms + after)}]"

    def verdict(self, faults: Faults) -> tuple[str, str, list[tuple[int, str]]]:
        """(Kafka error name, the answer's error_message, [(batch index, message)])."""
        errors = [(index, self.message(index, kind, delta))
                  for index, kind, delta in faults.listed]
        if faults.stamped:
            return ("invalid_timestamp",
                    "One or more records have been rejected due to invalid timestamp", errors)
        shown = ", ".join(f"RecordError(batchIndex={index}, message='{message}')"
                          for index, message in errors[:3])
        return ("invalid_record",
                f"One or more records have been rejected due to {faults.found} record errors "
                f"in total, and only showing the first three errors at most: [{shown}]", errors)
