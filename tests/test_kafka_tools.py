"""Apache Kafka 4.4's command-line tools, run by class (loadtest/apache_kafka.py), against this
broker: each check parses what the tool prints (its tables, its JSON events) and compares it
with what the broker holds, not only its exit status.  What is asserted was first checked
against Apache Kafka 4.4.0 itself with the same invocations.

One broker serves the module: SASL-less, with Kafka's StandardAuthorizer on (kafka-acls needs
one), ANONYMOUS a super user so every tool may do everything.  A tool is a JVM (about a second,
mostly start-up), so independent invocations run at once on threads.  The default run (`make
test`) keeps a short set: topics, configs, consumer-groups describe and reset, get-offsets,
and the verifiable producer and consumer; the rest carry the `long` marker (`make compat`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from loadtest import apache_kafka
from tests.harness import BrokerProcess, wait_until
from tests.test_parent_amplification import ask, stable_group
from tests.wire import KafkaSocket, alter_raw

pytestmark = [
    pytest.mark.system,
    pytest.mark.skipif(shutil.which("java") is None or not os.path.isdir(apache_kafka.LIB),
                       reason=apache_kafka.MISSING),
]

STANDARD = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
TOOLS_BROKER = {"authorizer.class.name": STANDARD, "super.users": "User:ANONYMOUS",
                "allow.everyone.if.no.acl.found": "true",
                "group.initial.rebalance.delay.ms": "0"}
NODE = "0"  # this broker's id


@pytest.fixture(scope="module")
def broker():
    with BrokerProcess(workers=2, overrides=TOOLS_BROKER) as running:
        yield running


# --- running the tools ---------------------------------------------------------------------------

def kafka(broker, name: str, *args: str, stdin: str | None = None, check: bool = True):
    """One of Kafka's tools pointed at the broker: its CompletedProcess (raises with its output
    when it fails and `check` is set)."""
    return apache_kafka.tool(name, "--bootstrap-server", broker.bootstrap, *args, stdin=stdin,
                             timeout=120, check=check)


def out(broker, name: str, *args: str, stdin: str | None = None) -> str:
    return kafka(broker, name, *args, stdin=stdin).stdout


def together(*calls):
    """Independent invocations at once (each call a function of no argument): their results,
    in order; the first failure is raised."""
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
        return [future.result() for future in futures]


# --- reading what they print -------------------------------------------------------------------

def table(text: str, first_column: str = "GROUP") -> list[dict[str, str]]:
    """The rows of a table kafka-consumer-groups prints (a header of names, then rows, columns
    apart by spaces), as dicts by column name."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [first_column])
    names = lines[start].split()
    return [dict(zip(names, line.split())) for line in lines[start + 1:] if line.strip()]


def tab_table(text: str) -> list[dict[str, str]]:
    """A table kafka-transactions prints: cells apart by tabs, padded with spaces."""
    lines = [line.split("\t") for line in text.splitlines() if "\t" in line]
    names = [cell.strip() for cell in lines[0]]
    return [dict(zip(names, (cell.strip() for cell in line))) for line in lines[1:]]


def offsets(text: str) -> dict[tuple[str, int], int]:
    """kafka-get-offsets' `topic:partition:offset` lines."""
    found = {}
    for line in text.splitlines():
        topic, partition, offset = line.rsplit(":", 2)
        found[(topic, int(partition))] = int(offset)
    return found


def configs(text: str) -> dict[str, tuple[str, str]]:
    """kafka-configs' `  key=value sensitive=false synonyms={...}` lines: key -> (value,
    synonyms)."""
    found = {}
    for match in re.finditer(r"^  (\S+?)=(.*) sensitive=\w+ synonyms=\{(.*)\}$", text, re.M):
        found[match.group(1)] = (match.group(2), match.group(3))
    return found


def topic_lines(text: str) -> list[dict[str, str]]:
    """kafka-topics --describe: each line's `Name: value` cells."""
    return [dict(cell.split(": ", 1) for cell in line.strip().split("\t") if ": " in cell)
            for line in text.splitlines() if line.strip()]


def events(text: str) -> list[dict]:
    """The JSON events the verifiable producer and consumer print, one a line."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


# --- what the broker holds, through Python clients ----------------------------------------------

def admin(broker):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": broker.bootstrap})


def create_topics(broker, partitions: int, *names: str) -> None:
    from confluent_kafka.admin import NewTopic

    client = admin(broker)  # held: the futures fail once their client is collected
    for future in client.create_topics([NewTopic(name, partitions, 1) for name in names]).values():
        future.result(timeout=20)


def produce(broker, topic: str, count: int, partitions: int) -> None:
    """`count` records spread round the partitions, each acknowledged."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    failed = []
    for index in range(count):
        producer.produce(topic, key=b"k%d" % index, value=b"v%d" % index,
                         partition=index % partitions,
                         on_delivery=lambda error, _m: failed.append(error) if error else None)
    assert producer.flush(20) == 0 and failed == []


def commit(broker, group: str, positions: dict[tuple[str, int], int]) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    try:
        consumer.commit(offsets=[TopicPartition(topic, partition, offset)
                                 for (topic, partition), offset in positions.items()],
                        asynchronous=False)
    finally:
        consumer.close()


def committed(broker, group: str, topic: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, partition)
                                                   for partition in range(partitions)])
    client = admin(broker)
    answer = client.list_consumer_group_offsets([request])[group].result(timeout=20)
    return {part.partition: part.offset for part in answer.topic_partitions}


# --- the short set (make test) -------------------------------------------------------------------

def test_the_short_set_topics_configs_groups_offsets_and_verifiable_clients(broker):
    """Seven invocations in five chains at once: kafka-topics --create, kafka-configs
    --describe of the broker, kafka-consumer-groups --describe then --reset-offsets,
    kafka-get-offsets, and the verifiable producer then consumer."""
    create_topics(broker, 2, "short-groups")
    create_topics(broker, 3, "short-verifiable")
    produce(broker, "short-groups", 10, 2)
    commit(broker, "short-group", {("short-groups", 0): 3, ("short-groups", 1): 5})
    for layer, value in ((NODE, "5000"), ("", "6000")):  # this broker's, the cluster default
        assert alter_raw(broker.listeners["PLAINTEXT"], layer, "max.connections", value) == 0
    together(lambda: check_topic_creation(broker), lambda: check_broker_configs(broker),
             lambda: check_group_describe_and_reset(broker),
             lambda: check_get_offsets(broker),
             lambda: check_verifiable_clients(broker, "short-verifiable", 3, 600))


def check_topic_creation(broker) -> None:
    from confluent_kafka.admin import ConfigResource

    printed = out(broker, "kafka-topics", "--create", "--topic", "short-created",
                  "--partitions", "3", "--config", "retention.ms=100000",
                  "--config", "cleanup.policy=compact")
    assert printed.strip() == "Created topic short-created."
    client = admin(broker)
    topic = client.list_topics("short-created", timeout=10).topics["short-created"]
    assert topic.error is None and sorted(topic.partitions) == [0, 1, 2]
    resource = ConfigResource("topic", "short-created")
    entries = client.describe_configs([resource])[resource].result(timeout=20)
    assert (entries["retention.ms"].value, entries["cleanup.policy"].value) == \
        ("100000", "compact")


def check_broker_configs(broker) -> None:
    """Kafka prints a broker's dynamic configs only: those whose source is
    DYNAMIC_BROKER_CONFIG, each with its synonyms, the highest layer first."""
    printed = out(broker, "kafka-configs", "--describe", "--entity-type", "brokers",
                  "--entity-name", NODE)
    assert printed.startswith(f"Dynamic configs for broker {NODE} are:")
    assert configs(printed) == {"max.connections": (
        "5000", "DYNAMIC_BROKER_CONFIG:max.connections=5000, "
                "DYNAMIC_DEFAULT_BROKER_CONFIG:max.connections=6000, "
                "DEFAULT_CONFIG:max.connections=2147483647")}


def check_group_describe_and_reset(broker) -> None:
    described = kafka(broker, "kafka-consumer-groups", "--describe", "--group", "short-group")
    assert "Consumer group 'short-group' has no active members." in described.stderr
    rows = {int(row["PARTITION"]): row for row in table(described.stdout)}
    assert {partition: (row["TOPIC"], row["CURRENT-OFFSET"], row["LOG-END-OFFSET"], row["LAG"],
                        row["CONSUMER-ID"])
            for partition, row in rows.items()} == {
        0: ("short-groups", "3", "5", "2", "-"), 1: ("short-groups", "5", "5", "0", "-")}
    reset = out(broker, "kafka-consumer-groups", "--group", "short-group", "--reset-offsets",
                "--to-earliest", "--topic", "short-groups", "--execute")
    assert {(row["TOPIC"], int(row["PARTITION"]), int(row["NEW-OFFSET"]))
            for row in table(reset)} == {("short-groups", 0, 0), ("short-groups", 1, 0)}
    assert committed(broker, "short-group", "short-groups", 2) == {0: 0, 1: 0}


def check_get_offsets(broker) -> None:
    printed = out(broker, "kafka-get-offsets", "--topic", "short-groups", "--time", "-1")
    assert offsets(printed) == {("short-groups", 0): 5, ("short-groups", 1): 5}


def check_verifiable_clients(broker, topic: str, partitions: int, count: int) -> None:
    """Every record the verifiable producer had acknowledged is read back exactly once by the
    verifiable consumer in a group, which commits as it goes (Kafka's system tests' check)."""
    acked = verifiable_produce(broker, topic, count)
    assert {partition for partition, _offset in acked} == set(range(partitions))
    consumer = events(out(broker, "kafka-verifiable-consumer", "--topic", topic,
                          "--group-id", f"{topic}-group", "--max-messages", str(count),
                          "--verbose"))
    read = [(event["partition"], event["offset"], event["value"]) for event in consumer
            if event["name"] == "record_data"]
    assert len(read) == len(set(read)) == count
    assert {(partition, offset): value for partition, offset, value in read} == acked
    assert last_commits(consumer) == end_offsets(acked)
    assert consumer[-1]["name"] in ("shutdown_complete", "shutdown_requested")


def verifiable_produce(broker, topic: str, count: int) -> dict[tuple[int, int], str]:
    """The verifiable producer's acknowledged records, (partition, offset) -> value; each
    record of `count` acknowledged, none failed.  Round robin spreads them over the
    partitions (the sticky default would fill one)."""
    printed = events(out(broker, "kafka-verifiable-producer", "--topic", topic,
                         "--max-messages", str(count), "--acks", "-1", "--command-config",
                         properties(broker, "round-robin", partitioner_class=ROUND_ROBIN)))
    sent = [event for event in printed if event["name"] == "producer_send_success"]
    assert [event for event in printed if event["name"] == "producer_send_error"] == []
    assert printed[-1]["name"] == "tool_data" and printed[-1]["acked"] == count
    acked = {(event["partition"], event["offset"]): event["value"] for event in sent}
    assert len(acked) == count and sorted(acked.values(), key=int) == \
        [str(index) for index in range(count)]
    return acked


ROUND_ROBIN = "org.apache.kafka.clients.producer.RoundRobinPartitioner"


def properties(broker, name: str, **settings: str) -> str:
    """A client properties file (in the broker's temporary directory) with `settings`, their
    underscores dots."""
    path = os.path.join(broker.data_dir, f"{name}.properties")
    with open(path, "w") as handle:
        handle.writelines(f"{key.replace('_', '.')}={value}\n" for key, value in settings.items())
    return path


def last_commits(consumer_events: list[dict]) -> dict[int, int]:
    """The last offset each partition's successful commits reached."""
    reached: dict[int, int] = {}
    for event in consumer_events:
        if event["name"] == "offsets_committed":
            assert event["success"], event
            for item in event["offsets"]:
                reached[item["partition"]] = item["offset"]
    return reached


def end_offsets(acked) -> dict[int, int]:
    ends: dict[int, int] = {}
    for partition, offset in acked:
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    return ends


# --- what the tools found, held by Python clients and raw requests -------------------------------

DYNAMIC_BROKER, DYNAMIC_DEFAULT, STATIC, DEFAULT = 2, 3, 4, 5  # Kafka's config sources
GROUP_ID_NOT_FOUND, INVALID_PARTITIONS, DUPLICATE_RESOURCE = 69, 37, 92


def describe_broker(sock, name: str, keys) -> dict[str, tuple]:
    """DescribeConfigs v4 of the BROKER resource `name` with synonyms: key -> (value, source,
    [(synonym value, source)...])."""
    answer = ask(sock, 32, 4, {"resources": [{"resource_type": 4, "resource_name": name,
                                              "configuration_keys": keys}],
                               "include_synonyms": True, "include_documentation": False})[1]
    return {entry.name: (entry.value, int(entry.config_source),
                         [(synonym.value, int(synonym.source)) for synonym in entry.synonyms])
            for entry in answer.results[0].configs}


def test_broker_configs_say_kafkas_sources_and_synonyms(broker):
    """kafka-configs showed nothing of a broker's dynamic configs: they were described as
    source 1 (DYNAMIC_TOPIC_CONFIG to every client) and the cluster default as 2, without
    synonyms; and the cluster-default resource described every key, as DEFAULT_CONFIG."""
    address = broker.listeners["PLAINTEXT"]
    assert alter_raw(address, NODE, "max.connections.per.ip", "9000") == 0
    assert alter_raw(address, "", "max.connections.per.ip", "9500") == 0
    with KafkaSocket(address) as sock:
        node = describe_broker(sock, NODE, ["max.connections.per.ip", "num.network.threads",
                                            "max.connection.creation.rate"])
        cluster_default = describe_broker(sock, "", None)
    assert node == {
        "max.connections.per.ip": ("9000", DYNAMIC_BROKER, [
            ("9000", DYNAMIC_BROKER), ("9500", DYNAMIC_DEFAULT), ("2147483647", DEFAULT)]),
        "num.network.threads": ("2", STATIC, [("2", STATIC), ("3", DEFAULT)]),
        "max.connection.creation.rate": ("2147483647", DEFAULT, [("2147483647", DEFAULT)])}
    assert cluster_default["max.connections.per.ip"] == \
        ("9500", DYNAMIC_DEFAULT, [("9500", DYNAMIC_DEFAULT)])
    assert {source for _, source, _ in cluster_default.values()} == {DYNAMIC_DEFAULT}


def test_offsets_by_time_begin_at_the_log_start_offset_and_latest_tiered_is_none(broker):
    """After DeleteRecords, a timestamp lookup answered offsets below the log start (0 where
    Kafka says 2, or nothing when every record is gone); LATEST_TIERED_TIMESTAMP (-5) answered
    the high watermark where Kafka, without tiered storage, answers no offset."""
    from confluent_kafka import Producer, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    create_topics(broker, 2, "regress-times")
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    now = int(time.time() * 1000)
    for partition, count in ((0, 4), (1, 2)):
        for index in range(count):
            producer.produce("regress-times", b"v", partition=partition,
                             timestamp=now - 60_000 + 1000 * index)
    assert producer.flush(20) == 0
    client = admin(broker)
    deleted = client.delete_records([TopicPartition("regress-times", 0, 2),
                                     TopicPartition("regress-times", 1, 2)])
    assert [future.result(timeout=20).low_watermark for future in deleted.values()] == [2, 2]

    def by_time(stamp: int) -> dict[int, int]:
        wanted = {TopicPartition("regress-times", partition): OffsetSpec.for_timestamp(stamp)
                  for partition in (0, 1)}
        return {part.partition: result.result(timeout=20).offset
                for part, result in client.list_offsets(wanted).items()}

    assert by_time(0) == {0: 2, 1: -1}
    assert by_time(now - 60_000 + 2500) == {0: 3, 1: -1}
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as sock:
        answer = ask(sock, 2, 9, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": "regress-times", "partitions": [
                {"partition_index": 0, "current_leader_epoch": -1, "timestamp": -5}]}]})[1]
    part = answer.topics[0].partitions[0]
    assert (part.error_code, part.offset, part.timestamp, part.leader_epoch) == (0, -1, -1, -1)


def test_refusals_in_kafkas_words_and_a_missing_group_is_not_found(broker):
    """What kafka-configs, kafka-topics and kafka-consumer-groups print of a refusal is the
    broker's message: Kafka's, for both SCRAM mechanisms of one user in one request and for
    fewer partitions; DescribeGroups v6 (KIP-1043) says a group does not exist."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (NewPartitions, ScramCredentialInfo, ScramMechanism,
                                       UserScramCredentialUpsertion)

    client = admin(broker)
    both = [UserScramCredentialUpsertion("twice", ScramCredentialInfo(mechanism, 4096), b"pw")
            for mechanism in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512)]
    with pytest.raises(KafkaException) as refused:
        client.alter_user_scram_credentials(both)["twice"].result(timeout=20)
    assert (refused.value.args[0].code(), refused.value.args[0].str()) == \
        (DUPLICATE_RESOURCE, "A user credential cannot be altered twice in the same request")
    create_topics(broker, 2, "regress-shrink")
    with pytest.raises(KafkaException) as refused:
        client.create_partitions([NewPartitions("regress-shrink", 1)])["regress-shrink"] \
            .result(timeout=20)
    assert (refused.value.args[0].code(), refused.value.args[0].str()) == (
        INVALID_PARTITIONS, "The topic regress-shrink currently has 2 partition(s); 1 would not "
                            "be an increase.")
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as sock:
        for version, code in ((5, 0), (6, GROUP_ID_NOT_FOUND)):
            group = ask(sock, 15, version, {"groups": ["no-such-group"],
                                            "include_authorized_operations": False})[1].groups[0]
            assert (group.error_code, group.group_state) == (code, "Dead")
        assert group.error_message == "Group no-such-group not found."


def test_a_members_host_is_described_in_javas_form(broker):
    """kafka-consumer-groups printed a member's HOST as 127.0.0.1 where Kafka prints
    /127.0.0.1 (Java's InetAddress.toString(), which Kafka's DescribeGroups answers)."""
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as sock:
        member = stable_group(sock, "regress-host", b"m")
        described = ask(sock, 15, 5, {"groups": ["regress-host"],
                                      "include_authorized_operations": False})[1].groups[0]
    assert [(m.member_id, m.client_host) for m in described.members] == [(member, "/127.0.0.1")]
