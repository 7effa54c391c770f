"""The share partitions of every share group and the requests on them (KIP-932): ShareFetch,
ShareAcknowledge, share sessions, lock expiry, and the share offsets the admin APIs read and
set.

Where the truth lives: here, in the parent, one object per share partition
(share_partition.SharePartition).  Every worker forwards ShareFetch and ShareAcknowledge to the
parent, whose event loop handles one request at a time, so two members' fetches on one
partition are two steps of one state machine: a record is acquired by exactly one member
whatever worker each member's connection is on.  The records themselves are read from the log
here and go back to the worker in the answer.

A ShareFetch: the share session (epoch 0 opens one for the member, -1 closes it and gives back
what the member holds, else the epoch must be the session's next: INVALID_SHARE_SESSION_EPOCH,
SHARE_SESSION_NOT_FOUND; at most `group.share.max.share.sessions`), then the
acknowledgements it carries (AcknowledgeErrorCode per partition), then records acquired for
the member from each partition of its session: at most MaxRecords in all and about MaxBytes,
whole batches, with the AcquiredRecords ranges that say which of their records are this
member's (and their delivery counts).  Offsets that hold no record to deliver (a transaction
marker) are archived on the way.  With nothing to give, the answer waits up to MaxWaitMs for
records, looking again every WAIT_STEP seconds.

ACLs as Kafka: READ on the group for both APIs, READ on each topic (TOPIC_AUTHORIZATION_FAILED
for its partitions).  Every change is saved (share_store) before the answer goes out.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from broker.parent.forwarded import budget_of
from broker.parent.group_configs import GroupConfigs, reset_duration
from broker.parent.groups.share_partition import (InvalidRecordState, Limits, SharePartition,
                                                  runs_of)
from broker.parent.groups.share_state import ShareGroup
from broker.parent.groups.share_store import ShareStore, restored
from broker.shared.access import Access
from broker.shared.acl import Operation, ResourceType
from broker.shared.clock import now_ms
from broker.shared.events import EventLog, ShareDeliveries
from broker.shared.log import records as batches
from broker.shared.protocol.context import NO_THROTTLE, RequestContext
from broker.shared.protocol.errors import ErrorCode

log = logging.getLogger("broker.parent.groups.share_fetch")

OPEN, CLOSE = 0, -1  # share session epochs
MEMBER_ID_CHARS = 36  # a member id longer than a UUID's text is not a client's
WAIT_STEP = 0.05  # seconds between looks for records while a ShareFetch waits
CONTROL = 0x20  # a batch's attribute bit: transaction markers, never delivered
PEEK_BYTES = 1 << 20  # read past a share partition's end to find whole batches to acquire
Key = tuple[uuid.UUID, int]


@dataclass
class ShareSession:
    epoch: int  # the epoch the next request must carry
    partitions: dict[Key, None] = field(default_factory=dict)
    used: float = 0.0  # monotonic: when a request last came on it
    turn: int = 0  # which of its partitions a fetch looks at first


def _next_epoch(epoch: int) -> int:
    return 1 if epoch == 2**31 - 1 else epoch + 1


class ShareFetches:
    """Share partitions and sessions of the coordinator's share groups."""

    def __init__(self, loop: asyncio.AbstractEventLoop, props, access: Access, groups: dict,
                 topics, store: ShareStore, clock=time.monotonic,
                 events: EventLog | None = None, node_id: int = 0,
                 group_configs: GroupConfigs | None = None):
        self.loop = loop
        self.props = props
        self.access = access
        self.groups = groups
        self.topics = topics
        self.store = store
        self.clock = clock
        self.events = events
        self.node_id = node_id  # the leader of every partition, as answers say
        self.group_configs = group_configs or GroupConfigs(props)
        self.limits = Limits(props.group_share_record_lock_duration_ms / 1000,
                             props.group_share_delivery_count_limit,
                             props.group_share_partition_max_record_locks)
        self.sessions: dict[tuple[str, str], ShareSession] = {}
        self._topics_seen = None  # the topic registry's epoch deleted topics were looked for at
        # ShareFetches waiting for records -> what each answers if the broker stops first.
        self._waiting: dict[asyncio.Future, Callable[[], bytes]] = {}

    # --- the groups' share partitions ------------------------------------------------------

    def restore(self, group: ShareGroup) -> None:
        """A share group taken into the table: its share partitions as saved."""
        for saved in self.store.of_group(group.group_id):
            group.shares[(uuid.UUID(saved.topic), saved.partition)] = restored(
                saved, self._limits(group.group_id))

    def restore_all(self) -> None:
        """At start-up: every share group with saved share partitions, without members."""
        for group_id in self.store.groups():
            if group_id not in self.groups:  # empty from now: its retention starts here
                group = ShareGroup(group_id, empty_since_ms=now_ms())
                self.groups[group_id] = group
                self.restore(group)

    def _share(self, group: ShareGroup, key: Key, name: str) -> SharePartition | None:
        share = group.shares.get(key)
        partition = self.topics.partition(name, key[1])
        if partition is None:
            return None
        if share is None:  # first fetch: share.auto.offset.reset (latest, as Kafka)
            share = group.shares[key] = SharePartition(self._initial(group, partition),
                                                       self._limits(group.group_id))
        share.limits = self._limits(group.group_id)  # the group's lock duration may change
        share.skip_to(partition.log_start_offset)
        return share

    def _initial(self, group: ShareGroup, partition) -> int:
        """Where a share partition the group never read starts: its log start (earliest),
        the first record at or after now - d (by_duration:d; the log end if none), or the log
        end (latest)."""
        reset = self.group_configs.value(group.group_id, "share.auto.offset.reset")
        if reset == "earliest":
            return partition.log_start_offset
        back = reset_duration(reset)
        if back is not None:
            found = partition.offset_for_timestamp(now_ms() - int(back * 1000))
            return partition.high_watermark if found is None else found[0]
        return partition.high_watermark

    def _limits(self, group_id: str) -> Limits:
        """The group's limits: its own share.record.lock.duration.ms, or the broker's."""
        lock_ms = int(self.group_configs.value(group_id, "share.record.lock.duration.ms"))
        if lock_ms != self.limits.lock_seconds * 1000:
            return Limits(lock_ms / 1000, self.limits.delivery_limit, self.limits.max_locks)
        return self.limits

    def member_gone(self, group: ShareGroup, member_id: str) -> None:
        """A member left or expired, or its session closed: what it holds goes back, its
        session ends."""
        self.sessions.pop((group.group_id, member_id), None)
        for key, share in group.shares.items():
            if share.release_member(member_id):
                self.store.save(group.group_id, key, share)

    def has_sessions(self, group_id: str) -> bool:
        return any(key[0] == group_id for key in self.sessions)

    def forget_group(self, group: ShareGroup) -> None:
        """The group is gone: its share partitions, their records and its sessions."""
        for key in list(group.shares):
            self.store.forget(group.group_id, key)
        group.shares.clear()
        for key in [key for key in self.sessions if key[0] == group.group_id]:
            del self.sessions[key]

    def expire(self, now: float) -> None:
        """Locks that ran out; share sessions idle for a share session timeout (a client
        gone without closing its session: what its member holds goes back); and the share
        partitions of deleted topics (a topic made again has another id, and starts afresh)."""
        self._forget_deleted_topics()
        idle = self.props.group_share_session_timeout_ms / 1000
        for (group_id, member_id), session in list(self.sessions.items()):
            group = self.groups.get(group_id)
            if not isinstance(group, ShareGroup):  # the group was deleted under it
                del self.sessions[(group_id, member_id)]
            elif now - session.used > idle:
                log.info("share group %s: session of %s idle; closed", group_id, member_id)
                self.member_gone(group, member_id)
        for group in self.groups.values():
            if isinstance(group, ShareGroup):
                for key, share in group.shares.items():
                    if share.expire(now):
                        self.store.save(group.group_id, key, share)

    def _forget_deleted_topics(self) -> None:
        epoch = self.topics.epoch.get()
        if epoch == self._topics_seen:
            return
        self._topics_seen = epoch
        alive = {info.topic_id for info in self.topics.topics().values()}
        for group in self.groups.values():
            if isinstance(group, ShareGroup):
                for key in [key for key in group.shares if key[0] not in alive]:
                    del group.shares[key]
                    self.store.forget(group.group_id, key)
                for session in self.sessions.values():
                    for key in [key for key in session.partitions if key[0] not in alive]:
                        del session.partitions[key]

    def flush_events(self, second: int) -> None:
        """share_deliveries of the second that ended, for each share partition with any."""
        for group in self.groups.values():
            if not isinstance(group, ShareGroup):
                continue
            for (topic_id, index), share in group.shares.items():
                if not share.counts.any():
                    continue
                if self.events is not None:
                    self.events.emit(ShareDeliveries(
                        ts=second * 1000, second=second, group=group.group_id,
                        topic=self._name(topic_id) or "", partition=index,
                        **vars(share.counts)))
                share.counts = type(share.counts)()

    # --- ShareFetch ----------------------------------------------------------------------------

    def fetch(self, ctx: RequestContext, body, _host: str):
        top, session = self._session(ctx, body)
        if top is not None:
            return self._answer(ctx, top, {})
        group = self.groups[body.group_id]
        rows: dict[Key, dict] = {}
        for key, (code, acknowledged) in self._acknowledge_named(ctx, body, group).items():
            rows[key] = dict(self._row_for_data(key), error_code=code,
                             acknowledge_error_code=acknowledged.value)
            if code == ErrorCode.none:
                session.partitions[key] = None
        for topic in body.forgotten_topics_data or ():
            for index in topic.partitions:
                session.partitions.pop((topic.topic_id, index), None)
        if body.share_session_epoch == CLOSE:
            self.member_gone(group, body.member_id)
            return self._answer(ctx, ErrorCode.none, rows, body.group_id)
        self._acquire(group, body, session, rows)
        if any(row.get("acquired_records") for row in rows.values()) or body.max_wait.total_seconds() <= 0:
            return self._answer(ctx, ErrorCode.none, rows, body.group_id)
        return self._wait(ctx, body, group, session, rows)

    def _session(self, ctx: RequestContext, body):
        """(an error for the whole request or None, the member's share session).  As
        Kafka, the member id is checked for form only, not for membership: a member's records
        are released when it leaves the group or its session closes."""
        if not body.group_id or not body.member_id or len(body.member_id) > MEMBER_ID_CHARS:
            return ErrorCode.invalid_request, None
        if not self.access.check(ctx, Operation.READ, ResourceType.GROUP, body.group_id):
            return ErrorCode.group_authorization_failed, None
        group = self.groups.get(body.group_id)
        if group is None:  # made by a member's heartbeat (or the admin's offsets), not here
            return ErrorCode.group_id_not_found, None
        if not isinstance(group, ShareGroup):
            return ErrorCode.inconsistent_group_protocol, None
        if body.share_session_epoch == OPEN and any(
                part.acknowledgement_batches for topic in getattr(body, "topics", ())
                for part in topic.partitions):
            return ErrorCode.invalid_request, None  # nothing to acknowledge in a new session
        if body.share_session_epoch == CLOSE and getattr(body, "forgotten_topics_data", None):
            return ErrorCode.invalid_request, None
        key = (body.group_id, body.member_id)
        session = self.sessions.get(key)
        epoch = body.share_session_epoch
        if epoch == OPEN:
            if session is None and len(self.sessions) >= self.props.group_share_max_share_sessions:
                return ErrorCode.share_session_limit_reached, None
            session = self.sessions[key] = ShareSession(1, used=self.clock())
            return None, session
        if session is None:
            return ErrorCode.share_session_not_found, None
        if epoch != CLOSE:
            if epoch != session.epoch:
                return ErrorCode.invalid_share_session_epoch, None
            session.epoch = _next_epoch(epoch)
        session.used = self.clock()
        return None, session

    def _name(self, topic_id: uuid.UUID) -> str | None:
        info = self.topics.by_id(topic_id)
        return None if info is None else info.name

    def _problem(self, ctx: RequestContext, key: Key) -> ErrorCode:
        """Whether the request may touch this partition: it exists, READ on its topic."""
        name = self._name(key[0])
        if name is None:
            return ErrorCode.unknown_topic_id
        if not self.access.check(ctx, Operation.READ, ResourceType.TOPIC, name):
            return ErrorCode.topic_authorization_failed
        if self.topics.partition(name, key[1]) is None:
            return ErrorCode.unknown_topic_or_partition
        return ErrorCode.none

    def _acknowledge_named(self, ctx: RequestContext, body,
                           group: ShareGroup) -> dict[Key, tuple[ErrorCode, ErrorCode]]:
        """Each partition the request names, once (a partition named twice keeps its first
        error): (its error, the error of the acknowledgements it carried)."""
        found: dict[Key, tuple[ErrorCode, ErrorCode]] = {}
        for topic in body.topics:
            for part in topic.partitions:
                key = (topic.topic_id, part.partition_index)
                code, acknowledged = found.get(key) or (self._problem(ctx, key), ErrorCode.none)
                if code == ErrorCode.none and acknowledged == ErrorCode.none:
                    acknowledged = self._acknowledge(group, body.member_id, key,
                                                     part.acknowledgement_batches)
                found[key] = (code, acknowledged)
        return found

    def _acknowledge(self, group: ShareGroup, member_id: str, key: Key, acks) -> ErrorCode:
        if not acks:
            return ErrorCode.none
        share = group.shares.get(key)
        if share is None:
            return ErrorCode.invalid_record_state
        if not _well_formed(acks):
            return ErrorCode.invalid_request
        try:
            share.acknowledge_all(member_id, [(ack.first_offset, ack.last_offset,
                                              list(ack.acknowledge_types)) for ack in acks])
        except InvalidRecordState:
            return ErrorCode.invalid_record_state
        finally:
            self.store.save(group.group_id, key, share)
        return ErrorCode.none

    def _acquire(self, group: ShareGroup, body, session: ShareSession, rows: dict) -> None:
        budget = max(1, body.max_bytes) if body.max_bytes > 0 else 1 << 20
        budget = min(budget, budget_of(self.props).max_bytes // 2)
        room = body.max_records if body.max_records > 0 else 500
        # Each fetch starts one partition further, so no partition's backlog starves the rest.
        order = list(session.partitions)
        session.turn = (session.turn + 1) % max(1, len(order))
        for key in order[session.turn:] + order[:session.turn]:
            if room <= 0 or budget <= 0:
                break
            name = self._name(key[0])
            share = None if name is None else self._share(group, key, name)
            if share is None:
                continue
            partition = self.topics.partition(name, key[1])
            data, ranges = self._take(share, partition, body.member_id, room, budget)
            if not ranges:
                continue
            row = rows.get(key) or self._row_for_data(key)
            rows[key] = row
            row["records"] = data
            row["acquired_records"] = [{"first_offset": first, "last_offset": last,
                                        "delivery_count": count} for first, last, count in ranges]
            room -= sum(last - first + 1 for first, last, _ in ranges)
            budget -= len(data)
            self.store.save(group.group_id, key, share)

    def _row_for_data(self, key: Key) -> dict:
        return {"partition_index": key[1], "error_code": ErrorCode.none,
                "acknowledge_error_code": 0, "records": b"",  # an i16, not an ErrorCode here
                "acquired_records": [],
                "current_leader": {"leader_id": self.node_id, "leader_epoch": 0}}

    def _take(self, share: SharePartition, partition, member: str, room: int, budget: int):
        """(the batches' bytes, the acquired ranges) of one share partition for `member`."""
        high = partition.high_watermark
        cap = share.end
        if share.end < high and share.in_flight() < share.limits.max_locks:
            peek, _ = partition.read(share.end, min(budget, PEEK_BYTES))
            headers = list(batches.headers_in(peek))
            cap = headers[-1].next_offset if headers else share.end
        ranges = share.acquire(member, cap, room, self.clock())
        if not ranges:
            return b"", []
        chosen: dict[int, bytes] = {}  # base offset -> the batch, in offset order
        wanted = {o for first, last, _ in ranges for o in range(first, last + 1)}
        delivered: set[int] = set()
        markers: set[int] = set()
        seen_end, left = share.start, budget
        for first, last, _ in ranges:
            if first in delivered or first in markers:
                continue
            data, _ = partition.read(first, max(left, 1))
            for header in batches.headers_in(data):
                if header.base_offset > last:
                    break
                span = [o for o in range(header.base_offset, header.next_offset) if o in wanted]
                if header.attributes & CONTROL:
                    markers.update(span)
                elif header.base_offset not in chosen:
                    if chosen and left < header.size:
                        break  # no room: what it holds goes back
                    chosen[header.base_offset] = data[header.position:header.position
                                                      + header.size]
                    left -= header.size
                    delivered.update(span)
                seen_end = max(seen_end, header.next_offset)
        missing = wanted - delivered - markers
        gaps = {o for o in missing if o < seen_end}  # compacted away: nothing to deliver
        share.archive(markers | gaps)
        share.give_back(missing - gaps)
        final = sorted((o, share.records[o].deliveries) for o in delivered)
        return b"".join(chosen[base] for base in sorted(chosen)), runs_of(final)

    def _wait(self, ctx, body, group, session, rows):
        future = self.loop.create_future()
        wait_ms = min(body.max_wait.total_seconds() * 1000, self.props.pybroker_fetch_max_wait_ms)
        deadline = self.clock() + wait_ms / 1000
        key = (body.group_id, body.member_id)
        self._waiting[future] = lambda: self._answer(ctx, ErrorCode.none, rows, body.group_id)
        future.add_done_callback(lambda done: self._waiting.pop(done, None))

        def look() -> None:
            if future.done():
                return
            if self.sessions.get(key) is not session:  # closed, or opened again: answer now
                future.set_result(self._answer(ctx, ErrorCode.none, rows, body.group_id))
                return
            self._acquire(group, body, session, rows)
            if any(row.get("acquired_records") for row in rows.values()) or \
                    self.clock() >= deadline:
                future.set_result(self._answer(ctx, ErrorCode.none, rows, body.group_id))
            else:
                self.loop.call_later(WAIT_STEP, look)

        self.loop.call_later(WAIT_STEP, look)
        return future

    def abort_waiting(self) -> None:
        """Shutting down: every ShareFetch still waiting is answered with what it has."""
        for future, answer in list(self._waiting.items()):
            if not future.done():
                future.set_result(answer())

    def _answer(self, ctx: RequestContext, code: ErrorCode, rows, group_id: str = "") -> bytes:
        by_topic: dict[uuid.UUID, list] = {}
        for (topic_id, _), row in rows.items():
            by_topic.setdefault(topic_id, []).append(row)
        return ctx.respond({
            "throttle_time": NO_THROTTLE, "error_code": code, "error_message": None,
            "acquisition_lock_timeout": datetime.timedelta(
                seconds=self._limits(group_id).lock_seconds if group_id else self.limits.lock_seconds),
            "responses": [{"topic_id": topic, "partitions": parts}
                          for topic, parts in by_topic.items()],
            "node_endpoints": []})

    # --- ShareAcknowledge --------------------------------------------------------------------

    def acknowledge(self, ctx: RequestContext, body, _host: str) -> bytes:
        top, session = self._session(ctx, body)
        if top is None and body.share_session_epoch == OPEN:
            top = ErrorCode.invalid_share_session_epoch  # acknowledging needs a session
        if top is not None:
            return self._answer(ctx, top, {})
        group = self.groups[body.group_id]
        rows = {key: {"partition_index": key[1],
                      "error_code": code if code != ErrorCode.none else acknowledged,
                      "error_message": None,
                      "current_leader": {"leader_id": self.node_id, "leader_epoch": 0}}
                for key, (code, acknowledged)
                in self._acknowledge_named(ctx, body, group).items()}
        if body.share_session_epoch == CLOSE:
            self.member_gone(group, body.member_id)
        return self._answer(ctx, ErrorCode.none, rows, body.group_id)

    # --- the admin side of share offsets ---------------------------------------------------

    def start_offsets(self, group: ShareGroup | None, key: Key) -> int:
        share = group.shares.get(key) if group is not None else None
        return -1 if share is None else share.start

    def reset(self, group: ShareGroup, key: Key, start: int) -> None:
        share = group.shares.get(key)
        if share is None:
            share = group.shares[key] = SharePartition(start, self._limits(group.group_id))
        share.reset(start)
        self.store.save(group.group_id, key, share)

    def delete(self, group: ShareGroup, topic_id: uuid.UUID) -> None:
        for key in [k for k in group.shares if k[0] == topic_id]:
            del group.shares[key]
            self.store.forget(group.group_id, key)


def _well_formed(acks) -> bool:
    """Kafka's rules for acknowledgement batches: ascending, not overlapping, each with one
    type for the whole range or one per offset, each type a known one (0 to 3)."""
    previous = -1
    for ack in acks:
        kinds = ack.acknowledge_types
        span = ack.last_offset - ack.first_offset + 1
        if ack.first_offset <= previous or span < 1 or len(kinds) not in (1, span) or \
                any(not 0 <= kind <= 3 for kind in kinds):
            return False
        previous = ack.last_offset
    return True
