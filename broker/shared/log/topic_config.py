"""Topic-level configs: each key declared once, validated as Kafka validates it, and turned
into the settings the topic's partitions use.

A topic's own values (CreateTopics configs, IncrementalAlterConfigs or AlterConfigs on a
TOPIC resource) are kept by the topic registry (broker.shared.log.topics) in
`<first log dir>/.pybroker-topic-configs.json`, written under the topics lock with the
metadata epoch bumped, so every process applies them at its next look.  A key a topic does
not set falls back on the broker's `log.*` (or other) key standing behind it, as Kafka's
synonyms do.

What each key does here: retention.ms / retention.bytes (the parent's retention), segment.bytes
and segment.ms (roll, at the next append), max.message.bytes, message.timestamp.type (LogAppendTime stamps batches at append),
message.timestamp.before/after.max.ms, min.insync.replicas (above 1, acks=all produce gets
NOT_ENOUGH_REPLICAS), cleanup.policy (a compact-only topic is left alone by retention; a
compacted topic refuses records without a key, INVALID_RECORD, as Kafka).
min.compaction.lag.ms and delete.retention.ms steer the log cleaner
(broker.shared.log.compaction), which takes a partition only once its dirty share reaches
min.cleanable.dirty.ratio; compression.type accepts only `producer` (batches are kept as the
producer compressed them).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from broker.shared.config import ServerProperties, retention_ms
from broker.shared.log.records import TimestampBounds

LONG_MAX = 2**63 - 1


@dataclass(frozen=True)
class TopicKey:
    name: str
    kind: str  # "int", "long", "double", "string" or "list" (Kafka's config types)
    broker_key: str  # the ServerProperties field behind it (its synonym)
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    doc: str = ""

    @property
    def broker_name(self) -> str:
        return self.broker_key.replace("_", ".")


TOPIC_KEYS: dict[str, TopicKey] = {key.name: key for key in (
    TopicKey("cleanup.policy", "list", "log_cleanup_policy", choices=("delete", "compact"),
             doc="delete, compact, or both"),
    TopicKey("retention.ms", "long", "log_retention_ms", minimum=-1, maximum=LONG_MAX,
             doc="Segments older than this are deleted; -1: no limit."),
    TopicKey("retention.bytes", "long", "log_retention_bytes", minimum=-1, maximum=LONG_MAX,
             doc="Per partition, oldest segments go past this size; -1: no limit."),
    TopicKey("segment.bytes", "int", "log_segment_bytes", minimum=14, maximum=2**31 - 1,
             doc="The active segment rolls past this size."),
    TopicKey("segment.ms", "long", "log_roll_ms", minimum=1, maximum=LONG_MAX),
    TopicKey("max.message.bytes", "int", "message_max_bytes", minimum=0, maximum=2**31 - 1,
             doc="Largest record batch accepted."),
    TopicKey("message.timestamp.type", "string", "log_message_timestamp_type",
             choices=("CreateTime", "LogAppendTime")),
    TopicKey("message.timestamp.before.max.ms", "long", "log_message_timestamp_before_max_ms",
             minimum=0, maximum=LONG_MAX),
    TopicKey("message.timestamp.after.max.ms", "long", "log_message_timestamp_after_max_ms",
             minimum=0, maximum=LONG_MAX),
    TopicKey("min.compaction.lag.ms", "long", "log_cleaner_min_compaction_lag_ms", minimum=0,
             maximum=LONG_MAX),
    TopicKey("delete.retention.ms", "long", "log_cleaner_delete_retention_ms", minimum=0,
             maximum=LONG_MAX),
    TopicKey("min.cleanable.dirty.ratio", "double", "log_cleaner_min_cleanable_ratio",
             minimum=0, maximum=1),
    TopicKey("compression.type", "string", "compression_type", choices=("producer",),
             doc="producer: batches are kept as produced"),
    TopicKey("min.insync.replicas", "int", "min_insync_replicas", minimum=1,
             maximum=2**31 - 1),
)}


class TopicConfigError(ValueError):
    """A topic config Kafka would refuse (INVALID_CONFIG, Kafka's words where it has them)."""


def validate(name: str, value: str | None) -> str:
    """The value as stored (normalised), or TopicConfigError."""
    key = TOPIC_KEYS.get(name)
    if key is None:
        raise TopicConfigError(f"Unknown topic config name: {name}")
    if value is None:
        raise TopicConfigError(f"Invalid value null for configuration {name}")
    text = value.strip()
    if key.kind == "list":
        items = [item.strip() for item in text.split(",") if item.strip()]
        wrong = [item for item in items if item not in key.choices]
        if not items or wrong:
            raise TopicConfigError(f"Invalid value {value} for configuration {name}: String "
                                   f"must be one of: {', '.join(key.choices)}")
        return ",".join(dict.fromkeys(items))
    if key.kind == "string":
        if text not in key.choices:
            raise TopicConfigError(f"Invalid value {value} for configuration {name}: String "
                                   f"must be one of: {', '.join(key.choices)}")
        return text
    try:
        number = float(text) if key.kind == "double" else int(text)
    except ValueError:
        kind = {"int": "INT", "long": "LONG", "double": "DOUBLE"}[key.kind]
        raise TopicConfigError(f"Invalid value {value} for configuration {name}: Not a number "
                               f"of type {kind}") from None
    if (key.minimum is not None and number < key.minimum) or \
            (key.maximum is not None and number > key.maximum):
        raise TopicConfigError(f"Invalid value {value} for configuration {name}: Value must "
                               f"be at least {_bound(key.minimum)}"
                               if key.minimum is not None and number < key.minimum else
                               f"Invalid value {value} for configuration {name}: Value must "
                               f"be no more than {_bound(key.maximum)}")
    return str(number)


def _bound(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def broker_default(props, name: str) -> str:
    """The value a topic without its own takes: the broker key behind it."""
    key = TOPIC_KEYS[name]
    if name == "retention.ms":  # log.retention.ms, else minutes, else hours
        return str(retention_ms(props))
    value = getattr(props, key.broker_key)
    if isinstance(value, float) and value.is_integer() and key.kind == "double":
        return str(value)
    return str(value)


DEFAULT_PROPS = ServerProperties()  # a registry built without a configuration (tools, tests)


def effective(props, own: dict[str, str]) -> dict[str, str]:
    """Every topic key's value for a topic: its own, else the broker's."""
    return {name: own.get(name, broker_default(props, name)) for name in TOPIC_KEYS}


def topic_settings(base, props, own: dict[str, str]):
    """The LogSettings (broker.shared.log.partition) of a topic with these configs: the
    broker's (`base`), with what the topic sets itself over them."""
    if not own:
        return base
    changes = {}
    if "segment.bytes" in own:
        changes["segment_bytes"] = int(own["segment.bytes"])
    if "segment.ms" in own:
        changes["segment_ms"] = int(own["segment.ms"])
    if "max.message.bytes" in own:
        changes["max_message_bytes"] = int(own["max.message.bytes"])
    if "min.insync.replicas" in own:
        changes["min_insync_replicas"] = int(own["min.insync.replicas"])
    if "cleanup.policy" in own:
        changes["compacted"] = "compact" in own["cleanup.policy"].split(",")
    if "message.timestamp.type" in own:
        changes["log_append_time"] = own["message.timestamp.type"] == "LogAppendTime"
    if "message.timestamp.before.max.ms" in own or "message.timestamp.after.max.ms" in own:
        values = effective(props, own)
        changes["timestamps"] = TimestampBounds(int(values["message.timestamp.before.max.ms"]),
                                                int(values["message.timestamp.after.max.ms"]))
    if changes.get("log_append_time", base.log_append_time):
        changes["timestamps"] = TimestampBounds()  # the broker's clock: nothing to bound
    return dataclasses.replace(base, **changes)


def deletes(props, own: dict[str, str]) -> bool:
    """Whether the topic's cleanup.policy has delete: retention applies, and DeleteRecords may
    move its log start (Kafka refuses it otherwise, POLICY_VIOLATION)."""
    policy = own.get("cleanup.policy", broker_default(props, "cleanup.policy"))
    return "delete" in (item.strip() for item in policy.split(","))


def retention(props, own: dict[str, str]) -> tuple[int, int] | None:
    """(retention.bytes, retention.ms) of a topic, or None if retention leaves it alone
    (cleanup.policy without delete)."""
    if not deletes(props, own):
        return None
    values = effective(props, own)
    return int(values["retention.bytes"]), int(values["retention.ms"])


# Kafka's config sources (DescribeConfigs, CreateTopics v5+).
DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 4, 5
CONFIG_TYPES = {"int": 3, "long": 5, "double": 6, "string": 2, "list": 7}


def describe(props, own: dict[str, str], keys=None, synonyms: bool = False,
             documentation: bool = False) -> list[dict]:
    """DescribeConfigs' entries of a topic (all keys, or `keys`): its own value
    (DYNAMIC_TOPIC_CONFIG), else the broker's (STATIC_BROKER_CONFIG when the broker sets it,
    DEFAULT_CONFIG when that is the default); with `synonyms`, the broker key behind each."""
    entries = []
    for name in keys if keys else TOPIC_KEYS:
        key = TOPIC_KEYS.get(name)
        if key is None:
            continue  # Kafka leaves out a key it does not know
        broker_value = broker_default(props, name)
        broker_source = DEFAULT_CONFIG if broker_value == broker_default(DEFAULT_PROPS, name) \
            else STATIC_BROKER_CONFIG
        value, source = (own[name], DYNAMIC_TOPIC_CONFIG) if name in own \
            else (broker_value, broker_source)
        chain = []
        if synonyms:
            if name in own:
                chain.append({"name": name, "value": own[name], "source": DYNAMIC_TOPIC_CONFIG})
            chain.append({"name": key.broker_name, "value": broker_value,
                          "source": broker_source})
        entries.append({"name": name, "value": value, "read_only": False,
                        "config_source": source, "is_default": source == DEFAULT_CONFIG,
                        "is_sensitive": False, "synonyms": chain,
                        "config_type": CONFIG_TYPES[key.kind],
                        "documentation": key.doc or None if documentation else None})
    return entries


def altered(own: dict[str, str], name: str, operation: int, value: str | None) -> dict[str, str]:
    """One IncrementalAlterConfigs operation (0 SET, 1 DELETE, 2 APPEND, 3 SUBTRACT) on a copy
    of a topic's own configs; TopicConfigError if Kafka would refuse it."""
    if name not in TOPIC_KEYS:
        raise TopicConfigError(f"Unknown topic config name: {name}")
    result = dict(own)
    if operation == 1:
        result.pop(name, None)
        return result
    if operation in (2, 3):
        if TOPIC_KEYS[name].kind != "list":
            raise TopicConfigError(f"Config value append is not allowed for config key: {name}")
        # From the topic's value, else the key's default (as Kafka's ConfigAdminManager).
        base = own.get(name, broker_default(DEFAULT_PROPS, name))
        current = [item for item in base.split(",") if item]
        items = [item.strip() for item in (value or "").split(",") if item.strip()]
        if operation == 2:
            current += [item for item in items if item not in current]
        else:
            current = [item for item in current if item not in items]
        if not current:
            result.pop(name, None)
            return result
        value = ",".join(current)
    elif operation != 0:
        raise TopicConfigError(f"Unknown config operation {operation}")
    result[name] = validate(name, value)
    return result
