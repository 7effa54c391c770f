"""The log settings a broker configuration implies (the same in the parent and every worker)."""

from __future__ import annotations

from broker.shared.config import BrokerConfig
from broker.shared.log.partition import LogSettings
from broker.shared.log.records import TimestampBounds
from broker.shared.log.topic_config import topic_codec


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
