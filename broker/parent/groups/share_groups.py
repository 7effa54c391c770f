"""Share groups of KIP-932: ShareGroupHeartbeat, ShareGroupDescribe, the members' sessions, and
the admin side of share offsets (DescribeShareGroupOffsets, AlterShareGroupOffsets,
DeleteShareGroupOffsets).

A heartbeat joins (member epoch 0; the client makes its member id), leaves (-1: whatever the
member holds in any share partition goes back at once) or keeps a member alive; a member that
does not heartbeat for `group.share.session.timeout.ms` is removed the same way.  Anything that
changes what the assignment must be (a member joining or leaving, a subscription, a subscribed
topic's partitions) bumps the group epoch, and the next heartbeat computes the assignment
(share_state.share_assignment); a member takes its new assignment with the answer, as there
is nothing to revoke: several members may read one partition.

Offsets: a share partition's start offset is what DescribeShareGroupOffsets shows (with the
lag to the log's end); AlterShareGroupOffsets and DeleteShareGroupOffsets need a group without
members (NON_EMPTY_GROUP), as Kafka.  The share partitions themselves (what is in flight, who
holds it) live in broker.parent.groups.share_fetch, which this module hands to.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Callable

from broker.parent.forwarded import budget_of
from broker.parent.group_configs import GroupConfigs
from broker.parent.groups.heartbeats import (NO_OPERATIONS, Refused, answer_heartbeat,
                                             encoded, hidden_topics, interval, not_described,
                                             session_seconds, to_describe)
from broker.parent.groups.share_state import ShareGroup, ShareMember, share_assignment
from broker.parent.groups.state import java_host
from broker.shared.access import Access
from broker.shared.acl import Operation, ResourceType
from broker.shared.clock import now_ms
from broker.shared.events import EventLog, GroupRebalance
from broker.shared.protocol.context import NO_THROTTLE, RequestContext
from broker.shared.protocol.errors import ErrorCode

log = logging.getLogger("broker.parent.groups.share_groups")

JOIN_EPOCH, LEAVE_EPOCH = 0, -1
MEMBER_ID_CHARS = 36  # a UUID's text: what clients make (ShareFetch refuses longer ones)
ASSIGNOR = "simple"


class ShareGroups:
    """The share groups of the coordinator's table (shared with the other kinds)."""

    def __init__(self, props, access: Access, groups: dict, topics, shares,
                 others_total: Callable[[], int], clock: Callable[[], float] = time.monotonic,
                 events: EventLog | None = None, group_configs: GroupConfigs | None = None):
        self.props = props
        self.access = access
        self.groups = groups
        self.topics = topics
        self.shares = shares  # share_fetch.ShareFetches: the share partitions and sessions
        self.others_total = others_total
        self.clock = clock
        self.events = events
        self.group_configs = group_configs or GroupConfigs(props)
        self.member_count = 0

    def _session(self, group_id: str) -> float:
        return session_seconds(self.group_configs, "share", group_id)

    # --- ShareGroupHeartbeat --------------------------------------------------------------

    def heartbeat(self, ctx: RequestContext, body, host: str) -> bytes:
        return answer_heartbeat(ctx, body, host,
                                interval(self.group_configs, "share", body.group_id),
                                self.access, self._validate, self._heartbeat)

    @staticmethod
    def _validate(_ctx: RequestContext, body) -> None:
        if not body.group_id:
            raise Refused(ErrorCode.invalid_request, "GroupId can't be empty.")
        if not body.member_id:
            raise Refused(ErrorCode.invalid_request, "MemberId can't be empty.")
        if len(body.member_id) > MEMBER_ID_CHARS:
            raise Refused(ErrorCode.invalid_request,
                          f"MemberId can't be longer than {MEMBER_ID_CHARS} characters.")
        if body.rack_id is not None and not body.rack_id:
            raise Refused(ErrorCode.invalid_request, "RackId can't be empty.")
        if body.member_epoch == JOIN_EPOCH and body.subscribed_topic_names is None:
            raise Refused(ErrorCode.invalid_request,
                          "SubscribedTopicNames must be set in first request.")
        if body.member_epoch < LEAVE_EPOCH:
            raise Refused(ErrorCode.invalid_request, "MemberEpoch is invalid.")

    def _heartbeat(self, ctx: RequestContext, body, host: str):
        group = self._group(body.group_id, create=body.member_epoch == JOIN_EPOCH)
        if body.member_epoch == LEAVE_EPOCH:
            member = self._known(group, body.member_id)
            self._remove(group, member, "left the group")
            return member.member_id, LEAVE_EPOCH, None
        if body.member_epoch == JOIN_EPOCH:
            member, joined = self._join(ctx, group, body, host)
        else:
            member, joined = self._known(group, body.member_id), False
            if body.member_epoch not in (member.epoch, member.previous_epoch):
                raise Refused(ErrorCode.fenced_member_epoch,
                              f"The share group member has a greater member epoch "
                              f"({member.epoch}) than the one known by the member "
                              f"({body.member_epoch}).")
        subscribed = False
        if body.subscribed_topic_names is not None:
            names = tuple(sorted(set(body.subscribed_topic_names)))
            subscribed, member.topic_names = names != member.topic_names, names
        if body.rack_id is not None:
            member.rack_id = body.rack_id
        if self._refresh(group, joined or subscribed) or joined or subscribed:
            self._bump(group, "member joined" if joined else "subscription changed"
                       if subscribed else "topics changed")
        if group.assignment_epoch < group.group_epoch:
            self._assign(group)
        before = member.assigned
        member.assigned = group.target.get(member.member_id, {})
        if member.epoch != group.assignment_epoch:  # an answer with the new one may be lost
            member.previous_epoch, member.epoch = member.epoch, group.assignment_epoch
        member.deadline = self.clock() + self._session(group.group_id)
        send = body.member_epoch == JOIN_EPOCH or before != member.assigned
        return member.member_id, member.epoch, encoded(member.assigned) if send else None

    def _group(self, group_id: str, create: bool) -> ShareGroup:
        group = self.groups.get(group_id)
        if isinstance(group, ShareGroup):
            return group
        if group is not None:  # a group of another kind, in use or only holding offsets
            raise Refused(ErrorCode.group_id_not_found, f"Group {group_id} is not a share group.")
        if not create:
            raise Refused(ErrorCode.group_id_not_found, f"Group {group_id} not found.")
        group = ShareGroup(group_id, empty_since_ms=now_ms())
        self.groups[group_id] = group
        self.shares.restore(group)  # its share partitions, as saved
        return group

    def _known(self, group: ShareGroup, member_id: str) -> ShareMember:
        member = group.members.get(member_id)
        if member is None:
            raise Refused(ErrorCode.unknown_member_id,
                          f"Member {member_id} is not a member of group {group.group_id}.")
        return member

    def _join(self, ctx: RequestContext, group: ShareGroup, body, host: str):
        member = group.members.get(body.member_id)
        if member is not None:  # joining again (after UNKNOWN_MEMBER_ID or a fence)
            return member, False
        if len(group.members) >= self.props.group_share_max_size or \
                self.member_count + self.others_total() >= \
                self.props.pybroker_group_max_members:
            raise Refused(ErrorCode.group_max_size_reached,
                          f"The share group has reached its maximum capacity of "
                          f"{self.props.group_share_max_size} members.")
        member = ShareMember(body.member_id, body.rack_id, ctx.header.client_id or "",
                             java_host(host), user=ctx.user, host=host)
        group.members[member.member_id] = member
        self.member_count += 1
        return member, True

    # --- the assignment ----------------------------------------------------------------------

    def _refresh(self, group: ShareGroup, changed: bool) -> bool:
        epoch = self.topics.epoch.get()
        if group.metadata_epoch == epoch and not changed and \
                group.assignment_epoch == group.group_epoch:
            return False
        group.metadata_epoch = epoch
        topics = self.topics.topics()
        wanted = {name for m in group.members.values() for name in m.topic_names
                  if name in topics}
        partitions = {topics[name].topic_id: topics[name].partitions for name in wanted}
        group.topic_names = frozenset(wanted)
        if partitions == group.partitions:
            return False
        group.partitions = partitions
        return True

    def _assign(self, group: ShareGroup) -> None:
        topics = self.topics.topics()
        subscriptions = {m.member_id: frozenset(topics[n].topic_id for n in m.topic_names
                                                if n in topics)
                         for m in group.members.values()}
        group.target = share_assignment(subscriptions, group.partitions)
        group.assignment_epoch = group.group_epoch

    def _bump(self, group: ShareGroup, reason: str) -> None:
        group.group_epoch += 1
        if self.events is not None:
            self.events.emit(GroupRebalance(group=group.group_id, group_type="share",
                                            epoch=group.group_epoch,
                                            members=len(group.members), reason=reason))

    def _remove(self, group: ShareGroup, member: ShareMember, why: str) -> None:
        del group.members[member.member_id]
        group.target.pop(member.member_id, None)
        self.member_count -= 1
        self.shares.member_gone(group, member.member_id)
        if not group.members:
            group.empty_since_ms = now_ms()
        self._bump(group, why)
        log.info("share group %s: member %s %s (group epoch %d)", group.group_id,
                 member.member_id, why, group.group_epoch)

    def expire(self, now: float) -> None:
        for group in list(self.groups.values()):
            if isinstance(group, ShareGroup):
                for member in [m for m in group.members.values() if now >= m.deadline]:
                    self._remove(group, member, "session expired")

    def drop(self, group_id: str) -> None:
        """An empty share group goes (deleted, or its offsets expired), its state with it."""
        group = self.groups.get(group_id)
        if isinstance(group, ShareGroup) and not group.members:
            del self.groups[group_id]
            self.shares.forget_group(group)

    # --- ShareGroupDescribe ----------------------------------------------------------------

    def describe(self, ctx: RequestContext, body, _host: str) -> bytes:
        budget = budget_of(self.props)
        described = []
        names = {info.topic_id: name for name, info in self.topics.topics().items()}
        for group_id in dict.fromkeys(body.group_ids):
            budget.charge(len(group_id))
            group, refusal = to_describe(self.access, ctx, self.groups, group_id, ShareGroup,
                                         "share")
            if refusal is not None:
                described.append(refusal)
                continue
            shown = {n for m in group.members.values() for n in m.topic_names} | {
                names[t] for goal in group.target.values() for t in goal if t in names}
            if self.access.enabled and hidden_topics(self.access, ctx, shown):
                described.append(not_described(group_id, ErrorCode.topic_authorization_failed))
                continue
            operations = self.access.operations(ctx, ResourceType.GROUP, group_id) \
                if body.include_authorized_operations else NO_OPERATIONS
            members = []
            for m in group.members.values():
                budget.charge(len(m.member_id) + len(m.client_id) + len(m.client_host)
                              + sum(map(len, m.topic_names)) + 12 * len(m.assigned))
                members.append({
                    "member_id": m.member_id, "rack_id": m.rack_id, "member_epoch": m.epoch,
                    "client_id": m.client_id, "client_host": m.client_host,
                    "subscribed_topic_names": m.topic_names,
                    "assignment": {"topic_partitions": [
                        {"topic_id": t, "topic_name": names.get(t, ""), "partitions": sorted(ps)}
                        for t, ps in m.assigned.items()]}})
            described.append({"error_code": ErrorCode.none, "error_message": None,
                              "group_id": group_id, "group_state": group.state.value,
                              "group_epoch": group.group_epoch,
                              "assignment_epoch": group.assignment_epoch,
                              "assignor_name": ASSIGNOR, "members": members,
                              "authorized_operations": operations})
        return ctx.respond({"throttle_time": NO_THROTTLE, "groups": described})


    # --- DescribeShareGroupOffsets, AlterShareGroupOffsets, DeleteShareGroupOffsets -------

    def describe_offsets(self, ctx: RequestContext, body, _host: str) -> bytes:
        """Each share partition's start offset (-1: never fetched) and the lag to the log's
        end; DESCRIBE on the group and on each topic."""
        budget = budget_of(self.props)
        topics = self.topics.topics()
        found = []
        for asked in body.groups:
            budget.charge(len(asked.group_id))
            group = self.groups.get(asked.group_id)
            code = None
            if not self.access.check(ctx, Operation.DESCRIBE, ResourceType.GROUP,
                                     asked.group_id):
                code = ErrorCode.group_authorization_failed
            elif group is not None and not isinstance(group, ShareGroup):
                code = ErrorCode.group_id_not_found
            if code is not None:
                found.append({"group_id": asked.group_id, "topics": [], "error_code": code,
                              "error_message": None})
                continue
            wanted = [(t.topic_name, list(t.partitions)) for t in asked.topics] \
                if asked.topics is not None else self._held(group, topics)
            rows = []
            for name, partitions in wanted:
                info = topics.get(name)
                budget.charge(len(name) + 24 * len(partitions))
                allowed = self.access.check(ctx, Operation.DESCRIBE, ResourceType.TOPIC, name)
                rows.append({"topic_name": name,
                             "topic_id": info.topic_id if info else uuid.UUID(int=0),
                             "partitions": [self._offset_row(group, info, p, allowed)
                                            for p in partitions]})
            found.append({"group_id": asked.group_id, "topics": rows,
                          "error_code": ErrorCode.none, "error_message": None})
        return ctx.respond({"throttle_time": NO_THROTTLE, "groups": found})

    @staticmethod
    def _held(group, topics) -> list[tuple[str, list[int]]]:
        if group is None:
            return []
        names = {info.topic_id: name for name, info in topics.items()}
        held: dict[str, list[int]] = {}
        for topic_id, index in sorted(group.shares):
            if topic_id in names:
                held.setdefault(names[topic_id], []).append(index)
        return list(held.items())

    def _offset_row(self, group, info, index: int, allowed: bool) -> dict:
        row = {"partition_index": index, "start_offset": -1, "leader_epoch": 0, "lag": -1,
               "error_code": ErrorCode.none, "error_message": None}
        if not allowed:
            row["error_code"] = ErrorCode.topic_authorization_failed
        elif info is None or not 0 <= index < info.partitions:
            row["error_code"] = ErrorCode.unknown_topic_or_partition
        else:
            start = self.shares.start_offsets(group, (info.topic_id, index))
            if start >= 0:
                partition = self.topics.partition(info.name, index)
                row.update(start_offset=start,
                           lag=max(0, partition.high_watermark - start) if partition else -1)
        return row

    def alter_offsets(self, ctx: RequestContext, body, _host: str) -> bytes:
        """New start offsets (kafka-share-groups --reset-offsets): the group must have no
        members (NON_EMPTY_GROUP); READ on the group and on each topic."""
        group, code = self._empty_share_group(ctx, body.group_id, Operation.READ)
        topics = self.topics.topics()
        results = []
        for asked in body.topics:
            info = topics.get(asked.topic_name)
            allowed = code is None and self.access.check(ctx, Operation.READ,
                                                         ResourceType.TOPIC, asked.topic_name)
            rows = []
            for part in asked.partitions:
                row_code = code or (ErrorCode.topic_authorization_failed if not allowed else
                                    ErrorCode.unknown_topic_or_partition if info is None or
                                    not 0 <= part.partition_index < info.partitions else None)
                if row_code is None:
                    self.shares.reset(group, (info.topic_id, part.partition_index),
                                      part.start_offset)
                rows.append({"partition_index": part.partition_index,
                             "error_code": row_code or ErrorCode.none, "error_message": None})
            results.append({"topic_name": asked.topic_name,
                            "topic_id": info.topic_id if info else uuid.UUID(int=0),
                            "partitions": rows})
        return ctx.respond({"throttle_time": NO_THROTTLE, "error_code": code or ErrorCode.none,
                            "error_message": None, "responses": results})

    def delete_offsets(self, ctx: RequestContext, body, _host: str) -> bytes:
        """A topic's share partitions forgotten (the group must have no members); DELETE on
        the group, READ on each topic."""
        group, code = self._empty_share_group(ctx, body.group_id, Operation.DELETE)
        topics = self.topics.topics()
        results = []
        for asked in body.topics:
            info = topics.get(asked.topic_name)
            row_code = code or (ErrorCode.topic_authorization_failed if not self.access.check(
                ctx, Operation.READ, ResourceType.TOPIC, asked.topic_name) else
                ErrorCode.unknown_topic_or_partition if info is None else None)
            if row_code is None:
                self.shares.delete(group, info.topic_id)
            results.append({"topic_name": asked.topic_name,
                            "topic_id": info.topic_id if info else uuid.UUID(int=0),
                            "error_code": row_code or ErrorCode.none, "error_message": None})
        return ctx.respond({"throttle_time": NO_THROTTLE, "error_code": code or ErrorCode.none,
                            "error_message": None, "responses": results})

    def _empty_share_group(self, ctx: RequestContext, group_id: str, operation: Operation):
        """(the share group, None) when offsets may change, else (None or it, the error)."""
        if not self.access.check(ctx, operation, ResourceType.GROUP, group_id):
            return None, ErrorCode.group_authorization_failed
        group = self.groups.get(group_id)
        if group is None:
            group = ShareGroup(group_id, empty_since_ms=now_ms())
            self.groups[group_id] = group
        if not isinstance(group, ShareGroup):
            return None, ErrorCode.group_id_not_found
        if group.members:
            return group, ErrorCode.non_empty_group
        return group, None
