"""Kafka error codes used by this broker, as kio's ErrorCode members (an IntEnum)."""

from kio.schema.errors import ErrorCode

NONE = ErrorCode.none
UNKNOWN_TOPIC_OR_PARTITION = ErrorCode.unknown_topic_or_partition
UNSUPPORTED_VERSION = ErrorCode.unsupported_version
INVALID_REQUEST = ErrorCode.invalid_request
UNKNOWN_TOPIC_ID = ErrorCode.unknown_topic_id
