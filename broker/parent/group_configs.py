"""Group configs: keys a group may set for itself (IncrementalAlterConfigs or AlterConfigs on a
GROUP resource), each defaulting to the broker's setting, validated and described as Kafka's
GroupConfig.

    share.auto.offset.reset        where a share partition a share group never read starts:
                                   latest (default), earliest or by_duration:<ISO-8601>
    share.record.lock.duration.ms  group.share.record.lock.duration.ms
    share.session.timeout.ms       group.share.session.timeout.ms
    share.heartbeat.interval.ms    group.share.heartbeat.interval.ms
    consumer.session.timeout.ms    group.consumer.session.timeout.ms
    consumer.heartbeat.interval.ms group.consumer.heartbeat.interval.ms

A *.ms key lies within the broker's group.{share,consumer}.min/max.* bounds, and a session
timeout above its heartbeat interval (the group's own or the broker's).  The group coordinator
reads them (`value`); the admin service changes them (`validated`, then `replace`), each change
written to `<first log dir>/.pybroker-group-configs.jsonl` (one line per group: its whole set)
before it is acknowledged, so they survive a restart.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import msgspec

from broker.parent.record_file import LatestRecords
from broker.shared.config import ServerProperties
from broker.shared.config.values import CONFIG_TYPES
from broker.shared.constants import INT_MAX

FILE_NAME = ".pybroker-group-configs.jsonl"
# Groups with configs of their own: each is held in the parent and a line of its file.
MAX_CONFIGURED_GROUPS = 100_000
# Kafka's ConfigSource ids in DescribeConfigs.
STATIC_BROKER_CONFIG, DEFAULT_CONFIG, GROUP_CONFIG = 4, 5, 8
SET, DELETE, APPEND, SUBTRACT = range(4)

RESET_DOC = (
    "The strategy to initialize the share-partition start offset. <ul><li>earliest: "
    "automatically reset the offset to the earliest offset</li><li>latest: automatically "
    "reset the offset to the latest offset</li><li>by_duration:&lt;duration&gt;: automatically "
    "reset the offset to a configured duration from the current timestamp. &lt;duration&gt; "
    "must be specified in ISO8601 format (PnDTnHnMn.nS). Negative duration is not allowed."
    "</li><li>anything else: throw exception to the share consumer.</li></ul>")
# java.time.Duration.parse's grammar: PnDTnHnMn.nS, each part optional but at least one.
ISO_DURATION = re.compile(
    r"([-+]?)P(?:([-+]?[0-9]+)D)?(T(?:([-+]?[0-9]+)H)?(?:([-+]?[0-9]+)M)?"
    r"(?:([-+]?[0-9]+)(?:[.,]([0-9]{0,9}))?S)?)?", re.IGNORECASE)


class GroupConfigError(ValueError):
    """An alteration Kafka refuses; the message is Kafka's, the code its error's name."""

    def __init__(self, message: str, code: str = "invalid_config"):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class GroupKey:
    name: str
    broker_key: str  # the ServerProperties field its default comes from ("": `fixed`)
    doc: str
    at_least: int = 0  # Kafka's atLeast of an INT key (0: a STRING key)
    fixed: str = ""  # the default of a key without a broker key

    @property
    def broker_name(self) -> str:
        return self.broker_key.replace("_", ".")

    def bounds(self, props) -> tuple[int, int]:
        """The broker's group.<kind>.min/max.<what> around the key."""
        kind, _, what = self.broker_key.removeprefix("group_").partition("_")
        return (getattr(props, f"group_{kind}_min_{what}"),
                getattr(props, f"group_{kind}_max_{what}"))


KEYS = {key.name: key for key in (
    GroupKey("consumer.session.timeout.ms", "group_consumer_session_timeout_ms",
             "The timeout to detect client failures when using the consumer group protocol.", 1),
    GroupKey("consumer.heartbeat.interval.ms", "group_consumer_heartbeat_interval_ms",
             "The heartbeat interval given to the members of a consumer group.", 1),
    GroupKey("share.session.timeout.ms", "group_share_session_timeout_ms",
             "The timeout to detect client failures when using the share group protocol.", 1),
    GroupKey("share.heartbeat.interval.ms", "group_share_heartbeat_interval_ms",
             "The heartbeat interval given to the members of a share group.", 1),
    GroupKey("share.record.lock.duration.ms", "group_share_record_lock_duration_ms",
             "The record acquisition lock duration in milliseconds for share groups.", 1000),
    GroupKey("share.auto.offset.reset", "", RESET_DOC, fixed="latest"),
)}
# Kafka's check that a session outlasts its heartbeats: (session key, heartbeat key).
SESSION_OVER_HEARTBEAT = (("consumer.session.timeout.ms", "consumer.heartbeat.interval.ms"),
                          ("share.session.timeout.ms", "share.heartbeat.interval.ms"))
DEFAULTS_PROPS = ServerProperties()


class SavedGroupConfigs(msgspec.Struct, frozen=True):
    group: str
    configs: dict[str, str]  # empty: the group has none of its own any more


def reset_problem(value: str) -> str | None:
    """Kafka's check of share.auto.offset.reset (ShareGroupAutoOffsetResetStrategy)."""
    if value in ("earliest", "latest"):
        return None
    prefix, _, duration = value.partition(":")
    match = ISO_DURATION.fullmatch(duration) if prefix == "by_duration" else None
    if match is not None and (match[2] or match[4] or match[5] or match[6]) and \
            not (match[3] and not (match[4] or match[5] or match[6])) and \
            _seconds(match) >= 0:
        return None
    return (f"Invalid value {value} for configuration share.auto.offset.reset: Invalid value "
            f"`{value}` for configuration share.auto.offset.reset. The value must be either "
            "'earliest', 'latest' or of the format 'by_duration:<PnDTnHnMn.nS>'.")


def reset_duration(value: str) -> float | None:
    """The seconds back of a valid `by_duration:<ISO-8601>` share.auto.offset.reset; None for
    earliest and latest."""
    prefix, _, duration = value.partition(":")
    match = ISO_DURATION.fullmatch(duration) if prefix == "by_duration" else None
    return None if match is None else _seconds(match)


def _seconds(match: re.Match) -> float:
    """The signed length of a parsed ISO-8601 duration."""
    days, hours, minutes, seconds = (int(match[group] or 0) for group in (2, 4, 5, 6))
    fraction = int((match[7] or "0").ljust(9, "0")) / 1e9
    if match[6] and match[6].startswith("-"):
        fraction = -fraction
    total = days * 86400 + hours * 3600 + minutes * 60 + seconds + fraction
    return -total if match[1] == "-" else total


def _checked(key: GroupKey, value: str) -> str:
    """A value as ConfigDef.parse takes it (trimmed), or Kafka's refusal."""
    value = value.strip()
    if not key.at_least:
        problem = reset_problem(value)
        if problem is not None:
            raise GroupConfigError(problem)
        return value
    try:
        number = int(value)
    except ValueError:
        number = None
    if number is None or not -INT_MAX - 1 <= number <= INT_MAX:
        raise GroupConfigError(f"Invalid value {value} for configuration {key.name}: "
                               f"Not a number of type INT")
    if number < key.at_least:
        raise GroupConfigError(f"Invalid value {value} for configuration {key.name}: "
                               f"Value must be at least {key.at_least}")
    return str(number)


class GroupConfigs:
    """The groups' own configs (group id -> {key: value}) over the broker's defaults, durable
    in `directory` when one is given."""

    def __init__(self, props, directory: str | None = None, fsync_every_write: bool = False):
        self.props = props
        self.records = None if directory is None else LatestRecords(
            os.path.join(directory, FILE_NAME), SavedGroupConfigs, key=lambda saved: saved.group,
            alive=lambda saved: bool(saved.configs), fsync_every_write=fsync_every_write)
        self.configs: dict[str, dict[str, str]] = {} if self.records is None else {
            group: dict(saved.configs) for group, saved in self.records.saved.items()}

    def default(self, key: str) -> str:
        spec = KEYS[key]
        return str(getattr(self.props, spec.broker_key)) if spec.broker_key else spec.fixed

    def value(self, group_id: str, key: str) -> str:
        """The group's own value of `key`, else the broker's default."""
        return self.configs.get(group_id, {}).get(key) or self.default(key)

    def own(self, group_id: str) -> dict[str, str]:
        """A copy of the group's own configs."""
        return dict(self.configs.get(group_id, {}))

    def set(self, group_id: str, key: str, value: str | None) -> None:
        """Set (None: delete) one of the group's configs, unchecked."""
        own = self.own(group_id)
        if value is None:
            own.pop(key, None)
        else:
            own[key] = value
        self.replace(group_id, own)

    # --- alteration -----------------------------------------------------------------------

    def validated(self, group_id: str, own: dict[str, str], operations) -> dict[str, str]:
        """The group's configs after `operations` ((name, operation, value) as
        IncrementalAlterConfigs gives them) on `own`, checked whole as Kafka's
        GroupConfig.validate; GroupConfigError if Kafka refuses them."""
        result = dict(own)
        for name, operation, value in operations:
            key = KEYS.get(name)
            if key is None:
                raise GroupConfigError(f"Unknown group config name: {name}")
            if operation in (APPEND, SUBTRACT):
                raise GroupConfigError(f"Config value append is not allowed for config key: "
                                       f"{name}")
            if operation not in (SET, DELETE):
                raise GroupConfigError(f"Unknown config operation {operation}", "invalid_request")
            if operation == DELETE or value is None:
                result.pop(name, None)
            else:
                result[name] = _checked(key, value)
        self._check_bounds(result)
        if group_id not in self.configs and result and \
                len(self.configs) >= MAX_CONFIGURED_GROUPS:
            raise GroupConfigError(f"{MAX_CONFIGURED_GROUPS} groups have configs of their own "
                                   f"already (the most kept)", "invalid_request")
        return result

    def _check_bounds(self, own: dict[str, str]) -> None:
        """Kafka's GroupConfig.validateValues: the keys the group sets within the broker's
        bounds, and each session timeout above its heartbeat interval."""
        for name, value in own.items():
            key = KEYS[name]
            if key.broker_key:
                low, high = key.bounds(self.props)
                if not low <= int(value) <= high:
                    raise GroupConfigError(f"{name} must be in the range {low} to {high} "
                                           f"inclusive.")
        for session, heartbeat in SESSION_OVER_HEARTBEAT:
            if (session in own or heartbeat in own) and \
                    int(self.value_in(own, session)) <= int(self.value_in(own, heartbeat)):
                raise GroupConfigError(f"{session} must be greater than {heartbeat}")

    def value_in(self, own: dict[str, str], key: str) -> str:
        return own.get(key) or self.default(key)

    def replace(self, group_id: str, own: dict[str, str]) -> None:
        """The group's configs become `own`, written first (raises OSError: nothing
        changed)."""
        if self.records is not None:
            self.records.write(SavedGroupConfigs(group_id, dict(own)))
        if own:
            self.configs[group_id] = dict(own)
        else:
            self.configs.pop(group_id, None)

    # --- description ----------------------------------------------------------------------

    def describe(self, group_id: str, keys=None, synonyms: bool = False,
                 documentation: bool = False) -> list[dict]:
        """DescribeConfigs' entries of a group (all keys, or `keys`; a key Kafka does not
        know is left out): its own value (GROUP_CONFIG), else the broker's (DEFAULT_CONFIG,
        as Kafka's ConfigHelper); with `synonyms`, the key itself and the broker key behind
        it."""
        own = self.configs.get(group_id, {})
        entries = []
        for name in keys if keys else KEYS:
            key = KEYS.get(name)
            if key is None:
                continue
            value = self.value_in(own, name)
            source = GROUP_CONFIG if name in own else DEFAULT_CONFIG
            chain = [{"name": name, "value": value, "source": source}] if synonyms else []
            if synonyms and key.broker_key:
                broker_value = self.default(name)
                chain.append({"name": key.broker_name, "value": broker_value,
                              "source": DEFAULT_CONFIG
                              if broker_value == str(getattr(DEFAULTS_PROPS, key.broker_key))
                              else STATIC_BROKER_CONFIG})
            entries.append({"name": name, "value": value, "read_only": False,
                            "config_source": source, "is_default": source == DEFAULT_CONFIG,
                            "is_sensitive": False, "synonyms": chain,
                            "config_type": CONFIG_TYPES["int" if key.at_least else "string"],
                            "documentation": key.doc if documentation else None})
        return entries

    def close(self) -> None:
        if self.records is not None:
            self.records.close()
