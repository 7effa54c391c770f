"""Group membership: JoinGroup, SyncGroup, Heartbeat and LeaveGroup, the rebalances they
start, the sessions that expire, and when a group's stable generation is kept
(broker.parent.groups.membership_store keeps it).

Rebalance (eager, as Kafka's GroupCoordinator): a join, a leave or an expired session moves
the group to PreparingRebalance; it completes once every member has rejoined and no member id
handed out with MEMBER_ID_REQUIRED is still pending - or when the largest rebalance timeout
passes, dropping the members that did not rejoin.  The first rebalance of an empty group
waits `group.initial.rebalance.delay.ms` for more members.  Completion bumps the generation,
picks the protocol by vote and answers every JoinGroup (the leader gets the member list);
the leader's SyncGroup then hands every member its assignment.  JoinGroup and SyncGroup are
answered with a Future of bytes when the answer must wait for the rebalance.  Sessions: a
member that neither heartbeats, commits offsets (while the group is Stable or
PreparingRebalance, as Kafka's classic coordinator; broker.parent.groups.offsets) nor waits in
a join or sync for `session.timeout.ms` is removed.  Static members (`group.instance.id`) keep
their assignment across a restart of the client: rejoining with the same instance id takes
over the old member id's place without a rebalance while the group is stable, and the old
member id is fenced (FENCED_INSTANCE_ID on its join, sync, heartbeat, commit or leave), so two
clients sharing an instance id cannot take the place from each other forever.  Joining,
syncing, heartbeating and leaving need READ on the group (GROUP_AUTHORIZATION_FAILED).

Durable: each time a generation becomes stable (the leader's SyncGroup) or a static member
takes over a place, the group is saved before the answers go out, and forgotten when it
becomes empty (`MembershipStore.save`, `forget`).

At start-up each saved group is taken back as Stable with its generation, leader and
assignments, every member's session counted from when the broker serves (its workers ready),
as Kafka's coordinator reschedules every member's heartbeat when it loads a group: a client
that comes back within its session timeout goes on with its generation (its heartbeats and
commits are accepted: a Kafka Streams application with exactly-once keeps its tasks and their
state instead of wiping and restoring them); one that does not is removed by session expiry
and the group rebalances.
"""

from __future__ import annotations

import asyncio
import logging
import math
import struct
import time
import uuid
from typing import Callable

from broker.parent.groups.membership_store import MembershipStore, stable_group
from broker.parent.groups.offset_store import OffsetStore
from broker.parent.groups.state import (Group, GroupState, Member, fenced, java_host,
                                        member_problem)
from broker.shared.access import Access
from broker.shared.acl import Operation, ResourceType
from broker.shared.clock import now_ms
from broker.shared.events import EventLog, GroupRebalance
from broker.shared.protocol.context import NO_THROTTLE, RequestContext
from broker.shared.protocol.errors import ErrorCode

log = logging.getLogger("broker.parent.groups.membership")

MEMBER_ID_PREFIX = 255  # characters of the client id a generated member id starts with


class Membership:
    """The members of every group in the coordinator's table: their joins, syncs, heartbeats
    and leaves, the rebalances and the session expiry, within the bounds on members."""

    def __init__(self, loop: asyncio.AbstractEventLoop, props, access: Access,
                 groups: dict[str, Group], offsets: OffsetStore, store: MembershipStore):
        self.loop = loop
        self.props = props
        self.access = access
        self.groups = groups  # the coordinator's table, shared
        self.offsets = offsets  # a group with committed offsets is kept when it empties
        self.store = store
        # The table's consumer group of that id (KIP-848, empty) is dropped: set by the
        # coordinator, which owns both kinds.
        self.give_way: Callable[[str], None] = lambda group_id: None
        self.events: EventLog | None = None  # group_rebalance events: set by the coordinator
        self.consumer_members: Callable[[], int] = lambda: 0  # members of consumer groups
        self._pending: dict[tuple[str, str], None] = {}  # every pending member, oldest first
        self._member_count = 0  # members of every group (pending ones are counted apart)

    def restore(self) -> None:
        """Every saved group Stable again, its members' sessions waiting for `start` (workers
        may take seconds to start, and no client can heartbeat before); a group that no
        longer fits the bounds on members is left for its members to join again."""
        restored = 0
        for saved in self.store.saved.values():
            count = len(saved.members)
            if count > self.props.group_max_size or \
                    self._members_total() + count > self.props.pybroker_group_max_members:
                log.warning("group %s: %d saved members exceed the bounds; they join again",
                            saved.group, count)
                continue
            group = stable_group(saved, math.inf)
            group.subscribed = _subscribed_topics(group)
            self.groups[saved.group] = group
            self._member_count += count
            restored += 1
        if restored:
            log.info("groups restored: %d stable, %d members", restored, self._member_count)

    def start(self) -> None:
        """The broker serves from now on: every member's session counts from here."""
        now = time.monotonic()
        for group in self._classic_groups():
            for member in group.members.values():
                member.keep_alive(now)

    def abort_waiting(self) -> None:
        """Every JoinGroup and SyncGroup still waiting is answered NOT_COORDINATOR (the client
        looks for the coordinator again), so no connection owes an answer."""
        for group in self._classic_groups():
            for member in group.members.values():
                for waiting in (member.join, member.sync):
                    if waiting is not None:
                        waiting({"error_code": ErrorCode.not_coordinator})
                member.join = member.sync = None

    def cancel_timers(self) -> None:
        for group in self._classic_groups():
            if group.timer is not None:
                group.timer.cancel()

    def _may(self, ctx: RequestContext, operation: Operation, group_id: str) -> bool:
        return self.access.check(ctx, operation, ResourceType.GROUP, group_id)

    def _classic_groups(self) -> list[Group]:
        """The table's classic groups (it holds the consumer groups of KIP-848 too)."""
        return [group for group in self.groups.values() if isinstance(group, Group)]

    def _classic(self, group_id: str) -> Group | None:
        """The classic group of that id; None for a consumer group, whose members a classic
        request cannot name (UNKNOWN_MEMBER_ID, as Kafka answers a member it does not know)."""
        group = self.groups.get(group_id)
        return group if isinstance(group, Group) else None

    # --- JoinGroup ------------------------------------------------------------------------

    def join(self, ctx: RequestContext, body, host: str):
        def answer(code, **values):
            values = dict({"throttle_time": NO_THROTTLE, "error_code": code,
                           "generation_id": -1, "protocol_type": None, "protocol_name": None,
                           "leader": "", "member_id": "", "members": []}, **values)
            if values["protocol_name"] is None and ctx.version < 7:
                values["protocol_name"] = ""  # nullable from v7 only
            return ctx.respond(values)

        if not self._may(ctx, Operation.READ, body.group_id):
            return answer(ErrorCode.group_authorization_failed)
        props = self.props
        session = body.session_timeout.total_seconds()
        rebalance = (body.rebalance_timeout.total_seconds() if ctx.version >= 1 else session)
        if not body.group_id:
            return answer(ErrorCode.invalid_group_id)
        if not props.group_min_session_timeout_ms <= session * 1000 <= \
                props.group_max_session_timeout_ms:
            return answer(ErrorCode.invalid_session_timeout)
        group = self.groups.get(body.group_id)
        if group is not None and not isinstance(group, Group):
            if group.members or group.kind == "share":  # not two kinds at once
                return answer(ErrorCode.inconsistent_group_protocol)
            self.give_way(body.group_id)  # an empty one becomes classic (its offsets stay)
            group = None
        group = group or Group(body.group_id, empty_since_ms=now_ms())
        protocols = [(p.name, bytes(p.metadata)) for p in body.protocols]
        if not self._compatible(group, body.protocol_type, protocols):
            return answer(ErrorCode.inconsistent_group_protocol)
        self.groups.setdefault(body.group_id, group)
        instance = getattr(body, "group_instance_id", None)
        member_id = body.member_id
        client_id = ctx.header.client_id or ""
        if not member_id:
            # Kafka's form (client id, then a UUID), the client id's part bounded.
            member_id = f"{client_id[:MEMBER_ID_PREFIX]}-{uuid.uuid4()}"
            static = group.by_instance(instance) if instance else None
            if static is not None and group.state is GroupState.STABLE and \
                    static.protocols == protocols:
                return self._replace_static(ctx, group, static, member_id, answer)
            if static is not None:
                self._remove(group, static, rebalance=False)
            if self._members_total() >= props.pybroker_group_max_members:
                self._forget_if_unused(group)
                return answer(ErrorCode.group_max_size_reached)
            if ctx.version >= 4 and instance is None:
                # KIP-394: the client must come back with this id; until then it is pending.
                self._add_pending(group, member_id, time.monotonic() + session)
                return answer(ErrorCode.member_id_required, member_id=member_id)
        elif fenced(group, member_id, instance):
            return answer(ErrorCode.fenced_instance_id, member_id=member_id)
        elif member_id not in group.members and member_id not in group.pending:
            return answer(ErrorCode.unknown_member_id, member_id=member_id)
        if member_id not in group.members and len(group.members) >= props.group_max_size:
            self._drop_pending(group, member_id)
            return answer(ErrorCode.group_max_size_reached, member_id=member_id)
        self._drop_pending(group, member_id)
        member = group.members.get(member_id)
        changed = member is None or member.protocols != protocols
        if member is None:
            member = Member(member_id, instance, client_id, java_host(host), session, rebalance,
                            protocols)
            group.add(member)
            self._member_count += 1
        elif changed:
            group.set_protocols(member, protocols)
        member.session_timeout, member.rebalance_timeout = session, rebalance
        member.keep_alive(time.monotonic())
        group.protocol_type = body.protocol_type
        future = self.loop.create_future()
        if member.join is not None:  # a retried join replaces the one still waiting
            member.join({"error_code": ErrorCode.unknown_member_id, "member_id": member_id})

        def respond(values: dict) -> None:
            if not future.done():
                future.set_result(answer(values.pop("error_code", ErrorCode.none), **values))

        member.join = respond
        if not changed and (group.state is GroupState.COMPLETING or (
                group.state is GroupState.STABLE and member_id != group.leader)):
            # Nothing new: hand back the current generation without a rebalance (as Kafka).
            member.join = None
            respond(self._join_values(group, member))
            return future
        if group.state is not GroupState.PREPARING:
            log.info("group %s: %s joined", group.group_id, member_id)
            self._prepare_rebalance(group, "member joined")
        self._maybe_complete_join(group)
        return future

    # --- bounds (see the bound table in ARCHITECTURE.md) -----------------------------------

    def classic_members(self) -> int:
        """Members of classic groups, pending ones included."""
        return self._member_count + len(self._pending)

    def _members_total(self) -> int:
        """What pybroker.group.max.members bounds: the members of both kinds of group."""
        return self.classic_members() + self.consumer_members()

    def _add_pending(self, group: Group, member_id: str, expiry: float) -> None:
        """A member id handed out with MEMBER_ID_REQUIRED, kept until it rejoins or expires.
        At most pybroker.group.max.pending.members in all (and group.max.size per group): the
        oldest goes first; a client that comes back too late joins again from the start."""
        limit = self.props.pybroker_group_max_pending_members
        if len(group.pending) >= min(limit, self.props.group_max_size):
            self._drop_pending(group, next(iter(group.pending)))
        while len(self._pending) >= limit:
            group_id, oldest = next(iter(self._pending))
            owner = self.groups.get(group_id)
            if owner is None:
                self._pending.pop((group_id, oldest), None)
                continue
            self._drop_pending(owner, oldest)
            self._forget_if_unused(owner)
        group.pending[member_id] = expiry
        self._pending[(group.group_id, member_id)] = None

    def _drop_pending(self, group: Group, member_id: str) -> None:
        group.pending.pop(member_id, None)
        self._pending.pop((group.group_id, member_id), None)

    def _forget_if_unused(self, group: Group) -> None:
        """A group with no member, no pending member and no committed offset is only a name a
        client sent: it is not kept."""
        if group.state is GroupState.EMPTY and not group.members and not group.pending and \
                not self.offsets.get(group.group_id) and \
                self.groups.get(group.group_id) is group:
            del self.groups[group.group_id]

    def _compatible(self, group: Group, protocol_type: str, protocols) -> bool:
        if not protocols or not protocol_type:
            return False
        if not group.members:
            return True
        if protocol_type != group.protocol_type:
            return False
        return group.supported_by_all({name for name, _ in protocols})

    def _replace_static(self, ctx, group: Group, old: Member, member_id: str, answer):
        group.rename(old, member_id)
        if group.leader is not None and group.leader not in group.members:
            group.leader = member_id
        old.keep_alive(time.monotonic())
        self.store.save(group)  # after a restart the old member id stays fenced
        return answer(ErrorCode.none, **self._join_values(group, old))

    def _join_values(self, group: Group, member: Member) -> dict:
        leader = member.member_id == group.leader
        return {"generation_id": group.generation, "protocol_type": group.protocol_type,
                "protocol_name": group.protocol, "leader": group.leader or "",
                "member_id": member.member_id, "members": [
                    {"member_id": m.member_id, "group_instance_id": m.instance_id,
                     "metadata": m.metadata(group.protocol)}
                    for m in group.members.values()] if leader else []}

    # --- rebalancing ----------------------------------------------------------------------

    def _prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.state is GroupState.COMPLETING:
            for member in group.members.values():  # the leader's assignment will not come
                member.assignment = b""
                if member.sync is not None:
                    member.sync({"error_code": ErrorCode.rebalance_in_progress})
                    member.sync = None
        was_empty = group.state is GroupState.EMPTY
        group.transition(GroupState.PREPARING)
        if self.events is not None:
            self.events.emit(GroupRebalance(group=group.group_id, group_type="classic",
                                            epoch=group.generation + 1,
                                            members=len(group.members), reason=reason))
        log.info("group %s rebalancing (generation %d): %s", group.group_id, group.generation,
                 reason)
        if group.timer is not None:
            group.timer.cancel()
        delay = self.props.group_initial_rebalance_delay_ms / 1000 if was_empty else 0.0
        if delay > 0:
            group.delaying = True
            group.timer = self.loop.call_later(delay, self._delay_over, group)
        else:
            self._arm_rebalance_timeout(group)

    def _delay_over(self, group: Group) -> None:
        group.delaying = False
        self._arm_rebalance_timeout(group)
        self._maybe_complete_join(group)

    def _arm_rebalance_timeout(self, group: Group) -> None:
        timeout = max((m.rebalance_timeout for m in group.members.values()), default=0.0)
        group.timer = self.loop.call_later(timeout, self._complete_join, group)

    def _maybe_complete_join(self, group: Group) -> None:
        if group.state is GroupState.PREPARING and not group.delaying and group.all_joined():
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        if group.state is not GroupState.PREPARING:
            return
        if group.timer is not None:
            group.timer.cancel()
            group.timer = None
        group.delaying = False
        for member in [m for m in group.members.values() if m.join is None]:
            log.info("group %s: member %s did not rejoin in time", group.group_id,
                     member.member_id)
            group.drop(member.member_id)
            self._member_count -= 1
        for member_id in list(group.pending):
            self._drop_pending(group, member_id)
        group.generation += 1
        if not group.members:
            group.transition(GroupState.EMPTY)
            group.protocol = group.leader = None
            group.subscribed = frozenset()
            group.empty_since_ms = now_ms()
            self.store.forget(group.group_id)
            return
        group.protocol = group.select_protocol()
        # Read from the members' metadata once a generation (Kafka's initNextGeneration), not
        # for each OffsetDelete: that was every member's metadata parsed for each request.
        group.subscribed = _subscribed_topics(group)
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.transition(GroupState.COMPLETING)
        # The leader's SyncGroup must come within the rebalance timeout (Kafka's pending-sync
        # timeout): otherwise members that have not synced are dropped and it starts over.
        timeout = max(m.rebalance_timeout for m in group.members.values())
        group.timer = self.loop.call_later(timeout, self._sync_expired, group, group.generation)
        now = time.monotonic()
        for member in group.members.values():
            respond, member.join = member.join, None
            member.keep_alive(now)
            respond(self._join_values(group, member))
        log.info("group %s: generation %d, %d members, protocol %s", group.group_id,
                 group.generation, len(group.members), group.protocol)

    def _sync_expired(self, group: Group, generation: int) -> None:
        if group.state is not GroupState.COMPLETING or group.generation != generation:
            return
        for member in [m for m in group.members.values() if m.sync is None]:
            log.info("group %s: member %s did not sync in time", group.group_id,
                     member.member_id)
            self._remove(group, member, rebalance=False)
        self._prepare_rebalance(group, "members did not sync in time")
        self._maybe_complete_join(group)

    def _remove(self, group: Group, member: Member, rebalance: bool = True) -> None:
        group.drop(member.member_id)
        self._member_count -= 1
        if member.join is not None:
            member.join({"error_code": ErrorCode.unknown_member_id, "member_id": member.member_id})
        if member.sync is not None:
            member.sync({"error_code": ErrorCode.unknown_member_id})
        if not rebalance:
            return
        if group.state in (GroupState.STABLE, GroupState.COMPLETING):
            log.info("group %s: %s left", group.group_id, member.member_id)
            self._prepare_rebalance(group, "member left")
        self._maybe_complete_join(group)

    def expire_sessions(self, now: float) -> None:
        """Members whose session ran out (none waiting in a join or sync) leave; pending
        member ids past their expiry are dropped; groups left with nothing are forgotten."""
        for group in self._classic_groups():
            for member in [m for m in group.members.values() if m.deadline < now
                           and m.join is None and m.sync is None]:
                log.info("group %s: session of %s expired", group.group_id, member.member_id)
                self._remove(group, member)
            for member_id in [i for i, expiry in group.pending.items() if expiry < now]:
                self._drop_pending(group, member_id)
                self._maybe_complete_join(group)
            self._forget_if_unused(group)

    # --- SyncGroup, Heartbeat, LeaveGroup ---------------------------------------------------

    def sync(self, ctx: RequestContext, body, _host: str):
        def answer(code, assignment=b""):
            return ctx.respond({"throttle_time": NO_THROTTLE, "error_code": code,
                                "protocol_type": group.protocol_type if group else None,
                                "protocol_name": group.protocol if group else None,
                                "assignment": assignment})

        if not self._may(ctx, Operation.READ, body.group_id):
            group = None  # a denied client learns nothing of the group
            return answer(ErrorCode.group_authorization_failed)
        group = self._classic(body.group_id)
        problem = member_problem(group, body.member_id, body.generation_id,
                                 getattr(body, "group_instance_id", None))
        if problem is not None:
            return answer(problem)
        if ctx.version >= 5 and body.protocol_name is not None and \
                body.protocol_name != group.protocol:
            return answer(ErrorCode.inconsistent_group_protocol)
        if group.state is GroupState.PREPARING:
            return answer(ErrorCode.rebalance_in_progress)
        member = group.members[body.member_id]
        member.keep_alive(time.monotonic())
        if group.state is GroupState.STABLE:
            return answer(ErrorCode.none, member.assignment)
        future = self.loop.create_future()

        def respond(values: dict) -> None:
            if not future.done():
                future.set_result(answer(values.get("error_code", ErrorCode.none),
                                         values.get("assignment", b"")))

        if member.sync is not None:  # a retried SyncGroup: the earlier one gets an answer too
            member.sync({"error_code": ErrorCode.rebalance_in_progress})
        member.sync = respond
        if body.member_id == group.leader:
            given = {a.member_id: bytes(a.assignment) for a in body.assignments}
            group.transition(GroupState.STABLE)
            if group.timer is not None:
                group.timer.cancel()
                group.timer = None
            for other in group.members.values():
                other.assignment = given.get(other.member_id, b"")
            self.store.save(group)  # before any member hears of its assignment
            for other in group.members.values():
                if other.sync is not None:
                    other.sync({"assignment": other.assignment})
                    other.sync = None
                other.keep_alive(time.monotonic())
        return future

    def heartbeat(self, ctx: RequestContext, body, _host: str) -> bytes:
        if not self._may(ctx, Operation.READ, body.group_id):
            return ctx.respond({"throttle_time": NO_THROTTLE,
                                "error_code": ErrorCode.group_authorization_failed})
        group = self._classic(body.group_id)
        problem = member_problem(group, body.member_id, body.generation_id,
                                 getattr(body, "group_instance_id", None))
        if problem is None:
            group.members[body.member_id].keep_alive(time.monotonic())
            if group.state is GroupState.PREPARING:
                problem = ErrorCode.rebalance_in_progress
        return ctx.respond({"throttle_time": NO_THROTTLE, "error_code": problem or ErrorCode.none})

    def leave(self, ctx: RequestContext, body, _host: str) -> bytes:
        if not self._may(ctx, Operation.READ, body.group_id):
            return ctx.respond({"throttle_time": NO_THROTTLE,
                                "error_code": ErrorCode.group_authorization_failed, "members": []})
        group = self._classic(body.group_id)
        if ctx.version >= 3:
            leaving = [(m.member_id, m.group_instance_id) for m in body.members]
        else:
            leaving = [(body.member_id, None)]
        results = []
        for member_id, instance in leaving:
            member = None
            if group is not None and member_id and fenced(group, member_id, instance):
                results.append({"member_id": member_id, "group_instance_id": instance,
                                "error_code": ErrorCode.fenced_instance_id})
                continue
            if group is not None:
                member = group.members.get(member_id) or (
                    group.by_instance(instance) if instance else None)
            if member is None:
                results.append({"member_id": member_id, "group_instance_id": instance,
                                "error_code": ErrorCode.unknown_member_id})
                continue
            self._remove(group, member)
            results.append({"member_id": member_id, "group_instance_id": instance,
                            "error_code": ErrorCode.none})
        top = ErrorCode.none
        if ctx.version < 3 and results[0]["error_code"] != ErrorCode.none:
            top = results[0]["error_code"]
        return ctx.respond({"throttle_time": NO_THROTTLE, "error_code": top, "members": results})


def _subscribed_topics(group: Group) -> frozenset[str]:
    """The topics a consumer group's members subscribe to (the consumer protocol's
    subscription: int16 version, then an array of int16-sized names); other protocols: none."""
    topics: set[str] = set()
    if group.protocol_type != "consumer" or group.protocol is None:
        return frozenset()
    for member in group.members.values():
        data = member.metadata(group.protocol) if member.supports(group.protocol) else b""
        try:
            (count,) = struct.unpack_from(">i", data, 2)
            position = 6
            for _ in range(max(0, min(count, len(data) // 2))):
                (size,) = struct.unpack_from(">h", data, position)
                topics.add(data[position + 2:position + 2 + size].decode("utf-8", "replace"))
                position += 2 + max(size, 0)
        except struct.error:
            continue  # not what a Kafka consumer sends: nothing can be said of it
    return frozenset(topics)
