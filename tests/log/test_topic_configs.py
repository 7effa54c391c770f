"""Topic-level configs: validated as Kafka validates them, described with
their sources, changed incrementally or whole, kept across a restart, and applied by every
worker: max.message.bytes, message.timestamp.type, min.insync.replicas, retention, and the
fsyncs of flush.messages and flush.ms."""

from __future__ import annotations

import os
import struct
import time

import pytest

from broker.shared.config import load_config
from broker.shared.log import topic_config
from broker.shared.log.topic_config import TopicConfigError, altered, describe, validate
from tests.harness import BrokerProcess, wait_until

CREATE_TIME, LOG_APPEND_TIME = 1, 2  # confluent_kafka.TIMESTAMP_*


# --- unit ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, value, message", [
    ("retention.msx", "1", "Unknown topic config name: retention.msx"),
    ("retention.ms", "soon", "Not a number of type LONG"),
    ("retention.ms", "-2", "Value must be at least -1"),
    ("segment.bytes", "13", "Value must be at least 14"),
    ("cleanup.policy", "compact,shred", "String must be one of: delete, compact"),
    ("message.timestamp.type", "WallClock", "String must be one of: CreateTime, LogAppendTime"),
    ("min.cleanable.dirty.ratio", "1.5", "Value must be no more than 1"),
    ("flush.ms", "-1", "Value must be at least 0"),
    ("flush.messages", "0", "Value must be at least 1"),
    ("preallocate", "maybe", "Expected value to be either true or false"),
    ("remote.storage.enable", "true", "Tiered Storage functionality is disabled in the broker"),
    ("leader.replication.throttled.replicas", "0:1,x",
     r"Invalid value \[0:1, x\] .* must be the literal '\*' or a list of replicas"),
    ("compression.type", "brotli",
     "String must be one of: uncompressed, zstd, lz4, snappy, gzip, producer"),
    ("compression.gzip.level", "0", "Value must be between 1 and 9 or equal to -1"),
    ("compression.gzip.level", "10", "Value must be between 1 and 9 or equal to -1"),
    ("compression.lz4.level", "18", "Value must be no more than 17"),
    ("compression.zstd.level", "-131073", "Value must be at least -131072"),
])
def test_bad_topic_configs_are_refused_in_kafkas_words(name, value, message):
    with pytest.raises(TopicConfigError, match=message):
        validate(name, value)


def test_every_codec_and_its_levels_are_taken_as_kafka_takes_them():
    for name in ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"):
        assert validate("compression.type", name) == name
    assert [validate("compression.gzip.level", level) for level in ("-1", "1", "9")] == \
        ["-1", "1", "9"]
    assert validate("compression.lz4.level", "1") == "1"
    assert validate("compression.zstd.level", "-131072") == "-131072"


def test_values_are_normalised_and_list_operations_apply():
    assert validate("cleanup.policy", " compact , delete,compact") == "compact,delete"
    own = altered({}, "cleanup.policy", 2, "compact")  # APPEND to the default, delete
    assert own == {"cleanup.policy": "delete,compact"}
    assert altered(own, "cleanup.policy", 3, "delete") == {"cleanup.policy": "compact"}
    assert altered(own, "cleanup.policy", 1, None) == {}
    with pytest.raises(TopicConfigError, match="append is not allowed"):
        altered({}, "retention.ms", 2, "5")


def test_describe_names_each_value_and_where_it_comes_from(tmp_path):
    props = load_config({"listeners": "PLAINTEXT://:9092", "log.dirs": str(tmp_path),
                         "log.retention.hours": "24"}).props
    entries = {entry["name"]: entry for entry in describe(props, {"segment.bytes": "4096"},
                                                          synonyms=True)}
    assert (entries["segment.bytes"]["value"], entries["segment.bytes"]["config_source"]) == \
        ("4096", topic_config.DYNAMIC_TOPIC_CONFIG)
    assert entries["segment.bytes"]["synonyms"][1]["name"] == "log.segment.bytes"
    assert (entries["retention.ms"]["value"], entries["retention.ms"]["config_source"]) == \
        (str(24 * 3600 * 1000), topic_config.STATIC_BROKER_CONFIG)
    assert entries["cleanup.policy"]["config_source"] == topic_config.DEFAULT_CONFIG
    assert len(entries) == len(topic_config.TOPIC_KEYS)


def test_flush_keys_take_kafkas_defaults_or_the_brokers_and_inert_keys_say_so(tmp_path):
    unset = load_config({"log.dirs": str(tmp_path)}).props
    entries = {entry["name"]: entry for entry in describe(unset, {}, synonyms=True,
                                                          documentation=True)}
    # Kafka's defaults; an unset log.flush.interval.ms is no synonym (Kafka leaves it out).
    assert [(entries[name]["value"], entries[name]["config_source"], entries[name]["synonyms"])
            for name in ("flush.ms", "flush.messages")] == [
        ("9223372036854775807", topic_config.DEFAULT_CONFIG, []),
        ("9223372036854775807", topic_config.DEFAULT_CONFIG, [
            {"name": "log.flush.interval.messages", "value": "9223372036854775807",
             "source": topic_config.DEFAULT_CONFIG}])]
    assert "no effect here: segment files grow" in entries["preallocate"]["documentation"]
    assert entries["preallocate"]["synonyms"][0]["name"] == "log.preallocate"
    assert entries["flush.ms"]["documentation"].startswith("A partition's appends are fsynced")
    timed = load_config({"log.dirs": str(tmp_path), "log.flush.interval.ms": "1000"}).props
    [entry] = describe(timed, {}, ["flush.ms"], synonyms=True)
    assert (entry["value"], entry["config_source"], entry["synonyms"]) == (
        "1000", topic_config.STATIC_BROKER_CONFIG,
        [{"name": "log.flush.interval.ms", "value": "1000",
          "source": topic_config.STATIC_BROKER_CONFIG}])
    assert topic_config.flush_ms(timed, {"flush.ms": "5"}) == 5
    assert topic_config.flush_ms(unset, {}) == topic_config.LONG_MAX


# --- real brokers, real clients -----------------------------------------------------------------

def _describe(admin, topic: str) -> dict:
    from confluent_kafka.admin import ConfigResource

    resource = ConfigResource("topic", topic)
    return admin.describe_configs([resource])[resource].result(timeout=20)


@pytest.mark.system
def test_topic_configs_round_trip_and_survive_a_restart(tmp_path):
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry,
                                       ConfigResource, NewTopic)
    from kafka.admin import ConfigResource as KafkaResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient

    data_dir = str(tmp_path)
    with BrokerProcess(workers=2, data_dir=data_dir) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("changelog", 1, 1, config={
            "cleanup.policy": "compact", "segment.bytes": "1048576",
            "min.compaction.lag.ms": "100", "flush.ms": "60000", "flush.messages": "1000",
            "preallocate": "TRUE"})])["changelog"].result(timeout=20)
        broker.wait_for_line(r"topic changelog: preallocate stored as Kafka does, but without "
                             r"effect here \(preallocate: segment files grow")
        with pytest.raises(KafkaException, match="Unknown topic config name: colour"):
            admin.create_topics([NewTopic("bad", 1, 1, config={"colour": "blue"})])[
                "bad"].result(timeout=20)
        described = _describe(admin, "changelog")
        assert described["cleanup.policy"].value == "compact"
        assert described["cleanup.policy"].source == 1  # DYNAMIC_TOPIC_CONFIG
        assert described["retention.ms"].source == 5  # DEFAULT_CONFIG
        assert [(described[name].value, described[name].source) for name in
                ("flush.ms", "flush.messages", "preallocate", "unclean.leader.election.enable")] \
            == [("60000", 1), ("1000", 1), ("true", 1), ("false", 5)]
        resource = ConfigResource("topic", "changelog", incremental_configs=[
            ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.APPEND),
            ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("min.compaction.lag.ms", None,
                        incremental_operation=AlterConfigOpType.DELETE)])
        admin.incremental_alter_configs([resource])[resource].result(timeout=20)
        described = _describe(admin, "changelog")
        assert (described["cleanup.policy"].value, described["retention.ms"].value,
                described["min.compaction.lag.ms"].source) == ("compact,delete", "3600000", 5)
        # The legacy AlterConfigs sets the whole set: kafka-python carries the other dynamic
        # keys along itself; confluent-kafka's alter_configs sends only what it is given.
        legacy = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
        legacy.alter_configs([KafkaResource(ConfigResourceType.TOPIC, "changelog",
                                            configs={"retention.bytes": "2000000"})],
                             incremental=False)
        legacy.close()
        described = _describe(admin, "changelog")
        assert (described["retention.bytes"].value, described["cleanup.policy"].value,
                described["retention.ms"].source) == ("2000000", "compact,delete", 1)
        whole = ConfigResource("topic", "changelog", set_config={"retention.bytes": "1000000"})
        with pytest.deprecated_call():  # deprecated by the client, still sent by tools
            admin.alter_configs([whole])[whole].result(timeout=20)
        described = _describe(admin, "changelog")
        assert (described["retention.bytes"].value, described["cleanup.policy"].source,
                described["retention.ms"].source) == ("1000000", 5, 5)
    with BrokerProcess(workers=1, data_dir=data_dir) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        described = _describe(admin, "changelog")
        assert (described["retention.bytes"].value, described["retention.bytes"].source) == \
            ("1000000", 1)
        flushed = ConfigResource("topic", "changelog", incremental_configs=[
            ConfigEntry("flush.ms", "0", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("segment.jitter.ms", "10", incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([flushed])[flushed].result(timeout=20)
        broker.wait_for_line(r"topic changelog: segment.jitter.ms stored as Kafka does")
        described = _describe(admin, "changelog")
        assert (described["flush.ms"].value, described["segment.jitter.ms"].value) == ("0", "10")


def _state_word(running: BrokerProcess, topic: str, word: int) -> int:
    """A word of partition 0's state file (broker.shared.log.partition_state), as the broker left it."""
    from broker.shared.log.partition_state import STATE_FILE

    path = os.path.join(running.data_dir, "logs", f"{topic}-0", STATE_FILE)
    with open(path, "rb") as handle:
        return struct.unpack_from("=q", handle.read(), 8 * word)[0]


@pytest.mark.system
def test_flush_messages_and_flush_ms_fsync_their_topics_only(broker):
    from confluent_kafka.admin import AdminClient, NewTopic

    from broker.shared.log.partition_state import W_LAST_FLUSH, W_UNFLUSHED
    from tests.helpers import produce_acked

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    configs = {"each": {"flush.messages": "2"}, "timed": {"flush.ms": "200"}, "never": {}}
    for name, result in admin.create_topics([NewTopic(name, 1, 1, config=config)
                                             for name, config in configs.items()]).items():
        result.result(timeout=20)
    address = broker.listeners["PLAINTEXT"]
    for name in configs:
        produce_acked(address, name, 3, name.encode())
    # The second append reached flush.messages=2 and was fsynced before it was acknowledged.
    assert _state_word(broker, "each", W_UNFLUSHED) == 1
    assert _state_word(broker, "each", W_LAST_FLUSH) > 0
    wait_until(lambda: _state_word(broker, "timed", W_UNFLUSHED) == 0, timeout=5)
    assert _state_word(broker, "never", W_UNFLUSHED) == 3  # the parent's rounds left it alone
    assert _state_word(broker, "each", W_UNFLUSHED) == 1


@pytest.mark.system
def test_topic_configs_apply_in_every_worker(broker):
    from confluent_kafka import Consumer, KafkaException, Producer
    from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry,
                                       ConfigResource, NewTopic)

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("stamped", 1, 1, config={
        "message.timestamp.type": "LogAppendTime", "max.message.bytes": "2000"})])[
        "stamped"].result(timeout=20)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0,
                         "message.max.bytes": 100_000})
    errors = []

    def delivered(error, _message):
        errors.append(error.name() if error else None)

    before = int(time.time() * 1000)
    producer.produce("stamped", value=b"x", timestamp=1_000_000, on_delivery=delivered)
    producer.flush(30)  # a batch of its own: the next one is too large for the topic
    producer.produce("stamped", value=b"y" * 5000, on_delivery=delivered)
    producer.flush(30)
    assert errors == [None, "MSG_SIZE_TOO_LARGE"]
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "stamps",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe(["stamped"])
    message, deadline = None, time.monotonic() + 20
    while message is None and time.monotonic() < deadline:
        polled = consumer.poll(0.5)
        if polled is not None and polled.error() is None:
            message = polled
    consumer.close()
    kind, stamp = message.timestamp()
    assert kind == LOG_APPEND_TIME and stamp >= before  # the broker's clock, not 1000 s
    resource = ConfigResource("topic", "stamped", incremental_configs=[ConfigEntry(
        "min.insync.replicas", "2", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(timeout=20)
    strict = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all",
                       "message.timeout.ms": 3000, "retries": 0})
    answered = []
    for _ in range(4):  # through both workers' connections
        strict.produce("stamped", value=b"z",
                       on_delivery=lambda error, _m: answered.append(error and error.name()))
    strict.flush(10)
    # as Kafka: acks=all waits for min(min.insync.replicas, replicas) in sync: one here
    assert answered == [None] * 4
    with pytest.raises(KafkaException, match="INVALID_CONFIG"):
        bad = ConfigResource("topic", "stamped", incremental_configs=[ConfigEntry(
            "segment.bytes", "12", incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([bad])[bad].result(timeout=20)
