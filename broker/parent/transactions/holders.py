"""Who holds the transaction coordinator's transactional ids, and each holder's fair share.

A holder is the principal that last initialized an id (InitProducerId), or, for ANONYMOUS, the
client's address: a client must not keep every id of the table busy.  `Holdings` keeps, per
holder, how many ids it holds and which of them are idle (no transaction in progress), least
recently used first; `room` decides whether a holder may take one more id:

- a holder at its share (`pybroker.max.transactional.ids.per.principal`) makes room from its
  own idle ids only (its least recently used is forgotten); with none idle it is refused;
- a full table (`pybroker.max.transactional.ids`) forgets the least recently used idle id of
  the heaviest holder that has one idle; with no id idle at all the request is refused.

So a client keeps at most its share of the ids busy, and a client churning through new ids
replaces its own (it is soon the heaviest holder) rather than other clients' ids.

Every update is a few dict operations.  `room` looks at most at the distinct holding sizes
among holders with an idle id: sizes 1..d held by distinct holders add up to d(d+1)/2 ids, so
there are fewer than sqrt(2 * ids) of them (447 for 100,000 ids), never the whole table.
"""

from __future__ import annotations

import heapq
from typing import NamedTuple

ANONYMOUS = "ANONYMOUS"
MAX_NAME_CHARS = 256  # of a principal's name in a log line or an event
SHARE = "share"  # refused: the holder is at its share, all of its ids busy
FULL = "full"  # refused: the table is full, every id busy


class Holder(NamedTuple):
    """A principal's name; its address too when it is ANONYMOUS ("" otherwise)."""

    user: str
    host: str = ""

    @classmethod
    def of(cls, user: str, host: str) -> "Holder":
        return cls(user, host if user == ANONYMOUS else "")

    def __str__(self) -> str:
        user = self.user if len(self.user) <= MAX_NAME_CHARS else \
            self.user[:MAX_NAME_CHARS] + "..."
        return f"User:{user}@{self.host}" if self.host else f"User:{user}"


class Room(NamedTuple):
    """`room`'s answer: the id to forget first, if any, and the bound that was reached
    (SHARE, FULL; None: there is room).  A bound reached with nothing to forget: refused."""

    forget: str | None = None
    reason: str | None = None

    @property
    def refused(self) -> bool:
        return self.reason is not None and self.forget is None


class Holdings:
    def __init__(self, total: int, share: int):
        if total < 1 or share < 1:
            raise ValueError(f"transactional id bounds must be positive: {total}, {share}")
        self.total = total  # ids in the table at most
        self.share = share  # ids one holder may hold
        self.count = 0
        self.held: dict[Holder, int] = {}
        self._idle: dict[Holder, dict[str, None]] = {}  # only holders with an idle id; LRU first
        self._by_size: dict[int, dict[Holder, None]] = {}  # holders with an idle id, by held

    def add(self, transactional_id: str, holder: Holder, idle: bool) -> None:
        """`holder` now holds the id (its most recently used when idle)."""
        self._unlist(holder)
        self.held[holder] = self.held.get(holder, 0) + 1
        self.count += 1
        if idle:
            self._idle.setdefault(holder, {})[transactional_id] = None
        self._list(holder)

    def remove(self, transactional_id: str, holder: Holder, idle: bool) -> None:
        """The id is forgotten, or about to be added again (changed)."""
        self._unlist(holder)
        left = self.held[holder] - 1
        if left:
            self.held[holder] = left
        else:
            del self.held[holder]
        self.count -= 1
        if idle:
            ids = self._idle[holder]
            del ids[transactional_id]
            if not ids:
                del self._idle[holder]
        self._list(holder)

    def room(self, holder: Holder, new_id: bool) -> Room:
        """May `holder` take one more id (`new_id`: one the table does not hold yet)?"""
        if self.held.get(holder, 0) >= self.share:
            own = self._idle.get(holder)
            return Room(next(iter(own)) if own else None, SHARE)
        if new_id and self.count >= self.total:
            if not self._by_size:
                return Room(None, FULL)
            heaviest = next(iter(self._by_size[max(self._by_size)]))
            return Room(next(iter(self._idle[heaviest])), FULL)
        return Room()

    def busy(self, holder: Holder) -> int:
        return self.held.get(holder, 0) - len(self._idle.get(holder, ()))

    def largest(self, n: int) -> list[tuple[Holder, int]]:
        """The `n` holders holding the most ids, with their counts (for the log line)."""
        return heapq.nlargest(n, self.held.items(), key=lambda item: item[1])

    def _list(self, holder: Holder) -> None:
        if holder in self._idle:
            self._by_size.setdefault(self.held[holder], {})[holder] = None

    def _unlist(self, holder: Holder) -> None:
        if holder in self._idle:
            size = self.held[holder]
            bucket = self._by_size[size]
            del bucket[holder]
            if not bucket:
                del self._by_size[size]
