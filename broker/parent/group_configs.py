"""Group configs: keys a group may set for itself (IncrementalAlterConfigs on a GROUP resource),
each defaulting to the broker's setting, as Kafka's GroupConfig.

    share.auto.offset.reset        where a share partition a share group never read starts:
                                   latest (default) or earliest
    share.record.lock.duration.ms  group.share.record.lock.duration.ms
    share.session.timeout.ms       group.share.session.timeout.ms
    share.heartbeat.interval.ms    group.share.heartbeat.interval.ms
    consumer.session.timeout.ms    group.consumer.session.timeout.ms
    consumer.heartbeat.interval.ms group.consumer.heartbeat.interval.ms

The group coordinator reads them (`value`); the admin service changes them.
"""

from __future__ import annotations

DEFAULTS = {  # group config -> the broker key its default comes from (None: a fixed default)
    "share.auto.offset.reset": None,
    "share.record.lock.duration.ms": "group_share_record_lock_duration_ms",
    "share.session.timeout.ms": "group_share_session_timeout_ms",
    "share.heartbeat.interval.ms": "group_share_heartbeat_interval_ms",
    "consumer.session.timeout.ms": "group_consumer_session_timeout_ms",
    "consumer.heartbeat.interval.ms": "group_consumer_heartbeat_interval_ms",
}
FIXED_DEFAULTS = {"share.auto.offset.reset": "latest"}


class GroupConfigs:
    """The groups' own configs (group id -> {key: value}) over the broker's defaults."""

    def __init__(self, props):
        self.props = props
        self.configs: dict[str, dict[str, str]] = {}

    def default(self, key: str) -> str:
        field = DEFAULTS[key]
        return FIXED_DEFAULTS[key] if field is None else str(getattr(self.props, field))

    def value(self, group_id: str, key: str) -> str:
        """The group's own value of `key`, else the broker's default."""
        return self.configs.get(group_id, {}).get(key) or self.default(key)

    def set(self, group_id: str, key: str, value: str | None) -> None:
        """Set (None: delete) one of the group's configs."""
        if value is None:
            self.configs.get(group_id, {}).pop(key, None)
        else:
            self.configs.setdefault(group_id, {})[key] = value
