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
from kio.schema.errors import ErrorCode

from loadtest import apache_kafka
from tests.harness import BrokerProcess, wait_until
from tests.helpers import create_topics, produce
from tests.security.helpers import STANDARD
from tests.helpers import ask, stable_group
from tests.wire import KafkaSocket, alter_raw

pytestmark = [
    pytest.mark.system,
    pytest.mark.skipif(shutil.which("java") is None or not os.path.isdir(apache_kafka.LIB),
                       reason=apache_kafka.MISSING),
]

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


def numbered(count: int) -> dict[str, list[bytes]]:
    """`count` records' keys k0.. and values v0.., as tests.helpers.produce takes them."""
    return {"keys": [b"k%d" % i for i in range(count)],
            "values": [b"v%d" % i for i in range(count)]}


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
    """Nine invocations in six chains at once: kafka-topics --create, kafka-configs
    --describe of the broker, kafka-consumer-groups --describe then --reset-offsets,
    kafka-share-groups --reset-offsets then --describe, kafka-get-offsets, and the
    verifiable producer then consumer."""
    create_topics(broker.bootstrap, "short-groups", partitions=2)
    create_topics(broker.bootstrap, "short-share", partitions=1)
    produce(broker.bootstrap, "short-share", **numbered(3))
    create_topics(broker.bootstrap, "short-verifiable", partitions=3)
    produce(broker.bootstrap, "short-groups", partitions=range(2), **numbered(10))
    commit(broker, "short-group", {("short-groups", 0): 3, ("short-groups", 1): 5})
    for layer, value in ((NODE, "5000"), ("", "6000")):  # this broker's, the cluster default
        assert alter_raw(broker.listeners["PLAINTEXT"], layer, "max.connections", value) == ErrorCode.none
    together(lambda: check_topic_creation(broker), lambda: check_broker_configs(broker),
             lambda: check_group_describe_and_reset(broker),
             lambda: check_share_group_reset(broker),
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


def check_share_group_reset(broker) -> None:
    """A share group that never read a topic starts at its beginning once reset (KIP-932)."""
    reset = out(broker, "kafka-share-groups", "--group", "short-share-group", "--reset-offsets",
                "--to-earliest", "--topic", "short-share", "--execute")
    assert [(row["TOPIC"], row["PARTITION"], row["NEW-OFFSET"]) for row in table(reset)] == [
        ("short-share", "0", "0")]
    described = out(broker, "kafka-share-groups", "--describe", "--group", "short-share-group",
                    "--offsets")
    assert [(row["TOPIC"], row["START-OFFSET"], row["LAG"]) for row in table(described)] == [
        ("short-share", "0", "3")]


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


def verifiable_produce(broker, topic: str, count: int,
                       throughput: str = "-1") -> dict[tuple[int, int], str]:
    """The verifiable producer's acknowledged records, (partition, offset) -> value; each
    record of `count` acknowledged, none failed.  Round robin spreads them over the
    partitions (the sticky default would fill one); `throughput`: records a second at most."""
    printed = events(out(broker, "kafka-verifiable-producer", "--topic", topic,
                         "--max-messages", str(count), "--acks", "-1", "--throughput",
                         throughput, "--command-config",
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
    assert alter_raw(address, NODE, "max.connections.per.ip", "9000") == ErrorCode.none
    assert alter_raw(address, "", "max.connections.per.ip", "9500") == ErrorCode.none
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

    create_topics(broker.bootstrap, "regress-times", partitions=2)
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
    assert (part.error_code, part.offset, part.timestamp, part.leader_epoch) == (ErrorCode.none, -1, -1, -1)


def test_records_of_a_compacted_topic_cannot_be_deleted(broker):
    """kafka-delete-records moved the log start of a compacted topic; Kafka refuses it with
    POLICY_VIOLATION unless cleanup.policy has delete."""
    from confluent_kafka import KafkaException, TopicPartition
    from confluent_kafka.admin import NewTopic, OffsetSpec

    client = admin(broker)
    futures = client.create_topics([
        NewTopic("regress-compacted", 1, 1, config={"cleanup.policy": "compact"}),
        NewTopic("regress-both", 1, 1, config={"cleanup.policy": "compact,delete"})])
    for future in futures.values():
        future.result(timeout=20)
    produce(broker.bootstrap, "regress-compacted", partitions=range(1), **numbered(3))
    produce(broker.bootstrap, "regress-both", partitions=range(1), **numbered(3))
    refused = client.delete_records([TopicPartition("regress-compacted", 0, 1)])
    with pytest.raises(KafkaException) as error:
        next(iter(refused.values())).result(timeout=20)
    assert error.value.args[0].code() == ErrorCode.policy_violation
    start = client.list_offsets({TopicPartition("regress-compacted", 0): OffsetSpec.earliest()})
    assert next(iter(start.values())).result(timeout=20).offset == 0  # kept
    allowed = client.delete_records([TopicPartition("regress-both", 0, 1)])
    assert next(iter(allowed.values())).result(timeout=20).low_watermark == 1


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
        (ErrorCode.duplicate_resource,
         "A user credential cannot be altered twice in the same request")
    create_topics(broker.bootstrap, "regress-shrink", partitions=2)
    with pytest.raises(KafkaException) as refused:
        client.create_partitions([NewPartitions("regress-shrink", 1)])["regress-shrink"] \
            .result(timeout=20)
    assert (refused.value.args[0].code(), refused.value.args[0].str()) == (
        ErrorCode.invalid_partitions,
        "The topic regress-shrink currently has 2 partition(s); 1 would not be an increase.")
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as sock:
        for version, code in ((5, 0), (6, ErrorCode.group_id_not_found)):
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


# --- the long set (make compat) -----------------------------------------------------------------

def failure(result) -> str:
    """What a refused invocation printed, both streams (the tools print errors on either)."""
    assert result.returncode != 0, result.stdout
    return result.stdout + result.stderr


@pytest.mark.long
def test_topics_create_list_describe_alter_and_delete(broker):
    topic = "long-topics"
    created = out(broker, "kafka-topics", "--create", "--topic", topic, "--partitions", "2",
                  "--config", "retention.ms=100000")
    assert created.strip() == f"Created topic {topic}."
    twice, listed, _more = together(
        lambda: kafka(broker, "kafka-topics", "--create", "--topic", topic, "--partitions", "2",
                      check=False),
        lambda: out(broker, "kafka-topics", "--list"),
        lambda: out(broker, "kafka-topics", "--alter", "--topic", topic, "--partitions", "4"))
    assert f"Topic '{topic}' already exists." in failure(twice)
    assert topic in listed.split()
    fewer, described, missing = together(
        lambda: kafka(broker, "kafka-topics", "--alter", "--topic", topic, "--partitions", "3",
                      check=False),
        lambda: out(broker, "kafka-topics", "--describe", "--topic", topic),
        lambda: kafka(broker, "kafka-topics", "--describe", "--topic", "long-no-such",
                      check=False))
    assert f"The topic {topic} currently has 4 partition(s); 3 would not be an increase." in \
        failure(fewer)
    assert "Topic 'long-no-such' does not exist as expected" in failure(missing)
    head, *partitions = topic_lines(described)
    assert (head["Topic"], head["PartitionCount"], head["ReplicationFactor"], head["Configs"]) \
        == (topic, "4", "1", "retention.ms=100000")
    assert head["TopicId"] == topic_id(broker, topic)
    assert [(p["Topic"], p["Partition"], p["Leader"], p["Replicas"], p["Isr"])
            for p in partitions] == [(topic, str(index), NODE, NODE, NODE) for index in range(4)]
    assert out(broker, "kafka-topics", "--delete", "--topic", topic).strip() == ""
    assert topic not in out(broker, "kafka-topics", "--list").split()


def topic_id(broker, topic: str) -> str:
    """The topic's id as Java prints it (URL-safe base64; librdkafka's is the standard one)."""
    from confluent_kafka import TopicCollection

    client = admin(broker)
    found = client.describe_topics(TopicCollection([topic]))[topic].result(timeout=20).topic_id
    return str(found).translate(str.maketrans("+/", "-_"))


def quota_lines(text: str) -> dict[str, dict[str, str]]:
    """kafka-configs' `Quota configs for <entity> are a=1.0, b=2.0` lines: entity -> values."""
    found = {}
    for match in re.finditer(r"^Quota configs for (.+) are (.*)$", text, re.M):
        found[match.group(1)] = dict(item.split("=", 1) for item in match.group(2).split(", "))
    return found


def scram_lines(text: str) -> dict[str, set[str]]:
    """`SCRAM credential configs for user-principal 'x' are SCRAM-SHA-256=iterations=4096, ...`"""
    return {match.group(1): set(match.group(2).split(", ")) for match in re.finditer(
        r"^SCRAM credential configs for user-principal '(.+)' are (.*)$", text, re.M)}


@pytest.mark.long
def test_configs_of_topics_brokers_quotas_and_scram_users(broker):
    create_topics(broker.bootstrap, "long-configs", partitions=1)

    def configs_of(*entity: str, describe_all: bool = False) -> dict[str, str]:
        printed = out(broker, "kafka-configs", "--describe", *entity,
                      *(["--all"] if describe_all else []))
        return {key: value for key, (value, _synonyms) in configs(printed).items()}

    def alter(*args: str) -> str:
        return out(broker, "kafka-configs", "--alter", *args).strip()

    topic = ("--entity-type", "topics", "--entity-name", "long-configs")
    node = ("--entity-type", "brokers", "--entity-name", NODE)
    cluster = ("--entity-type", "brokers", "--entity-default")
    assert together(
        lambda: alter(*topic, "--add-config", "retention.ms=200000,cleanup.policy=compact"),
        lambda: alter(*node, "--add-config", "max.connections.per.ip.overrides=[10.9.9.9:5]"),
        lambda: alter(*cluster, "--add-config", "max.connection.creation.rate=100000"),
    ) == ["Completed updating config for topic long-configs.",
          f"Completed updating config for broker {NODE}.",
          "Completed updating default config for brokers in the cluster."]
    described_topic, described_node, described_cluster, every_key, bad = together(
        lambda: configs_of(*topic), lambda: configs_of(*node), lambda: configs_of(*cluster),
        lambda: configs_of(*node, describe_all=True),
        lambda: kafka(broker, "kafka-configs", "--alter", *topic, "--add-config",
                      "retention.ms=abc", check=False))
    assert described_topic == {"retention.ms": "200000", "cleanup.policy": "compact"}
    assert described_node["max.connections.per.ip.overrides"] == "10.9.9.9:5"
    assert described_cluster["max.connection.creation.rate"] == "100000"
    assert (every_key["num.network.threads"], every_key["max.connection.creation.rate"]) == \
        ("2", "100000")
    assert "Invalid value abc for configuration retention.ms: Not a number of type LONG" in \
        failure(bad)
    together(lambda: alter(*topic, "--delete-config", "cleanup.policy"),
             lambda: alter(*node, "--delete-config", "max.connections.per.ip.overrides"))
    assert configs_of(*topic) == {"retention.ms": "200000"}
    assert "max.connections.per.ip.overrides" not in configs_of(*node)

    alice = ("--entity-type", "users", "--entity-name", "long-alice")
    assert together(
        lambda: alter(*alice, "--add-config", "producer_byte_rate=1024,consumer_byte_rate=2048"),
        lambda: alter("--entity-type", "clients", "--entity-name", "long-app",
                      "--add-config", "request_percentage=50"),
        lambda: alter(*alice, "--entity-type", "clients", "--entity-name", "long-app2",
                      "--add-config", "producer_byte_rate=4096"),
        lambda: alter("--entity-type", "users", "--entity-default",
                      "--add-config", "producer_byte_rate=999"),
        lambda: alter("--entity-type", "ips", "--entity-name", "10.1.2.3",
                      "--add-config", "connection_creation_rate=7"),
        lambda: alter(*alice, "--add-config", "SCRAM-SHA-256=[password=alice-secret]"),
        lambda: alter("--entity-type", "users", "--entity-name", "long-bob",
                      "--add-config", "SCRAM-SHA-512=[iterations=8192,password=bob-secret]"),
    ) == ["Completed updating config for user long-alice.",
          "Completed updating config for client long-app.",
          "Completed updating config for user long-alice.",
          "Completed updating default config for users in the cluster.",
          "Completed updating config for ip 10.1.2.3.",
          "Completed updating config for user long-alice.",
          "Completed updating config for user long-bob."]
    assert alter(*alice, "--add-config", "SCRAM-SHA-512=[iterations=8192,password=x]") == \
        "Completed updating config for user long-alice."
    twice = kafka(broker, "kafka-configs", "--alter", *alice, "--add-config",
                  "SCRAM-SHA-256=[password=a],SCRAM-SHA-512=[password=b]", check=False)
    assert "DuplicateResourceException: A user credential cannot be altered twice in the same " \
           "request" in failure(twice)
    users, clients, pairs, ips = together(
        lambda: out(broker, "kafka-configs", "--describe", "--entity-type", "users"),
        lambda: out(broker, "kafka-configs", "--describe", "--entity-type", "clients"),
        lambda: out(broker, "kafka-configs", "--describe", *alice, "--entity-type", "clients"),
        lambda: out(broker, "kafka-configs", "--describe", "--entity-type", "ips"))
    assert quota_lines(users)["user-principal 'long-alice'"] == \
        {"consumer_byte_rate": "2048.0", "producer_byte_rate": "1024.0"}
    assert quota_lines(users)["the default user-principal"] == {"producer_byte_rate": "999.0"}
    assert scram_lines(users) == {
        "long-alice": {"SCRAM-SHA-256=iterations=4096", "SCRAM-SHA-512=iterations=8192"},
        "long-bob": {"SCRAM-SHA-512=iterations=8192"}}
    assert quota_lines(clients)["client-id 'long-app'"] == {"request_percentage": "50.0"}
    assert quota_lines(pairs) == {"user-principal 'long-alice', client-id 'long-app2'":
                                  {"producer_byte_rate": "4096.0"}}
    assert quota_lines(ips)["ip '10.1.2.3'"] == {"connection_creation_rate": "7.0"}
    together(lambda: alter(*alice, "--delete-config", "SCRAM-SHA-512"),
             lambda: alter(*alice, "--delete-config", "consumer_byte_rate"))
    nobody = kafka(broker, "kafka-configs", "--alter", "--entity-type", "users", "--entity-name",
                   "long-nobody", "--delete-config", "SCRAM-SHA-512", check=False)
    assert "Attempt to delete a user credential that does not exist" in failure(nobody)
    left = out(broker, "kafka-configs", "--describe", *alice)
    assert quota_lines(left) == {"user-principal 'long-alice'": {"producer_byte_rate": "1024.0"}}
    assert scram_lines(left) == {"long-alice": {"SCRAM-SHA-256=iterations=4096"}}


def acl_lines(text: str) -> dict[str, set[str]]:
    """kafka-acls' listing: each resource pattern -> its `(principal=..., ...)` entries."""
    found: dict[str, set[str]] = {}
    pattern = None
    for line in text.splitlines():
        if match := re.match(r"^(?:Current|Adding) ACLs for resource `ResourcePattern\((.*)\)`",
                             line):
            pattern = match.group(1)
            found.setdefault(pattern, set())
        elif line.strip().startswith("(principal=") and pattern is not None:
            found[pattern].add(line.strip())
    return found


def acl(principal: str, operation: str, permission: str = "ALLOW", host: str = "*") -> str:
    return (f"(principal={principal}, host={host}, operation={operation}, "
            f"permissionType={permission})")


@pytest.mark.long
def test_acls_add_list_and_remove(broker):
    topic = "resourceType=TOPIC, name=long-acl, patternType=LITERAL"
    prefix = "resourceType=TOPIC, name=long-orders-, patternType=PREFIXED"
    group = "resourceType=GROUP, name=long-group, patternType=LITERAL"
    cluster = "resourceType=CLUSTER, name=kafka-cluster, patternType=LITERAL"
    transactional = "resourceType=TRANSACTIONAL_ID, name=long-tx-, patternType=PREFIXED"
    added = together(
        lambda: out(broker, "kafka-acls", "--add", "--allow-principal", "User:alice",
                    "--operation", "Read", "--operation", "Write", "--topic", "long-acl"),
        lambda: out(broker, "kafka-acls", "--add", "--allow-principal", "User:bob", "--producer",
                    "--topic", "long-orders-", "--resource-pattern-type", "prefixed"),
        lambda: out(broker, "kafka-acls", "--add", "--allow-principal", "User:carol",
                    "--consumer", "--topic", "long-acl", "--group", "long-group"),
        lambda: out(broker, "kafka-acls", "--add", "--deny-principal", "User:mallory",
                    "--deny-host", "10.0.0.1", "--operation", "All", "--cluster"),
        lambda: out(broker, "kafka-acls", "--add", "--allow-principal", "User:tx",
                    "--operation", "Write", "--transactional-id", "long-tx-",
                    "--resource-pattern-type", "prefixed"))
    assert acl_lines(added[3]) == {cluster: {acl("User:mallory", "ALL", "DENY", "10.0.0.1")}}
    expected = {
        topic: {acl("User:alice", "READ"), acl("User:alice", "WRITE"),
                acl("User:carol", "READ"), acl("User:carol", "DESCRIBE")},
        prefix: {acl("User:bob", "WRITE"), acl("User:bob", "DESCRIBE"), acl("User:bob", "CREATE")},
        group: {acl("User:carol", "READ")},
        cluster: {acl("User:mallory", "ALL", "DENY", "10.0.0.1")},
        transactional: {acl("User:tx", "WRITE")}}
    everything, of_topic, of_bob, matching = together(
        lambda: out(broker, "kafka-acls", "--list"),
        lambda: out(broker, "kafka-acls", "--list", "--topic", "long-acl"),
        lambda: out(broker, "kafka-acls", "--list", "--principal", "User:bob"),
        lambda: out(broker, "kafka-acls", "--list", "--topic", "long-orders-1",
                    "--resource-pattern-type", "match"))
    assert acl_lines(everything) == expected
    assert acl_lines(of_topic) == {topic: expected[topic]}
    assert acl_lines(of_bob) == {prefix: expected[prefix]}
    assert acl_lines(matching) == {prefix: expected[prefix]}
    out(broker, "kafka-acls", "--remove", "--force", "--allow-principal", "User:alice",
        "--operation", "Write", "--topic", "long-acl")
    assert acl_lines(out(broker, "kafka-acls", "--list", "--topic", "long-acl")) == \
        {topic: expected[topic] - {acl("User:alice", "WRITE")}}
    out(broker, "kafka-acls", "--remove", "--force", "--topic", "long-acl")
    assert acl_lines(out(broker, "kafka-acls", "--list", "--topic", "long-acl")) == {}


class Background:
    """One of Kafka's tools running until stopped (a verifiable consumer), its JSON events
    collected as it prints them; stopped by SIGTERM (its shutdown hook closes it cleanly)."""

    def __init__(self, broker, name: str, *args: str):
        self.stderr = open(os.path.join(broker.data_dir, f"{name}-{id(self)}.err"), "w+")
        self.proc = apache_kafka.tool_process(
            name, "--bootstrap-server", broker.bootstrap, *args, stdout=subprocess.PIPE,
            stderr=self.stderr, text=True)
        self._events: list[dict] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                with self._lock:
                    self._events.append(json.loads(line))

    def events(self, name: str | None = None) -> list[dict]:
        with self._lock:
            return [event for event in self._events if name is None or event["name"] == name]

    def stop(self) -> list[dict]:
        """SIGTERM, then its events once it has exited."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._reader.join(10)
        self.stderr.close()
        return self.events()

    def __enter__(self) -> "Background":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def consumed(consumer: Background) -> int:
    return len(consumer.events("record_data"))


@pytest.mark.long
def test_consumer_groups_live_then_reset_every_way_delete_offsets_and_delete(broker):
    topic, group = "long-groups", "long-live"
    create_topics(broker.bootstrap, topic, partitions=3)
    produce(broker.bootstrap, topic, partitions=range(3), **numbered(30))
    with Background(broker, "kafka-verifiable-consumer", "--topic", topic, "--group-id", group,
                    "--verbose") as live:
        wait_until(lambda: consumed(live) == 30 and last_commits(live.events()) ==
                   {0: 10, 1: 10, 2: 10}, timeout=60, message="the live consumer read all")
        offsets_view, members, verbose, state, listed, reset, delete = together(
            lambda: out(broker, "kafka-consumer-groups", "--describe", "--group", group),
            lambda: out(broker, "kafka-consumer-groups", "--describe", "--group", group,
                        "--members"),
            lambda: out(broker, "kafka-consumer-groups", "--describe", "--group", group,
                        "--members", "--verbose"),
            lambda: out(broker, "kafka-consumer-groups", "--describe", "--group", group,
                        "--state"),
            lambda: out(broker, "kafka-consumer-groups", "--list", "--state"),
            lambda: kafka(broker, "kafka-consumer-groups", "--group", group, "--reset-offsets",
                          "--to-earliest", "--all-topics", "--execute"),
            lambda: kafka(broker, "kafka-consumer-groups", "--group", group, "--delete"))
    member = table(members)[0]
    assert (member["HOST"], member["CLIENT-ID"], member["#PARTITIONS"]) == \
        ("/127.0.0.1", f"consumer-{group}-1", "3")
    assert member["CONSUMER-ID"].startswith(f"consumer-{group}-1-")
    assert [(row["PARTITION"], row["CURRENT-OFFSET"], row["LOG-END-OFFSET"], row["LAG"],
             row["CONSUMER-ID"], row["HOST"]) for row in table(offsets_view)] == \
        [(str(p), "10", "10", "0", member["CONSUMER-ID"], "/127.0.0.1") for p in range(3)]
    assert table(verbose)[0]["CURRENT-ASSIGNMENT"] == f"{topic}:0,1,2"
    described = table(re.sub(r" +\((\w+)\)", r"(\1)", state))[0]  # "host:port  (id)"
    assert (described["COORDINATOR(ID)"], described["ASSIGNMENT-STRATEGY"], described["STATE"],
            described["#MEMBERS"]) == (f"{broker.bootstrap}({NODE})", "range", "Stable", "1")
    assert {"GROUP": group, "STATE": "Stable"} in table(listed)
    assert f"Assignments can only be reset if the group '{group}' is inactive, but the " \
           "current state is Stable." in reset.stdout + reset.stderr
    assert "GroupNotEmptyException: The group is not empty." in delete.stdout + delete.stderr
    assert committed(broker, group, topic, 3) == {0: 10, 1: 10, 2: 10}

    def reset_to(*how: str) -> dict[int, int]:
        printed = out(broker, "kafka-consumer-groups", "--group", group, "--reset-offsets",
                      *how)
        return {int(row["PARTITION"]): int(row["NEW-OFFSET"]) for row in table(printed)}

    everything = ("--all-topics", "--execute")
    assert reset_to("--to-earliest", "--all-topics", "--dry-run") == {0: 0, 1: 0, 2: 0}
    assert committed(broker, group, topic, 3) == {0: 10, 1: 10, 2: 10}  # a dry run
    assert reset_to("--to-offset", "4", "--topic", f"{topic}:1", "--execute") == {1: 4}
    assert reset_to("--shift-by", "-3", *everything) == {0: 7, 1: 1, 2: 7}
    assert reset_to("--to-datetime", "2020-01-01T00:00:00.000", *everything) == \
        {0: 0, 1: 0, 2: 0}
    assert reset_to("--to-latest", *everything) == {0: 10, 1: 10, 2: 10}
    assert reset_to("--by-duration", "PT1H", *everything) == {0: 0, 1: 0, 2: 0}
    assert reset_to("--to-offset", "100", *everything) == {0: 10, 1: 10, 2: 10}  # the end
    assert committed(broker, group, topic, 3) == {0: 10, 1: 10, 2: 10}
    deleted = out(broker, "kafka-consumer-groups", "--group", group, "--delete-offsets",
                  "--topic", f"{topic}:0")
    assert f"Request succeeded for deleting offsets from group {group}." in deleted
    assert table(deleted, "TOPIC") == [{"TOPIC": topic, "PARTITION": "0", "STATUS": "Successful"}]
    assert [row["PARTITION"] for row in table(out(
        broker, "kafka-consumer-groups", "--describe", "--group", group))] == ["1", "2"]
    assert f"Deletion of requested consumer groups ('{group}') was successful." in out(
        broker, "kafka-consumer-groups", "--group", group, "--delete")
    gone, listed = together(
        lambda: kafka(broker, "kafka-consumer-groups", "--describe", "--group", group,
                      check=False),
        lambda: out(broker, "kafka-consumer-groups", "--list"))
    assert f"GroupIdNotFoundException: Group {group} not found." in gone.stdout + gone.stderr
    assert group not in listed.split()


@pytest.mark.long
def test_transactions_list_describe_producers_and_find_hanging(broker):
    from confluent_kafka import Producer

    topic, transactional_id = "long-txn", "long-tx"
    create_topics(broker.bootstrap, topic, partitions=1)
    producer = Producer({"bootstrap.servers": broker.bootstrap,
                         "transactional.id": transactional_id, "transaction.timeout.ms": 60000})
    producer.init_transactions(20)
    producer.begin_transaction()
    for index in range(3):
        producer.produce(topic, value=b"t%d" % index, partition=0)
    assert producer.flush(20) == 0
    listed, described, producers, hanging, unknown = together(
        lambda: out(broker, "kafka-transactions", "list"),
        lambda: out(broker, "kafka-transactions", "describe", "--transactional-id",
                    transactional_id),
        lambda: out(broker, "kafka-transactions", "describe-producers", "--topic", topic,
                    "--partition", "0"),
        lambda: out(broker, "kafka-transactions", "find-hanging", "--broker-id", NODE),
        lambda: kafka(broker, "kafka-transactions", "describe", "--transactional-id",
                      "long-no-such", check=False))
    ongoing = next(row for row in tab_table(listed) if row["TransactionalId"] == transactional_id)
    assert (ongoing["Coordinator"], ongoing["TransactionState"]) == (NODE, "Ongoing")
    state = tab_table(described)[0]
    assert (state["CoordinatorId"], state["ProducerId"], state["ProducerEpoch"],
            state["TransactionState"], state["TransactionTimeoutMs"], state["TopicPartitions"]) \
        == (NODE, ongoing["ProducerId"], "0", "Ongoing", "60000", f"{topic}-0")
    assert int(state["TransactionDurationMs"]) >= 0
    writer = next(row for row in tab_table(producers)
                  if row["ProducerId"] == ongoing["ProducerId"])
    assert (writer["ProducerEpoch"], writer["LastSequence"],
            writer["CurrentTransactionStartOffset"]) == ("0", "2", "0")
    assert tab_table(hanging + "\n") == []  # its header only: nothing hangs
    assert hanging.split("\t")[0] == "Topic"
    assert "failed because the ID could not be found" in failure(unknown)
    producer.commit_transaction(20)
    described, producers = together(
        lambda: out(broker, "kafka-transactions", "describe", "--transactional-id",
                    transactional_id),
        lambda: out(broker, "kafka-transactions", "describe-producers", "--topic", topic,
                    "--partition", "0"))
    state = tab_table(described)[0]
    assert (state["TransactionState"], state["TopicPartitions"]) == ("CompleteCommit", "")
    writer = next(row for row in tab_table(producers)
                  if row["ProducerId"] == ongoing["ProducerId"])
    assert writer["CurrentTransactionStartOffset"] == "None"


@pytest.mark.long
def test_console_producer_and_consumer_with_keys_headers_and_a_group(broker):
    topic, group = "long-console", "long-console-group"
    create_topics(broker.bootstrap, topic, partitions=2)
    keyed = "".join(f"k{index}\tv{index}\n" for index in range(4))
    with_headers = "h1:a,h2:b\tk4\tv4\n"
    together(
        lambda: out(broker, "kafka-console-producer", "--topic", topic, "--reader-property",
                    "parse.key=true", stdin=keyed),
        lambda: out(broker, "kafka-console-producer", "--topic", topic, "--reader-property",
                    "parse.key=true", "--reader-property", "parse.headers=true",
                    stdin=with_headers))
    printed = out(broker, "kafka-console-consumer", "--topic", topic, "--from-beginning",
                  "--max-messages", "5", "--group", group, *(
                      item for key in ("key", "headers", "partition", "offset")
                      for item in ("--formatter-property", f"print.{key}=true")))
    read = [dict(zip(("partition", "offset", "headers", "key", "value"), line.split("\t")))
            for line in printed.splitlines() if line.startswith("Partition:")]
    assert sorted((row["key"], row["value"], row["headers"]) for row in read) == \
        [(f"k{i}", f"v{i}", "NO_HEADERS") for i in range(4)] + [("k4", "v4", "h1:a,h2:b")]
    ends: dict[int, int] = {}
    for row in read:  # each partition's offsets from 0, in order
        partition, offset = int(row["partition"][10:]), int(row["offset"][7:])
        assert offset == ends.get(partition, 0)
        ends[partition] = offset + 1
    assert committed(broker, group, topic, 2) == {p: ends.get(p, -1001) for p in range(2)}


@pytest.mark.long
def test_delete_records_get_offsets_every_way_log_dirs_and_api_versions(broker):
    """Offsets by time are Kafka's after DeleteRecords (from the log start; -5 without tiered
    storage: none); log-dirs' JSON sizes are the partition's files."""
    from confluent_kafka import Producer

    topic = "long-records"
    create_topics(broker.bootstrap, topic, partitions=2)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    base = int(time.time() * 1000) - 60_000
    for index in range(5):
        producer.produce(topic, b"r%d" % index, partition=0, timestamp=base + 1000 * index)
    producer.produce(topic, b"r", partition=1, timestamp=base)
    assert producer.flush(20) == 0
    plan = os.path.join(broker.data_dir, "delete-records.json")
    with open(plan, "w") as handle:
        json.dump({"version": 1, "partitions": [
            {"topic": topic, "partition": 0, "offset": 2},
            {"topic": topic, "partition": 1, "offset": -1}]}, handle)
    too_far = os.path.join(broker.data_dir, "delete-too-far.json")
    with open(too_far, "w") as handle:
        json.dump({"version": 1, "partitions": [{"topic": topic, "partition": 0, "offset": 99}]},
                  handle)
    deleted = out(broker, "kafka-delete-records", "--offset-json-file", plan)
    assert sorted(re.findall(r"partition: (\S+)\tlow_watermark: (\d+)", deleted)) == \
        [(f"{topic}-0", "2"), (f"{topic}-1", "1")]
    refused = out(broker, "kafka-delete-records", "--offset-json-file", too_far)
    assert f"partition: {topic}-0\terror: org.apache.kafka.common.errors." \
           "OffsetOutOfRangeException" in refused
    times = ("-2", "-1", "-3", "-4", "-5", "0", str(base + 2500), str(base + 60_000))
    found = together(*(
        lambda at=at: offsets(out(broker, "kafka-get-offsets", "--topic", topic, "--time", at))
        for at in times))
    assert dict(zip(times, found)) == {
        "-2": {(topic, 0): 2, (topic, 1): 1}, "-1": {(topic, 0): 5, (topic, 1): 1},
        "-3": {(topic, 0): 4, (topic, 1): 0}, "-4": {(topic, 0): 2, (topic, 1): 1},
        "-5": {}, "0": {(topic, 0): 2}, str(base + 2500): {(topic, 0): 3},
        str(base + 60_000): {}}
    described, versions = together(
        lambda: out(broker, "kafka-log-dirs", "--describe", "--topic-list", topic),
        lambda: out(broker, "kafka-broker-api-versions"))
    report = json.loads(next(line for line in described.splitlines() if line.startswith("{")))
    (node,) = report["brokers"]
    (directory,) = node["logDirs"]
    assert (node["broker"], directory["logDir"], directory["error"]) == \
        (int(NODE), os.path.join(broker.data_dir, "logs"), None)
    assert {entry["partition"]: entry["size"] for entry in directory["partitions"]} == \
        {f"{topic}-{p}": log_bytes(broker, topic, p) for p in range(2)}
    assert served_versions(versions) == advertised_versions()


def log_bytes(broker, topic: str, partition: int) -> int:
    directory = os.path.join(broker.data_dir, "logs", f"{topic}-{partition}")
    return sum(os.path.getsize(os.path.join(directory, name)) for name in os.listdir(directory)
               if name.endswith(".log"))


def served_versions(printed: str) -> dict[int, tuple[int, int]]:
    """kafka-broker-api-versions' `Name(key): low to high [usable: n]` lines (a single
    version prints `Name(key): n [usable: n]`)."""
    found = {}
    for match in re.finditer(r"\((\d+)\): (\d+)(?: to (\d+))? \[usable: \d+\]", printed):
        low = int(match.group(2))
        found[int(match.group(1))] = (low, int(match.group(3) or low))
    return found


def advertised_versions() -> dict[int, tuple[int, int]]:
    from broker.shared.apis import API_NAMES, BY_NAME

    return {BY_NAME[name].key: BY_NAME[name].versions for name in API_NAMES.values()}


@pytest.mark.long
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_verifiable_consumers_in_a_group_read_every_record_once_across_a_rebalance(broker,
                                                                                    static):
    """Kafka's system tests' check with two verifiable consumers (the eager range assignor,
    members dynamic or static, KIP-345): one reads while the verifiable producer writes, a
    second joins (a rebalance mid-stream), and together they read every acknowledged record
    exactly once, committing as they go."""
    kind = "static" if static else "dynamic"
    topic, group, count = f"long-verifiable-{kind}", f"long-verifiable-{kind}", 3000
    create_topics(broker.bootstrap, topic, partitions=4)

    def member(number: int) -> tuple[str, ...]:
        instance = ("--group-instance-id", f"{group}-{number}") if static else ()
        return ("--topic", topic, "--group-id", group, "--verbose", *instance)

    with Background(broker, "kafka-verifiable-consumer", *member(1)) as first:
        producing = ThreadPoolExecutor(1)
        acked = producing.submit(verifiable_produce, broker, topic, count, "300")
        wait_until(lambda: consumed(first) > 0, timeout=60, message="the first reads")
        with Background(broker, "kafka-verifiable-consumer", *member(2)) as second:
            acked = acked.result(timeout=120)
            producing.shutdown()
            ends = end_offsets(acked)
            wait_until(lambda: consumed(second) > 0 and
                       merged_commits(first, second) == ends, timeout=90,
                       message="every record read and committed")
            second_events = second.stop()
        first_events = first.stop()
    read = [(event["partition"], event["offset"], event["value"])
            for events_ in (first_events, second_events) for event in events_
            if event["name"] == "record_data"]
    assert len(read) == len(set(read)) == count  # none twice
    assert {(partition, offset): value for partition, offset, value in read} == acked
    assert [e["name"] for e in first_events].count("partitions_revoked") >= 1  # rebalanced


def merged_commits(*consumers: Background) -> dict[int, int]:
    """The furthest offset each partition's commits reached, whichever consumer made them."""
    reached: dict[int, int] = {}
    for consumer in consumers:
        for partition, offset in last_commits(consumer.events()).items():
            reached[partition] = max(reached.get(partition, 0), offset)
    return reached
