"""Consumer groups of the KIP-848 protocol: ConsumerGroupHeartbeat and ConsumerGroupDescribe,
the target assignment computed on the broker, the members' sessions and revocation deadlines.

One heartbeat does everything a member needs (Kafka's GroupMetadataManager):

  1. validate the request (INVALID_REQUEST with Kafka's message), READ on the group;
  2. join (member epoch 0: a new member, or a static member taking its place back), leave
     (-1; -2 for a static member, whose place and partitions wait `session.timeout` for it),
     or find the member and check its epoch (FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID);
  3. take its subscription (topic names or a regular expression, evaluated here against the
     topics that exist), its assignor, its rebalance timeout; anything that changes what the
     assignment must be bumps the group epoch: a member joining or leaving, a subscription,
     the partitions of a subscribed topic (a topic created or grown is seen at the next
     heartbeat of any member: the topic registry's epoch moved);
  4. when the group epoch is ahead of the assignment epoch, compute the target assignment with
     the group's assignor (broker.parent.groups.assignors);
  5. move the member one step towards its target (consumer_state.reconcile): revoke first,
     assign only partitions no other member owns;
  6. answer its epoch, the heartbeat interval and its assignment when it changed or the
     request was a full one.

Every change is written to the group's record (consumer_store) before the answer goes out, so
a restarted broker takes each group back with its epochs, members, assignments and target,
every member's session counted from when the broker serves again.

Timers, on the coordinator's tick: a member that does not heartbeat for
`group.consumer.session.timeout.ms` is removed, and one that holds partitions to revoke for
longer than its rebalance timeout is fenced (removed: its partitions are free for others).
"""

from __future__ import annotations

import base64
import datetime
import logging
import time
import uuid
from typing import Callable

import re2

from broker.parent.forwarded import budget_of
from broker.parent.group_configs import GroupConfigs
from broker.parent.groups.assignors import ASSIGNORS, Assignment, chosen_assignor
from broker.parent.groups.consumer_state import (ConsumerGroup, ConsumerMember, MemberState,
                                                 reconcile)
from broker.parent.groups.consumer_store import restored_group
from broker.parent.groups.heartbeats import (NO_OPERATIONS, Refused, answer_heartbeat,
                                             encoded, hidden_topics, interval, not_described,
                                             session_seconds, to_describe)
from broker.parent.groups.state import java_host
from broker.shared.access import Access
from broker.shared.acl import Operation, ResourceType
from broker.shared.clock import now_ms
from broker.shared.config.properties import split_csv
from broker.shared.protocol.context import NO_THROTTLE, RequestContext
from broker.shared.events import EventLog, GroupRebalance
from broker.shared.log.topics import Epoch
from broker.shared.protocol.errors import ErrorCode

log = logging.getLogger("broker.parent.groups.consumer")

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2
MAX_PATTERNS = 1000  # compiled subscription expressions kept
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a bad expression is the client's answer, not a log line
CONSUMER_MEMBER = 1  # ConsumerGroupDescribe v1's member type: 0 classic, 1 consumer


class _NoTopics:
    """The topic registry of a coordinator given none (tests of the classic protocol)."""

    epoch = Epoch()

    @staticmethod
    def topics() -> dict:
        return {}

    @staticmethod
    def by_id(_topic_id):
        return None


NO_TOPICS = _NoTopics()


class ConsumerGroups:
    """The KIP-848 groups of the coordinator's table (shared with the classic ones)."""

    def __init__(self, props, access: Access, groups: dict, topics, store,
                 others_total: Callable[[], int], clock: Callable[[], float] = time.monotonic,
                 events: EventLog | None = None, group_configs: GroupConfigs | None = None):
        self.props = props
        self.access = access
        self.groups = groups  # the coordinator's table: classic and consumer groups
        self.topics = topics  # the topic registry (names, ids, partition counts)
        self.store = store
        self.others_total = others_total  # members of classic groups (pybroker.group.max.members)
        self.clock = clock
        self.events = events  # group_rebalance events, when the event log is on
        self.offered = tuple(split_csv(props.group_consumer_assignors))
        self.group_configs = group_configs or GroupConfigs(props)
        self.member_count = 0  # members of every consumer group
        self._regexes: dict = {}

    def _session(self, group_id: str) -> float:
        return session_seconds(self.group_configs, "consumer", group_id)

    # --- ConsumerGroupHeartbeat ------------------------------------------------------------

    def heartbeat(self, ctx: RequestContext, body, host: str) -> bytes:
        return answer_heartbeat(ctx, body, host,
                                interval(self.group_configs, "consumer", body.group_id),
                                self.access, self._validate, self._heartbeat)

    def _validate(self, ctx: RequestContext, body) -> None:
        epoch = body.member_epoch
        if not body.group_id:
            raise Refused(ErrorCode.invalid_request, "GroupId can't be empty.")
        if body.instance_id is not None and not body.instance_id:
            raise Refused(ErrorCode.invalid_request, "InstanceId can't be empty.")
        if body.rack_id is not None and not body.rack_id:
            raise Refused(ErrorCode.invalid_request, "RackId can't be empty.")
        if not body.member_id and (ctx.version >= 1 or epoch > JOIN_EPOCH or
                                   epoch == LEAVE_EPOCH):
            raise Refused(ErrorCode.invalid_request, "MemberId can't be empty.")
        if epoch == JOIN_EPOCH:
            if body.rebalance_timeout.total_seconds() * 1000 == -1:
                raise Refused(ErrorCode.invalid_request,
                              "RebalanceTimeoutMs must be provided in first request.")
            if body.topic_partitions is None or body.topic_partitions:
                raise Refused(ErrorCode.invalid_request,
                              "TopicPartitions must be empty when (re-)joining.")
            if body.subscribed_topic_names is None and \
                    getattr(body, "subscribed_topic_regex", None) is None:
                raise Refused(ErrorCode.invalid_request,
                              "Either SubscribedTopicNames or SubscribedTopicRegex must be "
                              "non-null when (re-)joining.")
        elif epoch == STATIC_LEAVE_EPOCH and body.instance_id is None:
            raise Refused(ErrorCode.invalid_request,
                          "InstanceId can't be null.")
        elif epoch < STATIC_LEAVE_EPOCH:
            raise Refused(ErrorCode.invalid_request, "MemberEpoch is invalid.")
        if body.server_assignor is not None and body.server_assignor not in self.offered:
            raise Refused(ErrorCode.unsupported_assignor,
                          f"ServerAssignor {body.server_assignor} is not supported. "
                          f"Supported assignors: {', '.join(self.offered)}.")
        regex = getattr(body, "subscribed_topic_regex", None)
        if regex is not None:
            self._pattern(regex)

    def _pattern(self, regex: str):
        """The compiled expression (RE2, as Kafka's RE2J: matching takes linear time, so no
        expression a client sends can hold the parent's loop)."""
        pattern = self._regexes.get(regex)
        if pattern is None:
            try:
                pattern = re2.compile(regex, _RE2_OPTIONS)
            except re2.error as error:
                reason = error.args[0].decode(errors="replace") \
                    if error.args and isinstance(error.args[0], bytes) else str(error)
                raise Refused(ErrorCode.invalid_regular_expression,
                              f"SubscribedTopicRegex `{regex}` is not a valid regular "
                              f"expression: {reason}.") from None
            if len(self._regexes) >= MAX_PATTERNS:
                self._regexes.clear()
            self._regexes[regex] = pattern
        return pattern

    def _heartbeat(self, ctx: RequestContext, body, host: str):
        """(member id, member epoch, assignment to send or None) for a valid request."""
        epoch = body.member_epoch
        group = self._group(body.group_id, create=epoch == JOIN_EPOCH)
        if epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return self._leave(group, body), epoch, None
        member, joined = self._member(ctx, group, body, host)
        reported = None if body.topic_partitions is None else _assignment_of(body.topic_partitions)
        if epoch != JOIN_EPOCH:
            self._check_epoch(member, epoch, reported)
        subscribed = self._subscribe(member, body)
        topics_changed = self._refresh_partitions(group, joined or subscribed)
        changed = joined or subscribed or topics_changed
        if changed:  # one bump for all the request changed
            self._bump(group, "member joined" if joined else "subscription changed"
                       if subscribed else "topics changed")
        if group.assignment_epoch < group.group_epoch:
            self._assign(group)
        before = (member.epoch, member.state, member.assigned, member.revoking)
        self._step(group, member, reported)
        now = self.clock()
        member.deadline = now + self._session(group.group_id)
        changed |= before != (member.epoch, member.state, member.assigned, member.revoking)
        if changed:
            self.store.save(group)
        full = epoch == JOIN_EPOCH or (body.topic_partitions is not None and
                                       body.subscribed_topic_names is not None and
                                       body.rebalance_timeout.total_seconds() >= 0)
        send = full or before[2] != member.assigned
        return member.member_id, member.epoch, encoded(member.assigned) if send else None

    def _group(self, group_id: str, create: bool) -> ConsumerGroup:
        group = self.groups.get(group_id)
        if isinstance(group, ConsumerGroup):
            return group
        if group is not None and (group.members or group.pending or group.kind == "share"):
            raise Refused(ErrorCode.group_id_not_found, f"Group {group_id} is not a consumer group.")
        if not create:
            raise Refused(ErrorCode.group_id_not_found, f"Consumer group {group_id} not found.")
        # A group that does not exist, or a classic one without members (its committed
        # offsets stay: they are the group's, whatever its protocol).
        group = ConsumerGroup(group_id, empty_since_ms=now_ms())
        self.groups[group_id] = group
        return group

    def _member(self, ctx: RequestContext, group: ConsumerGroup, body, host: str):
        """(the member the request is from, whether it joins now)."""
        if body.member_epoch != JOIN_EPOCH:
            member = group.members.get(body.member_id)
            if member is None:
                raise Refused(ErrorCode.unknown_member_id,
                              f"Member {body.member_id} is not a member of group "
                              f"{group.group_id}.")
            if body.instance_id and group.instances.get(body.instance_id) is not member:
                raise Refused(ErrorCode.fenced_instance_id,
                              f"Static member {body.member_id} with instance id "
                              f"{body.instance_id} was replaced by another member.")
            return member, False
        member_id = body.member_id or _new_member_id()
        taken = group.members.get(member_id)
        if body.instance_id and taken is not None and taken.instance_id != body.instance_id:
            # v1 members name themselves: a static member may not take another's id
            raise Refused(ErrorCode.invalid_request, f"MemberId {member_id} is another member's.")
        if body.instance_id:
            static = group.instances.get(body.instance_id)
            if static is not None and not static.left and static.member_id != member_id:
                raise Refused(ErrorCode.unreleased_instance_id,
                              f"Static member {static.member_id} with instance id "
                              f"{body.instance_id} is not released.")
            if static is not None:
                return self._take_place(group, static, member_id), False
        if taken is not None:  # a member joining again (after FENCED_MEMBER_EPOCH)
            return taken, False
        if len(group.members) >= self.props.group_consumer_max_size or \
                self.member_count + self.others_total() >= \
                self.props.pybroker_group_max_members:
            raise Refused(ErrorCode.group_max_size_reached,
                          f"The consumer group has reached its maximum capacity of "
                          f"{self.props.group_consumer_max_size} members.")
        member = ConsumerMember(member_id, body.instance_id, body.rack_id,
                                ctx.header.client_id or "", java_host(host),
                                _millis(body.rebalance_timeout), user=ctx.user, host=host)
        group.add(member)
        self.member_count += 1
        return member, True

    def _take_place(self, group: ConsumerGroup, static: ConsumerMember,
                    member_id: str) -> ConsumerMember:
        """A static member back (a new member id): its partitions and epoch kept, no
        rebalance."""
        if static.member_id != member_id:
            group.members.pop(static.member_id)
            target = group.target.pop(static.member_id, None)
            assigned, revoking = static.assigned, static.revoking
            group.set_owned(static, {}, {})
            static.member_id = member_id
            group.members[member_id] = static
            if target is not None:
                group.target[member_id] = target
            group.set_owned(static, assigned, revoking)
        static.left = False
        return static

    def _check_epoch(self, member: ConsumerMember, epoch: int, reported) -> None:
        """Kafka's fencing: an epoch ahead of the member's, or behind it unless it is the
        previous one with nothing but current partitions (the answer that bumped it was
        lost)."""
        if epoch > member.epoch or (epoch < member.epoch and (
                epoch != member.previous_epoch or reported is None or
                not _subset(reported, member.assigned))):
            raise Refused(ErrorCode.fenced_member_epoch,
                          f"The consumer group member has a greater member epoch "
                          f"({member.epoch}) than the one known by the member ({epoch}).")

    def _subscribe(self, member: ConsumerMember, body) -> bool:
        """Take what the request says of the member's subscription: whether it changed."""
        changed = False
        if body.subscribed_topic_names is not None:
            names = tuple(sorted(set(body.subscribed_topic_names)))
            changed |= names != member.topic_names
            member.topic_names = names
        regex = getattr(body, "subscribed_topic_regex", None)
        if regex is not None:
            regex = regex or None  # an empty expression: no longer subscribed by one
            changed |= regex != member.topic_regex
            member.topic_regex = regex
        if body.server_assignor is not None:
            changed |= body.server_assignor != member.server_assignor
            member.server_assignor = body.server_assignor
        if _millis(body.rebalance_timeout) >= 0:
            member.rebalance_timeout_ms = _millis(body.rebalance_timeout)
        if body.rack_id is not None:
            member.rack_id = body.rack_id
        return changed

    # --- the assignment ----------------------------------------------------------------------

    def _subscribed(self, member: ConsumerMember, topics: dict) -> frozenset[uuid.UUID]:
        """The ids of the existing topics the member subscribes to, by name or expression (an
        expression matches whole names, among the topics its principal may DESCRIBE)."""
        found = {topics[name].topic_id for name in member.topic_names if name in topics}
        if member.topic_regex is not None:
            pattern = self._pattern(member.topic_regex)
            found.update(info.topic_id for name, info in topics.items()
                         if pattern.fullmatch(name) and self._may_describe(member, name))
        return frozenset(found)

    def _may_describe(self, member: ConsumerMember, topic: str) -> bool:
        access = self.access
        return not access.enabled or access.authorizer.allows(
            member.user, member.host, Operation.DESCRIBE, ResourceType.TOPIC, topic)

    def _refresh_partitions(self, group: ConsumerGroup, subscriptions_changed: bool) -> bool:
        """Re-read the subscribed topics' partitions when the topics, the members or their
        subscriptions changed: whether they differ from what the group knew."""
        epoch = self.topics.epoch.get()
        if group.metadata_epoch == epoch and not subscriptions_changed and \
                group.assignment_epoch == group.group_epoch:
            return False
        group.metadata_epoch = epoch
        topics = self.topics.topics()
        wanted = set().union(*(self._subscribed(m, topics) for m in group.members.values()))
        by_id = {info.topic_id: info.partitions for info in topics.values()}
        partitions = {topic: by_id[topic] for topic in wanted}
        group.topic_names = frozenset(name for name, info in topics.items()
                                      if info.topic_id in wanted)
        if partitions == group.partitions:
            return False
        group.partitions = partitions
        return True

    def _assign(self, group: ConsumerGroup) -> None:
        topics = self.topics.topics()
        subscriptions = {m.member_id: self._subscribed(m, topics)
                         for m in group.members.values()}
        group.assignor = chosen_assignor(self.offered, [m.server_assignor
                                                        for m in group.members.values()])
        group.target = ASSIGNORS[group.assignor](subscriptions, group.partitions, group.target)
        group.assignment_epoch = group.group_epoch

    def _step(self, group: ConsumerGroup, member: ConsumerMember, reported) -> None:
        step = reconcile(member, group.assignment_epoch, group.target.get(member.member_id, {}),
                         group.owner_of, reported)
        if step.epoch != member.epoch:
            member.previous_epoch = member.epoch
            member.epoch = step.epoch
        member.state = step.state
        group.set_owned(member, step.assigned, step.revoking)
        if step.state is MemberState.UNREVOKED_PARTITIONS:
            if member.revoke_deadline is None:
                member.revoke_deadline = self.clock() + member.rebalance_timeout_ms / 1000
        else:
            member.revoke_deadline = None

    # --- ConsumerGroupDescribe ----------------------------------------------------------------

    def describe(self, ctx: RequestContext, body, _host: str) -> bytes:
        """Each group named once; DESCRIBE on the group; what grows with members and partitions
        is charged to the answer's ResponseBudget before it is built."""
        budget = budget_of(self.props)
        wanted = body.include_authorized_operations
        described = []
        for group_id in dict.fromkeys(body.group_ids):
            budget.charge(len(group_id))
            group, refusal = to_describe(self.access, ctx, self.groups, group_id,
                                         ConsumerGroup, "consumer")
            if refusal is not None:
                described.append(refusal)
                continue
            if hidden_topics(self.access, ctx, self._named_topics(group)):
                described.append(not_described(group_id, ErrorCode.topic_authorization_failed))
                continue
            operations = self.access.operations(ctx, ResourceType.GROUP, group_id) \
                if wanted else NO_OPERATIONS
            described.append(self._description(group, operations, budget))
        return ctx.respond({"throttle_time": NO_THROTTLE, "groups": described})

    def _named_topics(self, group: ConsumerGroup) -> set[str]:
        """The topics a description shows: subscribed by name, and assigned."""
        if not self.access.enabled:
            return set()
        names = {info.topic_id: name for name, info in self.topics.topics().items()}
        shown = {name for m in group.members.values() for name in m.topic_names}
        shown.update(names[t] for goal in group.target.values() for t in goal if t in names)
        return shown

    def _description(self, group: ConsumerGroup, operations: int, budget) -> dict:
        names = {info.topic_id: name for name, info in self.topics.topics().items()}

        def parts(assignment: Assignment) -> dict:
            budget.charge(sum(8 + 4 * len(ps) for ps in assignment.values()), len(assignment))
            return {"topic_partitions": [
                {"topic_id": topic, "topic_name": names.get(topic, ""),
                 "partitions": sorted(ps)} for topic, ps in assignment.items()]}

        members = []
        for m in group.members.values():
            budget.charge(len(m.member_id) + len(m.client_id) + len(m.client_host)
                          + sum(map(len, m.topic_names)) + len(m.topic_regex or ""))
            members.append({
                "member_id": m.member_id, "instance_id": m.instance_id, "rack_id": m.rack_id,
                "member_epoch": m.epoch, "client_id": m.client_id, "client_host": m.client_host,
                "subscribed_topic_names": m.topic_names, "subscribed_topic_regex": m.topic_regex,
                "assignment": parts(m.assigned),
                "target_assignment": parts(group.target.get(m.member_id, {})),
                "member_type": CONSUMER_MEMBER})
        return {"error_code": ErrorCode.none, "error_message": None, "group_id": group.group_id,
                "group_state": group.state.value, "group_epoch": group.group_epoch,
                "assignment_epoch": group.assignment_epoch,
                "assignor_name": group.assignor or self.offered[0], "members": members,
                "authorized_operations": operations}

    # --- leaving -----------------------------------------------------------------------------

    def _leave(self, group: ConsumerGroup, body) -> str:
        member = group.members.get(body.member_id)
        if member is None and body.instance_id:
            member = group.instances.get(body.instance_id)
        if member is None:
            raise Refused(ErrorCode.unknown_member_id,
                          f"Member {body.member_id} is not a member of group {group.group_id}.")
        if body.member_epoch == STATIC_LEAVE_EPOCH:
            # Its place and partitions wait a session for the same instance to come back.
            member.left = True
            member.deadline = self.clock() + self._session(group.group_id)
        else:
            self._remove(group, member, "left the group")
        self.store.save(group)
        return member.member_id

    def _remove(self, group: ConsumerGroup, member: ConsumerMember, why: str) -> None:
        group.remove(member)
        self.member_count -= 1
        if not group.members:
            group.empty_since_ms = now_ms()
        self._bump(group, why)
        log.info("consumer group %s: member %s %s (group epoch %d)", group.group_id,
                 member.member_id, why, group.group_epoch)

    def _bump(self, group: ConsumerGroup, reason: str) -> None:
        """A new group epoch: the target assignment is computed again at the next heartbeat."""
        group.group_epoch += 1
        if self.events is not None:
            self.events.emit(GroupRebalance(group=group.group_id, group_type="consumer",
                                            epoch=group.group_epoch,
                                            members=len(group.members), reason=reason))

    # --- timers ------------------------------------------------------------------------------

    def expire(self, now: float) -> None:
        """Members whose session ended, or that did not revoke within their rebalance
        timeout, are removed; their partitions are free at once."""
        for group in list(self.groups.values()):
            if not isinstance(group, ConsumerGroup) or not group.members:
                continue
            removed = False
            for member in list(group.members.values()):
                if now >= member.deadline:
                    self._remove(group, member, "session expired")
                    removed = True
                elif member.revoke_deadline is not None and now >= member.revoke_deadline:
                    self._remove(group, member, "rebalance timeout")
                    removed = True
            if removed:
                self.store.save(group)

    def restore(self) -> None:
        """Every saved group back, its members' sessions waiting for `start`."""
        for saved in self.store.saved.values():
            group = restored_group(saved)
            self.groups[group.group_id] = group
            self.member_count += len(group.members)
        if self.store.saved:
            log.info("consumer groups restored: %d, %d members", len(self.store.saved),
                     self.member_count)

    def start(self) -> None:
        now = self.clock()
        for group in self.groups.values():
            if isinstance(group, ConsumerGroup):
                for member in group.members.values():
                    member.deadline = now + self._session(group.group_id)
                    if member.state is MemberState.UNREVOKED_PARTITIONS:
                        member.revoke_deadline = now + member.rebalance_timeout_ms / 1000

    def drop(self, group_id: str) -> None:
        """An empty consumer group goes: it gives way to a classic group of that id, its
        offsets expired, or it was deleted."""
        group = self.groups.get(group_id)
        if isinstance(group, ConsumerGroup) and not group.members:
            del self.groups[group_id]
        self.store.forget(group_id)


def _new_member_id() -> str:
    """Kafka's form: a random UUID in URL-safe base64 without padding (22 characters)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _millis(delta: datetime.timedelta) -> int:
    return round(delta.total_seconds() * 1000)


def _assignment_of(topic_partitions) -> Assignment:
    return {part.topic_id: frozenset(part.partitions) for part in topic_partitions
            if part.partitions}


def _subset(reported: Assignment, assigned: Assignment) -> bool:
    return all(partitions <= assigned.get(topic, frozenset())
               for topic, partitions in reported.items())
