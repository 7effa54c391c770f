"""Fetch (with long poll) and ListOffsets: reading the shared log.

A Fetch that finds fewer than `min_bytes` waits, without blocking the loop: the handler returns
a Future and the connection stays muted (its response order is kept).  The wait ends at
`max_wait_ms`, or earlier when enough data arrives: an append in this worker wakes its waiters
at once; appends in other workers are noticed by a poll of the partitions' high watermarks
every POLL_SECONDS, which runs only while some fetch waits.

Zero-copy: with `pybroker.fetch.zero.copy` (the default) a partition's records are
answered as where they lie in the segment files (Partition.read_regions) and the answer is
encoded by hand (workers.fetch_response); the connection sends those regions with
`os.sendfile`.  With the key off, records are copied into memory and kio encodes the answer:
the path kept for comparison in `make bench`.

Fetch sessions (KIP-227, workers/fetch_sessions.py): a full fetch with epoch 0 creates one
with its answer; an incremental fetch serves every partition of its session and answers only
those with news.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time

from broker.shared.acl import Operation, ResourceType
from broker.shared.client_quotas import FETCH
from broker.shared.log.files import OutOfDescriptors
from broker.shared.protocol.errors import ErrorCode
from workers.answer import Answer
from workers.fetch_response import FileResponse, encode_fetch, file_piece, piece_size
from workers.fetch_sessions import (FINAL_EPOCH, INITIAL_EPOCH, NO_SESSION, CachedPartition,
                                    FetchSession, next_epoch)
from workers.router import NO_THROTTLE, Api, RequestContext

log = logging.getLogger("workers.apis.fetch")
# The answer's "no error", bound once: an enum member's lookup costs ~70 ns on Python 3.11,
# and the answers below name it once per partition.
NO_ERROR = ErrorCode.none

POLL_SECONDS = 0.005
DENIED = object()  # in place of a partition the principal may not READ
UNAVAILABLE = object()  # in place of a partition the process has no descriptor to open


def opened(registry, topic: str, index: int):
    """The partition's handle, None if unknown, UNAVAILABLE when out of descriptors (a
    retriable storage error for the client, never a closed connection)."""
    try:
        return registry.partition(topic, index)
    except OutOfDescriptors:
        return UNAVAILABLE
NEW = object()  # a full fetch that asks for a session
EARLIEST, LATEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -2, -1, -3, -4, -5
EARLIEST_PENDING_UPLOAD = -6  # ListOffsets v11
# Offsets in tiered storage, which this broker has not: Kafka without it answers -1 for them.
TIERED = (LATEST_TIERED, EARLIEST_PENDING_UPLOAD)
LOOKUP_TURN_S = 0.002  # offsets by time looked up per loop turn (at least one)
READ_COMMITTED = 1  # isolation_level: nothing past the last stable offset, aborts listed


class Fetch(Api, api="Fetch"):

    def __init__(self, services):
        super().__init__(services)
        self._max_wait_seconds = services.props.pybroker_fetch_max_wait_ms / 1000
        self._zero_copy = services.props.pybroker_fetch_zero_copy

    def handle(self, ctx: RequestContext, body):
        session_id = getattr(body, "session_id", NO_SESSION)  # fields of v7+
        epoch = getattr(body, "session_epoch", FINAL_EPOCH)
        sessions = self.services.sessions
        if (session_id == NO_SESSION and epoch == FINAL_EPOCH) or sessions is None:
            return self._fetch(ctx, body, body.topics, None)
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):  # a full fetch closes the session it names
            sessions.remove(session_id)
            return self._fetch(ctx, body, body.topics, NEW if epoch == INITIAL_EPOCH else None)
        session = sessions.get(session_id)
        if session is None:
            return self._session_error(ctx, ErrorCode.fetch_session_id_not_found)
        if session.epoch != epoch:
            return self._session_error(ctx, ErrorCode.invalid_fetch_session_epoch)
        topic_ids = ctx.version >= 13
        if session.topic_ids != topic_ids:
            return self._session_error(ctx, ErrorCode.fetch_session_topic_id_error)
        session.update(body.topics, body.forgotten_topics_data, topic_ids)
        if not sessions.fits(session):  # grown past its bounds: evicted, and the client
            sessions.evict(session_id)  # starts over with a full fetch
            return self._session_error(ctx, ErrorCode.fetch_session_id_not_found)
        if not session.partitions:  # Kafka: an emptied session is closed, the fetch sessionless
            sessions.remove(session_id)
            return self._fetch(ctx, body, (), None)
        session.epoch = next_epoch(session.epoch)
        sessions.touch(session)
        return self._fetch(ctx, body, _session_topics(session), session, session.epoch)

    def _fetch(self, ctx: RequestContext, body, topics, session, epoch: int = 0):
        """Serve the partitions `topics` name (the request's, or an incremental session's):
        `session` is None (no session), NEW (create one with the answer) or the session,
        `epoch` what its epoch must still be when the answer is made."""
        quotas = self.services.quotas
        owed = quotas.owes(FETCH, ctx.user, ctx.header.client_id) \
            if quotas is not None and quotas.active() else 0.0
        if owed > 0:  # over the consumer quota: answered empty, nothing read; throttled
            return Answer(self._encode(ctx, [], _session_id(session)), FETCH, 0, owed=owed)
        wanted = self._wanted_partitions(ctx, topics)
        found, total, failed = self._read(ctx, body, wanted)
        wait_seconds = min(body.max_wait.total_seconds(), self._max_wait_seconds)
        waits = self.services.waits
        if total >= body.min_bytes or failed or wait_seconds <= 0 or waits is None:
            return self._answer(ctx, wanted, found, total, session, epoch)
        return waits.wait(wait_seconds, wanted, lambda: self._read(ctx, body, wanted),
                          body.min_bytes, lambda found, size: self._answer(
                              ctx, wanted, found, size, session, epoch))

    def _answer(self, ctx: RequestContext, wanted: list, topics: list, total: int, session,
                epoch: int = 0):
        """Encode the answer, its bytes charged to the consumer quota."""
        session_id = NO_SESSION
        if session is NEW:
            session_id = self._create_session(ctx, wanted, topics)
        elif session is not None:
            if session.epoch != epoch:  # served meanwhile by a request of another connection
                return ctx.respond({"throttle_time": NO_THROTTLE, "session_id": session.id,
                                    "responses": [],
                                    "error_code": ErrorCode.invalid_fetch_session_epoch})
            topics = self._news(session, wanted, topics)
            session_id = session.id
        answer = self._encode(ctx, topics, session_id)
        quotas = self.services.quotas
        if quotas is not None and quotas.active() and total:
            return Answer(answer, FETCH, total)
        return answer

    def _encode(self, ctx: RequestContext, topics: list, session_id: int) -> FileResponse | bytes:
        if self._zero_copy:
            return encode_fetch(ctx.correlation, ctx.version, 0, NO_ERROR, session_id, topics)
        return ctx.respond({"throttle_time": NO_THROTTLE, "error_code": NO_ERROR,
                            "session_id": session_id, "responses": topics})

    def _create_session(self, ctx: RequestContext, wanted: list, topics: list) -> int:
        """A session for a full fetch's partitions, remembering what this answer tells."""
        topic_ids = ctx.version >= 13
        partitions = {}
        for (name, topic_id, _info, parts), answer in zip(wanted, topics):
            key = topic_id if topic_ids else name
            for (asked, _partition), told in zip(parts, answer["partitions"]):
                partitions[key, asked.partition] = CachedPartition(
                    key, asked.partition, asked.fetch_offset, asked.partition_max_bytes,
                    -1 if told["error_code"] else told["high_watermark"],
                    told["log_start_offset"])
        return self.services.sessions.create(topic_ids, partitions)

    @staticmethod
    def _news(session, wanted: list, topics: list) -> list:
        """Only the partitions with news, for an incremental answer; those that returned
        records move to the back of the session."""
        kept, served = [], []
        for (_name, _topic_id, _info, parts), answer in zip(wanted, topics):
            told = []
            for (cached, _partition), part in zip(parts, answer["partitions"]):
                if cached.news(part):
                    told.append(part)
                    if part["records"]:
                        served.append(cached)
            if told:
                kept.append(dict(answer, partitions=told))
        session.rotate(served)
        return kept

    @staticmethod
    def _session_error(ctx: RequestContext, code) -> bytes:
        return ctx.respond({"throttle_time": NO_THROTTLE, "session_id": NO_SESSION,
                            "responses": [], "error_code": code})

    def _wanted_partitions(self, ctx: RequestContext, topics) -> list:
        """[(topic name or None, topic id or None, info, [(request partition, Partition)])].

        `topics` reads like the request's: items with a topic (name, or id from v13) and
        partitions.  A partition named twice is read once, with the last entry's offsets,
        and answered once, where it first appeared (Kafka keeps fetch data in an
        insertion-ordered map); so the work and the answer grow with distinct partitions,
        not with the request.
        """
        registry, version = self.services.registry, ctx.version
        by_topic: dict = {}  # topic name or id -> (name, id, info, {partition index: request})
        for topic in topics:
            key = topic.topic_id if version >= 13 else topic.topic
            if key not in by_topic:
                info = registry.by_id(key) if version >= 13 else registry.get(key)
                name = info.name if info is not None else None if version >= 13 else key
                by_topic[key] = (name, key if version >= 13 else None, info, {})
            parts = by_topic[key][3]
            for part in topic.partitions:
                parts[part.partition] = part
        return [(name, topic_id, info,
                 [(part, DENIED if denied else opened(registry, info.name, index)
                   if info else None) for index, part in parts.items()])
                for name, topic_id, info, parts in by_topic.values()
                for denied in (self._denied(ctx, name, info),)]

    def _denied(self, ctx: RequestContext, name, info) -> bool:
        """READ on the topic, as Kafka checks it: after an unknown topic id, before an unknown
        topic name."""
        if name is None or (info is None and ctx.version >= 13):
            return False
        return not self.services.access.check(ctx, Operation.READ, ResourceType.TOPIC, name)

    def _read(self, ctx: RequestContext, body, wanted) -> tuple[list, int, bool]:
        room, total, failed = body.max_bytes, 0, False
        committed = body.isolation_level == READ_COMMITTED
        topics = []
        for name, topic_id, info, parts in wanted:
            answers = []
            for request, partition in parts:
                answer, size = self._read_partition(ctx.version, info, request, partition,
                                                    room, total == 0, self._zero_copy,
                                                    committed)
                failed |= answer["error_code"] != NO_ERROR
                total += size
                room -= size
                answers.append(answer)
            topics.append({"topic": name, "topic_id": topic_id, "partitions": answers})
        return topics, total, failed

    @staticmethod
    def _read_partition(version: int, info, request, partition, room: int, first: bool,
                        regions: bool, committed: bool = False):
        """The partition's answer and its record bytes; the records are (segment, position,
        length) regions with `regions`, else bytes.  `committed` (read_committed): nothing at
        or past the last stable offset, and the aborted transactions the records hold."""
        answer = {"partition_index": request.partition, "high_watermark": -1,
                  "last_stable_offset": -1, "log_start_offset": -1, "aborted_transactions": None,
                  "preferred_read_replica": -1, "records": b""}
        if partition is None:
            unknown = ErrorCode.unknown_topic_id if version >= 13 and info is None \
                else ErrorCode.unknown_topic_or_partition
            return dict(answer, error_code=unknown), 0
        if partition is DENIED:
            return dict(answer, error_code=ErrorCode.topic_authorization_failed), 0
        if partition is UNAVAILABLE or partition.offline:
            return dict(answer, error_code=ErrorCode.kafka_storage_error), 0
        stable = partition.last_stable_offset  # first: it never passes the high watermark
        high, start = partition.high_watermark, partition.log_start_offset
        answer.update(high_watermark=high, last_stable_offset=stable, log_start_offset=start)
        offset = request.fetch_offset
        if offset < start or offset > high:
            return dict(answer, error_code=ErrorCode.offset_out_of_range), 0
        limit = max(min(request.partition_max_bytes, room), 0)
        upper = stable if committed else None
        try:
            if regions:
                data, high = partition.read_regions(offset, limit, first, upper, file_piece)
                size = sum(piece_size(piece) for piece in data)
            else:
                data, high = partition.read(offset, limit, first, upper)
                size = len(data)
            if committed:  # the consumer drops these producers' records up to their marker
                answer["aborted_transactions"] = [
                    {"producer_id": producer, "first_offset": first_offset}
                    for producer, first_offset in partition.aborted_transactions(offset, stable)]
        except FileNotFoundError:  # retention deleted the segment between two looks
            return dict(answer, error_code=ErrorCode.offset_out_of_range), 0
        except OutOfDescriptors:  # retriable: the client asks again
            return dict(answer, error_code=ErrorCode.kafka_storage_error), 0
        answer.update(high_watermark=high, records=data or b"")
        return dict(answer, error_code=NO_ERROR), size


class _SessionTopic:
    """A run of one topic's partitions in a session, read as a request's FetchTopic."""

    __slots__ = ("topic", "topic_id", "partitions")

    def __init__(self, key, partitions: list):
        self.topic = self.topic_id = key
        self.partitions = partitions


def _session_topics(session: FetchSession) -> list[_SessionTopic]:
    return [_SessionTopic(key, parts) for key, parts in session.by_topic()]


def _session_id(session) -> int:
    return session.id if isinstance(session, FetchSession) else NO_SESSION


class FetchWaits:
    """Fetches waiting for data in one worker."""

    def __init__(self, loop: asyncio.AbstractEventLoop, report=lambda count: None):
        self.loop = loop
        self._report = report  # told the number of waiting fetches whenever it changes
        self._waiting: dict[_Waiter, None] = {}  # insertion-ordered, O(1) removal
        self._polling = False

    def wait(self, seconds: float, wanted, read, min_bytes: int, answer) -> asyncio.Future:
        """Wait for data: `read()` gives (topics, bytes, failed); `answer(topics, bytes)` the
        response the future resolves to."""
        waiter = _Waiter(self, self.loop.create_future(), wanted, read, min_bytes, answer)
        waiter.timer = self.loop.call_later(seconds, waiter.finish)
        # The connection went away (the future is cancelled): forget the waiter at once.
        waiter.future.add_done_callback(lambda future: future.cancelled() and waiter._forget())
        self._waiting[waiter] = None
        self._report(len(self._waiting))
        if not self._polling:
            self._polling = True
            self.loop.call_later(POLL_SECONDS, self._poll)
        return waiter.future

    def appended(self, partition) -> None:
        """A local append: wake the waiters on that partition now."""
        for waiter in [w for w in self._waiting if w.watches(partition)]:
            waiter.try_finish()

    def _poll(self) -> None:
        for waiter in [w for w in self._waiting if w.moved()]:
            waiter.try_finish()
        if self._waiting:
            self.loop.call_later(POLL_SECONDS, self._poll)
        else:
            self._polling = False

    def discard(self, waiter: "_Waiter") -> None:
        if self._waiting.pop(waiter, False) is None:
            self._report(len(self._waiting))


class _Waiter:
    def __init__(self, waits: FetchWaits, future, wanted, read, min_bytes: int, answer):
        self.waits = waits
        self.future = future
        self.read = read
        self.answer = answer
        self.min_bytes = min_bytes
        self.partitions = list({id(p): p for _n, _i, _info, parts in wanted for _r, p in parts
                                if p is not None and p is not DENIED and p is not UNAVAILABLE}
                               .values())
        self.marks = [p.high_watermark for p in self.partitions]
        self.timer = None

    def watches(self, partition) -> bool:
        return any(p is partition for p in self.partitions)

    def moved(self) -> bool:
        return any(p.high_watermark != mark for p, mark in zip(self.partitions, self.marks))

    def try_finish(self) -> None:
        if self.future.done():
            self._forget()
            return
        try:
            topics, total, failed = self.read()
            self.marks = [p.high_watermark for p in self.partitions]
            if total >= self.min_bytes or failed:
                self._fulfil(self.answer(topics, total))
        except Exception as error:  # e.g. the topic was deleted: the connection must hear of it
            self._fail(error)

    def finish(self) -> None:
        if not self.future.done():
            try:
                topics, total, _ = self.read()
                self._fulfil(self.answer(topics, total))
            except Exception as error:  # as in try_finish
                self._fail(error)
        self._forget()

    def _fail(self, error: Exception) -> None:
        if not self.future.done():
            self.future.set_exception(error)
        self._forget()

    def _fulfil(self, response) -> None:
        if not self.future.done():
            self.future.set_result(response)
        else:  # nobody will send it: a file answer's descriptors go now
            payload = response.payload if type(response) is Answer else response
            if type(payload) is FileResponse:
                payload.close()
        self._forget()

    def _forget(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.waits.discard(self)


class ListOffsets(Api, api="ListOffsets"):
    """Offsets by position answer at once; offsets by time (a timestamp, or the greatest one)
    may decompress a batch each (up to pybroker.max.decompressed.batch.bytes, tens of ms), so
    they are looked up through one queue per worker, a request at a time and at most
    LOOKUP_TURN_S of lookups per loop turn (always one): other clients are answered between
    them however many connections ask."""

    def __init__(self, services):
        self.services = services
        self._looking: collections.deque = collections.deque()  # (answers, lookups, ...)

    def handle(self, ctx: RequestContext, body):
        registry = self.services.registry
        seen: dict[tuple[str, int], int] = {}
        for topic in body.topics:
            for part in topic.partitions:
                key = (topic.name, part.partition_index)
                seen[key] = seen.get(key, 0) + 1
        topics, access, lookups = [], self.services.access, []
        committed = getattr(body, "isolation_level", 0) == READ_COMMITTED
        for topic in body.topics:
            answers = []
            if not access.check(ctx, Operation.DESCRIBE, ResourceType.TOPIC, topic.name):
                topics.append({"name": topic.name, "partitions": [
                    dict(self._duplicate(part),
                         error_code=ErrorCode.topic_authorization_failed)
                    for part in topic.partitions]})
                continue
            for part in topic.partitions:
                if seen[(topic.name, part.partition_index)] > 1:  # Kafka: each one refused,
                    answers.append(self._duplicate(part))  # none looked up
                    continue
                partition = opened(registry, topic.name, part.partition_index)
                answers.append(self._offset(partition, part, committed))
                if answers[-1] is None:  # by time: looked up in turn
                    lookups.append((answers, len(answers) - 1, partition, part))
            topics.append({"name": topic.name, "partitions": answers})
        try:
            loop = asyncio.get_running_loop() if lookups else None
        except RuntimeError:  # in-process use: no loop to take turns on
            loop = None
        if loop is None:
            for answers, slot, partition, part in lookups:
                answers[slot] = self._by_time(partition, part)
            return ctx.respond({"throttle_time": NO_THROTTLE, "topics": topics})
        future = loop.create_future()
        self._looking.append((ctx, topics, collections.deque(lookups), future))
        if len(self._looking) == 1:
            loop.call_soon(self._look_some)
        return future

    def _look_some(self) -> None:
        """Lookups of the oldest request for at most LOOKUP_TURN_S; answer it once done."""
        ctx, topics, lookups, future = self._looking[0]
        if not future.done():  # else its connection went away
            deadline = time.monotonic() + LOOKUP_TURN_S
            while True:  # at least one
                answers, slot, partition, part = lookups.popleft()
                answers[slot] = self._by_time(partition, part)
                if not lookups or time.monotonic() >= deadline:
                    break
            if lookups:
                asyncio.get_running_loop().call_soon(self._look_some)
                return
            try:
                future.set_result(ctx.respond({"throttle_time": NO_THROTTLE, "topics": topics}))
            except Exception as error:  # noqa: BLE001 - the connection hears of it
                future.set_exception(error)
        self._looking.popleft()
        if self._looking:
            asyncio.get_running_loop().call_soon(self._look_some)

    @staticmethod
    def _duplicate(request) -> dict:
        return {"partition_index": request.partition_index, "timestamp": -1, "offset": -1,
                "leader_epoch": -1, "error_code": ErrorCode.invalid_request}

    @staticmethod
    def _offset(partition, request, committed: bool = False) -> dict | None:
        """The answer, or None when it is looked up by time (`_by_time`)."""
        answer = {"partition_index": request.partition_index, "timestamp": -1, "offset": -1,
                  "leader_epoch": 0, "error_code": NO_ERROR}
        if partition is None:
            return dict(answer, error_code=ErrorCode.unknown_topic_or_partition, leader_epoch=-1)
        if partition is UNAVAILABLE or partition.offline:
            return dict(answer, error_code=ErrorCode.kafka_storage_error, leader_epoch=-1)
        wanted = request.timestamp
        if wanted == LATEST:
            return dict(answer, offset=partition.last_stable_offset if committed
                        else partition.high_watermark)
        if wanted in TIERED:
            return dict(answer, leader_epoch=-1)
        if wanted in (EARLIEST, EARLIEST_LOCAL):
            return dict(answer, offset=partition.log_start_offset)
        return None

    @staticmethod
    def _by_time(partition, request) -> dict:
        answer = {"partition_index": request.partition_index, "timestamp": -1, "offset": -1,
                  "leader_epoch": 0, "error_code": NO_ERROR}
        wanted = request.timestamp
        try:
            found = partition.max_timestamp_offset() if wanted == MAX_TIMESTAMP \
                else partition.offset_for_timestamp(wanted)
        except OutOfDescriptors:
            return dict(answer, error_code=ErrorCode.kafka_storage_error, leader_epoch=-1)
        except FileNotFoundError:  # retention took the segment meanwhile: no record there
            return answer
        if found is None:
            return answer
        return dict(answer, offset=found[0], timestamp=found[1])
