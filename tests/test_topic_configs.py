"""Topic-level configs (issue 18, item 5): validated as Kafka validates them, described with
their sources, changed incrementally or whole, kept across a restart, and applied by every
worker: max.message.bytes, message.timestamp.type, min.insync.replicas, retention."""

from __future__ import annotations

import time

import pytest

from broker.shared.config import load_config
from broker.shared.log import topic_config
from broker.shared.log.topic_config import TopicConfigError, altered, describe, validate
from tests.harness import BrokerProcess

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
    ("compression.type", "gzip", "String must be one of: producer"),
])
def test_bad_topic_configs_are_refused_in_kafkas_words(name, value, message):
    with pytest.raises(TopicConfigError, match=message):
        validate(name, value)


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
            "min.compaction.lag.ms": "100"})])["changelog"].result(timeout=20)
        with pytest.raises(KafkaException, match="Unknown topic config name: colour"):
            admin.create_topics([NewTopic("bad", 1, 1, config={"colour": "blue"})])[
                "bad"].result(timeout=20)
        described = _describe(admin, "changelog")
        assert described["cleanup.policy"].value == "compact"
        assert described["cleanup.policy"].source == 1  # DYNAMIC_TOPIC_CONFIG
        assert described["retention.ms"].source == 5  # DEFAULT_CONFIG
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


@pytest.mark.system
def test_topic_configs_apply_in_every_worker():
    from confluent_kafka import Consumer, KafkaException, Producer
    from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry,
                                       ConfigResource, NewTopic)

    with BrokerProcess(workers=2) as broker:
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
