"""Produce and InitProducerId: appending record batches to the shared log."""

from __future__ import annotations

import datetime
import logging
import secrets

from broker.log import records
from broker.protocol import errors
from broker.quotas import PRODUCE
from workers.handlers import NO_THROTTLE, Api, InvalidRequest, RequestContext, error_code
from workers.quotas import Throttled, throttle_applies_client_side

log = logging.getLogger("workers.apis.produce")


class Produce(Api):
    key, name, versions = 0, "Produce", (3, 10)  # kio has no v0-2 (magic v0/v1 batches)

    def __init__(self, services):
        self.services = services

    def handle(self, ctx: RequestContext, body):
        acks = body.acks
        refusal = None
        if acks not in (0, 1, -1):
            refusal = "invalid_required_acks"
        elif body.transactional_id is not None:
            refusal = "transactional_id_authorization_failed"  # transactions are not served
        topics, failed = [], False
        for topic in body.topic_data:
            partitions = []
            for data in topic.partition_data:
                result = self._append(topic.name, data, refusal or self._refusal(ctx, data))
                failed |= result["error_code"] != errors.NONE
                partitions.append(result)
            topics.append({"name": topic.name, "partition_responses": partitions})
        if acks == 0 and failed:  # the only way to tell an acks=0 producer: Kafka closes
            raise InvalidRequest("produce_failed", "acks=0 produce failed; closing")
        seconds = self._charge(ctx, body)
        if seconds <= 0:
            return None if acks == 0 else ctx.respond({"responses": topics,
                                                       "throttle_time": NO_THROTTLE})
        ms = max(1, int(seconds * 1000))
        if acks == 0:
            return Throttled(None, ms, delay=False)  # muted, but no response
        frame = ctx.respond({"responses": topics,
                            "throttle_time": datetime.timedelta(milliseconds=ms)})
        return Throttled(frame, ms, delay=not throttle_applies_client_side(0, ctx.version))

    def _charge(self, ctx: RequestContext, body) -> float:
        """Record the produced bytes against the producer quota; the throttle earned."""
        quotas = self.services.quotas
        if quotas is None or not quotas.active():
            return 0.0
        size = sum(len(data.records or b"") for topic in body.topic_data
                   for data in topic.partition_data)
        return quotas.record(PRODUCE, ctx.header.client_id, size)

    @staticmethod
    def _refusal(ctx: RequestContext, data) -> str | None:
        """What Kafka refuses by the request before the log sees the batch."""
        batch = data.records
        if not batch or len(batch) < records.HEADER_BYTES:
            return None  # the log refuses it with the right code
        attributes = batch[22] | batch[21] << 8
        if attributes & records.TRANSACTIONAL:  # transactional records need a transactional id
            return "transactional_id_authorization_failed"
        if attributes & records.CODEC_MASK == records.ZSTD and ctx.version < 7:
            return "unsupported_compression_type"
        return None

    def _append(self, topic: str, data, refusal: str | None) -> dict:
        answer = {"index": data.index, "base_offset": -1, "log_append_time": None,
                  "log_start_offset": -1, "record_errors": [], "error_message": None}
        if refusal is not None:
            return dict(answer, error_code=error_code(refusal))
        partition = self.services.registry.partition(topic, data.index)
        if partition is None:
            return dict(answer, error_code=errors.UNKNOWN_TOPIC_OR_PARTITION)
        if not data.records:
            return dict(answer, error_code=error_code("invalid_record"),
                        error_message="no record batch")
        try:
            result = partition.append(data.records)
        except OSError as error:
            log.error("append to %s-%d failed: %s", topic, data.index, error)
            return dict(answer, error_code=error_code("kafka_storage_error"))
        if result.error is not None:
            log.info("produce to %s-%d refused: %s", topic, data.index, result.message)
            return dict(answer, error_code=error_code(result.error), error_message=result.message)
        waits = self.services.waits
        if waits is not None:
            waits.appended(partition)
        return dict(answer, error_code=errors.NONE, base_offset=result.base_offset,
                    log_start_offset=result.log_start_offset)


class InitProducerId(Api):
    """Hands out producer ids for idempotent producers (no transactions)."""

    key, name, versions = 22, "InitProducerId", (0, 4)

    def handle(self, ctx: RequestContext, body) -> bytes:
        answer = {"throttle_time": NO_THROTTLE, "producer_id": -1, "producer_epoch": -1}
        if body.transactional_id is not None:
            return ctx.respond(dict(answer, error_code=error_code(
                "transactional_id_authorization_failed")))
        producer_id = getattr(body, "producer_id", -1)
        epoch = getattr(body, "producer_epoch", -1)
        if producer_id >= 0 and epoch >= 0:  # KIP-360: bump the epoch of a known producer
            return ctx.respond(dict(answer, error_code=errors.NONE, producer_id=producer_id,
                                    producer_epoch=(epoch + 1) % 32768))
        # Ids are random 62-bit numbers: unique across workers and restarts without a shared
        # counter (a collision is as likely as 2**-31 after 2**16 producers).
        return ctx.respond(dict(answer, error_code=errors.NONE,
                                producer_id=secrets.randbits(62), producer_epoch=0))
