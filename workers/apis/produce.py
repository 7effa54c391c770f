"""Produce: appending record batches to the shared log (InitProducerId is the parent's
transaction coordinator's: broker.parent.transactions)."""

from __future__ import annotations

import asyncio
import collections
import datetime
import logging
from typing import Callable

from broker.shared.acl import Operation, ResourceType
from broker.shared.client_quotas import PRODUCE
from broker.shared.log import records
from broker.shared.log.files import OutOfDescriptors
from broker.shared.log.record_errors import FaultRoom
from broker.shared.log.records import COMPRESS_SLICE, HEADER_BYTES
from broker.shared.protocol.errors import ErrorCode
from workers.answer import Answer
from workers.router import NO_THROTTLE, Api, InvalidRequest, RequestContext, error_code

log = logging.getLogger("workers.apis.produce")
# The answer's "no error", bound once: an enum member's lookup costs ~70 ns on Python 3.11,
# and the answers below name it once per partition.
NO_ERROR = ErrorCode.none

SYNC_RECORDS = 20_000  # records one request may walk at once (under 1 ms in C)
SYNC_DECOMPRESSED = 4 << 20  # decompressed bytes likewise (a few ms of zstd)
SLICE_RECORDS = 10_000  # records walked per loop turn beyond that


class Produce(Api, api="Produce"):
    """Each batch is validated before it is appended (broker.shared.log.records.BatchCheck), the
    request's batches in order.

    A request of at most SYNC_RECORDS records whose compressed batches decompress within
    SYNC_DECOMPRESSED bytes, and whose batches to recompress (a topic's compression.type other
    than their codec) hold at most COMPRESS_SLICE bytes of records, is walked at once.  A
    larger one waits in a queue, holding nothing but its request, and the queue is walked one
    request at a time, SLICE_RECORDS records, at most one batch's decompression and about
    COMPRESS_SLICE bytes of recompression per event-loop turn; the request is answered when
    all of it was appended.  So the decompressed records a worker holds are at most one
    batch being walked in slices (pybroker.max.decompressed.batch.bytes) and one being walked
    at once (SYNC_DECOMPRESSED), however many connections send large batches, and no request
    holds the loop for longer than one such step: other clients' small requests are answered
    between slices.  A recompressed batch is appended as soon as it is made (the others once
    all are checked), so a request holds at most one recompressed batch (within
    max.message.bytes) whatever its records expand to.

    A batch refused for some of its records (a compacted topic's records without a key,
    timestamps out of bounds) is answered as Kafka answers it (v8+): the records' indexes and
    Kafka's messages in record_errors, at most RECORD_ERRORS of them in the whole answer."""

    def __init__(self, services):
        self.services = services
        self._walking: collections.deque = collections.deque()  # requests walked in slices

    def handle(self, ctx: RequestContext, body):
        acks = body.acks
        refusal = None
        if acks not in (0, 1, -1):
            refusal = "invalid_required_acks"
        elif body.transactional_id is not None and not self.services.access.check(
                ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id):
            refusal = "transactional_id_authorization_failed"
        access, pending = self.services.access, []
        room = FaultRoom()
        for topic in body.topic_data:
            # ACLs: WRITE on the topic, checked before the topic's existence (as Kafka).
            denied = None if refusal is not None or access.check(
                ctx, Operation.WRITE, ResourceType.TOPIC, topic.name) \
                else "topic_authorization_failed"
            pending.append([self._prepare(topic.name, data,
                                          refusal or denied or self._refusal(ctx, body, data),
                                          room)
                            for data in topic.partition_data])
        checks = [item for items in pending for item in items if item.check is not None]
        if _walk_at_once(checks, self._append_made):
            return self._finish(ctx, body, pending)
        future = asyncio.get_running_loop().create_future()
        self._walking.append((ctx, body, pending, checks, future))
        if len(self._walking) == 1:
            asyncio.get_running_loop().call_soon(self._walk_slice)
        return future

    def _walk_slice(self) -> None:
        """One slice of the oldest request waiting to be walked; answer it once done."""
        ctx, body, pending, checks, future = self._walking[0]
        if not future.done():  # else its connection went away: nothing more is appended
            try:
                if not _walk_some(checks, SLICE_RECORDS, self._append_made):
                    asyncio.get_running_loop().call_soon(self._walk_slice)
                    return
                future.set_result(self._finish(ctx, body, pending))
            except Exception as error:  # an acks=0 failure: the connection must hear of it
                future.set_exception(error)
        self._walking.popleft()
        if self._walking:
            asyncio.get_running_loop().call_soon(self._walk_slice)

    def _finish(self, ctx: RequestContext, body, pending: list):
        """Append what passed and is not appended yet (in request order), then answer."""
        topics, failed = [], False
        for topic, items in zip(body.topic_data, pending):
            partitions = [item.answer or self._append(item) for item in items]
            failed |= any(result["error_code"] != NO_ERROR for result in partitions)
            topics.append({"name": topic.name, "partition_responses": partitions})
        if body.acks == 0 and failed:  # the only way to tell an acks=0 producer: Kafka closes
            raise InvalidRequest("produce_failed", "acks=0 produce failed; closing")
        if body.acks == 0:  # no answer, but its size is charged all the same
            return Answer(None, PRODUCE, ctx.size)

        def encode(throttle_ms: int) -> bytes:
            return ctx.respond({"responses": topics, "throttle_time": NO_THROTTLE if not
                                throttle_ms else datetime.timedelta(milliseconds=throttle_ms)})

        return Answer(encode(0), PRODUCE, ctx.size, encode=encode)

    @staticmethod
    def _refusal(ctx: RequestContext, body, data) -> str | None:
        """What Kafka refuses by the request before the log sees the batch."""
        batch = data.records
        if not batch or len(batch) < records.HEADER_BYTES:
            return None  # the log refuses it with the right code
        attributes = batch[22] | batch[21] << 8
        if attributes & records.TRANSACTIONAL and body.transactional_id is None:
            return "transactional_id_authorization_failed"  # a transaction needs its id
        if attributes & records.CODEC_MASK == records.ZSTD and ctx.version < 7:
            return "unsupported_compression_type"
        return None

    def _prepare(self, topic: str, data, refusal: str | None, room: FaultRoom) -> "_Pending":
        """The partition and the check of its batch, or why it is refused."""
        if refusal is not None:
            return _Pending(topic, data, None, None, refusal)
        try:
            partition = self.services.registry.partition(topic, data.index)
        except OutOfDescriptors:  # retriable: the producer sends it again
            return _Pending(topic, data, None, None, "kafka_storage_error")
        if partition is None:
            return _Pending(topic, data, None, None, "unknown_topic_or_partition")
        if not data.records:
            return _Pending(topic, data, partition, None, "invalid_record", "no record batch")
        try:
            return _Pending(topic, data, partition, partition.check(data.records, room), None)
        except records.BatchError as error:
            return _Pending(topic, data, partition, None, error.code, str(error))

    def _append_made(self, item: "_Pending") -> None:
        """Append a recompressed batch as soon as it is made (its answer kept for the end)."""
        if item.problem is None and item.check.stored is not None:
            item.answer = self._append(item)

    def _append(self, item: "_Pending") -> dict:
        data, topic = item.data, item.topic
        answer = {"index": data.index, "base_offset": -1, "log_append_time": None,
                  "log_start_offset": -1, "record_errors": [], "error_message": None}
        if item.problem is not None:
            if item.message is not None:
                log.info("produce to %s-%d refused: %s", topic, data.index, item.message)
            if item.record_errors:  # Kafka's record_errors, with the log start offset
                answer.update(log_start_offset=item.partition.log_start_offset,
                              record_errors=[{"batch_index": index,
                                              "batch_index_error_message": message}
                                             for index, message in item.record_errors])
            return dict(answer, error_code=error_code(item.problem), error_message=item.message)
        partition, check = item.partition, item.check
        try:
            result = partition.append(check.stored or data.records, checked=check.batch)
        except OSError as error:
            log.error("append to %s-%d failed: %s", topic, data.index, error)
            return dict(answer, error_code=ErrorCode.kafka_storage_error)
        if result.error is not None:
            log.info("produce to %s-%d refused: %s", topic, data.index, result.message)
            return dict(answer, error_code=error_code(result.error), error_message=result.message)
        self.services.appended(partition)
        if result.log_append_time >= 0:  # the topic stamps batches: the client is told when
            answer["log_append_time"] = datetime.datetime.fromtimestamp(
                result.log_append_time / 1000, tz=datetime.timezone.utc)
        return dict(answer, error_code=NO_ERROR, base_offset=result.base_offset,
                    log_start_offset=result.log_start_offset)


class _Pending:
    """One partition of a Produce request: its check, or why it is refused; `answer` once a
    recompressed batch was appended before the others."""

    __slots__ = ("topic", "data", "partition", "check", "problem", "message", "record_errors",
                 "done", "answer")

    def __init__(self, topic: str, data, partition, check, problem: str | None,
                 message: str | None = None):
        self.topic, self.data, self.partition, self.check = topic, data, partition, check
        self.problem, self.message = problem, message
        self.record_errors: list | None = None
        self.done = check is None
        self.answer: dict | None = None

    def refused(self, error: records.BatchError) -> None:
        self.problem, self.message, self.done = error.code, str(error), True
        if isinstance(error, records.RecordErrors):
            self.record_errors = error.errors


def _walk_at_once(pending: list, made: Callable[[_Pending], None]) -> bool:
    """Walk a small request's checks now; True once all are done.  False, holding nothing, for
    one past SYNC_RECORDS records in all (as the headers count them: a walk stops at the count),
    SYNC_DECOMPRESSED decompressed bytes or COMPRESS_SLICE bytes to recompress: the queue walks
    the checks not done yet.  A check that refuses its batch leaves its refusal in its place;
    one done is given to `made`."""
    if sum(item.check.batch.record_count for item in pending) > SYNC_RECORDS:
        return False
    room, packing = SYNC_DECOMPRESSED, COMPRESS_SLICE
    for item in pending:
        check = item.check
        try:
            if check.recompresses:  # its records, decompressed if need be, are compressed too
                if not check.compressed and check.batch.size - HEADER_BYTES > packing:
                    return False
                if not check.start(min(room, packing)):
                    return False
                packing -= check.decompressed or check.batch.size - HEADER_BYTES
            elif not check.start(room):
                return False
            room -= check.decompressed
            item.done = check.step(SYNC_RECORDS)
        except records.BatchError as error:
            item.refused(error)
        if item.done:
            made(item)
    return all(item.done for item in pending)


def _walk_some(pending: list, budget: int, made: Callable[[_Pending], None]) -> bool:
    """Walk up to `budget` records of the checks not done yet, decompressing at most one
    batch and recompressing about COMPRESS_SLICE bytes of records; True once all are done.  A
    check that refuses its batch leaves its refusal in its place; one done is given to
    `made`."""
    packing = COMPRESS_SLICE
    for item in pending:
        if item.done:
            continue
        check = item.check
        decompresses = check.compressed and not check.started
        walked, packed = check.walked, check.packed
        try:
            item.done = check.step(budget)
        except records.BatchError as error:
            item.refused(error)
        if item.done:
            made(item)
        budget -= check.walked - walked
        packing -= check.packed - packed
        if decompresses or not item.done or budget <= 0 or packing <= 0:
            break
    return all(item.done for item in pending)
