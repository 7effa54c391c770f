"""The server-side assignors of consumer groups (KIP-848): `uniform` and `range`.

An assignor maps the group's members to a target assignment: member id -> {topic id ->
partitions}.  Both are pure functions of what they are given (the members' subscriptions, the
subscribed topics' partition counts and the previous target), so the coordinator can run them
at every group epoch and a test can check them alone.

    uniform  every partition of a subscribed topic to exactly one of the members subscribed to
             it, counts balanced to within one where the subscriptions allow, and sticky: a
             member keeps what it had in the previous target up to its share, so a rebalance
             moves as few partitions as it can.  Kafka's default.
    range    per topic, the members subscribed to it in member-id order each take a contiguous
             range, the first `partitions % members` one partition more (Kafka's RangeAssignor
             on the client, moved to the broker).

`group.consumer.assignors` lists those the broker offers, the first being the default; a
member names one in ConsumerGroupHeartbeat's ServerAssignor, and the group uses the one most
of its members name (ties: the offered order).
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Callable, Mapping

from broker.shared.config.keys import SERVER_ASSIGNORS

TopicId = uuid.UUID
Assignment = dict[TopicId, frozenset[int]]
Subscriptions = Mapping[str, frozenset[TopicId]]  # member id -> subscribed topics that exist
Partitions = Mapping[TopicId, int]  # subscribed topic -> its partition count

Assignor = Callable[[Subscriptions, Partitions, Mapping[str, Assignment]], dict[str, Assignment]]


def _as_assignment(owned: set[tuple[TopicId, int]]) -> Assignment:
    grouped: dict[TopicId, set[int]] = {}
    for topic, partition in owned:
        grouped.setdefault(topic, set()).add(partition)
    return {topic: frozenset(partitions) for topic, partitions in grouped.items()}


def uniform(members: Subscriptions, partitions: Partitions,
            previous: Mapping[str, Assignment]) -> dict[str, Assignment]:
    """Balanced and sticky (see the module's docstring)."""
    owned: dict[str, set[tuple[TopicId, int]]] = {member: set() for member in members}
    taken: set[tuple[TopicId, int]] = set()
    shares = _shares(members, partitions)
    # Keep what each member had, within its subscription and its share (lowest first).
    for member in sorted(members, key=lambda m: -_count(previous.get(m, {}))):
        kept = sorted((topic, p) for topic, held in previous.get(member, {}).items()
                      if topic in members[member] for p in held
                      if p < partitions.get(topic, 0) and (topic, p) not in taken)
        limit = shares.take(member, len(kept))
        owned[member].update(kept[:limit])
        taken.update(kept[:limit])
    # Hand out the rest, each to the least loaded member subscribed to its topic.
    subscribers = _subscribers(members)
    for topic in sorted(partitions):
        candidates = subscribers.get(topic, ())
        for p in range(partitions[topic]):
            if (topic, p) in taken or not candidates:
                continue
            chosen = min(candidates, key=lambda m: (len(owned[m]), m))
            owned[chosen].add((topic, p))
            taken.add((topic, p))
    _balance(owned, members)
    return {member: _as_assignment(held) for member, held in owned.items()}


class _Shares:
    """How many partitions each member may keep of its previous target: with every member on
    the same topics, `total // members` each and one more for `total % members` of them (the
    members that held most get the extra ones); otherwise no limit, and `_balance` evens out."""

    def __init__(self, base: int | None, extra: int):
        self.base = base
        self.extra = extra

    def take(self, member: str, wanted: int) -> int:
        if self.base is None:
            return wanted
        if wanted > self.base and self.extra > 0:
            self.extra -= 1
            return min(wanted, self.base + 1)
        return min(wanted, self.base)


def _shares(members: Subscriptions, partitions: Partitions) -> _Shares:
    topic_sets = set(members.values())
    if len(topic_sets) != 1 or not members:
        return _Shares(None, 0)
    total = sum(partitions.get(topic, 0) for topic in next(iter(topic_sets)))
    return _Shares(total // len(members), total % len(members))


def _subscribers(members: Subscriptions) -> dict[TopicId, list[str]]:
    found: dict[TopicId, list[str]] = {}
    for member in sorted(members):
        for topic in members[member]:
            found.setdefault(topic, []).append(member)
    return found


def _count(assignment: Assignment) -> int:
    return sum(len(partitions) for partitions in assignment.values())


def _balance(owned: dict[str, set[tuple[TopicId, int]]], members: Subscriptions) -> None:
    """Move partitions from the most loaded member to a member subscribed to their topic that
    holds at least two fewer, until no such move exists (each move lowers the spread; bounded
    by the partitions held)."""
    for _ in range(sum(map(len, owned.values())) + 1):
        loads = [len(held) for held in owned.values()]
        if not loads or max(loads) - min(loads) <= 1:
            return  # balanced as well as any subscriptions allow
        moved = False
        for giver in sorted(owned, key=lambda m: (-len(owned[m]), m)):
            for topic, p in sorted(owned[giver]):
                takers = [m for m in owned if topic in members[m]
                          and len(owned[m]) + 1 < len(owned[giver])]
                if takers:
                    taker = min(takers, key=lambda m: (len(owned[m]), m))
                    owned[giver].remove((topic, p))
                    owned[taker].add((topic, p))
                    moved = True
                    break
            if moved:
                break
        if not moved:
            return


def range_assignor(members: Subscriptions, partitions: Partitions,
                   previous: Mapping[str, Assignment]) -> dict[str, Assignment]:
    """Contiguous ranges per topic (see the module's docstring); `previous` is not used."""
    owned: dict[str, set[tuple[TopicId, int]]] = {member: set() for member in members}
    for topic, subscribers in _subscribers(members).items():
        count = partitions.get(topic, 0)
        base, extra = divmod(count, len(subscribers))
        start = 0
        for index, member in enumerate(subscribers):
            size = base + (index < extra)
            owned[member].update((topic, p) for p in range(start, start + size))
            start += size
    return {member: _as_assignment(held) for member, held in owned.items()}


ASSIGNORS: dict[str, Assignor] = {"uniform": uniform, "range": range_assignor}
assert tuple(ASSIGNORS) == SERVER_ASSIGNORS, "the configuration and the assignors disagree"


def chosen_assignor(offered: tuple[str, ...], wanted: list[str | None]) -> str:
    """The assignor a group uses: the one most of its members name among those offered (ties
    in the offered order), else the first offered."""
    votes = Counter(name for name in wanted if name in offered)
    if not votes:
        return offered[0]
    return max(offered, key=lambda name: (votes[name], -offered.index(name)))
