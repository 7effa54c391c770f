"""The group coordinator (classic protocol), in the parent: one place for every group's state.

Workers forward the group APIs' raw frames to the parent (IPC AdminRequest, like config
requests); `GroupCoordinator.handle` answers with bytes, or with a Future of bytes when the
answer must wait for a rebalance (JoinGroup, SyncGroup).  The worker keeps that connection
muted meanwhile, so its event loop never blocks.  Committed offsets are durable
(broker.parent.groups.offsets), and so is each group's last stable generation
(broker.parent.groups.membership): after a restart a group is Stable again with its members,
whose sessions start over, as Kafka's coordinator loads its groups.

Rebalance (eager, as Kafka's GroupCoordinator): a join, a leave or an expired session moves
the group to PreparingRebalance; it completes once every member has rejoined and no member id
handed out with MEMBER_ID_REQUIRED is still pending - or when the largest rebalance timeout
passes, dropping the members that did not rejoin.  The first rebalance of an empty group
waits `group.initial.rebalance.delay.ms` for more members.  Completion bumps the generation,
picks the protocol by vote and answers every JoinGroup (the leader gets the member list);
the leader's SyncGroup then hands every member its assignment.  Sessions: a member that
neither heartbeats, commits offsets (while the group is Stable or PreparingRebalance, as
Kafka's classic coordinator) nor waits in a join or sync for `session.timeout.ms` is removed.
Static members (`group.instance.id`) keep their assignment across a restart of the client:
rejoining with the same instance id takes over the old member id's place without a
rebalance while the group is stable, and the old member id is fenced (FENCED_INSTANCE_ID on
its join, sync, heartbeat, commit or leave), so two clients sharing an instance id cannot
take the place from each other forever.

Authorization (with an authorizer, broker.shared.access), as Kafka's KafkaApis: joining,
syncing, heartbeating, leaving and committing need READ on the group (GROUP_AUTHORIZATION_FAILED),
a commit also READ on each topic (TOPIC_AUTHORIZATION_FAILED for its partitions); fetching
offsets and describing need DESCRIBE on the group (a fetch of all topics leaves out those the
principal may not DESCRIBE); deleting needs DELETE; ListGroups lists every group to a principal
with DESCRIBE on the cluster, else the groups it may DESCRIBE.

Answers stay proportional to what is held, never to how often a request names it: each group,
topic and partition a DescribeGroups, OffsetFetch, OffsetDelete or DeleteGroups names is
answered once, and what grows with the groups held (a group's members and their metadata,
committed offsets, the list of groups) is charged to the answer's ResponseBudget
(broker.parent.forwarded) before it is built.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import os
import struct
import time
import uuid

from broker.parent.forwarded import ResponseBudget, budget_of, decode_forwarded
from broker.parent.groups.membership import MembershipStore, stable_group
from broker.parent.groups.offsets import OffsetStore, Record
from broker.parent.groups.state import Group, GroupState, Member
from broker.shared.access import Access
from broker.shared.acl import CLUSTER_NAME, Operation, ResourceType
from broker.shared.apis import BY_NAME, GROUP_KEYS
from broker.shared.protocol import errors
from broker.shared.protocol.context import NO_THROTTLE, RequestContext

log = logging.getLogger("broker.parent.groups")

CHECK_EVERY = 0.25  # seconds between session expiry checks
MEMBER_ID_PREFIX = 255  # characters of the client id a generated member id starts with
NO_OPERATIONS = -2147483648  # authorized operations not asked for (Kafka's INT32_MIN)
E = errors.ErrorCode

class GroupCoordinator:
    def __init__(self, loop: asyncio.AbstractEventLoop, props, offsets: OffsetStore,
                 partitions_of, access: Access | None = None,
                 membership: MembershipStore | None = None):
        self.loop = loop
        self.access = access or Access(False)
        self.props = props
        self.offsets = offsets
        self.partitions_of = partitions_of  # topic name -> partition count, or None
        # (transactional id, producer id, epoch, group) -> an error code or None: set by the
        # transaction coordinator (broker.parent.transactions), which owns that state.
        self.transaction_problem = lambda *_: E.coordinator_not_available
        self.groups: dict[str, Group] = {}
        self._pending: dict[tuple[str, str], None] = {}  # every pending member, oldest first
        self._member_count = 0  # members of every group (pending ones are counted apart)
        self._handlers = {BY_NAME[name].key: handler for name, handler in (
            ("OffsetCommit", self._offset_commit), ("OffsetFetch", self._offset_fetch),
            ("JoinGroup", self._join), ("Heartbeat", self._heartbeat), ("LeaveGroup", self._leave),
            ("SyncGroup", self._sync), ("DescribeGroups", self._describe),
            ("ListGroups", self._list), ("DeleteGroups", self._delete),
            ("OffsetDelete", self._offset_delete), ("TxnOffsetCommit", self._txn_offset_commit))}
        assert set(self._handlers) == GROUP_KEYS, "the API table and the coordinator disagree"
        for group_id, committed in offsets.groups.items():  # known again after a restart
            newest = max((entry.committed_ms for entry in committed.values()), default=0)
            self.groups[group_id] = Group(group_id, empty_since_ms=newest)
        self.membership = membership or MembershipStore(
            os.path.dirname(offsets.path), fsync_every_write=offsets.file.fsync)
        self._restore_members()
        self._ticker = loop.call_later(CHECK_EVERY, self._tick)
        self._next_retention = time.monotonic() + props.offsets_retention_check_interval_ms / 1000

    def _restore_members(self) -> None:
        """Every saved group Stable again, its members' sessions waiting for `start` (workers
        may take seconds to start, and no client can heartbeat before); a group that no
        longer fits the bounds on members is left for its members to join again."""
        restored = 0
        for saved in self.membership.saved.values():
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
        for group in self.groups.values():
            for member in group.members.values():
                member.keep_alive(now)

    def abort_waiting(self) -> None:
        """Shutting down: every JoinGroup and SyncGroup still waiting is answered
        NOT_COORDINATOR (the client looks for the coordinator again), so no connection owes
        an answer and workers can drain at once."""
        for group in self.groups.values():
            for member in group.members.values():
                for waiting in (member.join, member.sync):
                    if waiting is not None:
                        waiting({"error_code": E.not_coordinator})
                member.join = member.sync = None

    def close(self) -> None:
        self._ticker.cancel()
        for group in self.groups.values():
            if group.timer is not None:
                group.timer.cancel()
        self.offsets.close()
        self.membership.close()

    def handle(self, request: bytes, listener: int, peer: str, user: str = "ANONYMOUS"):
        ctx, body = decode_forwarded(request, listener, peer, user)
        return self._handlers[ctx.api_key](ctx, body, ctx.host)

    def _may(self, ctx: RequestContext, operation: Operation, group_id: str) -> bool:
        return self.access.check(ctx, operation, ResourceType.GROUP, group_id)

    # --- JoinGroup ------------------------------------------------------------------------

    def _join(self, ctx: RequestContext, body, host: str):
        def answer(code, **values):
            values = dict({"throttle_time": NO_THROTTLE, "error_code": code,
                           "generation_id": -1, "protocol_type": None, "protocol_name": None,
                           "leader": "", "member_id": "", "members": []}, **values)
            if values["protocol_name"] is None and ctx.version < 7:
                values["protocol_name"] = ""  # nullable from v7 only
            return ctx.respond(values)

        if not self._may(ctx, Operation.READ, body.group_id):
            return answer(E.group_authorization_failed)
        props = self.props
        session = body.session_timeout.total_seconds()
        rebalance = (body.rebalance_timeout.total_seconds() if ctx.version >= 1 else session)
        if not body.group_id:
            return answer(E.invalid_group_id)
        if not props.group_min_session_timeout_ms <= session * 1000 <= \
                props.group_max_session_timeout_ms:
            return answer(E.invalid_session_timeout)
        group = self.groups.get(body.group_id) or Group(body.group_id, empty_since_ms=_now_ms())
        protocols = [(p.name, bytes(p.metadata)) for p in body.protocols]
        if not self._compatible(group, body.protocol_type, protocols):
            return answer(E.inconsistent_group_protocol)
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
                return answer(E.group_max_size_reached)
            if ctx.version >= 4 and instance is None:
                # KIP-394: the client must come back with this id; until then it is pending.
                self._add_pending(group, member_id, time.monotonic() + session)
                return answer(E.member_id_required, member_id=member_id)
        elif _fenced(group, member_id, instance):
            return answer(E.fenced_instance_id, member_id=member_id)
        elif member_id not in group.members and member_id not in group.pending:
            return answer(E.unknown_member_id, member_id=member_id)
        if member_id not in group.members and len(group.members) >= props.group_max_size:
            self._drop_pending(group, member_id)
            return answer(E.group_max_size_reached, member_id=member_id)
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
            member.join({"error_code": E.unknown_member_id, "member_id": member_id})

        def respond(values: dict) -> None:
            if not future.done():
                future.set_result(answer(values.pop("error_code", E.none), **values))

        member.join = respond
        if not changed and (group.state is GroupState.COMPLETING or (
                group.state is GroupState.STABLE and member_id != group.leader)):
            # Nothing new: hand back the current generation without a rebalance (as Kafka).
            member.join = None
            respond(self._join_values(group, member))
            return future
        if group.state is not GroupState.PREPARING:
            self._prepare_rebalance(group, f"{member_id} joined")
        self._maybe_complete_join(group)
        return future

    # --- bounds (see the bound table in ARCHITECTURE.md) -----------------------------------

    def _members_total(self) -> int:
        return self._member_count + len(self._pending)

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
        self.membership.save(group)  # after a restart the old member id stays fenced
        return answer(E.none, **self._join_values(group, old))

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
                    member.sync({"error_code": E.rebalance_in_progress})
                    member.sync = None
        was_empty = group.state is GroupState.EMPTY
        group.transition(GroupState.PREPARING)
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
            group.empty_since_ms = _now_ms()
            self.membership.forget(group.group_id)
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
            member.join({"error_code": E.unknown_member_id, "member_id": member.member_id})
        if member.sync is not None:
            member.sync({"error_code": E.unknown_member_id})
        if not rebalance:
            return
        if group.state in (GroupState.STABLE, GroupState.COMPLETING):
            self._prepare_rebalance(group, f"{member.member_id} left")
        self._maybe_complete_join(group)

    def _tick(self) -> None:
        try:
            self._expire(time.monotonic())
        except Exception:  # noqa: BLE001 - a bad tick must not stop every later one
            log.exception("group coordinator tick failed")
        finally:
            self._ticker = self.loop.call_later(CHECK_EVERY, self._tick)

    def _expire(self, now: float) -> None:
        for group in list(self.groups.values()):
            for member in [m for m in group.members.values() if m.deadline < now
                           and m.join is None and m.sync is None]:
                log.info("group %s: session of %s expired", group.group_id, member.member_id)
                self._remove(group, member)
            for member_id in [i for i, expiry in group.pending.items() if expiry < now]:
                self._drop_pending(group, member_id)
                self._maybe_complete_join(group)
            self._forget_if_unused(group)
        if now >= self._next_retention:
            self._next_retention = now + self.props.offsets_retention_check_interval_ms / 1000
            try:
                self.expire_offsets()
            except OSError as error:
                log.error("expiring committed offsets failed: %s", error)

    # --- SyncGroup, Heartbeat, LeaveGroup ---------------------------------------------------

    def _member_problem(self, group: Group | None, member_id: str, generation: int,
                        instance: str | None = None):
        if group is not None and _fenced(group, member_id, instance):
            return E.fenced_instance_id  # an older client with this group.instance.id
        if group is None or member_id not in group.members:
            return E.unknown_member_id
        if generation != group.generation:
            return E.illegal_generation
        return None

    def _sync(self, ctx: RequestContext, body, _host: str):
        def answer(code, assignment=b""):
            return ctx.respond({"throttle_time": NO_THROTTLE, "error_code": code,
                                "protocol_type": group.protocol_type if group else None,
                                "protocol_name": group.protocol if group else None,
                                "assignment": assignment})

        if not self._may(ctx, Operation.READ, body.group_id):
            group = None  # a denied client learns nothing of the group
            return answer(E.group_authorization_failed)
        group = self.groups.get(body.group_id)
        problem = self._member_problem(group, body.member_id, body.generation_id,
                                       getattr(body, "group_instance_id", None))
        if problem is not None:
            return answer(problem)
        if ctx.version >= 5 and body.protocol_name is not None and \
                body.protocol_name != group.protocol:
            return answer(E.inconsistent_group_protocol)
        if group.state is GroupState.PREPARING:
            return answer(E.rebalance_in_progress)
        member = group.members[body.member_id]
        member.keep_alive(time.monotonic())
        if group.state is GroupState.STABLE:
            return answer(E.none, member.assignment)
        future = self.loop.create_future()

        def respond(values: dict) -> None:
            if not future.done():
                future.set_result(answer(values.get("error_code", E.none),
                                         values.get("assignment", b"")))

        if member.sync is not None:  # a retried SyncGroup: the earlier one gets an answer too
            member.sync({"error_code": E.rebalance_in_progress})
        member.sync = respond
        if body.member_id == group.leader:
            given = {a.member_id: bytes(a.assignment) for a in body.assignments}
            group.transition(GroupState.STABLE)
            if group.timer is not None:
                group.timer.cancel()
                group.timer = None
            for other in group.members.values():
                other.assignment = given.get(other.member_id, b"")
            self.membership.save(group)  # before any member hears of its assignment
            for other in group.members.values():
                if other.sync is not None:
                    other.sync({"assignment": other.assignment})
                    other.sync = None
                other.keep_alive(time.monotonic())
        return future

    def _heartbeat(self, ctx: RequestContext, body, _host: str) -> bytes:
        if not self._may(ctx, Operation.READ, body.group_id):
            return ctx.respond({"throttle_time": NO_THROTTLE,
                                "error_code": E.group_authorization_failed})
        group = self.groups.get(body.group_id)
        problem = self._member_problem(group, body.member_id, body.generation_id,
                                       getattr(body, "group_instance_id", None))
        if problem is None:
            group.members[body.member_id].keep_alive(time.monotonic())
            if group.state is GroupState.PREPARING:
                problem = E.rebalance_in_progress
        return ctx.respond({"throttle_time": NO_THROTTLE, "error_code": problem or E.none})

    def _leave(self, ctx: RequestContext, body, _host: str) -> bytes:
        if not self._may(ctx, Operation.READ, body.group_id):
            return ctx.respond({"throttle_time": NO_THROTTLE,
                                "error_code": E.group_authorization_failed, "members": []})
        group = self.groups.get(body.group_id)
        if ctx.version >= 3:
            leaving = [(m.member_id, m.group_instance_id) for m in body.members]
        else:
            leaving = [(body.member_id, None)]
        results = []
        for member_id, instance in leaving:
            member = None
            if group is not None and member_id and _fenced(group, member_id, instance):
                results.append({"member_id": member_id, "group_instance_id": instance,
                                "error_code": E.fenced_instance_id})
                continue
            if group is not None:
                member = group.members.get(member_id) or (
                    group.by_instance(instance) if instance else None)
            if member is None:
                results.append({"member_id": member_id, "group_instance_id": instance,
                                "error_code": E.unknown_member_id})
                continue
            self._remove(group, member)
            results.append({"member_id": member_id, "group_instance_id": instance,
                            "error_code": E.none})
        top = E.none
        if ctx.version < 3 and results[0]["error_code"] != E.none:
            top = results[0]["error_code"]
        return ctx.respond({"throttle_time": NO_THROTTLE, "error_code": top, "members": results})

    # --- offsets ----------------------------------------------------------------------------

    def _offset_commit(self, ctx: RequestContext, body, _host: str) -> bytes:
        group = self.groups.get(body.group_id)
        generation = body.generation_id_or_member_epoch
        problem = None
        if not self._may(ctx, Operation.READ, body.group_id):
            problem = E.group_authorization_failed
        elif not body.group_id:
            problem = E.invalid_group_id
        elif generation >= 0 or (group is not None and group.members):
            # Kafka's order: who commits (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION) first; only a
            # current member of the current generation hears REBALANCE_IN_PROGRESS, which
            # librdkafka would otherwise take as final.
            problem = self._member_problem(group, body.member_id, generation,
                                           getattr(body, "group_instance_id", None))
            if problem is None and group.state is GroupState.COMPLETING:
                problem = E.rebalance_in_progress
            elif problem is None and group.state in (GroupState.STABLE, GroupState.PREPARING):
                # As Kafka's classic coordinator: a member's commit keeps its session alive
                # (one that commits but heartbeats late is not expired meanwhile).
                group.members[body.member_id].keep_alive(time.monotonic())
        records, results = [], []
        now = _now_ms()
        limit = self.props.offset_metadata_max_bytes
        for topic in body.topics:
            partitions = self.partitions_of(topic.name)
            answers = []
            topic_problem = problem
            if problem is None and not self.access.check(ctx, Operation.READ,
                                                         ResourceType.TOPIC, topic.name):
                topic_problem = E.topic_authorization_failed
            for part in topic.partitions:
                code = topic_problem
                metadata = part.committed_metadata
                if code is None and (partitions is None or not 0 <= part.partition_index < partitions):
                    code = E.unknown_topic_or_partition
                if code is None and metadata is not None and len(metadata.encode()) > limit:
                    code = E.offset_metadata_too_large
                if code is None:
                    records.append(Record(group=body.group_id, topic=topic.name,
                                          partition=part.partition_index,
                                          offset=part.committed_offset,
                                          leader_epoch=getattr(part, "committed_leader_epoch", -1),
                                          metadata=metadata, committed_ms=now))
                answers.append({"partition_index": part.partition_index,
                                "error_code": code or E.none})
            results.append({"name": topic.name, "partitions": answers})
        self._persist(records, results, body.group_id)
        if records and group is None:
            self.groups[body.group_id] = Group(body.group_id, empty_since_ms=now)
        return ctx.respond({"throttle_time": NO_THROTTLE, "topics": results})

    def _txn_offset_commit(self, ctx: RequestContext, body, _host: str) -> bytes:
        """Offsets committed inside a transaction: written at once, pending (invisible to
        OffsetFetch) until the transaction coordinator ends the transaction."""
        group = self.groups.get(body.group_id)
        problem = None
        if not self.access.check(ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID,
                                 body.transactional_id):
            problem = E.transactional_id_authorization_failed
        elif not self._may(ctx, Operation.READ, body.group_id):
            problem = E.group_authorization_failed
        else:
            problem = self.transaction_problem(body.transactional_id, body.producer_id,
                                               body.producer_epoch, body.group_id, ctx.version)
        generation = getattr(body, "generation_id", -1)
        if problem is None and generation >= 0:  # KIP-447: the member's generation is checked
            problem = self._member_problem(group, body.member_id, generation,
                                           getattr(body, "group_instance_id", None))
        records, results = [], []
        now = _now_ms()
        for topic in body.topics:
            topic_problem = problem
            if problem is None and not self.access.check(ctx, Operation.READ,
                                                         ResourceType.TOPIC, topic.name):
                topic_problem = E.topic_authorization_failed
            partitions = self.partitions_of(topic.name)
            answers = []
            for part in topic.partitions:
                code = topic_problem
                if code is None and (partitions is None or
                                     not 0 <= part.partition_index < partitions):
                    code = E.unknown_topic_or_partition
                if code is None:
                    records.append(Record(
                        group=body.group_id, topic=topic.name, partition=part.partition_index,
                        offset=part.committed_offset,
                        leader_epoch=getattr(part, "committed_leader_epoch", -1),
                        metadata=part.committed_metadata, committed_ms=now,
                        producer_id=body.producer_id))
                answers.append({"partition_index": part.partition_index,
                                "error_code": code or E.none})
            results.append({"name": topic.name, "partitions": answers})
        self._persist(records, results, body.group_id)
        return ctx.respond({"throttle_time": NO_THROTTLE, "topics": results})

    def _persist(self, records: list[Record], results: list[dict], group_id: str) -> None:
        """Write a commit's offsets; if that fails, the partitions it would have committed
        answer COORDINATOR_NOT_AVAILABLE (the client retries)."""
        try:
            self.offsets.commit(records)
        except OSError as error:
            log.error("committing offsets of group %s failed: %s", group_id, error)
            for topic in results:
                for part in topic["partitions"]:
                    if part["error_code"] == E.none:
                        part["error_code"] = E.coordinator_not_available

    def _fetched(self, ctx: RequestContext, group_id: str, wanted: dict | None,
                 require_stable: bool, budget: ResponseBudget) -> list[dict]:
        """The committed offsets of `wanted` (topic -> partitions, each once), or of every
        topic (None), each row charged to `budget` before it is built."""
        committed = self.offsets.get(group_id)
        # require_stable (v7+): a partition whose offset waits for a transaction's end says so
        # (UNSTABLE_OFFSET_COMMIT, retriable) instead of answering the older offset.
        unstable = self.offsets.pending_partitions(group_id) if require_stable else set()
        denied: set[str] = set()
        if wanted is None:  # all of them: those the principal may not see are left out
            wanted = {}
            for topic, partition in sorted(committed):
                if self.access.allowed(ctx, Operation.DESCRIBE, ResourceType.TOPIC, topic):
                    wanted.setdefault(topic, {})[partition] = None
        else:
            denied = {name for name in wanted if not self.access.check(
                ctx, Operation.DESCRIBE, ResourceType.TOPIC, name)}
        found = []
        for topic, partitions in wanted.items():
            budget.charge(len(topic))
            rows = []
            for partition in partitions:
                entry = None if topic in denied else committed.get((topic, partition))
                code = E.topic_authorization_failed if topic in denied else \
                    E.unstable_offset_commit if (topic, partition) in unstable else E.none
                if code == E.unstable_offset_commit:
                    entry = None
                metadata = (entry.metadata if entry else "") or ""
                budget.charge(len(metadata))
                rows.append({"partition_index": partition, "error_code": code,
                             "committed_offset": entry.offset if entry else -1,
                             "committed_leader_epoch": entry.leader_epoch if entry else -1,
                             "metadata": metadata})
            found.append({"name": topic, "partitions": rows})
        return found

    def _offset_fetch(self, ctx: RequestContext, body, _host: str) -> bytes:
        """Each group, topic and partition once however often the request names it (as
        Fetch): a partition named 100,000 times with 4 KB of committed metadata would be
        400 MB of answer.  Clients read the answer by group, topic and partition."""
        budget = budget_of(self.props)
        if ctx.version >= 8:
            groups = []
            for group_id, wanted in _wanted_groups(body.groups).items():
                budget.charge(len(group_id))
                if not self._may(ctx, Operation.DESCRIBE, group_id):
                    groups.append({"group_id": group_id, "topics": [],
                                   "error_code": E.group_authorization_failed})
                    continue
                groups.append({"group_id": group_id, "error_code": E.none,
                               "topics": self._fetched(ctx, group_id, wanted,
                                                       body.require_stable, budget)})
            return ctx.respond({"throttle_time": NO_THROTTLE, "groups": groups})
        if not self._may(ctx, Operation.DESCRIBE, body.group_id):
            return ctx.respond({"throttle_time": NO_THROTTLE,
                                "error_code": E.group_authorization_failed, "topics": []})
        return ctx.respond({"throttle_time": NO_THROTTLE, "error_code": E.none,
                            "topics": self._fetched(ctx, body.group_id,
                                                    _wanted_topics(body.topics),
                                                    getattr(body, "require_stable", False),
                                                    budget)})

    def expire_offsets(self) -> int:
        """Drop the offsets of groups empty for longer than offsets.retention.minutes."""
        retention = self.props.offsets_retention_minutes * 60000
        now = _now_ms()
        records = []
        for group_id, committed in list(self.offsets.groups.items()):
            group = self.groups.get(group_id)
            if group is not None and group.members:
                continue
            since = group.empty_since_ms if group is not None else 0
            for (topic, partition), entry in committed.items():
                if max(since, entry.committed_ms) + retention < now:
                    records.append(Record(group=group_id, topic=topic, partition=partition))
        if records:
            self.offsets.commit(records)
            log.info("expired %d committed offsets past offsets.retention.minutes",
                     len(records))
        for group_id, group in list(self.groups.items()):  # nothing left of them: forget
            if group.state is GroupState.EMPTY and not group.pending and \
                    not self.offsets.get(group_id):
                del self.groups[group_id]
        self.offsets.maybe_compact()
        return len(records)

    # --- DescribeGroups, ListGroups, DeleteGroups --------------------------------------------

    def _describe(self, ctx: RequestContext, body, _host: str) -> bytes:
        """Each group named once, however often the request names it: Kafka would describe
        a group named 10,000 times 10,000 times (1.1 GB for one 110 KB member); clients
        name each once and read the answer by group id."""
        budget = budget_of(self.props)
        wanted = getattr(body, "include_authorized_operations", False)
        found = []
        for group_id in dict.fromkeys(body.groups):
            budget.charge(len(group_id))
            if not self._may(ctx, Operation.DESCRIBE, group_id):
                found.append(_described(group_id, E.group_authorization_failed))
                continue
            operations = self.access.operations(ctx, ResourceType.GROUP, group_id) \
                if wanted else NO_OPERATIONS
            group = self.groups.get(group_id)
            if group is None and ctx.version >= 6:  # KIP-1043; before v6, a Dead group
                found.append(dict(_described(group_id, E.group_id_not_found, "Dead", operations),
                                  error_message=f"Group {group_id} not found."))
            elif group is None:
                found.append(_described(group_id, E.none, "Dead", operations))
            else:
                found.append(_description(group, operations, budget))
        return ctx.respond({"throttle_time": NO_THROTTLE, "groups": found})

    def _list(self, ctx: RequestContext, body, _host: str) -> bytes:
        # Kafka compares both filters case-insensitively (STABLE, Classic, ...).
        states = {state.lower() for state in getattr(body, "states_filter", ()) or ()}
        types = {kind.lower() for kind in getattr(body, "types_filter", ()) or ()}
        listed = []
        budget = budget_of(self.props)
        everything = self.access.allowed(ctx, Operation.DESCRIBE, ResourceType.CLUSTER,
                                         CLUSTER_NAME)
        for group in self.groups.values():
            if states and group.state.value.lower() not in states:
                continue
            if not everything and not self.access.allowed(ctx, Operation.DESCRIBE,
                                                          ResourceType.GROUP, group.group_id):
                continue
            if types and "classic" not in types:
                continue
            budget.charge(len(group.group_id) + len(group.protocol_type or "")
                          + len(group.state.value) + len("classic"))
            listed.append({"group_id": group.group_id, "protocol_type": group.protocol_type or "",
                           "group_state": group.state.value, "group_type": "classic"})
        return ctx.respond({"throttle_time": NO_THROTTLE, "error_code": E.none,
                            "groups": listed})

    def _offset_delete(self, ctx: RequestContext, body, _host: str) -> bytes:
        """OffsetDelete (kafka-consumer-groups --delete-offsets): the committed offsets of
        partitions the group no longer consumes.  DELETE on the group, READ on each topic;
        a topic the group's live members subscribe to is refused (GROUP_SUBSCRIBED_TO_TOPIC)."""
        if not self._may(ctx, Operation.DELETE, body.group_id):
            return _offset_delete_answer(ctx, E.group_authorization_failed, [])
        group = self.groups.get(body.group_id)
        if group is None and not self.offsets.get(body.group_id):
            return _offset_delete_answer(ctx, E.group_id_not_found, [])
        subscribed = group.subscribed if group is not None else frozenset()
        committed = self.offsets.get(body.group_id)
        answers: dict[str, dict[int, E]] = {}  # each partition once, as Kafka's answer maps
        doomed: dict[tuple[str, int], None] = {}
        for topic in body.topics:
            code, partitions = E.none, self.partitions_of(topic.name)
            if not self.access.check(ctx, Operation.READ, ResourceType.TOPIC, topic.name):
                code = E.topic_authorization_failed
            elif partitions is None:
                code = E.unknown_topic_or_partition
            rows = answers.setdefault(topic.name, {})
            for part in topic.partitions:
                index, row = part.partition_index, code
                if row == E.none and not 0 <= index < partitions:
                    row = E.unknown_topic_or_partition
                elif row == E.none and topic.name in subscribed:
                    row = E.group_subscribed_to_topic
                elif row == E.none and (topic.name, index) in committed:
                    doomed[(topic.name, index)] = None  # a tombstone only for an offset held
                rows[index] = row
        try:
            self.offsets.commit([Record(group=body.group_id, topic=topic, partition=partition)
                                 for topic, partition in doomed])
        except OSError as error:
            log.error("deleting offsets of group %s failed: %s", body.group_id, error)
            return _offset_delete_answer(ctx, E.coordinator_not_available, [])
        return _offset_delete_answer(ctx, E.none, [
            {"name": name, "partitions": [{"partition_index": index, "error_code": row}
                                          for index, row in rows.items()]}
            for name, rows in answers.items()])

    def _delete(self, ctx: RequestContext, body, _host: str) -> bytes:
        """Each group once (as Kafka's `distinct`); the tombstones of all the groups deleted
        are written together, not one write (and fsync) per group."""
        results: dict[str, E] = {}
        for group_id in dict.fromkeys(body.groups_names):
            group = self.groups.get(group_id)
            if not self._may(ctx, Operation.DELETE, group_id):
                results[group_id] = E.group_authorization_failed
            elif group is None and not self.offsets.get(group_id):
                results[group_id] = E.group_id_not_found
            elif group is not None and group.members:
                results[group_id] = E.non_empty_group
            else:
                results[group_id] = E.none
        deleted = [group_id for group_id, code in results.items() if code == E.none]
        try:
            self.offsets.delete_groups(deleted)
        except OSError as error:
            log.error("deleting groups failed: %s", error)
            results.update(dict.fromkeys(deleted, E.coordinator_not_available))
        else:
            for group_id in deleted:
                self.groups.pop(group_id, None)
        return ctx.respond({"throttle_time": NO_THROTTLE, "results": [
            {"group_id": group_id, "error_code": code} for group_id, code in results.items()]})


def _wanted_topics(topics) -> dict[str, dict[int, None]] | None:
    """An OffsetFetch's topics as topic -> partitions, each once, in the order first named;
    None (every committed topic) stays None."""
    if topics is None:
        return None
    wanted: dict[str, dict[int, None]] = {}
    for topic in topics:
        wanted.setdefault(topic.name, {}).update(dict.fromkeys(topic.partition_indexes))
    return wanted


def _wanted_groups(groups) -> dict[str, dict | None]:
    """OffsetFetch v8+: each group once, what its mentions ask merged (None: every topic)."""
    wanted: dict[str, dict | None] = {}
    for group in groups:
        topics = _wanted_topics(group.topics)
        if group.group_id not in wanted:
            wanted[group.group_id] = topics
            continue
        known = wanted[group.group_id]
        if known is None or topics is None:
            wanted[group.group_id] = None
            continue
        for name, partitions in topics.items():
            known.setdefault(name, {}).update(partitions)
    return wanted


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


def _described(group_id: str, code, state: str = "", operations: int = NO_OPERATIONS) -> dict:
    """A DescribeGroups entry without members: refused, or a group that does not exist."""
    return {"error_code": code, "group_id": group_id, "group_state": state, "protocol_type": "",
            "protocol_data": "", "members": [], "authorized_operations": operations}


def _description(group: Group, operations: int, budget: ResponseBudget) -> dict:
    """A group as Kafka describes it: members' metadata and assignments (and the protocol)
    only when it is Stable; charged to `budget` before any of it is built."""
    stable = group.state is GroupState.STABLE
    protocol = group.protocol if stable else None
    members = list(group.members.values())
    budget.charge(len(group.protocol_type or "") + len(protocol or ""))
    budget.charge(sum(len(m.member_id) + len(m.instance_id or "") + len(m.client_id)
                      + len(m.client_host) for m in members), len(members))
    if protocol is not None:
        budget.charge(sum(len(m.metadata(protocol)) + len(m.assignment) for m in members
                          if m.supports(protocol)), 0)
    return {"error_code": E.none, "group_id": group.group_id, "group_state": group.state.value,
            "protocol_type": group.protocol_type or "", "protocol_data": protocol or "",
            "authorized_operations": operations,
            "members": [{"member_id": m.member_id, "group_instance_id": m.instance_id,
                         "client_id": m.client_id, "client_host": m.client_host,
                         "member_metadata": m.metadata(protocol)
                         if protocol is not None and m.supports(protocol) else b"",
                         "member_assignment": m.assignment if stable else b""}
                        for m in members]}


def _offset_delete_answer(ctx: RequestContext, code, topics: list) -> bytes:
    return ctx.respond({"throttle_time": NO_THROTTLE, "error_code": code, "topics": topics})


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


def _fenced(group: Group, member_id: str, instance: str | None) -> bool:
    """KIP-345: the instance id now belongs to another member id (a newer client)."""
    if not instance:
        return False
    static = group.by_instance(instance)
    return static is not None and static.member_id != member_id


def _now_ms() -> int:
    return time.time_ns() // 1_000_000

