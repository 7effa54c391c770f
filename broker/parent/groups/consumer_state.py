"""A consumer group of the KIP-848 protocol: its epochs, members, target assignment, who owns
which partition, and the step that moves one member towards its target.

Three epochs, as Kafka's coordinator keeps them:

    group epoch        bumped by anything that changes what the assignment must be: a member
                       joining or leaving, a subscription changing, a subscribed topic's
                       partitions changing;
    assignment epoch   the group epoch the target assignment was computed for;
    member epoch       the epoch of the assignment a member holds: it reaches the assignment
                       epoch once the member has given up whatever the target takes from it.

A partition is owned by the member that has it assigned or still has to revoke it
(`ConsumerGroup.owners`); `reconcile` never hands a member a partition another member owns, and
a member revoking partitions gets nothing new until its next heartbeat shows it let them go.
So no partition is ever owned by two members at once.

Member states (Kafka's MemberState), and the only ways between them (`reconcile`):

    STABLE                  holds its target at the assignment epoch
    UNREVOKED_PARTITIONS    must give up `revoking`; keeps its epoch until it has
    UNRELEASED_PARTITIONS   at the assignment epoch, waiting for partitions others still own
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field
from typing import Callable

from broker.parent.groups.assignors import Assignment
from broker.shared.protocol.errors import ErrorCode

TopicPartition = tuple[uuid.UUID, int]


class MemberState(enum.Enum):
    STABLE = "stable"
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    UNRELEASED_PARTITIONS = "unreleased_partitions"


class ConsumerGroupState(enum.Enum):
    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"


@dataclass(eq=False)
class ConsumerMember:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    topic_names: tuple[str, ...] = ()
    topic_regex: str | None = None
    server_assignor: str | None = None
    epoch: int = 0
    previous_epoch: int = -1
    state: MemberState = MemberState.STABLE
    assigned: Assignment = field(default_factory=dict)
    revoking: Assignment = field(default_factory=dict)
    deadline: float = 0.0  # monotonic: removed unless it heartbeats before
    revoke_deadline: float | None = None  # monotonic: fenced unless it has revoked before
    left: bool = False  # a static member that left with epoch -2: its place is kept
    user: str = "ANONYMOUS"  # the principal that joined: which topics its regex may match
    host: str = ""

    def owned(self) -> set[TopicPartition]:
        return {(topic, p) for part in (self.assigned, self.revoking)
                for topic, partitions in part.items() for p in partitions}


@dataclass(eq=False)
class ConsumerGroup:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    target: dict[str, Assignment] = field(default_factory=dict)
    owners: dict[TopicPartition, str] = field(default_factory=dict)
    partitions: dict[uuid.UUID, int] = field(default_factory=dict)  # subscribed topic: count
    metadata_epoch: int | None = None  # the topic registry's epoch `partitions` was read at
    topic_names: frozenset[str] = frozenset()  # the names of the topics in `partitions`
    assignor: str = ""
    empty_since_ms: int = 0
    instances: dict[str, ConsumerMember] = field(default_factory=dict)  # static members
    kind = "consumer"
    protocol_type = "consumer"
    pending: dict = field(default_factory=dict)  # none: no member id waits to join here

    @property
    def state(self) -> ConsumerGroupState:
        if not self.members:
            return ConsumerGroupState.EMPTY
        if self.assignment_epoch < self.group_epoch:
            return ConsumerGroupState.ASSIGNING
        if any(m.epoch != self.assignment_epoch or m.state is not MemberState.STABLE
               for m in self.members.values()):
            return ConsumerGroupState.RECONCILING
        return ConsumerGroupState.STABLE

    @property
    def subscribed(self) -> frozenset[str]:
        """The topics its members consume (OffsetDelete refuses their offsets)."""
        return self.topic_names if self.members else frozenset()

    def offset_problem(self, member_id: str | None, epoch: int, version: int | None = None,
                       transactional: bool = False) -> ErrorCode | None:
        """Kafka's check of a member's offset commit or fetch against the group (None:
        allowed).  An epoch below zero is an admin's or a simple consumer's commit: allowed
        while the group has no members; else the member must exist, commit with OffsetCommit
        v9 or later (`version`), and be at its current epoch."""
        if epoch < 0 and not self.members:
            return None
        member = self.members.get(member_id or "")
        if member is None:
            return ErrorCode.unknown_member_id
        if version is not None and version < 9:
            return ErrorCode.unsupported_version
        if epoch != member.epoch:
            return ErrorCode.illegal_generation if transactional else ErrorCode.stale_member_epoch
        return None

    def add(self, member: ConsumerMember) -> None:
        self.members[member.member_id] = member
        if member.instance_id:
            self.instances[member.instance_id] = member

    def remove(self, member: ConsumerMember) -> None:
        """The member and what it owns: its partitions are free for others at once."""
        self.members.pop(member.member_id, None)
        if member.instance_id and self.instances.get(member.instance_id) is member:
            del self.instances[member.instance_id]
        self.target.pop(member.member_id, None)
        self.set_owned(member, {}, {})

    def set_owned(self, member: ConsumerMember, assigned: Assignment,
                  revoking: Assignment) -> None:
        """The member's assignment and partitions to revoke, the owner index kept with them."""
        for key in member.owned():
            if self.owners.get(key) == member.member_id:
                del self.owners[key]
        member.assigned, member.revoking = assigned, revoking
        for key in member.owned():
            self.owners[key] = member.member_id

    def owner_of(self, key: TopicPartition) -> str | None:
        return self.owners.get(key)


@dataclass(frozen=True)
class Step:
    """Where `reconcile` moves a member: its epoch, state, assignment and what it revokes."""

    epoch: int
    state: MemberState
    assigned: Assignment
    revoking: Assignment


def reconcile(member: ConsumerMember, target_epoch: int, target: Assignment,
              owner_of: Callable[[TopicPartition], str | None],
              reported: Assignment | None) -> Step:
    """The member's next step towards `target` (Kafka's CurrentAssignmentBuilder).

    `reported` is what the member says it owns in this heartbeat (None: it did not say), which
    acknowledges a revocation when it no longer holds the partitions being revoked."""
    here = Step(member.epoch, member.state, member.assigned, member.revoking)
    if member.state is MemberState.UNREVOKED_PARTITIONS:
        if reported is None or _holds_any(reported, member.revoking):
            return here
        return _next(member, target_epoch, target, owner_of, reported)
    if member.state is MemberState.STABLE and member.epoch == target_epoch:
        return here
    return _next(member, target_epoch, target, owner_of, reported)


def _next(member: ConsumerMember, target_epoch: int, target: Assignment,
          owner_of: Callable[[TopicPartition], str | None],
          reported: Assignment | None) -> Step:
    kept: Assignment = {}
    revoke: Assignment = {}
    wanted: dict[uuid.UUID, set[int]] = {}
    for topic in set(target) | set(member.assigned):
        current = member.assigned.get(topic, frozenset())
        goal = target.get(topic, frozenset())
        if current & goal:
            kept[topic] = current & goal
        if current - goal:
            revoke[topic] = current - goal
        if goal - current:
            wanted[topic] = set(goal - current)
    if revoke and (reported is None or _holds_any(reported, revoke)):
        # Revoke first; nothing new until the member shows it let those go.
        return Step(member.epoch, MemberState.UNREVOKED_PARTITIONS, kept, revoke)
    assigned = {topic: set(partitions) for topic, partitions in kept.items()}
    unreleased = False
    for topic, partitions in wanted.items():
        for p in partitions:
            if owner_of((topic, p)) in (None, member.member_id):
                assigned.setdefault(topic, set()).add(p)
            else:
                unreleased = True
    state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
    return Step(target_epoch, state,
                {topic: frozenset(ps) for topic, ps in assigned.items() if ps}, {})


def _holds_any(reported: Assignment, partitions: Assignment) -> bool:
    return any(reported.get(topic, frozenset()) & held for topic, held in partitions.items())
