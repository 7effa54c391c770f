"""A consumer group's state and members, as Kafka's classic group coordinator keeps them.

States and the only legal ways into each (Kafka's GroupState.validPreviousStates):

    PreparingRebalance   <- Stable, CompletingRebalance, Empty
    CompletingRebalance  <- PreparingRebalance
    Stable               <- CompletingRebalance
    Empty                <- PreparingRebalance
    Dead                 <- any

`Group.transition` raises IllegalGroupState on anything else: a coordinator bug is loud.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import Callable


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
    deadline: float = 0.0  # monotonic: expires unless it heartbeats before
    # Answers still owed: called with the values to encode (JoinGroup, SyncGroup).
    join: Callable[[dict], None] | None = None
    sync: Callable[[dict], None] | None = None

    def supports(self, protocol: str) -> bool:
        return any(name == protocol for name, _ in self.protocols)

    def metadata(self, protocol: str) -> bytes:
        return next(data for name, data in self.protocols if name == protocol)


@dataclass(eq=False)
class Group:
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

    def transition(self, state: GroupState) -> None:
        if self.state not in _PREVIOUS[state]:
            raise IllegalGroupState(f"group {self.group_id}: {self.state.value} -> {state.value}")
        self.state = state

    def all_joined(self) -> bool:
        return not self.pending and all(m.join is not None for m in self.members.values())

    def candidates(self) -> set[str]:
        """Protocols every member supports."""
        sets = [{name for name, _ in m.protocols} for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def select_protocol(self) -> str:
        """Kafka's vote: each member votes for its most preferred common protocol."""
        common = self.candidates()
        votes: dict[str, int] = {}
        for member in self.members.values():
            choice = next(name for name, _ in member.protocols if name in common)
            votes[choice] = votes.get(choice, 0) + 1
        return max(sorted(votes), key=lambda name: votes[name])

    def by_instance(self, instance_id: str) -> Member | None:
        return next((m for m in self.members.values() if m.instance_id == instance_id), None)
