"""Produce: appending record batches to the shared log (InitProducerId is the parent's
transaction coordinator's: broker.parent.transactions)."""

from __future__ import annotations

import asyncio
import collections
import datetime
import logging

from broker.shared.acl import Operation, ResourceType
from broker.shared.client_quotas import PRODUCE
from broker.shared.log import records
from broker.shared.log.files import OutOfDescriptors
from broker.shared.protocol import errors
from workers.handlers import NO_THROTTLE, Api, InvalidRequest, RequestContext, error_code
from workers.throttling import Throttled, throttle_applies_client_side

log = logging.getLogger("workers.apis.produce")

SYNC_RECORDS = 20_000  # records one request may walk at once (under 1 ms in C)
SYNC_DECOMPRESSED = 4 << 20  # decompressed bytes likewise (a few ms of zstd)
SLICE_RECORDS = 10_000  # records walked per loop turn beyond that


class Produce(Api, api="Produce"):
    """Every batch is validated before anything is appended (broker.shared.log.records.BatchCheck).

    A request of at most SYNC_RECORDS records whose compressed batches decompress within
    SYNC_DECOMPRESSED bytes is walked at once.  A larger one waits in a queue, holding nothing
    but its request, and the queue is walked one request at a time, SLICE_RECORDS records and
    at most one batch's decompression per event-loop turn; the request is answered when all
    of it was appended.  So the decompressed records a worker holds are at most one batch
    being walked in slices (pybroker.max.decompressed.batch.bytes) and one being walked at once
    (SYNC_DECOMPRESSED), however many connections send large batches, and no request holds the
    loop for longer than one such step: other clients' small requests are answered between
    slices."""

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
        for topic in body.topic_data:
            # ACLs: WRITE on the topic, checked before the topic's existence (as Kafka).
            denied = None if refusal is not None or access.check(
                ctx, Operation.WRITE, ResourceType.TOPIC, topic.name) \
                else "topic_authorization_failed"
            pending.append([self._prepare(topic.name, data,
                                          refusal or denied or self._refusal(ctx, body, data))
                            for data in topic.partition_data])
        checks = [item for items in pending for item in items if item.check is not None]
        if _walk_at_once(checks):
            return self._finish(ctx, body, pending)
        future = asyncio.get_running_loop().create_future()
        self._walking.append((ctx, body, pending, checks, future))
        if len(self._walking) == 1:
            asyncio.get_running_loop().call_soon(self._walk_slice)
        return future

    def _walk_slice(self) -> None:
        """One slice of the oldest request waiting to be walked; answer it once done."""
        ctx, body, pending, checks, future = self._walking[0]
        if not future.done():  # else its connection went away: nothing is appended
            try:
                if not _walk_some(checks, SLICE_RECORDS):
                    asyncio.get_running_loop().call_soon(self._walk_slice)
                    return
                future.set_result(self._finish(ctx, body, pending))
            except Exception as error:  # an acks=0 failure: the connection must hear of it
                future.set_exception(error)
        self._walking.popleft()
        if self._walking:
            asyncio.get_running_loop().call_soon(self._walk_slice)

    def _finish(self, ctx: RequestContext, body, pending: list):
        """Append what passed (in request order), then answer."""
        topics, failed = [], False
        for topic, items in zip(body.topic_data, pending):
            partitions = [self._append(topic.name, item) for item in items]
            failed |= any(result["error_code"] != errors.NONE for result in partitions)
            topics.append({"name": topic.name, "partition_responses": partitions})
        acks = body.acks
        if acks == 0 and failed:  # the only way to tell an acks=0 producer: Kafka closes
            raise InvalidRequest("produce_failed", "acks=0 produce failed; closing")
        seconds = self._charge(ctx)
        if seconds <= 0:
            return None if acks == 0 else ctx.respond({"responses": topics,
                                                       "throttle_time": NO_THROTTLE})
        ms = max(1, int(seconds * 1000))
        if acks == 0:
            return Throttled(None, ms, delay=False)  # muted, but no response
        frame = ctx.respond({"responses": topics,
                            "throttle_time": datetime.timedelta(milliseconds=ms)})
        return Throttled(frame, ms, delay=not throttle_applies_client_side(0, ctx.version))

    def _charge(self, ctx: RequestContext) -> float:
        """Charge the request's size to the producer quota, as Kafka; the throttle earned."""
        quotas = self.services.quotas
        if quotas is None or not quotas.active():
            return 0.0
        return quotas.record(PRODUCE, ctx.user, ctx.header.client_id, ctx.size)

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

    def _prepare(self, topic: str, data, refusal: str | None) -> "_Pending":
        """The partition and the check of its batch, or why it is refused."""
        if refusal is not None:
            return _Pending(data, None, None, refusal)
        try:
            partition = self.services.registry.partition(topic, data.index)
        except OutOfDescriptors:  # retriable: the producer sends it again
            return _Pending(data, None, None, "kafka_storage_error")
        if partition is None:
            return _Pending(data, None, None, "unknown_topic_or_partition")
        if not data.records:
            return _Pending(data, partition, None, "invalid_record", "no record batch")
        try:
            return _Pending(data, partition, partition.check(data.records), None)
        except records.BatchError as error:
            return _Pending(data, partition, None, error.code, str(error))

    def _append(self, topic: str, item: "_Pending") -> dict:
        data = item.data
        answer = {"index": data.index, "base_offset": -1, "log_append_time": None,
                  "log_start_offset": -1, "record_errors": [], "error_message": None}
        if item.problem is not None:
            if item.message is not None:
                log.info("produce to %s-%d refused: %s", topic, data.index, item.message)
            return dict(answer, error_code=error_code(item.problem), error_message=item.message)
        partition = item.partition
        try:
            result = partition.append(data.records, checked=item.check.batch)
        except OSError as error:
            log.error("append to %s-%d failed: %s", topic, data.index, error)
            return dict(answer, error_code=error_code("kafka_storage_error"))
        if result.error is not None:
            log.info("produce to %s-%d refused: %s", topic, data.index, result.message)
            return dict(answer, error_code=error_code(result.error), error_message=result.message)
        waits = self.services.waits
        if waits is not None:
            waits.appended(partition)
        if result.log_append_time >= 0:  # the topic stamps batches: the client is told when
            answer["log_append_time"] = datetime.datetime.fromtimestamp(
                result.log_append_time / 1000, tz=datetime.timezone.utc)
        return dict(answer, error_code=errors.NONE, base_offset=result.base_offset,
                    log_start_offset=result.log_start_offset)


class _Pending:
    """One partition of a Produce request: its check, or why it is refused."""

    __slots__ = ("data", "partition", "check", "problem", "message", "done")

    def __init__(self, data, partition, check, problem: str | None, message: str | None = None):
        self.data, self.partition, self.check = data, partition, check
        self.problem, self.message = problem, message
        self.done = check is None


def _walk_at_once(pending: list) -> bool:
    """Walk a small request's checks now; True once all are done.  False, holding nothing, for
    one past SYNC_RECORDS records in all (as the headers count them: a walk stops at the count)
    or SYNC_DECOMPRESSED decompressed bytes: the queue walks the checks not done yet.  A check
    that refuses its batch leaves its refusal in its place."""
    if sum(item.check.batch.record_count for item in pending) > SYNC_RECORDS:
        return False
    room = SYNC_DECOMPRESSED
    for item in pending:
        try:
            if not item.check.start(room):
                return False
            room -= item.check.decompressed
            item.done = item.check.step(SYNC_RECORDS)
        except records.BatchError as error:
            item.problem, item.message, item.done = error.code, str(error), True
    return all(item.done for item in pending)


def _walk_some(pending: list, budget: int) -> bool:
    """Walk up to `budget` records of the checks not done yet, decompressing at most one
    batch; True once all are done.  A check that refuses its batch leaves its refusal in its
    place."""
    for item in pending:
        if item.done:
            continue
        check = item.check
        decompresses, before = check.compressed and not check.started, check.walked
        try:
            item.done = check.step(budget)
        except records.BatchError as error:
            item.problem, item.message, item.done = error.code, str(error), True
        budget -= check.walked - before
        if decompresses or not item.done or budget <= 0:
            break
    return all(item.done for item in pending)
