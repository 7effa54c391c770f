"""Kafka's Java clients (4.4: KafkaProducer, KafkaConsumer, Admin) against this broker.

One JVM per broker runs the scenarios of `compat/src/main/java/pybroker/compat` (ClientsCheck)
and prints one JSON line per scenario with what the broker answered; one test per scenario
asserts those facts (values, counts, offsets, error classes).  The expected facts are Apache
Kafka 4.4.0's answers to the same scenarios (with transaction.version 1, the transactions this
broker has): the long set runs them against a single-node Kafka too (`ApacheKafka`), which
checks the expectations themselves.  `make test` runs the core
scenarios; `make compat` the rest, an authorizer-enabled SASL broker for the ACL and SCRAM
login scenarios, and Kafka.  Raw-wire regressions for what the Java clients found close the
module.
"""

from __future__ import annotations

import datetime
import uuid

import pytest
from kio.schema.errors import ErrorCode

from loadtest.apache_kafka import ApacheKafka, tool
from tests.batches import make_batch
from tests.compat.helpers import facts, run_scenarios
from tests.harness import BrokerProcess
from tests.helpers import ask
from tests.security.helpers import SASL_JAAS, STANDARD
from tests.wire import KafkaSocket, create_topic, produce_request

pytestmark = pytest.mark.system  # every test here starts a broker

CORE = ("transactions", "consumer_positions", "consumer_protocol", "share_group",
        "admin_topics", "admin_configs")
LONG = ("producer_idempotent", "transactions_fenced", "producer_formats", "consumer_group",
        "consumer_rebalance", "consumer_static", "admin_groups", "admin_records", "admin_quotas",
        "admin_scram", "acls_disabled")
SASL = ("admin_acls", "acls_enforced", "scram_login")
# A timed-out transaction is aborted within half a second (the transactions_fenced scenario).
# Members of the consumer group protocol heartbeat every half second (Kafka's 5 s would make a
# rebalance take seconds).
BROKER = {"group.initial.rebalance.delay.ms": "0",
          "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
          "group.consumer.heartbeat.interval.ms": "500",
          "group.consumer.min.heartbeat.interval.ms": "500"}
PLAIN = "org.apache.kafka.common.security.plain.PlainLoginModule required"
SASL_BROKER = {"sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
               "listener.name.sasl_plaintext.plain.sasl.jaas.config": SASL_JAAS,
               "authorizer.class.name": STANDARD, "inter.broker.listener.name": "SASL_PLAINTEXT"}
AS_ADMIN = ("security.protocol=SASL_PLAINTEXT", "sasl.mechanism=PLAIN",
            f'sasl.jaas.config={PLAIN} username="admin" password="admin-secret";')


# --- what Apache Kafka 4.4.0 answers ---------------------------------------------------------

def check_transactions(found: dict) -> None:
    """Consume-transform-produce: the committed round's records and offset, not the
    aborted one's; the transaction as described while open and after the abort (Kafka lists
    the __consumer_offsets partition the offsets go to as well; this broker has no such
    topic)."""
    assert "ctp-out-0" in found["ongoing"].pop("partitions")
    assert found == EXPECTED["transactions"]


def check_admin_groups(found: dict) -> None:
    """Kafka 4.4 adds DESCRIBE_CONFIGS and ALTER_CONFIGS to a group's operations (group
    configs, which this broker has not)."""
    assert {"DELETE", "DESCRIBE", "READ"} <= set(found.pop("live_operations"))
    assert found == EXPECTED["admin_groups"]


EXPECTED = {
    "transactions": {
        "consumed": 10,
        "ongoing": {"state": "ONGOING", "producer_id_known": True, "producer_epoch": 0,
                    "timeout_ms": 60000, "started": True},
        "ongoing_listed": True,
        "listed_by_filters": [True, False, True, False],  # producer id, other id, 0 ms, 1 h
        "ongoing_transaction_start_offsets": [6],
        "ongoing_last_stable_offset": 6, "group_committed_offset": 5,
        "after_abort": {"state": "COMPLETE_ABORT", "producer_id_known": True,
                        "producer_epoch": 0, "timeout_ms": 60000, "partitions": [],
                        "started": True},
        "after_abort_listed": True,
        "read_committed_values": ["IN-0", "IN-1", "IN-2", "IN-3", "IN-4"],
        "read_uncommitted_count": 10, "last_stable_offset": 12, "group_offset_listed": 5},
    "transactions_fenced": {
        "first_commit_error": "ProducerFencedException", "second_epoch": 2,
        "read_committed_values": ["second"], "stale_generation": "CommitFailedException",
        "admin_fenced_commit": "ProducerFencedException", "after_admin_fence": ["second"],
        "timeout_above_broker_max": "KafkaException", "timed_out_state": "COMPLETE_ABORT",
        "timed_out_commit": "ProducerFencedException", "after_time_out": ["second"]},
    "consumer_positions": {
        "beginning": 0, "end": 10, "after_seek_7": 7, "after_seek_to_beginning": 0,
        "after_seek_to_end": 10,
        "offsets_for_times": {"-1700000000000": [0, 0], "3500": [4, 4000], "9000": [9, 9000],
                              "9001": None},
        "record_3": ["r3-0", 3000, "CreateTime"],
        "admin_list_offsets": {  # [offset, timestamp]; no tiered storage: -1
            "earliest": [0, -1], "latest": [10, -1], "max_timestamp": [9, 9000],
            "for_timestamp_3500": [4, 4000], "earliest_local": [0, -1],
            "latest_tiered": [-1, -1], "earliest_pending_upload": [-1, -1]}},
    "admin_topics": {
        "created_partitions": 3, "created_replication": 1, "created_cleanup_policy": "compact",
        "created_topic_id_set": True, "create_existing": "TopicExistsException",
        "create_validate_only": "none",
        "create_replication_3": "InvalidReplicationFactorException",
        "create_unknown_config": "InvalidConfigurationException",
        "create_bad_name": "InvalidTopicException",
        "create_zero_partitions": "InvalidPartitionsException",
        "listed": [True, True, False], "described_partitions": 3, "described_internal": False,
        "leaders_are_the_node": True, "described_by_id": "adm-a",
        "describe_missing": "UnknownTopicOrPartitionException",
        "grown_partitions": [0, 1, 2, 3, 4], "shrink": "InvalidPartitionsException",
        "same_count": "InvalidPartitionsException",
        "grow_missing": "UnknownTopicOrPartitionException", "gone_after_delete": True,
        "delete_missing": "UnknownTopicOrPartitionException", "gone_after_delete_by_id": True,
        "assigned_partitions": 2, "default_partitions": 1,
        "assign_unknown_broker": "InvalidReplicaAssignmentException",
        "grown_with_assignment": 3, "grow_to_unknown_broker": "InvalidReplicaAssignmentException",
        "cluster_nodes": 1, "controller_is_the_node": True, "cluster_id_set": True},
    "admin_configs": {
        "after_set": {"cleanup.policy": ["compact", "DYNAMIC_TOPIC_CONFIG"],
                      "max.message.bytes": ["1048588", "DEFAULT_CONFIG"],
                      "retention.ms": ["3600000", "DYNAMIC_TOPIC_CONFIG"]},
        "after_append": {"cleanup.policy": ["compact,delete", "DYNAMIC_TOPIC_CONFIG"]},
        "after_subtract": {"cleanup.policy": ["delete", "DYNAMIC_TOPIC_CONFIG"]},
        "after_delete": {"retention.ms": ["604800000", "DEFAULT_CONFIG"]},
        "after_validate_only": {"segment.bytes": ["1073741824", "DEFAULT_CONFIG"]},
        "set_unknown": "InvalidConfigurationException",
        "set_bad_value": "InvalidConfigurationException",
        "two_resources": {"cfg": "none", "cfg-none": "UnknownTopicOrPartitionException"},
        "set_missing_topic": "UnknownTopicOrPartitionException",
        "legacy_validate_only": "NONE", "legacy_unknown": "INVALID_CONFIG", "legacy": "NONE",
        "after_legacy": {"cleanup.policy": ["delete", "DEFAULT_CONFIG"],  # the whole set
                         "max.message.bytes": ["2000000", "DYNAMIC_TOPIC_CONFIG"],
                         "retention.ms": ["604800000", "DEFAULT_CONFIG"]},
        "synonym_sources": ["max.message.bytes:DYNAMIC_TOPIC_CONFIG",
                            "message.max.bytes:DEFAULT_CONFIG"],
        "documented": True, "type": "INT",
        "describe_missing_topic": "UnknownTopicOrPartitionException",
        "broker": {"auto.create.topics.enable": "true", "log.retention.hours": "168",
                   "message.max.bytes": "1048588"},
        "broker_entries_over_100": True},
    "admin_groups": {
        "listed_while_live": {"grp-empty": ["EMPTY", "CLASSIC", ""],
                              "grp-live": ["STABLE", "CLASSIC", "consumer"]},
        "list_consumer_groups": ["grp-empty:EMPTY", "grp-live:STABLE"],
        "live_described": ["STABLE", "range", "CLASSIC", False],
        "live_members": [["live-client", 2, "host"]], "listed_stable": ["grp-live"],
        "live_offsets": {"grp-0": 5, "grp-1": 5},
        "alter_live": "UnknownMemberIdException",
        "offset_delete_live": "GroupSubscribedToTopicException",
        "delete_live": "GroupNotEmptyException",
        "batched_offsets": {"grp-empty": 2, "grp-live": 1},
        "after_remove_members": ["EMPTY", 0],
        "remove_unknown_instance": "UnknownMemberIdException",
        "listed_consumer_groups": {"grp-empty": ["EMPTY", "CLASSIC", ""],
                                   "grp-live": ["EMPTY", "CLASSIC", "consumer"]},
        "empty_offsets": {"grp-0": 3, "grp-1": 5}, "metadata_kept": "three",
        "empty_described": ["EMPTY", 0, True], "after_alter": {"grp-0": 1, "grp-1": 5},
        "after_offset_delete": {"grp-0": 1},
        "alter_missing_topic": "UnknownTopicOrPartitionException",
        "offsets_of_unknown_group": {}, "describe_unknown_group": "GroupIdNotFoundException",
        "after_group_delete": {}, "delete_unknown_group": "GroupIdNotFoundException"},
    "producer_idempotent": {
        "offsets_p0": "contiguous from 0, 100", "offsets_p1": "contiguous from 0, 50",
        "read": 150, "distinct_values": 150, "end_offsets": [100, 50], "producer_epoch": 0,
        "open_transaction": False, "producers_per_partition": [1, 1], "last_sequences": [99, 49],
        "one_producer_id": True},
    "producer_formats": {
        "read": 102, "compressed_values_match": True,
        "headers": [["trace", "abc"], ["empty", None]], "null_key": True,
        "tombstone": ["tombstone", None], "read_in_small_fetches": 102,
        # one replica: Kafka's effective min.insync.replicas is min(2, 1)
        "acks_all_one_replica_of_two": "none", "acks_1_one_replica_of_two": 1,
        "acks_0_offsets": [-1] * 5, "acks_0_read": [f"fire-{i}" for i in range(5)],
        "too_large": "RecordTooLargeException"},
    "consumer_group": {
        "consumed": 20, "assignment": ["cg-0", "cg-1"], "generation_positive": True,
        "partitions_for": 2, "topic_listed": True, "committed": [10, 10],
        "resumed_values": ["late-0", "late-1"], "resumed_offsets": [10, 11]},
    "consumer_rebalance": {
        kind: {"alone": 2, "shared": [1, 1], "split": True, "same_generation": True,
               "after_leave": 2} for kind in ("range", "cooperative")},
    "consumer_protocol": {
        "consumed": 20, "alone": 2, "epoch_positive": True, "split": True, "disjoint": True,
        "described": ["CONSUMER", 2, "uniform"], "listed_type": ["CONSUMER"],
        "after_leave": True, "committed": [10, 10]},
    "share_group": {"consumed": 10, "distinct": 10, "described": ["STABLE", 2],
                    "delivered_again": 0},
    "consumer_static": {
        "described_instances": ["static-1"], "same_generation_after_restart": True,
        "new_member_id": True, "third_assigned": 2,
        "replaced_one_commits": "FencedInstanceIdException",
        "replaced_one_polls": "FencedInstanceIdException"},
    "admin_records": {
        "low_watermark": 4, "beginning_after_delete": 4, "first_read_after_seek_2": 4,
        "delete_past_end": "OffsetOutOfRangeException", "delete_to_end": 10, "log_dirs": 1,
        "replica": [True, 0, False], "dir_error": "none", "dir_bytes_known": True,
        "dir_holds_recs": True, "replica_dir_matches": True,
        "producers": [[9, 0, False, True]]},  # [last sequence, epoch, in a transaction, time]
    "admin_quotas": {
        "all": {"client-id=app": {"request_percentage": 50.0},
                "client-id=app,user=alice": {"producer_byte_rate": 4096.0},
                "ip=127.0.0.1": {"connection_creation_rate": 30.0},
                "user=<default>": {"producer_byte_rate": 100000.0},
                "user=alice": {"consumer_byte_rate": 2048.0, "producer_byte_rate": 1024.0}},
        "only_alice": {"user=alice": {"consumer_byte_rate": 2048.0,
                                      "producer_byte_rate": 1024.0}},
        "containing_alice": {"client-id=app,user=alice": {"producer_byte_rate": 4096.0},
                             "user=alice": {"consumer_byte_rate": 2048.0,
                                            "producer_byte_rate": 1024.0}},
        "default_user": {"user=<default>": {"producer_byte_rate": 100000.0}},
        "any_client_id": {"client-id=app": {"request_percentage": 50.0},
                          "client-id=app,user=alice": {"producer_byte_rate": 4096.0}},
        "after_removal": {"client-id=app,user=alice": {"producer_byte_rate": 4096.0},
                          "user=alice": {"producer_byte_rate": 1024.0}},
        "unknown_key": "InvalidRequestException", "ip_with_user": "InvalidRequestException",
        "negative": "InvalidRequestException", "after_clearing": {}},
    "admin_scram": {
        "all": {"dora": ["SCRAM_SHA_256:4096", "SCRAM_SHA_512:8192"],
                "erin": ["SCRAM_SHA_256:10000"]},
        "dora": {"dora": ["SCRAM_SHA_256:4096", "SCRAM_SHA_512:8192"]},
        "dora_after_delete": {"dora": ["SCRAM_SHA_256:4096"]},
        "describe_unknown": "ResourceNotFoundException",
        "describe_unknown_all": {"erin": ["SCRAM_SHA_256:10000"], "nobody": []},
        "too_few_iterations": "UnacceptableCredentialException",
        "too_many_iterations": "UnacceptableCredentialException",
        "delete_absent": "ResourceNotFoundException",
        "empty_user": "UnacceptableCredentialException",
        "user_twice_in_one_request": "DuplicateResourceException", "after_clearing": {}},
    "acls_disabled": {"describe": "SecurityDisabledException",
                      "create": "SecurityDisabledException", "delete": "SecurityDisabledException"},
    "admin_acls": {
        "all": 4, "of_alice": 3, "matching_acl_x": 1, "matching_acl_secret": 2, "prefixed": 1,
        "create_again": "none", "all_after_create_again": 4,
        "bad_cluster_name": "InvalidRequestException", "bad_principal": "InvalidRequestException",
        "deleted_deny": ["acl-secret"], "deleted_nothing": 0, "all_after_delete": 3,
        "deleted_rest": 3, "all_at_end": 0},
    "acls_enforced": {
        "write_without_acl": "TopicAuthorizationException", "write_with_acl_offset": 0,
        "read_without_acl": "TopicAuthorizationException", "read_with_acl": ["v"],
        "commit_without_group_acl": "GroupAuthorizationException",
        "committed_with_group_acl": 1,
        "transactional_without_acl": "TransactionalIdAuthorizationException",
        "transactional_with_acl": "committed",
        "offsets_for_unreadable_group": "GroupAuthorizationException",
        "alice_describe_acls": "ClusterAuthorizationException",
        "alice_create_topic": "TopicAuthorizationException",
        "alice_topics": {"listed": ["acl-orders"]}},
    "scram_login": {"login": "none", "wrong_password": "SaslAuthenticationException",
                    "after_delete": "SaslAuthenticationException"},
}

CHECKS = {"transactions": check_transactions, "admin_groups": check_admin_groups}


def check(answers: dict, scenario: str) -> None:
    found = facts(answers, scenario)
    if scenario in CHECKS:
        CHECKS[scenario](found)
    else:
        assert found == EXPECTED[scenario]


# --- this broker -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def broker():
    with BrokerProcess(workers=2, overrides=BROKER) as b:
        yield b


@pytest.fixture(scope="module")
def core(broker):
    return run_scenarios(broker.bootstrap, CORE, timeout=120)


@pytest.fixture(scope="module")
def long_set(broker):
    return run_scenarios(broker.bootstrap, LONG)


@pytest.fixture(scope="module")
def sasl_set():
    overrides = dict(BROKER, listeners="SASL_PLAINTEXT://127.0.0.1:0", **SASL_BROKER,
                     **{"super.users": "User:admin"})
    with BrokerProcess(workers=2, overrides=overrides) as broker:
        host, port = broker.listeners["SASL_PLAINTEXT"]
        yield run_scenarios(f"{host}:{port}", SASL, AS_ADMIN)


# --- Apache Kafka 4.4.0: the expectations are its answers --------------------------------------

@pytest.fixture(scope="module")
def kafka_plain():
    """Kafka with transaction.version 1, the transactions this broker has (version 2, KIP-890,
    bumps the epoch at every transaction and answers a timed-out one otherwise)."""
    with ApacheKafka(BROKER) as kafka:
        tool("org.apache.kafka.tools.FeatureCommand", "--bootstrap-server", kafka.bootstrap,
             "downgrade", "--feature", "transaction.version=1")
        yield run_scenarios(kafka.bootstrap, CORE + LONG)


@pytest.fixture(scope="module")
def kafka_sasl():
    kafka = ApacheKafka()
    address = f"127.0.0.1:{kafka.port}"
    kafka.overrides.update(SASL_BROKER, **{
        "listeners": f"SASL_PLAINTEXT://{address},CONTROLLER://127.0.0.1:{kafka.controller_port}",
        "advertised.listeners": f"SASL_PLAINTEXT://{address}",
        "listener.security.protocol.map": "SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT",
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "super.users": "User:admin;User:ANONYMOUS"})  # the controller listener's principal
    with kafka:
        yield run_scenarios(address, SASL, AS_ADMIN)


def runs():
    """(the fixture that ran the JVM, scenario): the core set in `make test`, all else long."""
    core = [pytest.param("core", name, id=f"ours-{name}") for name in CORE]
    longer = [("long_set", LONG, "ours"), ("sasl_set", SASL, "ours"),
              ("kafka_plain", CORE + LONG, "kafka"), ("kafka_sasl", SASL, "kafka")]
    return core + [pytest.param(fixture, name, id=f"{who}-{name}", marks=pytest.mark.long)
                   for fixture, names, who in longer for name in names]


@pytest.mark.parametrize("run, scenario", runs())
def test_scenario(request, run, scenario):
    check(request.getfixturevalue(run), scenario)


# --- raw-wire regressions for what the Java clients found ---------------------------------------


def test_metadata_by_topic_id_ignores_the_empty_names_the_java_client_sends(broker):
    """Admin.describeTopics(TopicCollection.ofTopicIds(...)) sends Metadata v12 with name ""
    beside each id; Kafka looks the ids up (a request naming any id is one by id)."""
    create_topic(broker.bootstrap, "by-id", 2)
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as sock:
        def metadata(*topics):
            return ask(sock, 3, 12, {"topics": [{"name": name, "topic_id": topic_id}
                                                for name, topic_id in topics],
                                     "allow_auto_topic_creation": False,
                                     "include_topic_authorized_operations": False})[1].topics

        (named,) = metadata(("by-id", None))
        assert named.error_code == ErrorCode.none and named.topic_id != uuid.UUID(int=0)
        unknown = uuid.uuid4()
        found, missing = metadata(("", named.topic_id), ("", unknown))
        assert (found.error_code, found.name, found.topic_id) == (ErrorCode.none, "by-id", named.topic_id)
        assert [p.partition_index for p in found.partitions] == [0, 1]
        assert (missing.error_code, missing.name, missing.topic_id) == (
            ErrorCode.unknown_topic_id, None, unknown)


def test_describe_groups_v6_answers_an_unknown_group_with_group_id_not_found(broker):
    """Kafka's DescribeGroups v6 (what the 4.x Admin sends): GROUP_ID_NOT_FOUND and a
    message, the state "Dead" (what Apache Kafka 4.4 answers); up to v5 a "Dead" group
    without error."""
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as sock:
        values = {"groups": ["no-such-group"], "include_authorized_operations": False}
        (v6,) = ask(sock, 15, 6, values)[1].groups
        assert (v6.error_code, v6.error_message, v6.group_state) == (
            ErrorCode.group_id_not_found, "Group no-such-group not found.", "Dead")
        (v5,) = ask(sock, 15, 5, values)[1].groups
        assert (v5.error_code, v5.group_state) == (ErrorCode.none, "Dead")


def test_list_offsets_of_tiered_storage_are_minus_one_without_it(broker):
    """LATEST_TIERED (-5) and EARLIEST_PENDING_UPLOAD (-6) name offsets in remote storage:
    Kafka without it answers offset -1 (not the log end), as for a partition never tiered."""
    create_topic(broker.bootstrap, "tiered")
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as sock:
        sock.send(produce_request("tiered", make_batch(3)))
        sock.receive()

        def offsets(version: int, *timestamps: int):
            partitions = [{"partition_index": 0, "current_leader_epoch": -1,
                           "timestamp": stamp} for stamp in timestamps]
            answer = ask(sock, 2, version, {
                "replica_id": -1, "isolation_level": 0, "timeout": datetime.timedelta(0),
                "topics": [{"name": "tiered", "partitions": partitions}]})[1]
            return [(p.error_code, p.offset, p.leader_epoch)
                    for p in answer.topics[0].partitions]

        assert offsets(11, -1) == [(ErrorCode.none, 3, 0)]
        assert offsets(11, -5) == [(ErrorCode.none, -1, -1)]
        assert offsets(11, -6) == [(ErrorCode.none, -1, -1)]
        assert offsets(9, -5) == [(ErrorCode.none, -1, -1)]
