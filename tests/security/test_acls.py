"""ACL authorization: Kafka's decision, its filters and validation, the audit, and
real clients over SASL against a broker with `authorizer.class.name` set.

Real clients: confluent-kafka (AdminClient create/describe/delete_acls, producer, consumer),
kafka-python (KafkaAdminClient ACLs, a refused producer) and aiokafka (a refused consumer group).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from kio.schema.errors import ErrorCode

from broker.shared.access import Access
from broker.shared.acl import (Acl, AclFilter, Authorizer, Operation, PatternType, Permission,
                               ResourceType, creation_problem)
from broker.shared.events import AuthorizationDenied
from broker.shared.protocol.context import RequestContext
from tests.batches import make_batch
from tests.harness import BrokerProcess, wait_until
from tests.helpers import create_topics
from tests.security.helpers import ACL_JAAS, STANDARD, binding, client, create_acls, plain_session
from tests.wire import produce_errors, produce_request

T, G, C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY


def acl(kind, name, pattern, principal, operation, permission=ALLOW, host="*") -> Acl:
    return Acl(kind, name, pattern, principal, host, operation, permission)


# --- unit: the decision ------------------------------------------------------------------------

def test_deny_wins_and_describe_is_implied_by_read_write_delete_alter():
    auth = Authorizer([acl(T, "orders-", PRE, "User:alice", Operation.WRITE),
                       acl(T, "orders-secret", LIT, "User:alice", Operation.WRITE, DENY),
                       acl(T, "audit", LIT, "User:alice", Operation.ALTER_CONFIGS)])
    assert auth.allows("alice", "10.0.0.1", Operation.WRITE, T, "orders-1")
    assert not auth.allows("alice", "10.0.0.1", Operation.WRITE, T, "orders-secret")
    assert auth.allows("alice", "10.0.0.1", Operation.DESCRIBE, T, "orders-secret")  # not denied
    assert not auth.allows("alice", "10.0.0.1", Operation.READ, T, "orders-1")
    assert not auth.allows("bob", "10.0.0.1", Operation.WRITE, T, "orders-1")
    assert not auth.allows("alice", "10.0.0.1", Operation.WRITE, T, "order")  # not the prefix
    assert auth.allows("alice", "10.0.0.1", Operation.DESCRIBE_CONFIGS, T, "audit")
    assert not auth.allows("alice", "10.0.0.1", Operation.WRITE, G, "orders-1")  # another type


def test_wildcards_hosts_super_users_and_the_no_acl_rule():
    auth = Authorizer([acl(T, "*", LIT, "User:*", Operation.READ),
                       acl(T, "logs", LIT, "User:bob", Operation.ALL, host="10.0.0.9"),
                       acl(T, "logs", LIT, "User:mallory", Operation.ALL, DENY)],
                      super_users=frozenset({"User:root"}), allow_if_no_acl=True)
    assert auth.allows("anyone", "1.2.3.4", Operation.READ, T, "whatever")
    assert auth.allows("bob", "10.0.0.9", Operation.WRITE, T, "logs")  # ALL, from its host
    assert not auth.allows("bob", "10.0.0.8", Operation.WRITE, T, "logs")  # another host
    assert not auth.allows("mallory", "10.0.0.9", Operation.READ, T, "logs")  # DENY ALL wins
    assert auth.allows("root", "1.2.3.4", Operation.DELETE, T, "logs")  # super user
    assert auth.allows("anyone", "1.2.3.4", Operation.ALTER, G, "free")  # no ACL on it at all
    assert not auth.allows("anyone", "1.2.3.4", Operation.WRITE, T, "free")  # `*` is an ACL
    strict = Authorizer([], allow_if_no_acl=False)
    assert not strict.allows("anyone", "1.2.3.4", Operation.READ, G, "free")


def test_any_topic_grants_as_kafkas_authorize_by_resource_type():
    """InitProducerId without IDEMPOTENT_WRITE: WRITE on some topic that no DENY covers."""
    def may(*acls):
        return Authorizer(list(acls)).allows_any("alice", "h", Operation.WRITE, T)

    assert not may()
    assert may(acl(T, "a-", PRE, "User:alice", Operation.WRITE))
    assert not may(acl(T, "a-", PRE, "User:alice", Operation.WRITE),
                   acl(T, "a", PRE, "User:alice", Operation.WRITE, DENY))
    assert may(acl(T, "x", LIT, "User:alice", Operation.WRITE),
               acl(T, "y", LIT, "User:alice", Operation.WRITE, DENY))
    assert not may(acl(T, "x", LIT, "User:alice", Operation.WRITE),
                   acl(T, "*", LIT, "User:*", Operation.ALL, DENY))
    assert not may(acl(T, "x", LIT, "User:alice", Operation.READ))  # nothing implied


def test_authorized_operations_are_kafkas_bit_fields():
    auth = Authorizer([acl(T, "t", LIT, "User:alice", Operation.READ)])
    bits = auth.authorized_operations("alice", "h", T, "t")
    assert bits == (1 << Operation.READ) | (1 << Operation.DESCRIBE)
    everything = Authorizer([], super_users=frozenset({"User:root"}))
    assert everything.authorized_operations("root", "h", C, "kafka-cluster") == 8096


def test_filters_select_as_kafkas_any_and_match():
    prefixed = acl(T, "orders-", PRE, "User:alice", Operation.WRITE)
    literal = acl(T, "orders-1", LIT, "User:bob", Operation.READ)
    star = acl(T, "*", LIT, "User:*", Operation.DESCRIBE)
    everything = [prefixed, literal, star]

    def select(**fields):
        base = dict(resource_type=ResourceType.ANY, resource_name=None,
                    pattern_type=PatternType.ANY, principal=None, host=None,
                    operation=Operation.ANY, permission=Permission.ANY)
        return [item for item in everything if AclFilter(**dict(base, **fields)).matches(item)]

    assert select() == everything
    assert select(resource_name="orders-1") == [literal]  # ANY: the exact name only
    assert select(resource_name="orders-1", pattern_type=PatternType.MATCH) == everything
    assert select(pattern_type=PRE) == [prefixed]
    assert select(principal="User:bob") == [literal]
    assert select(operation=Operation.WRITE, permission=ALLOW) == [prefixed]
    assert AclFilter(0, None, 1, None, None, 1, 1).problem() is not None  # UNKNOWN type


@pytest.mark.parametrize("bad, message", [
    (acl(C, "cluster", LIT, "User:a", Operation.ALTER), "only valid name for the CLUSTER"),
    (acl(T, "", LIT, "User:a", Operation.READ), "Invalid empty resource name"),
    (acl(ResourceType.ANY, "t", LIT, "User:a", Operation.READ), "Invalid resourceType ANY"),
    (acl(T, "t", PatternType.MATCH, "User:a", Operation.READ), "Invalid patternType MATCH"),
    (acl(T, "t", LIT, "User:a", Operation.ANY), "Invalid operation ANY"),
    (acl(T, "t", LIT, "User:a", Operation.READ, Permission.ANY), "Invalid permissionType ANY"),
    (acl(T, "t", LIT, "alice", Operation.READ), "Could not parse principal from `alice`"),
])
def test_creations_kafka_refuses_are_named(bad, message):
    assert message in creation_problem(bad)
    assert creation_problem(acl(T, "t", PRE, "User:a", Operation.READ, host="10.0.0.1")) is None


def test_denials_are_counted_at_once_and_written_once_a_second():
    class Log:
        def __init__(self):
            self.emitted = []

        def emit(self, event):
            self.emitted.append(event)

    counted, log = [], Log()
    access = Access(True, count=counted.append, log=log, listeners=("SASL",),
                    api_names={0: "Produce"})
    access.update([acl(T, "ok", LIT, "User:alice", Operation.WRITE)])
    ctx = RequestContext(b"\0\0\0\1", 0, 9, 0, None, "alice", "10.0.0.7")
    assert access.check(ctx, Operation.WRITE, T, "ok")
    for _ in range(1000):  # a client retrying the same denied request
        assert not access.check(ctx, Operation.WRITE, T, "nope")
    assert counted == [0] * 1000 and log.emitted == []
    access.flush(1_800_000_000)
    [event] = log.emitted
    assert (event.principal, event.ip, event.api, event.resource_type, event.resource,
            event.operation, event.count) == ("User:alice", "10.0.0.7", "Produce", "TOPIC",
                                              "nope", "WRITE", 1000)
    assert Access(False).check(ctx, Operation.WRITE, T, "nope")  # no authorizer: all allowed


# --- real brokers, real clients ------------------------------------------------------------------

def acl_broker(**extra) -> dict[str, str]:
    settings = {"listeners": "SASL_PLAINTEXT://127.0.0.1:0",
                "inter.broker.listener.name": "SASL_PLAINTEXT",
                "sasl.enabled.mechanisms": "PLAIN",
                "listener.name.sasl_plaintext.plain.sasl.jaas.config": ACL_JAAS,
                "authorizer.class.name": STANDARD, "super.users": "User:admin",
                # A group forms without Kafka's 3 s wait for more members: who may join is
                # under test here, not when.
                "group.initial.rebalance.delay.ms": "0"}
    settings.update(extra)
    return settings


def produce_error(config: dict, topic: str, count: int = 1):
    """None if every record was acknowledged, else the first error's name."""
    from confluent_kafka import KafkaException, Producer

    producer = Producer(dict(config, **{"message.timeout.ms": 10000}))
    errors = []
    try:
        for index in range(count):
            producer.produce(topic, value=f"{topic}-{index}".encode(),
                             on_delivery=lambda error, _m: errors.append(error) if error else 0)
        producer.flush(20)
    except KafkaException as error:  # refused from the metadata already
        return error.args[0].name()
    return errors[0].name() if errors else None


def consume_error(config: dict, topic: str, group: str, expect: int = 0):
    """(records read, the first error's name) of a subscribing consumer."""
    from confluent_kafka import Consumer

    consumer = Consumer(dict(config, **{"group.id": group, "auto.offset.reset": "earliest"}))
    consumer.subscribe([topic])
    read, error, deadline = 0, None, time.monotonic() + 20
    while time.monotonic() < deadline and error is None and (expect == 0 or read < expect):
        message = consumer.poll(0.5)
        if message is None:
            continue
        if message.error() is not None:
            error = message.error().name()
        else:
            read += 1
    consumer.close()
    return read, error


def raw_produce(sock, topic: str = "orders-1") -> int:
    """One Produce on an authenticated raw connection: its partition's error code."""
    sock.send(produce_request(topic, make_batch(1)))
    return produce_errors(sock.receive())[0][0]


@pytest.mark.system
def test_a_user_without_acls_is_refused_with_kafkas_codes_by_every_client():
    from confluent_kafka.admin import AdminClient

    with BrokerProcess(workers=2, overrides=acl_broker()) as broker:
        admin = client(broker, "admin")
        create_topics(admin, "orders")
        alice = client(broker, "alice")
        assert produce_error(alice, "orders") == "TOPIC_AUTHORIZATION_FAILED"
        create_acls(admin, binding("TOPIC", "orders", "LITERAL", "User:alice", "READ"))
        assert consume_error(alice, "orders", "alice-group")[1] == "GROUP_AUTHORIZATION_FAILED"
        with pytest.raises(Exception, match="TOPIC_AUTHORIZATION_FAILED"):
            create_topics(alice, "mine")
        assert set(AdminClient(alice).list_topics(timeout=10).topics) == {"orders"}  # READ
        assert set(AdminClient(client(broker, "bob")).list_topics(timeout=10).topics) == set()

        from kafka import KafkaProducer
        from kafka.errors import TopicAuthorizationFailedError

        host, port = broker.listeners["SASL_PLAINTEXT"]
        common = dict(bootstrap_servers=f"{host}:{port}", security_protocol="SASL_PLAINTEXT",
                      sasl_mechanism="PLAIN", sasl_plain_username="bob",
                      sasl_plain_password="bob-secret")
        producer = KafkaProducer(max_block_ms=5000, **common)
        with pytest.raises(TopicAuthorizationFailedError):
            producer.send("orders", b"x").get(timeout=10)
        producer.close()

        async def aiokafka_group():
            from aiokafka import AIOKafkaConsumer
            from aiokafka.errors import GroupAuthorizationFailedError

            consumer = AIOKafkaConsumer("orders", group_id="alice-group", sasl_mechanism="PLAIN",
                                        bootstrap_servers=f"{host}:{port}",
                                        security_protocol="SASL_PLAINTEXT",
                                        sasl_plain_username="alice",
                                        sasl_plain_password="alice-secret")
            try:
                with pytest.raises(GroupAuthorizationFailedError):
                    await consumer.start()  # it joins the group on start
                    await asyncio.wait_for(consumer.getmany(timeout_ms=5000), 15)
            finally:
                await consumer.stop()

        asyncio.run(aiokafka_group())
        wait_until(lambda: {(d.principal, d.api, d.resource, d.operation) for d in broker.events(AuthorizationDenied)}
                   >= {("User:alice", "Metadata", "orders", "DESCRIBE"),
                       ("User:alice", "FindCoordinator", "alice-group", "DESCRIBE"),
                       ("User:alice", "CreateTopics", "mine", "CREATE")},
                   timeout=10)
        assert all(d.ip == "127.0.0.1" and d.count >= 1 for d in broker.events(AuthorizationDenied))
        assert broker.metric("broker_authorization_denied_total", api="FindCoordinator") >= 1
        assert broker.metric("broker_authorization_denied_total", api="CreateTopics") == 1


@pytest.mark.system
def test_acls_from_the_admin_client_grant_exactly_what_they_say():
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (AclBindingFilter, AclOperation, AclPermissionType,
                                       AdminClient, ResourcePatternType, ResourceType)

    with BrokerProcess(workers=2, overrides=acl_broker()) as broker:
        admin_config = client(broker, "admin")
        create_topics(admin_config, "orders-1", "orders-secret", "other", "public")
        create_acls(admin_config,
                    binding("TOPIC", "orders-", "PREFIXED", "User:alice", "WRITE"),
                    binding("TOPIC", "orders-", "PREFIXED", "User:alice", "READ"),
                    binding("TOPIC", "orders-secret", "LITERAL", "User:alice", "WRITE", "DENY"),
                    binding("GROUP", "alice-", "PREFIXED", "User:alice", "READ"),
                    binding("GROUP", "described", "LITERAL", "User:alice", "DESCRIBE"),
                    binding("TOPIC", "public", "LITERAL", "User:*", "DESCRIBE"))
        alice = client(broker, "alice")
        assert produce_error(alice, "orders-1", 20) is None
        assert produce_error(alice, "orders-secret") == "TOPIC_AUTHORIZATION_FAILED"  # DENY wins
        assert produce_error(alice, "other") == "TOPIC_AUTHORIZATION_FAILED"
        assert consume_error(alice, "orders-1", "alice-group", expect=20) == (20, None)
        # DESCRIBE on the group finds the coordinator; joining needs READ (in the parent).
        assert consume_error(alice, "orders-1", "described")[1] == "GROUP_AUTHORIZATION_FAILED"
        # Metadata shows what the principal may describe (READ and WRITE imply DESCRIBE).
        assert set(AdminClient(alice).list_topics(timeout=10).topics) == {
            "orders-1", "orders-secret", "public"}

        admin = AdminClient(admin_config)
        everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None,
                                      None, AclOperation.ANY, AclPermissionType.ANY)
        assert len(admin.describe_acls(everything).result(timeout=20)) == 6
        of_alice = AclBindingFilter(ResourceType.TOPIC, "orders-secret",
                                    ResourcePatternType.MATCH, "User:alice", None,
                                    AclOperation.ANY, AclPermissionType.ANY)
        assert sorted((b.name, b.operation.name, b.permission_type.name) for b in
                      admin.describe_acls(of_alice).result(timeout=20)) == [
            ("orders-", "READ", "ALLOW"), ("orders-", "WRITE", "ALLOW"),
            ("orders-secret", "WRITE", "DENY")]
        prefixed_writes = AclBindingFilter(ResourceType.TOPIC, None, ResourcePatternType.PREFIXED,
                                           None, None, AclOperation.WRITE, AclPermissionType.ANY)
        # Four authenticated connections, so both workers serve some: each may produce now.
        sessions = [plain_session(broker.listeners["SASL_PLAINTEXT"], "alice",
                                   "alice-secret")[0] for _ in range(4)]
        assert {raw_produce(sock) for sock in sessions} == {ErrorCode.none}
        [deleted] = [future.result(timeout=20) for future in
                     admin.delete_acls([prefixed_writes]).values()]
        answered = time.monotonic()
        assert [(b.name, b.operation.name) for b in deleted] == [("orders-", "WRITE")]
        wait_until(lambda: {raw_produce(sock) for sock in sessions} ==
                   {ErrorCode.topic_authorization_failed},
                   timeout=1.0)  # every worker applies the change within a second
        assert time.monotonic() - answered < 1.0
        for sock in sessions:
            sock.close()
        assert produce_error(alice, "orders-1") == "TOPIC_AUTHORIZATION_FAILED"
        with pytest.raises(KafkaException, match="INVALID_REQUEST"):
            create_acls(admin_config, binding("BROKER", "not-the-cluster", "LITERAL",
                                              "User:alice", "ALTER"))
        with pytest.raises(KafkaException, match="CLUSTER_AUTHORIZATION_FAILED"):
            create_acls(alice, binding("TOPIC", "anything", "LITERAL", "User:alice", "ALL"))
        # DescribeAcls without DESCRIBE on the cluster: CLUSTER_AUTHORIZATION_FAILED at the top
        # of the answer, which librdkafka reports as an empty list (kafka-python raises it,
        # see the restart test): nothing is shown either way.
        alice_admin = AdminClient(alice)  # held until the answer: a dropped handle fails it
        assert alice_admin.describe_acls(everything).result(timeout=20) == []
        assert broker.metric("broker_authorization_denied_total", api="DescribeAcls") == 1


@pytest.mark.system
def test_super_users_no_acl_rule_and_the_control_plane_rule():
    from confluent_kafka import KafkaException

    overrides = acl_broker(**{
        "listeners": "SASL_PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:0",
        "listener.security.protocol.map": "SASL_PLAINTEXT:SASL_PLAINTEXT,"
                                          "CONTROLLER:SASL_PLAINTEXT",
        "control.plane.listener.name": "CONTROLLER",
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config": ACL_JAAS,
        "pybroker.control.plane.alter.on.data.listeners": "true",  # topics made below
        "super.users": "User:admin;User:ops",
        "allow.everyone.if.no.acl.found": "true"})
    with BrokerProcess(workers=1, overrides=overrides) as broker:
        create_topics(client(broker, "admin"), "free", "guarded")
        create_acls(client(broker, "admin", "CONTROLLER"),
                    binding("TOPIC", "guarded", "LITERAL", "User:bob", "WRITE"),
                    binding("TOPIC", "guarded", "LITERAL", "User:*", "ALL", "DENY"))
        alice, ops = client(broker, "alice"), client(broker, "ops")
        assert produce_error(alice, "free") is None  # no ACL on it at all: allowed
        assert produce_error(alice, "guarded") == "TOPIC_AUTHORIZATION_FAILED"
        assert produce_error(client(broker, "bob"), "guarded") == "TOPIC_AUTHORIZATION_FAILED"
        assert produce_error(ops, "guarded") is None  # a super user, whatever the DENY says
    overrides["pybroker.control.plane.alter.on.data.listeners"] = "false"
    with BrokerProcess(workers=1, overrides=overrides) as broker:
        with pytest.raises(KafkaException, match="CLUSTER_AUTHORIZATION_FAILED"):
            create_acls(client(broker, "admin"),  # a super user, on a data listener
                        binding("TOPIC", "x", "LITERAL", "User:bob", "READ"))
        create_acls(client(broker, "admin", "CONTROLLER"),
                    binding("TOPIC", "x", "LITERAL", "User:bob", "READ"))


@pytest.mark.system
def test_acls_survive_a_worker_kill_and_a_restart_and_kafka_python_manages_them(tmp_path):
    from kafka.admin import (ACL, ACLFilter, ACLOperation, ACLPermissionType,
                             ACLResourcePatternType, KafkaAdminClient, ResourcePattern,
                             ResourcePatternFilter, ResourceType)
    from kafka.errors import ClusterAuthorizationFailedError

    def admin_client(broker, user: str) -> KafkaAdminClient:
        host, port = broker.listeners["SASL_PLAINTEXT"]
        return KafkaAdminClient(bootstrap_servers=f"{host}:{port}", sasl_mechanism="PLAIN",
                                security_protocol="SASL_PLAINTEXT", sasl_plain_username=user,
                                sasl_plain_password=f"{user}-secret")

    everything = ACLFilter(principal=None, host="*", operation=ACLOperation.ANY,
                           permission_type=ACLPermissionType.ANY,
                           resource_pattern=ResourcePatternFilter(
                               ResourceType.ANY, None, ACLResourcePatternType.ANY))
    data_dir = str(tmp_path)
    with BrokerProcess(workers=2, overrides=acl_broker(), data_dir=data_dir) as broker:
        create_topics(client(broker, "admin"), "kept")
        admin = admin_client(broker, "admin")
        result = admin.create_acls([ACL("User:alice", "*", ACLOperation.WRITE,
                                        ACLPermissionType.ALLOW,
                                        ResourcePattern(ResourceType.TOPIC, "kept"))])
        assert result["failed"] == [] and len(result["succeeded"]) == 1
        admin.close()
        victim = broker.worker_pids["data-0"]
        os.kill(victim, signal.SIGKILL)
        broker.wait_for_line(rf"pid {victim}\) was killed by SIGKILL")
        wait_until(lambda: broker.metric("broker_worker_up", worker="data-0") == 1)
        alice = client(broker, "alice")
        for _ in range(4):  # new connections reach both workers, the new one included
            assert produce_error(alice, "kept") is None
    with BrokerProcess(workers=2, overrides=acl_broker(), data_dir=data_dir) as broker:
        admin = admin_client(broker, "admin")
        acls, error = admin.describe_acls(everything)
        assert [(a.principal, a.operation, a.resource_pattern.resource_name) for a in acls] == \
            [("User:alice", ACLOperation.WRITE, "kept")]
        admin.close()
        assert produce_error(client(broker, "alice"), "kept") is None
        assert produce_error(client(broker, "bob"), "kept") == "TOPIC_AUTHORIZATION_FAILED"
        bob = admin_client(broker, "bob")
        with pytest.raises(ClusterAuthorizationFailedError):
            bob.describe_acls(everything)
        bob.close()


# --- authorized operations ------------------

def test_without_an_authorizer_every_supported_operation_is_answered(tmp_path):
    """Metadata v10 (topic and cluster), Metadata v13 (topic), DescribeCluster and
    DescribeGroups v5 fill in authorized operations when asked: all the resource type knows
    (topic 8 operations, cluster 7, group 3), as Kafka does without an authorizer."""
    from tests.helpers import make_router
    from tests.groups.helpers import GroupHarness
    from tests.wire import decode_response, request

    router = make_router(str(tmp_path / "logs"))
    router.apis[19].services.registry.create("t", 1)

    def ask(api_key: int, version: int, values: dict):
        answer = router.handle(request(api_key, version, values), 0)
        return decode_response(api_key, version, answer[4:])[1]

    for version in (10, 13):
        values = {"topics": [{"name": "t", "topic_id": None}], "allow_auto_topic_creation": False,
                  "include_topic_authorized_operations": True,
                  "include_cluster_authorized_operations": True}
        answer = ask(3, version, values)
        assert answer.topics[0].topic_authorized_operations == 3576  # 8 operations
        if version == 10:
            assert answer.cluster_authorized_operations == 8096  # 7 operations
        asked_not = ask(3, version, dict(values, include_topic_authorized_operations=False))
        assert asked_not.topics[0].topic_authorized_operations == -2147483648  # not cached
    described = ask(60, 1, {"include_cluster_authorized_operations": True, "endpoint_type": 1})
    assert described.cluster_authorized_operations == 8096
    (tmp_path / "groups").mkdir()
    harness = GroupHarness(tmp_path / "groups")
    try:
        groups = harness.send(15, 5, {"groups": ["g"], "include_authorized_operations": True})
        assert groups.groups[0].authorized_operations == 328  # READ, DESCRIBE, DELETE
    finally:
        harness.close()


# --- review findings: hosts as Kafka compares them, bounds ------------------------------------

def test_hosts_compare_as_addresses_not_as_text():
    from broker.shared.acl import canonical_host

    assert canonical_host("::ffff:10.0.0.5") == "10.0.0.5"  # IPv4 through a dual-stack socket
    assert canonical_host("2001:db8:0:0:0:0:0:1") == "2001:db8::1"
    assert canonical_host("fe80::1%eth0") == "fe80::1"
    assert canonical_host("*") == "*" and canonical_host("not-an-ip") == "not-an-ip"
    auth = Authorizer([acl(T, "orders", LIT, "User:*", Operation.WRITE),
                       acl(T, "orders", LIT, "User:*", Operation.WRITE, DENY,
                           host=canonical_host("::ffff:10.0.0.5"))])
    assert not auth.allows("x", canonical_host("::ffff:10.0.0.5"), Operation.WRITE, T, "orders")


def test_long_names_are_decided_but_never_cached_and_the_audit_is_bounded():
    from broker.shared.access import MAX_NAME_CHARS
    from broker.shared.acl import CACHED_NAME_CHARS

    class Log:
        emitted = []

        def emit(self, event):
            self.emitted.append(event)

    access = Access(True, log=Log(), listeners=("L",), api_names={10: "FindCoordinator"})
    ctx = RequestContext(b"\0\0\0\1", 10, 4, 0, None, "mallory", "10.0.0.9")
    for index in range(50):
        assert not access.check(ctx, Operation.DESCRIBE, G, f"{index}" + "g" * 100_000)
    assert len(access.authorizer._cache) == 0  # nothing over CACHED_NAME_CHARS is kept
    access.check(ctx, Operation.DESCRIBE, G, "g" * CACHED_NAME_CHARS)
    assert len(access.authorizer._cache) == 1
    access.flush(1_800_000_000)
    assert all(len(event.resource) <= MAX_NAME_CHARS + 3 for event in Log.emitted)


def test_delete_acls_filters_each_see_every_acl_and_a_failed_write_changes_nothing(
        tmp_path, monkeypatch):
    import kio.schema.create_acls.v3.request as create_request
    import kio.schema.delete_acls.v3.request as delete_request

    from broker.parent.acl_store import AclService, AclStore
    from tests.wire import decode_response

    store = AclStore(str(tmp_path))
    store.save((acl(T, "a", LIT, "User:x", Operation.READ), acl(T, "b", LIT, "User:x",
                                                                 Operation.READ)))
    access = Access(True, super_users=frozenset({"User:root"}))
    access.update(store.acls)
    service = AclService(store, access)
    ctx = RequestContext(b"\0\0\0\1", 31, 3, 0, None, "root", "10.0.0.1")

    def select(name):
        return delete_request.DeleteAclsFilter(
            resource_type_filter=T, resource_name_filter=name, pattern_type_filter=1,
            principal_filter=None, host_filter=None, operation=1, permission_type=1)

    body = delete_request.DeleteAclsRequest(filters=(select("a"), select(None)))
    answer = decode_response(31, 3, service.delete(ctx, body, "test")[4:])[1]
    assert [len(result.matching_acls) for result in answer.filter_results] == [1, 2]
    assert store.acls == ()

    def full_disk(acls):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "save", full_disk)  # the store can no longer be written
    creation = create_request.AclCreation(resource_type=T, resource_name="c",
                                          resource_pattern_type=LIT, principal="User:x",
                                          host="*", operation=Operation.READ,
                                          permission_type=ALLOW)
    create_ctx = RequestContext(b"\0\0\0\2", 30, 3, 0, None, "root", "10.0.0.1")
    reply = service.create(create_ctx, create_request.CreateAclsRequest(creations=(creation,)),
                           "test")
    [result] = decode_response(30, 3, reply[4:])[1].results
    assert result.error_code == ErrorCode.unknown_server_error and store.acls == ()
    assert not access.authorizer.acls  # nor was anything applied


# --- the parent's services: configs, quotas, SCRAM credentials, groups ----------------------


@pytest.mark.system
def test_the_parent_services_authorize_each_resource_as_kafkas_apis():
    """DescribeConfigs / (Incremental)AlterConfigs need DESCRIBE_CONFIGS / ALTER_CONFIGS on the
    topic or (broker resource) the cluster; client quotas the same on the cluster; SCRAM
    credentials DESCRIBE / ALTER on the cluster; DescribeGroups, OffsetFetch DESCRIBE on the
    group (and the committed topics), DeleteGroups and OffsetDelete DELETE (OffsetDelete READ
    on each topic); ListGroups lists the groups the principal may DESCRIBE.  An undescribable
    topic is TOPIC_AUTHORIZATION_FAILED whether it exists or not."""
    from tests.helpers import ask

    with BrokerProcess(workers=1, overrides=acl_broker()) as broker:
        admin_config = client(broker, "admin")
        create_topics(admin_config, "seen", "hidden", "tuned")
        create_acls(admin_config,
                    binding("TOPIC", "seen", "LITERAL", "User:alice", "DESCRIBE_CONFIGS"),
                    binding("TOPIC", "seen", "LITERAL", "User:alice", "DESCRIBE"),
                    binding("TOPIC", "tuned", "LITERAL", "User:alice", "ALTER_CONFIGS"),
                    binding("BROKER", "kafka-cluster", "LITERAL", "User:alice",
                            "DESCRIBE_CONFIGS"),
                    binding("GROUP", "mine", "LITERAL", "User:alice", "DESCRIBE"),
                    binding("GROUP", "doomed", "LITERAL", "User:alice", "DELETE"))
        address = broker.listeners["SASL_PLAINTEXT"]
        admin, alice, bob = (plain_session(address, user, f"{user}-secret")[0]
                             for user in ("admin", "alice", "bob"))
        for group in ("mine", "theirs", "doomed"):  # offsets committed by a super user
            committed = ask(admin, 8, 8, {
                "group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
                "group_instance_id": None, "topics": [{"name": name, "partitions": [{
                    "partition_index": 0, "committed_offset": 1, "committed_leader_epoch": -1,
                    "committed_metadata": None}]} for name in ("seen", "hidden")]})[1]
            assert {p.error_code for t in committed.topics for p in t.partitions} == {ErrorCode.none}

        # Configs.
        resources = [{"resource_type": kind, "resource_name": name, "configuration_keys": None}
                     for kind, name in ((4, "0"), (2, "seen"), (2, "hidden"), (2, "missing"))]
        topic_denied = ErrorCode.topic_authorization_failed
        cluster_denied = ErrorCode.cluster_authorization_failed
        for sock, codes in ((alice, [0, 0, topic_denied, topic_denied]),
                            (bob, [cluster_denied] + [topic_denied] * 3)):
            described = ask(sock, 32, 4, {"resources": resources, "include_synonyms": True,
                                          "include_documentation": False})[1]
            assert [r.error_code for r in described.results] == codes
        changes = [{"resource_type": kind, "resource_name": name, "configs": [
            {"name": key, "config_operation": 0, "value": value}]}
            for kind, name, key, value in ((4, "0", "max.connections", "1000"),
                                           (2, "seen", "retention.ms", "60000"),
                                           (2, "tuned", "retention.ms", "60000"))]
        altered = ask(alice, 44, 1, {"resources": changes, "validate_only": False})[1]
        assert [r.error_code for r in altered.responses] == [cluster_denied, topic_denied, 0]
        legacy = [dict(change, configs=[{"name": c["name"], "value": c["value"]}
                                        for c in change["configs"]]) for change in changes]
        altered = ask(bob, 33, 1, {"resources": legacy, "validate_only": False})[1]
        assert [r.error_code for r in altered.responses] == \
            [cluster_denied, topic_denied, topic_denied]

        # Client quotas: DESCRIBE_CONFIGS / ALTER_CONFIGS on the cluster.
        assert ask(alice, 48, 1, {"components": [], "strict": False})[1].error_code == ErrorCode.none
        assert ask(bob, 48, 1, {"components": [], "strict": False})[1].error_code == \
            ErrorCode.cluster_authorization_failed
        quota = {"entity": [{"entity_type": "user", "entity_name": "bob"}],
                 "ops": [{"key": "producer_byte_rate", "value": 1e6, "remove": False}]}
        for sock, code in ((alice, ErrorCode.cluster_authorization_failed), (admin, 0)):
            assert ask(sock, 49, 1, {"entries": [quota], "validate_only": False}
                       )[1].entries[0].error_code == code

        # SCRAM credentials: DESCRIBE / ALTER on the cluster (DESCRIBE_CONFIGS is not enough).
        assert ask(alice, 50, 0, {"users": None})[1].error_code == cluster_denied
        assert ask(admin, 50, 0, {"users": None})[1].error_code == ErrorCode.none
        deletion = {"deletions": [{"name": "carol", "mechanism": 1}], "upsertions": []}
        assert ask(alice, 51, 0, deletion)[1].results[0].error_code == cluster_denied

        # Groups.
        described = ask(alice, 15, 5, {"groups": ["mine", "theirs"],
                                       "include_authorized_operations": True})[1]
        assert [(g.group_id, g.error_code) for g in described.groups] == \
            [("mine", ErrorCode.none), ("theirs", ErrorCode.group_authorization_failed)]
        listed = {name: sorted(g.group_id for g in ask(sock, 16, 4, {"states_filter": []}
                                                        )[1].groups)
                  for name, sock in (("admin", admin), ("alice", alice), ("bob", bob))}
        # DELETE implies DESCRIBE: alice lists "doomed" too.
        assert listed == {"admin": ["doomed", "mine", "theirs"], "alice": ["doomed", "mine"],
                          "bob": []}
        fetched = ask(alice, 9, 8, {"groups": [{"group_id": "mine", "topics": None},
                                               {"group_id": "theirs", "topics": None}],
                                    "require_stable": False})[1]
        assert [(g.group_id, g.error_code, [t.name for t in g.topics])
                for g in fetched.groups] == \
            [("mine", 0, ["seen"]), ("theirs", ErrorCode.group_authorization_failed, [])]
        asked = ask(alice, 9, 7, {"group_id": "mine", "topics": [
            {"name": "hidden", "partition_indexes": [0]}], "require_stable": False})[1]
        assert asked.topics[0].partitions[0].error_code == ErrorCode.topic_authorization_failed
        deleted = ask(alice, 42, 2, {"groups_names": ["mine", "doomed"]})[1]
        assert sorted((r.group_id, r.error_code) for r in deleted.results) == \
            [("doomed", ErrorCode.none), ("mine", ErrorCode.group_authorization_failed)]
        offsets_deleted = ask(alice, 47, 0, {"group_id": "mine", "topics": [
            {"name": "seen", "partitions": [{"partition_index": 0}]}]})[1]
        assert offsets_deleted.error_code == ErrorCode.group_authorization_failed
        create_acls(admin_config, binding("GROUP", "mine", "LITERAL", "User:alice", "DELETE"))
        wait_until(lambda: ask(alice, 47, 0, {"group_id": "mine", "topics": [
            {"name": "seen", "partitions": [{"partition_index": 0}]}]})[1].error_code == ErrorCode.none)
        offsets_deleted = ask(alice, 47, 0, {"group_id": "mine", "topics": [
            {"name": "hidden", "partitions": [{"partition_index": 0}]}]})[1]
        assert offsets_deleted.topics[0].partitions[0].error_code == topic_denied
        for sock in (admin, alice, bob):
            sock.close()
