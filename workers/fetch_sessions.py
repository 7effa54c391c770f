"""Incremental fetch sessions (KIP-227): the sessions one worker's consumers hold.

A session remembers, per partition, what the consumer last asked for (fetch offset, max bytes)
and what it was last told (high watermark, log start offset).  An incremental Fetch then names
only the partitions whose fetch state changed (and those to forget), and its answer names only
the partitions with news: records, a moved high watermark or log start offset, or an error.

The request's session id and epoch, as Kafka reads them:

    id 0, epoch -1   full fetch without a session (clients before KIP-227, librdkafka)
    id 0, epoch 0    full fetch asking for a session: the answer carries its id (0: none free)
    id S, epoch 0    full fetch: session S is closed first, a new one is asked for
    id S, epoch -1   full fetch: session S is closed, no new one
    id S, epoch E>0  incremental fetch in session S, E being the epoch its last answer implied

Slots.  `max.incremental.fetch.session.cache.slots` is broker-wide.  A session lives in the
worker that created it and never moves (a client that reconnects to another worker hears
FETCH_SESSION_ID_NOT_FOUND and starts over with a full fetch, as after a Kafka broker restart);
its id carries that worker's slot (id mod stride), so no id is valid in two workers.  The
slots are shared fairly: each data worker always gets its even share, may borrow free slots
beyond it, and gives borrowed ones back (its least recently used sessions go) once a worker
below its share has taken them.  Workers publish their session counts in their own slots of
the shared block; two workers taking the last free slot at once exceed the total by one each
until the next tick gives the excess back.

Eviction when no slot is free, as Kafka's FetchSessionCache: the least recently used session
goes if it is stale (unused for `eviction_ms`, Kafka's fixed 120 s); otherwise a new session
may evict the smallest session that is older than `eviction_ms` and has fewer partitions.
"""

from __future__ import annotations

import random
import time
from typing import Callable, Iterator

INITIAL_EPOCH, FINAL_EPOCH, NO_SESSION = 0, -1, 0


def next_epoch(epoch: int) -> int:
    """The epoch after `epoch` (int32, wrapping to 1: 0 and -1 mean a full fetch)."""
    return 1 if epoch >= 2**31 - 1 else epoch + 1


class CachedPartition:
    """One partition of a session.  It reads like a request's FetchPartition (partition,
    fetch_offset, partition_max_bytes), so the Fetch handler serves either alike."""

    __slots__ = ("topic", "partition", "fetch_offset", "partition_max_bytes", "high_watermark",
                 "log_start_offset")

    def __init__(self, topic, partition: int, fetch_offset: int, partition_max_bytes: int,
                 high_watermark: int = -1, log_start_offset: int = -1):
        self.topic = topic  # its name, or its id in a session of Fetch v13+
        self.partition = partition
        self.fetch_offset = fetch_offset
        self.partition_max_bytes = partition_max_bytes
        self.high_watermark = high_watermark  # -1: never told (or an error): always answered
        self.log_start_offset = log_start_offset

    def news(self, answer: dict) -> bool:
        """Whether the answer for this partition must be sent; remembers what it tells."""
        error = answer["error_code"]
        changed = (bool(answer["records"]) or error != 0
                   or answer["high_watermark"] != self.high_watermark
                   or answer["log_start_offset"] != self.log_start_offset)
        # After an error, -1: the partition is answered again once the error is gone.
        self.high_watermark = -1 if error else answer["high_watermark"]
        self.log_start_offset = answer["log_start_offset"]
        return changed


class FetchSession:
    """A consumer's fetch state: partitions in fetch order, keyed by (topic, partition), the
    topic being its name, or its id for sessions of Fetch v13+ (`topic_ids`)."""

    __slots__ = ("id", "epoch", "topic_ids", "created", "last_used", "partitions")

    def __init__(self, session_id: int, topic_ids: bool, partitions: dict, now: float):
        self.id = session_id
        self.epoch = next_epoch(INITIAL_EPOCH)
        self.topic_ids = topic_ids
        self.created = self.last_used = now
        self.partitions: dict[tuple, CachedPartition] = partitions

    def update(self, topics, forgotten, topic_ids: bool) -> None:
        """Apply an incremental request: its partitions are added or updated, `forgotten`
        ones removed."""
        parts = self.partitions
        for topic in topics:
            key = topic.topic_id if topic_ids else topic.topic
            for asked in topic.partitions:
                cached = parts.get((key, asked.partition))
                if cached is None:
                    parts[key, asked.partition] = CachedPartition(
                        key, asked.partition, asked.fetch_offset, asked.partition_max_bytes)
                else:
                    cached.fetch_offset = asked.fetch_offset
                    cached.partition_max_bytes = asked.partition_max_bytes
        for topic in forgotten or ():
            key = topic.topic_id if topic_ids else topic.topic
            for index in topic.partitions:
                parts.pop((key, index), None)

    def by_topic(self) -> Iterator[tuple[object, list[CachedPartition]]]:
        """(topic, partitions) runs in session order: what a request would have named."""
        run_key, run = None, []
        for cached in self.partitions.values():
            if run and cached.topic != run_key:
                yield run_key, run
                run = []
            run_key = cached.topic
            run.append(cached)
        if run:
            yield run_key, run

    def rotate(self, served: list[CachedPartition]) -> None:
        """Partitions that just returned records go to the back, so a response capped by
        max_bytes serves the others first next time (Kafka's order, for fairness)."""
        parts = self.partitions
        for cached in served:
            key = (cached.topic, cached.partition)
            if key in parts:
                parts[key] = parts.pop(key)


class FetchSessionCache:
    """One worker's fetch sessions, within its fair share of the broker-wide slots."""

    def __init__(self, slots: int, share: int, slot: int, stride: int,
                 max_partitions: int, partition_budget: int, eviction_ms: int = 120_000,
                 total: Callable[[], int] | None = None,
                 publish: Callable[[int, int, int], None] = lambda *counts: None,
                 clock: Callable[[], float] = time.monotonic):
        if not 0 <= share <= slots:
            raise ValueError(f"share {share} outside 0..{slots}")
        if not 0 <= slot < stride:
            raise ValueError(f"slot {slot} outside 0..{stride - 1}")
        self.slots, self.share = slots, share
        self._slot, self._stride = slot, stride
        self.max_partitions = max_partitions  # in one session
        self.partition_budget = partition_budget  # in all of this worker's sessions
        self._eviction = eviction_ms / 1000
        self._total = total if total is not None else (lambda: len(self._sessions))
        self._publish = publish  # (sessions, partitions cached, evictions so far)
        self._clock = clock
        self._sessions: dict[int, FetchSession] = {}  # least recently used first
        self._partitions = 0  # cached, over all sessions, as of their last touch
        self._sizes: dict[int, int] = {}
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def partitions(self) -> int:
        return self._partitions

    def get(self, session_id: int) -> FetchSession | None:
        return self._sessions.get(session_id)

    def create(self, topic_ids: bool, partitions: dict) -> int:
        """A new session holding `partitions`, if a slot can be had: its id, else 0."""
        size = len(partitions)
        if self.slots == 0 or size > min(self.max_partitions, self.partition_budget) \
                or not self._room(size):
            return NO_SESSION
        session = FetchSession(self._new_id(), topic_ids, partitions, self._clock())
        self._sessions[session.id] = session
        self._resize(session)
        return session.id

    def fits(self, session: FetchSession) -> bool:
        """Whether a session that grew still fits its bounds: no more partitions than one
        request may name, and this worker's partition budget."""
        size = len(session.partitions)
        return size <= self.max_partitions and \
            self._partitions - self._sizes.get(session.id, 0) + size <= self.partition_budget

    def touch(self, session: FetchSession) -> None:
        """The session served a request: most recently used now; its size is recounted."""
        session.last_used = self._clock()
        self._sessions[session.id] = self._sessions.pop(session.id)
        self._resize(session)

    def remove(self, session_id: int) -> bool:
        session = self._sessions.pop(session_id, None)
        if session is None:
            return False
        self._partitions -= self._sizes.pop(session_id)
        self._report()
        return True

    def evict(self, session_id: int) -> None:
        """Remove a session to make room or because it grew too big (counted)."""
        self.evictions += 1
        self.remove(session_id)

    def tick(self) -> None:
        """Once a second: give back slots borrowed beyond this worker's share when the
        broker-wide count exceeds the slots (a worker below its share has taken one)."""
        excess = min(self._total() - self.slots, len(self._sessions) - self.share)
        for session_id in list(self._sessions)[:max(0, excess)]:
            self.evict(session_id)

    # --- internals ------------------------------------------------------------------------

    def _room(self, size: int) -> bool:
        """Make room for a new session of `size` partitions: a slot, and partition budget."""
        if len(self._sessions) >= self.share and self._total() >= self.slots \
                and not self._evict_for(size):
            return False
        while self._partitions + size > self.partition_budget:
            if not self._evict_for(size):
                return False
        return True

    def _evict_for(self, size: int) -> bool:
        """Kafka's tryEvict among this worker's sessions: a stale one, else the smallest one
        past `eviction_ms` of age with fewer partitions than the newcomer."""
        if not self._sessions:
            return False
        now = self._clock()
        oldest = next(iter(self._sessions.values()))
        if now - oldest.last_used > self._eviction:
            self.evict(oldest.id)
            return True
        grown = [s for s in self._sessions.values() if now - s.created > self._eviction]
        if not grown:
            return False
        smallest = min(grown, key=lambda s: (len(s.partitions), s.id))
        if len(smallest.partitions) >= size:
            return False
        self.evict(smallest.id)
        return True

    def _new_id(self) -> int:
        """A free positive int32 whose remainder by the stride is this worker's slot."""
        while True:
            session_id = random.randrange(1, (2**31 - 1) // self._stride) * self._stride \
                + self._slot
            if session_id not in self._sessions:
                return session_id

    def _resize(self, session: FetchSession) -> None:
        size = len(session.partitions)
        self._partitions += size - self._sizes.get(session.id, 0)
        self._sizes[session.id] = size
        self._report()

    def _report(self) -> None:
        self._publish(len(self._sessions), self._partitions, self.evictions)
