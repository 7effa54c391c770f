"""The log settings: what a partition needs of the configuration, the same in the parent and
every worker (`log_settings`: the broker's; topic_config.topic_settings: a topic's own)."""

from __future__ import annotations

from dataclasses import dataclass

from broker.shared.config import BrokerConfig
from broker.shared.log.compression import TopicCodec
from broker.shared.log.records import TimestampBounds
from broker.shared.log.topic_config import topic_codec


@dataclass(frozen=True)
class LogSettings:
    segment_bytes: int = 1 << 30
    index_interval_bytes: int = 4096
    max_message_bytes: int = 1048588
    flush_interval_messages: int = 2**63 - 1
    timestamps: TimestampBounds = TimestampBounds()
    producer_expiration_ms: int = 86_400_000  # producer.id.expiration.ms
    max_decompressed_bytes: int = 32 << 20  # pybroker.max.decompressed.batch.bytes
    max_producers: int = 100_000  # pybroker.max.producers.per.partition
    log_append_time: bool = False  # message.timestamp.type=LogAppendTime: stamped at append
    compacted: bool = False  # cleanup.policy has compact: every record needs a key
    segment_ms: int = 604_800_000  # segment.ms: a segment this old rolls at the next append
    compression: TopicCodec | None = None  # compression.type, None for producer (as produced)


def log_settings(config: BrokerConfig) -> LogSettings:
    props = config.props
    return LogSettings(segment_bytes=props.log_segment_bytes, segment_ms=props.log_roll_ms,
                       index_interval_bytes=props.log_index_interval_bytes,
                       max_message_bytes=props.message_max_bytes,
                       flush_interval_messages=props.log_flush_interval_messages,
                       timestamps=TimestampBounds(props.log_message_timestamp_before_max_ms,
                                                  props.log_message_timestamp_after_max_ms),
                       producer_expiration_ms=props.producer_id_expiration_ms,
                       max_producers=props.pybroker_max_producers_per_partition,
                       max_decompressed_bytes=props.pybroker_max_decompressed_batch_bytes,
                       log_append_time=props.log_message_timestamp_type == "LogAppendTime",
                       compacted="compact" in (item.strip() for item in
                                               props.log_cleanup_policy.split(",")),
                       compression=topic_codec(props, {}))
