"""A consumer group's state and members, as Kafka's classic group coordinator keeps them.

States and the only legal ways into each (Kafka's GroupState.validPreviousStates):

    PreparingRebalance   <- Stable, CompletingRebalance, Empty
    CompletingRebalance  <- PreparingRebalance
    Stable               <- CompletingRebalance
    Empty                <- PreparingRebalance
    Dead                 <- any

`Group.transition` raises IllegalGroupState on anything else: a coordinator bug is loud.

Members join, leave and change protocols only through `Group.add`, `drop`, `rename` and
`set_protocols`, which keep two indexes as they go: how many members support each protocol,
and the static members by instance id.  A join (is one of its protocols supported by every
member?) and a static member's request (which member holds this instance id?) then cost what
the request holds, not the group's size: a 10,000-member group rejoining was 10**8 steps.

`member_problem` and `fenced` say whether a request's member id holds its place in the
current generation: the membership APIs and the offset commits ask the same question.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import ipaddress
import struct
from dataclasses import dataclass, field
from typing import Callable

from broker.shared.protocol.errors import ErrorCode


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING = "PreparingRebalance"
    COMPLETING = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


_PREVIOUS = {
    GroupState.PREPARING: {GroupState.STABLE, GroupState.COMPLETING, GroupState.EMPTY},
    GroupState.COMPLETING: {GroupState.PREPARING},
    GroupState.STABLE: {GroupState.COMPLETING},
    GroupState.EMPTY: {GroupState.PREPARING},
    GroupState.DEAD: set(GroupState),
}


class IllegalGroupState(RuntimeError):
    pass


@dataclass(eq=False)
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout: float  # seconds
    rebalance_timeout: float  # seconds
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    deadline: float = 0.0  # monotonic: expires unless it heartbeats (or commits) before
    # Answers still owed: called with the values to encode (JoinGroup, SyncGroup).
    join: Callable[[dict], None] | None = None
    sync: Callable[[dict], None] | None = None

    def keep_alive(self, now: float) -> None:
        """Restart the session timer (a join, sync, heartbeat or commit of this member)."""
        self.deadline = now + self.session_timeout

    def supports(self, protocol: str) -> bool:
        return any(name == protocol for name, _ in self.protocols)

    def protocol_names(self) -> set[str]:
        return {name for name, _ in self.protocols}

    def metadata(self, protocol: str) -> bytes:
        return next(data for name, data in self.protocols if name == protocol)


@dataclass(eq=False)
class Group:
    kind = "classic"  # what ListGroups calls it (consumer groups of KIP-848: "consumer")
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    pending: dict[str, float] = field(default_factory=dict)  # member ids told to rejoin: expiry
    empty_since_ms: int = 0
    timer: asyncio.TimerHandle | None = None  # the rebalance's deadline (or initial delay)
    delaying: bool = False  # in the initial rebalance delay of a group that was empty
    support: collections.Counter = field(default_factory=collections.Counter)  # name: members
    subscribed: frozenset[str] = frozenset()  # a consumer group's topics, as of its generation
    instances: dict[str, Member] = field(default_factory=dict)  # static members

    def add(self, member: Member) -> None:
        self.members[member.member_id] = member
        self.support.update(member.protocol_names())
        if member.instance_id:
            self.instances[member.instance_id] = member

    def drop(self, member_id: str) -> Member:
        member = self.members.pop(member_id)
        self.support.subtract(member.protocol_names())
        if member.instance_id and self.instances.get(member.instance_id) is member:
            del self.instances[member.instance_id]
        return member

    def rename(self, member: Member, member_id: str) -> None:
        """A static member taking a new member id (its place and assignment kept)."""
        del self.members[member.member_id]
        member.member_id = member_id
        self.members[member_id] = member

    def set_protocols(self, member: Member, protocols: list[tuple[str, bytes]]) -> None:
        self.support.subtract(member.protocol_names())
        member.protocols = protocols
        self.support.update(member.protocol_names())

    def supported_by_all(self, names) -> bool:
        """Whether one of `names` is a protocol every member supports."""
        return any(self.support[name] == len(self.members) for name in names)

    def transition(self, state: GroupState) -> None:
        if self.state not in _PREVIOUS[state]:
            raise IllegalGroupState(f"group {self.group_id}: {self.state.value} -> {state.value}")
        self.state = state

    def all_joined(self) -> bool:
        return not self.pending and all(m.join is not None for m in self.members.values())

    def candidates(self) -> set[str]:
        """Protocols every member supports."""
        everyone = len(self.members)
        return {name for name, count in self.support.items() if count == everyone} \
            if everyone else set()

    def select_protocol(self) -> str:
        """Kafka's vote: each member votes for its most preferred common protocol."""
        common = self.candidates()
        votes: dict[str, int] = {}
        for member in self.members.values():
            choice = next(name for name, _ in member.protocols if name in common)
            votes[choice] = votes.get(choice, 0) + 1
        return max(sorted(votes), key=lambda name: votes[name])

    def by_instance(self, instance_id: str) -> Member | None:
        return self.instances.get(instance_id)


def fenced(group: Group, member_id: str, instance: str | None) -> bool:
    """KIP-345: the instance id now belongs to another member id (a newer client)."""
    if not instance:
        return False
    static = group.by_instance(instance)
    return static is not None and static.member_id != member_id


def member_problem(group: Group | None, member_id: str, generation: int,
                   instance: str | None = None):
    """The error code for a request of `member_id` in `generation`, or None: it is a member of
    the current generation."""
    if group is not None and fenced(group, member_id, instance):
        return ErrorCode.fenced_instance_id  # an older client with this group.instance.id
    if group is None or member_id not in group.members:
        return ErrorCode.unknown_member_id
    if generation != group.generation:
        return ErrorCode.illegal_generation
    return None


def java_host(ip: str) -> str:
    """A member's address as Kafka describes it: Java's InetAddress.toString() of an address
    not looked up, "/10.0.0.1" (IPv6 in Java's form: every group, in hex without leading
    zeros, "/0:0:0:0:0:0:0:1")."""
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:  # not an address (an in-process caller): as it is
        return ip
    if address.version == 4:
        return f"/{address}"
    groups = ":".join(f"{group:x}" for group in struct.unpack(">8H", address.packed))
    return f"/{groups}%{address.scope_id}" if address.scope_id else f"/{groups}"
