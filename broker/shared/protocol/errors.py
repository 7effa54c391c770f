"""Kafka's error codes, one spelling for the whole broker: `ErrorCode.name` (kio's IntEnum,
whose members are Kafka's names in lower case, e.g. `ErrorCode.unknown_topic_or_partition`)."""

from kio.schema.errors import ErrorCode

__all__ = ["ErrorCode"]
