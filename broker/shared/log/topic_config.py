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
message.timestamp.before/after.max.ms, min.insync.replicas (accepted; with one replica
Kafka's effective minimum, min(min.insync.replicas, replicas), is 1), cleanup.policy (a compact-only topic is left alone by retention; a
compacted topic refuses records without a key, INVALID_RECORD, as Kafka).
min.compaction.lag.ms and delete.retention.ms steer the log cleaner
(broker.shared.log.compaction), which takes a partition only once its dirty share reaches
min.cleanable.dirty.ratio; compression.type (with compression.gzip/lz4/zstd.level) names the
codec batches are stored in, a batch in another codec recompressed at append
(broker.shared.log.compression), or `producer` (batches kept as the producer compressed them).

flush.messages fsyncs a partition at the append that brings its messages since the last fsync
to that many; flush.ms has the parent fsync a partition's appends within that long of its last
fsync (broker.parent.log_manager checks as often as the smallest flush.ms of any topic asks);
index.interval.bytes spaces the offset index.  Kafka's other topic keys that need what a single
broker without tiered storage or share groups does not have (replication throttles, unclean
leader election, preallocation, tiered storage, ...) are accepted and described as Kafka does;
their documentation says why they have no effect here (`TopicKey.inert`), and the topic's
creation or change logs it.  remote.storage.enable=true is refused as Kafka refuses it where
tiered storage is disabled.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from broker.shared.config import ServerProperties, retention_ms
from broker.shared.config import values as config_values
from broker.shared.config.values import InvalidValue, checked
from broker.shared.constants import INT_MAX
from broker.shared.log import compression
from broker.shared.log.records import TimestampBounds

LONG_MAX = 2**63 - 1
NEVER = str(LONG_MAX)  # Kafka's default of flush.ms, flush.messages, max.compaction.lag.ms
LIST_KINDS = ("list", "replicas")  # the kinds APPEND and SUBTRACT apply to
NO_TIERED_STORAGE = "tiered storage is not offered here; retention.ms and retention.bytes bound " \
    "the whole log"


@dataclass(frozen=True)
class TopicKey:
    name: str
    # Kafka's config types: "int", "long", "double", "string", "list", "boolean", or "replicas"
    # (a list of partition:broker pairs, or "*")
    kind: str
    broker_key: str  # the ServerProperties field behind it (its synonym); "" if none here
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    doc: str = ""
    synonym: str = ""  # Kafka's broker key behind it, where this broker has no field for it
    default: str = ""  # the value when neither the topic nor a broker key sets one
    inert: str = ""  # why it has no effect on this broker ("": it has one)

    @property
    def broker_name(self) -> str:
        return self.synonym or self.broker_key.replace("_", ".")

    @property
    def documentation(self) -> str | None:
        """What DescribeConfigs tells of it (with include_documentation)."""
        if not self.inert:
            return self.doc or None
        return f"{self.doc} Accepted as Kafka accepts it; no effect here: {self.inert}.".strip()


def _inert(name: str, kind: str, default: str, why: str, synonym: str = "",
           minimum: float | None = None, maximum: float | None = None, doc: str = "") -> TopicKey:
    """A Kafka topic key accepted and described here without an effect (`why`)."""
    if maximum is None and kind in ("int", "long"):
        maximum = INT_MAX if kind == "int" else LONG_MAX
    return TopicKey(name, kind, "", minimum, maximum, doc=doc, synonym=synonym,
                    default=default, inert=why)


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
    TopicKey("compression.type", "string", "compression_type", choices=compression.TYPES,
             doc="The codec batches are stored in: uncompressed, zstd, lz4, snappy or gzip "
                 "(a batch in another codec is recompressed at append), or producer (kept as "
                 "produced)."),
    TopicKey("compression.gzip.level", "int", "compression_gzip_level", minimum=-1,
             maximum=9, doc="The level when compression.type is gzip."),
    TopicKey("compression.lz4.level", "int", "compression_lz4_level", minimum=1, maximum=17,
             doc="The level when compression.type is lz4."),
    TopicKey("compression.zstd.level", "int", "compression_zstd_level", minimum=-131072,
             maximum=22, doc="The level when compression.type is zstd."),
    TopicKey("min.insync.replicas", "int", "min_insync_replicas", minimum=1,
             maximum=2**31 - 1),
    TopicKey("flush.messages", "long", "log_flush_interval_messages", minimum=1,
             maximum=LONG_MAX, doc="A partition is fsynced at the append that brings its "
                                   "messages since the last fsync to this many."),
    TopicKey("flush.ms", "long", "log_flush_interval_ms", minimum=0, maximum=LONG_MAX,
             default=NEVER, doc="A partition's appends are fsynced within this long of its "
                                "last fsync, by the parent, which checks as often as the "
                                "smallest flush.ms asks (at most every 10 ms)."),
    TopicKey("index.interval.bytes", "int", "log_index_interval_bytes", minimum=0,
             maximum=INT_MAX, doc="Bytes of batches between two offset-index entries."),
    _inert("segment.index.bytes", "int", "10485760", "an offset index grows with its segment "
           "and never fills, so segments roll on segment.bytes and segment.ms only",
           "log.index.size.max.bytes", minimum=4),
    _inert("segment.jitter.ms", "long", "0", "segments roll at segment.ms exactly",
           minimum=0),  # Kafka's log.roll.jitter.ms has no default: no synonym
    _inert("file.delete.delay.ms", "long", "60000", "segments are deleted at once (a reader "
           "that has one open keeps reading it)", "log.segment.delete.delay.ms", minimum=0),
    _inert("preallocate", "boolean", "false", "segment files grow as they are written",
           "log.preallocate"),
    _inert("max.compaction.lag.ms", "long", NEVER, "the cleaner takes a partition once its "
           "dirty share reaches min.cleanable.dirty.ratio, however old its dirty records",
           "log.cleaner.max.compaction.lag.ms", minimum=1),
    _inert("unclean.leader.election.enable", "boolean", "false", "this broker is every "
           "partition's only replica", "unclean.leader.election.enable"),
    _inert("leader.replication.throttled.replicas", "replicas", "", "a single broker "
           "replicates nothing"),
    _inert("follower.replication.throttled.replicas", "replicas", "", "a single broker "
           "replicates nothing"),
    _inert("local.retention.ms", "long", "-2", NO_TIERED_STORAGE, "log.local.retention.ms",
           minimum=-2),
    _inert("local.retention.bytes", "long", "-2", NO_TIERED_STORAGE, "log.local.retention.bytes",
           minimum=-2),
    _inert("remote.storage.enable", "boolean", "false", "tiered storage is not offered here "
           "(true is refused)"),
    _inert("remote.log.copy.disable", "boolean", "false", NO_TIERED_STORAGE),
    _inert("remote.log.delete.on.disable", "boolean", "false", NO_TIERED_STORAGE),
    _inert("remote.copy.lag.bytes", "long", "-1", NO_TIERED_STORAGE, "log.remote.copy.lag.bytes",
           minimum=-1),
    _inert("remote.copy.lag.ms", "long", "0", NO_TIERED_STORAGE, "log.remote.copy.lag.ms",
           minimum=-1),
    _inert("errors.deadletterqueue.group.enable", "boolean", "false", "share groups, whose "
           "dead-letter queues this allows, are not offered here"),
)}
# Values Kafka refuses on a broker like this one, in Kafka's words.
_REFUSED = {("remote.storage.enable", "true"): "Tiered Storage functionality is disabled in the "
                                               "broker. Topic cannot be configured with remote "
                                               "log storage."}
_REPLICA = re.compile(r"([0-9]+:[0-9]+)?")  # matched whole; empty: nothing (Kafka's rule)
_REPLICAS_FORMAT = "must be the literal '*' or a list of replicas in the following format: " \
    "[partitionId]:[brokerId],[partitionId]:[brokerId],..."


LEVEL_KEYS = {f"compression.{codec}.level": codec for codec in compression.LEVELS}


class TopicConfigError(ValueError):
    """A topic config Kafka would refuse (INVALID_CONFIG, Kafka's words where it has them)."""


def validate(name: str, value: str | None) -> str:
    """The value as stored (normalised), or TopicConfigError."""
    key = TOPIC_KEYS.get(name)
    if key is None:
        raise TopicConfigError(f"Unknown topic config name: {name}")
    if value is None:
        raise TopicConfigError(f"Invalid value null for configuration {name}")
    if key.kind == "replicas":
        items = [item.strip() for item in value.split(",")]
        if items != ["*"] and not all(_REPLICA.fullmatch(item) for item in items):
            raise TopicConfigError(f"Invalid value [{', '.join(items)}] for configuration "
                                   f"{name}: {name} {_REPLICAS_FORMAT}")
        return ",".join(item for item in items if item)
    problem = _level_problem(name, value)
    if problem:
        raise TopicConfigError(f"Invalid value {value} for configuration {name}: {problem}")
    try:
        text = checked(name, key.kind, value, key.minimum, key.maximum, key.choices)
    except InvalidValue as error:
        raise TopicConfigError(str(error)) from None
    refusal = _REFUSED.get((name, text))
    if refusal is not None:
        raise TopicConfigError(refusal)
    return text


def _level_problem(name: str, value: str) -> str | None:
    """Kafka's own rule for a codec's level (gzip: -1 or 1 to 9), checked before the bounds."""
    codec = LEVEL_KEYS.get(name)
    if codec is None:
        return None
    try:
        number = int(value.strip())
    except ValueError:
        return None  # checked() says it is not a number
    return compression.level_problem(codec, number)


def broker_default(props, name: str) -> str:
    """The value a topic without its own takes: the broker key behind it, else the key's
    default."""
    key = TOPIC_KEYS[name]
    if name == "retention.ms":  # log.retention.ms, else minutes, else hours
        return str(retention_ms(props))
    value = getattr(props, key.broker_key) if key.broker_key else None
    return key.default if value is None else str(value)


def _broker_sets(props, key: TopicKey) -> bool:
    """Whether a broker key behind a topic key has a value (an unset one, such as
    log.flush.interval.ms or Kafka's log.roll.jitter.ms, is no synonym: Kafka leaves it out)."""
    if not key.broker_key:
        return bool(key.synonym)
    return getattr(props, key.broker_key) is not None


DEFAULT_PROPS = ServerProperties()  # a registry built without a configuration (tools, tests)


def effective(props, own: dict[str, str]) -> dict[str, str]:
    """Every topic key's value for a topic: its own, else the broker's."""
    return {name: own.get(name, broker_default(props, name)) for name in TOPIC_KEYS}


def topic_settings(base, props, own: dict[str, str]):
    """The LogSettings (broker.shared.log.settings) of a topic with these configs: the
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
    if "flush.messages" in own:
        changes["flush_interval_messages"] = int(own["flush.messages"])
    if "index.interval.bytes" in own:
        changes["index_interval_bytes"] = int(own["index.interval.bytes"])
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
    if "compression.type" in own or any(name in own for name in LEVEL_KEYS):
        changes["compression"] = topic_codec(props, own)
    return dataclasses.replace(base, **changes)


def topic_codec(props, own: dict[str, str]) -> compression.TopicCodec | None:
    """The codec a topic stores its batches in (its compression.type and level, else the
    broker's), None for `producer`."""
    values = effective(props, own)
    return compression.topic_codec(values["compression.type"], {
        codec: int(values[key]) for key, codec in LEVEL_KEYS.items()})


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


def flush_ms(props, own: dict[str, str]) -> int:
    """A topic's flush.ms: its own, else log.flush.interval.ms; LONG_MAX: never by time."""
    value = own.get("flush.ms")
    return int(value if value is not None else broker_default(props, "flush.ms"))


def note_inert(logger, topic: str, names) -> None:
    """One line in `logger`'s log naming the keys among `names` that a topic was given and
    that have no effect here, with why."""
    reasons = {name: TOPIC_KEYS[name].inert for name in names
               if name in TOPIC_KEYS and TOPIC_KEYS[name].inert}
    if reasons:
        logger.info("topic %s: %s stored as Kafka does, but without effect here (%s)", topic,
                    ", ".join(reasons), "; ".join(f"{name}: {why}"
                                                  for name, why in reasons.items()))


# Kafka's config sources (DescribeConfigs, CreateTopics v5+).
DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 4, 5
CONFIG_TYPES = dict(config_values.CONFIG_TYPES, replicas=config_values.CONFIG_TYPES["list"])


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
            if _broker_sets(props, key):
                chain.append({"name": key.broker_name, "value": broker_value,
                              "source": broker_source})
        entries.append({"name": name, "value": value, "read_only": False,
                        "config_source": source, "is_default": source == DEFAULT_CONFIG,
                        "is_sensitive": False, "synonyms": chain,
                        "config_type": CONFIG_TYPES[key.kind],
                        "documentation": key.documentation if documentation else None})
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
        if TOPIC_KEYS[name].kind not in LIST_KINDS:
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
