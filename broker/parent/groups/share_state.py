"""A share group of KIP-932: its members, their assignment, and its share partitions.

Members of a share group need not own partitions alone: several read the same partition, and
the share partition (broker.parent.groups.share_partition) decides record by record who
delivers what.  So an assignment changes at once, with no revocation step: a member's epoch is
the group's assignment epoch as soon as it heartbeats.

The assignment (`share_assignment`, Kafka's SimpleAssignor in spirit): every partition of a
subscribed topic goes to at least one member subscribed to it; with more members than
partitions, partitions are shared so every member gets one; with fewer, each partition has
one member and counts differ by at most one.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field

from broker.parent.groups.assignors import Assignment, Partitions, Subscriptions
from broker.parent.groups.share_partition import SharePartition


class ShareGroupState(enum.Enum):
    EMPTY = "Empty"
    STABLE = "Stable"


@dataclass(eq=False)
class ShareMember:
    member_id: str
    rack_id: str | None
    client_id: str
    client_host: str
    topic_names: tuple[str, ...] = ()
    epoch: int = 0
    previous_epoch: int = -1  # also accepted from it (the answer with `epoch` may be lost)
    assigned: Assignment = field(default_factory=dict)
    deadline: float = 0.0  # monotonic: removed unless it heartbeats before
    user: str = "ANONYMOUS"
    host: str = ""


@dataclass(eq=False)
class ShareGroup:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ShareMember] = field(default_factory=dict)
    target: dict[str, Assignment] = field(default_factory=dict)
    partitions: dict[uuid.UUID, int] = field(default_factory=dict)  # subscribed topic: count
    topic_names: frozenset[str] = frozenset()
    metadata_epoch: int | None = None
    shares: dict[tuple[uuid.UUID, int], SharePartition] = field(default_factory=dict)
    empty_since_ms: int = 0
    kind = "share"
    protocol_type = "share"
    pending: dict = field(default_factory=dict)  # none: no member id waits to join here

    @property
    def state(self) -> ShareGroupState:
        return ShareGroupState.STABLE if self.members else ShareGroupState.EMPTY

    @property
    def subscribed(self) -> frozenset[str]:
        return self.topic_names if self.members else frozenset()


def share_assignment(members: Subscriptions, partitions: Partitions) -> dict[str, Assignment]:
    """Every partition to at least one subscribed member, every member a partition when there
    are enough members to go round; deterministic (member ids in order)."""
    owned: dict[str, dict[uuid.UUID, set[int]]] = {member: {} for member in members}
    for topic in sorted(partitions):
        takers = sorted(member for member, topics in members.items() if topic in topics)
        count = partitions[topic]
        if not takers or not count:
            continue
        for slot in range(max(count, len(takers))):
            member = takers[slot % len(takers)]
            owned[member].setdefault(topic, set()).add(slot % count)
    return {member: {topic: frozenset(ps) for topic, ps in held.items()}
            for member, held in owned.items()}
