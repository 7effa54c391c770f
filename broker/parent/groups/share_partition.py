"""One share partition of a share group (KIP-932): which of its records are in flight, who
holds each, how often each was delivered, and how the start offset advances.

    start   the share-partition start offset: every record before it is done with
    end     the first offset never acquired yet; [start, end) are the records in flight

Each in-flight record is AVAILABLE (to be delivered, again), ACQUIRED by one member until its
lock expires, ACKNOWLEDGED (accepted) or ARCHIVED (rejected, a gap, or delivered
`delivery_limit` times).  Only `acquire`, `acknowledge`, `release_member`, `expire` and
`archive` change a record, and only in Kafka's ways:

    AVAILABLE  -> ACQUIRED                          acquire (its delivery count + 1)
    ACQUIRED   -> ACKNOWLEDGED                      acknowledge ACCEPT, by its holder
    ACQUIRED   -> ARCHIVED                          acknowledge REJECT (or a gap), by its holder
    ACQUIRED   -> AVAILABLE, or ARCHIVED at limit   acknowledge RELEASE; its holder leaves; its
                                                    lock expires

The start offset moves past every leading record that is ACKNOWLEDGED or ARCHIVED, so what is
held stays within [start, end); `end - start` is bounded by `max_locks`
(group.share.partition.max.record.locks): past it nothing new is acquired until the start
moves.  Pure: the caller passes the time and reads the log; a test drives it alone.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

ACCEPT, RELEASE, REJECT, GAP = 1, 2, 3, 0  # AcknowledgeTypes on the wire (0: a gap)


class RecordState(enum.IntEnum):
    AVAILABLE = 0
    ACQUIRED = 1
    ACKNOWLEDGED = 2
    ARCHIVED = 4


DONE = (RecordState.ACKNOWLEDGED, RecordState.ARCHIVED)


@dataclass(slots=True)
class InFlight:
    state: RecordState
    deliveries: int = 0
    holder: str | None = None
    deadline: float = 0.0


@dataclass(frozen=True)
class Limits:
    """What a share group allows (group.share.* keys, or the group's own configs)."""

    lock_seconds: float
    delivery_limit: int
    max_locks: int

    def __post_init__(self):
        if self.lock_seconds <= 0 or self.delivery_limit < 1 or self.max_locks < 1:
            raise ValueError(f"share partition limits need room: {self}")


@dataclass
class Counts:
    """What happened to the partition's records since the last look (share_deliveries)."""

    acquired: int = 0
    redelivered: int = 0
    accepted: int = 0
    released: int = 0
    rejected: int = 0
    lock_expired: int = 0
    delivery_limit: int = 0

    def any(self) -> bool:
        return any(vars(self).values())


class InvalidRecordState(Exception):
    """An acknowledgement of a record the member does not hold (INVALID_RECORD_STATE)."""


class SharePartition:
    def __init__(self, start: int, limits: Limits):
        self.start = start
        self.end = start
        self.limits = limits
        self.records: dict[int, InFlight] = {}
        self.counts = Counts()
        self.next_deadline = float("inf")  # no lock ends before: `expire` has nothing to do

    # --- acquiring ---------------------------------------------------------------------------

    def acquire(self, member: str, log_end: int, max_records: int,
                now: float) -> list[tuple[int, int, int]]:
        """Records for `member`: first the available ones in flight, then new ones up to
        `log_end`; at most `max_records`, never past `start + max_locks`.  Returns
        (first offset, last offset, delivery count) ranges, in offset order."""
        taken: list[tuple[int, int]] = []  # (offset, deliveries)
        deadline = now + self.limits.lock_seconds
        for offset in sorted(self.records):
            if len(taken) >= max_records:
                break
            record = self.records[offset]
            if record.state is RecordState.AVAILABLE:
                self._take(record, member, deadline)
                self.counts.redelivered += record.deliveries > 1
                taken.append((offset, record.deliveries))
        stop = min(log_end, self.start + self.limits.max_locks)
        while self.end < stop and len(taken) < max_records:
            record = InFlight(RecordState.AVAILABLE)
            self._take(record, member, deadline)
            self.records[self.end] = record
            taken.append((self.end, 1))
            self.end += 1
        self.counts.acquired += len(taken)
        if taken:
            self.next_deadline = min(self.next_deadline, deadline)
        return runs_of(taken)

    @staticmethod
    def _take(record: InFlight, member: str, deadline: float) -> None:
        record.state = RecordState.ACQUIRED
        record.deliveries += 1
        record.holder = member
        record.deadline = deadline

    def give_back(self, offsets) -> None:
        """Offsets acquired but not delivered after all (the answer had no room): as if never
        acquired, their delivery count as it was."""
        for offset in offsets:
            record = self.records.get(offset)
            if record is not None and record.state is RecordState.ACQUIRED:
                record.state, record.holder = RecordState.AVAILABLE, None
                record.deliveries -= 1
                self.counts.acquired -= 1
                self.counts.redelivered -= record.deliveries >= 1
        while self.end > self.start and self.records[self.end - 1].deliveries == 0:
            del self.records[self.end - 1]  # never delivered: acquired afresh later
            self.end -= 1

    def archive(self, offsets) -> None:
        """Offsets acquired that hold no record to deliver (a transaction marker, a record
        compacted away): done with at once."""
        for offset in offsets:
            record = self.records.get(offset)
            if record is not None and record.state is RecordState.ACQUIRED:
                record.state, record.holder = RecordState.ARCHIVED, None
        self._advance()

    # --- acknowledging, releasing ---------------------------------------------------------

    def acknowledge_all(self, member: str, batches: list[tuple[int, int, list[int]]]) -> None:
        """A request's acknowledgement batches (first, last, types: one for the range or
        one per offset), applied all or none: every record named at or past the start must
        be held by the member (else InvalidRecordState, and nothing changes); records before
        the start are done with already and skipped."""
        verdicts = []
        for first, last, kinds in batches:
            for offset in range(max(first, self.start), last + 1):
                record = self.records.get(offset)
                if record is None or record.state is not RecordState.ACQUIRED or \
                        record.holder != member:
                    raise InvalidRecordState(f"record {offset} is not held by {member}")
                kind = kinds[0] if len(kinds) == 1 else kinds[offset - first]
                verdicts.append((offset, kind))
        for offset, kind in verdicts:
            self.acknowledge(member, offset, offset, kind)

    def acknowledge(self, member: str, first: int, last: int, kind: int) -> None:
        """The member's verdict on [first, last]; every record of it must be held by the
        member (else InvalidRecordState, and nothing changes)."""
        if first > last or kind not in (ACCEPT, RELEASE, REJECT, GAP):
            raise InvalidRecordState(f"acknowledgement [{first}, {last}] of type {kind}")
        span = [self.records.get(offset) for offset in range(first, last + 1)]
        if any(r is None or r.state is not RecordState.ACQUIRED or r.holder != member
               for r in span):
            raise InvalidRecordState(f"records [{first}, {last}] are not held by {member}")
        for record in span:
            if kind == ACCEPT:
                record.state = RecordState.ACKNOWLEDGED
                self.counts.accepted += 1
            elif kind == RELEASE:
                self.counts.released += self._release(record)
            else:
                record.state = RecordState.ARCHIVED
                self.counts.rejected += kind == REJECT
            record.holder = None
        self._advance()

    def release_member(self, member: str) -> int:
        """Everything the member holds goes back (it left, or its share session closed)."""
        held = [r for r in self.records.values()
                if r.state is RecordState.ACQUIRED and r.holder == member]
        for record in held:
            self.counts.released += self._release(record)
        self._advance()
        return len(held)

    def expire(self, now: float) -> int:
        """Records whose lock ran out go back; how many."""
        if now < self.next_deadline:
            return 0
        expired = [r for r in self.records.values()
                   if r.state is RecordState.ACQUIRED and r.deadline <= now]
        self.next_deadline = min((r.deadline for r in self.records.values()
                                  if r.state is RecordState.ACQUIRED and r.deadline > now),
                                 default=float("inf"))
        for record in expired:
            self._release(record)
            self.counts.lock_expired += 1  # ended by its lock, whether delivered again or not
        self._advance()
        return len(expired)

    def _release(self, record: InFlight) -> bool:
        """Back to AVAILABLE (True), or ARCHIVED once delivered `delivery_limit` times."""
        record.holder = None
        if record.deliveries >= self.limits.delivery_limit:
            record.state = RecordState.ARCHIVED
            self.counts.delivery_limit += 1
            return False
        record.state = RecordState.AVAILABLE
        return True

    def _advance(self) -> None:
        while self.start < self.end and self.records[self.start].state in DONE:
            del self.records[self.start]
            self.start += 1

    # --- the log moving under it -----------------------------------------------------------

    def skip_to(self, log_start: int) -> None:
        """Records deleted from the log (retention, DeleteRecords) are out of reach."""
        if log_start <= self.start:
            return
        for offset in range(self.start, min(log_start, self.end)):
            self.records.pop(offset, None)
        self.start = log_start
        self.end = max(self.end, log_start)

    def reset(self, start: int) -> None:
        """AlterShareGroupOffsets (the group has no members): start afresh at `start`."""
        self.records.clear()
        self.start = self.end = start

    def in_flight(self) -> int:
        return self.end - self.start

    def holds(self, member: str) -> bool:
        return any(r.holder == member for r in self.records.values())


def runs_of(taken: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(offset, deliveries) pairs -> (first, last, deliveries) runs of consecutive offsets."""
    runs: list[list[int]] = []
    for offset, deliveries in taken:
        if runs and runs[-1][1] + 1 == offset and runs[-1][2] == deliveries:
            runs[-1][1] = offset
        else:
            runs.append([offset, offset, deliveries])
    return [tuple(run) for run in runs]
