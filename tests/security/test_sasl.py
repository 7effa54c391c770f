"""SASL listeners: PLAIN from JAAS, SCRAM credentials managed through
the admin API, failed authentication answered then closed after the configured delay.

Real clients: confluent-kafka (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512), kafka-python and aiokafka
(SCRAM-SHA-512 over SASL_SSL); raw frames for what clients never send on purpose.
"""

from __future__ import annotations

import asyncio
import glob
import os
import socket
import struct
import time

import pytest
from kio.schema.errors import ErrorCode

from broker.shared.config import ConfigError, load_config
from broker.shared.events import AuthenticationFailed, decode_line
from broker.shared.sasl import parse_jaas, plain_users
from tests.harness import BrokerProcess, wait_until
from tests.security.helpers import (SASL_JAAS, add_scram_user, authenticate, kafka_string,
                                   plain_session, sasl_broker)
from tests.wire import KafkaSocket, api_versions_request, metadata_request, peer_closed, raw_request


@pytest.fixture(scope="module")
def broker(pki):
    """One broker with sasl_broker's settings for the tests that need no others: each has its
    own users and topics, and reads its counts as differences."""
    with BrokerProcess(workers=2, overrides=sasl_broker(pki)) as started:
        yield started


def client_config(broker, listener: str, mechanism: str, user: str, password: str,
                  pki=None) -> dict:
    host, port = broker.listeners[listener]
    config = {"bootstrap.servers": f"{host}:{port}", "security.protocol": listener,
              "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password}
    if pki is not None:
        config["ssl.ca.location"] = pki["ca"]
    return config


def produce_and_consume(config: dict, topic: str, count: int = 100) -> set[bytes]:
    from confluent_kafka import Consumer, Producer

    producer = Producer(config)
    for index in range(count):
        producer.produce(topic, value=f"{topic}-{index}".encode())
    assert producer.flush(30) == 0
    consumer = Consumer(dict(config, **{"group.id": topic, "auto.offset.reset": "earliest"}))
    consumer.subscribe([topic])
    seen, deadline = set(), time.monotonic() + 30
    while len(seen) < count and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            seen.add(message.value())
    consumer.close()
    return seen


def refused(config: dict) -> bool:
    """True when the client cannot get Metadata within 4 s: its authentication is refused.
    librdkafka reports the refusal through its error callback at once; without waiting on it,
    each refusal took the whole 4 s."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    errors = []
    admin = AdminClient(dict(config, **{"socket.timeout.ms": 3000, "error_cb": errors.append}))
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        try:
            admin.list_topics(timeout=0.25)
            return False
        except KafkaException:  # no answer yet, or the transport failed
            admin.poll(0.05)  # serves the error callback
        if any(error.code() == KafkaError._AUTHENTICATION for error in errors):
            return True
    return True


# --- unit --------------------------------------------------------------------------------------

def test_jaas_plain_users_are_read_as_kafka_writes_them():
    module, options = parse_jaas(SASL_JAAS)
    assert module.endswith("PlainLoginModule") and options["username"] == "admin"
    assert plain_users(SASL_JAAS) == {"admin": "admin-secret", "alice": "alice-secret"}
    with pytest.raises(ValueError, match="no user_"):
        plain_users('org.apache.kafka.common.security.plain.PlainLoginModule required a="b";')


@pytest.mark.parametrize("extra, message", [
    ({}, "sasl.enabled.mechanisms: GSSAPI for SASL listener SASL_PLAINTEXT"),
    ({"sasl.enabled.mechanisms": "PLAIN"},
     "listener.name.sasl_plaintext.plain.sasl.jaas.config: required for PLAIN"),
    ({"listener.name.sasl_plaintext.sasl.enabled.mechanisms": "PLAIN",
      "listener.name.sasl_plaintext.plain.sasl.jaas.config": "nonsense"},
     "listener.name.sasl_plaintext.plain.sasl.jaas.config: expected"),
])
def test_bad_sasl_settings_name_the_key(tmp_path, extra, message):
    raw = {"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "log.dirs": str(tmp_path),
           "inter.broker.listener.name": "SASL_PLAINTEXT", **extra}
    with pytest.raises(ConfigError) as caught:
        load_config(raw)
    assert message in str(caught.value)


# --- real brokers, real clients ------------------------------------------------------------

@pytest.mark.system
def test_scram_users_created_through_the_admin_api_then_deleted(broker):
    from confluent_kafka.admin import AdminClient, ScramMechanism, UserScramCredentialDeletion

    def authentications(result: str) -> float:
        return broker.metric("broker_authentication_total", listener="SASL_PLAINTEXT",
                             mechanism="SCRAM-SHA-256", result=result)

    before = {result: authentications(result) for result in ("success", "failure")}
    add_scram_user(broker.bootstrap, "bob", "bob-secret", "SCRAM-SHA-256")
    bob = client_config(broker, "SASL_PLAINTEXT", "SCRAM-SHA-256", "bob", "bob-secret")
    assert produce_and_consume(bob, "scram256") == {f"scram256-{i}".encode()
                                                    for i in range(100)}
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    described = admin.describe_user_scram_credentials(["bob"])["bob"].result(timeout=20)
    assert [(info.mechanism, info.iterations)
            for info in described.scram_credential_infos] == \
        [(ScramMechanism.SCRAM_SHA_256, 4096)]
    assert refused(dict(bob, **{"sasl.password": "wrong"}))
    for future in admin.alter_user_scram_credentials([UserScramCredentialDeletion(
            "bob", ScramMechanism.SCRAM_SHA_256)]).values():
        future.result(timeout=20)
    assert refused(bob)  # deleted: refused from then on, in every worker
    assert authentications("success") - before["success"] >= 1
    assert authentications("failure") - before["failure"] >= 2
    path = os.path.join(broker.data_dir, "logs", ".pybroker-scram.json")
    assert "bob-secret" not in open(path).read()  # salted, never the password
    assert os.stat(path).st_mode & 0o077 == 0  # the broker's user only


@pytest.mark.system
def test_confluent_kafka_over_sasl_ssl_with_plain_and_scram_sha_512(broker, pki):
    alice = client_config(broker, "SASL_SSL", "PLAIN", "alice", "alice-secret", pki)
    assert len(produce_and_consume(alice, "plain-ssl", 50)) == 50
    add_scram_user(broker.bootstrap, "carol", "carol-secret", "SCRAM-SHA-512")
    carol = client_config(broker, "SASL_SSL", "SCRAM-SHA-512", "carol", "carol-secret",
                          pki)
    assert len(produce_and_consume(carol, "scram-ssl", 50)) == 50


@pytest.mark.system
def test_kafka_python_and_aiokafka_over_sasl_ssl_with_scram(broker, pki):
    import ssl

    from kafka import KafkaConsumer, KafkaProducer

    add_scram_user(broker.bootstrap, "dave", "dave-secret", "SCRAM-SHA-512")
    host, port = broker.listeners["SASL_SSL"]
    common = dict(bootstrap_servers=f"{host}:{port}", security_protocol="SASL_SSL",
                  sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="dave",
                  sasl_plain_password="dave-secret", ssl_cafile=pki["ca"])
    producer = KafkaProducer(**common)
    for index in range(20):
        producer.send("kp", f"kp-{index}".encode())
    producer.flush(30)
    producer.close()
    consumer = KafkaConsumer("kp", auto_offset_reset="earliest", **common)
    seen, deadline = set(), time.monotonic() + 10
    while len(seen) < 20 and time.monotonic() < deadline:  # not 10 s idle after the last
        seen |= {message.value for messages in consumer.poll(timeout_ms=500).values()
                 for message in messages}
    assert seen == {f"kp-{i}".encode() for i in range(20)}
    consumer.close()

    async def with_aiokafka():
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

        context = ssl.create_default_context(cafile=pki["ca"])
        options = dict(bootstrap_servers=f"{host}:{port}", security_protocol="SASL_SSL",
                       sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="dave",
                       sasl_plain_password="dave-secret", ssl_context=context)
        producer = AIOKafkaProducer(**options)
        await producer.start()
        try:
            for index in range(20):
                await producer.send_and_wait("aio", f"aio-{index}".encode())
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer("aio", auto_offset_reset="earliest", **options)
        await consumer.start()
        seen = set()
        try:
            deadline = time.monotonic() + 20
            while len(seen) < 20 and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=500)
                seen |= {message.value for messages in batch.values()
                         for message in messages}
        finally:
            await consumer.stop()
        return seen

    assert asyncio.run(with_aiokafka()) == {f"aio-{i}".encode() for i in range(20)}


@pytest.mark.system
def test_a_wrong_password_is_answered_then_closed_after_the_delay(pki):
    overrides = sasl_broker(pki, **{"connection.failed.authentication.delay.ms": "700"})
    with BrokerProcess(workers=1, overrides=overrides) as broker:
        with KafkaSocket(broker.listeners["SASL_PLAINTEXT"]) as sock:
            sock.send(api_versions_request(3))
            sock.receive()
            sock.send(raw_request(17, 1, 2, kafka_string("PLAIN")))
            assert struct.unpack_from(">h", sock.receive(), 4)[0] == ErrorCode.none
            code, body = authenticate(sock, b"\x00alice\x00not-her-password")
            answered = time.monotonic()
            assert code == ErrorCode.sasl_authentication_failed
            assert b"invalid username or password" in body
            assert peer_closed(sock.sock, wait=5)
            assert time.monotonic() - answered >= 0.6  # the delay, then the close
        wait_until(lambda: broker.metric("broker_connections_closed_total",
                                         listener="SASL_PLAINTEXT",
                                         reason="authentication_failed") == 1)
        events_dir = os.path.join(broker.data_dir, "pybroker-events")

        def failures():
            found = []
            for path in glob.glob(os.path.join(events_dir, "*.jsonl")):
                with open(path, "rb") as handle:
                    found += [event for event in map(decode_line, handle)
                              if isinstance(event, AuthenticationFailed)]
            return found

        wait_until(lambda: failures(), timeout=10)
        event = failures()[0]
        assert (event.ip, event.mechanism, event.user) == ("127.0.0.1", "PLAIN", "alice")
        with KafkaSocket(broker.listeners["SASL_PLAINTEXT"]) as sock:  # the right one works
            sock.send(raw_request(17, 1, 2, kafka_string("PLAIN")))
            sock.receive()
            assert authenticate(sock, b"\x00alice\x00alice-secret")[0] == ErrorCode.none
            sock.send(metadata_request(12, correlation_id=9))
            assert struct.unpack_from(">i", sock.receive())[0] == 9


@pytest.mark.system
def test_a_request_before_authentication_closes_the_connection(broker):
    before = broker.metric("broker_invalid_requests_total", reason="not_authenticated")
    with KafkaSocket(broker.listeners["SASL_PLAINTEXT"]) as sock:
        sock.send(metadata_request(12))
        assert peer_closed(sock.sock, wait=5)
    wait_until(lambda: broker.metric("broker_invalid_requests_total",
                                     reason="not_authenticated") == before + 1)
    with KafkaSocket(broker.listeners["SASL_PLAINTEXT"]) as sock:  # big before auth: no
        sock.send(raw_request(36, 1, 3, struct.pack(">i", 600_000) + b"x" * 600_000))
        assert peer_closed(sock.sock, wait=5)
    broker.wait_for_line(r"larger than sasl.server.max.receive.size \(not authenticated "
                         r"yet\) 524288")
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as sock:  # no SASL here: Kafka's answer
        sock.send(raw_request(17, 1, 2, kafka_string("PLAIN")))
        assert struct.unpack_from(">h", sock.receive(), 4)[0] == ErrorCode.illegal_sasl_state
    with socket.create_connection(broker.listeners["SASL_PLAINTEXT"], timeout=5) as raw:
        raw.sendall(raw_request(17, 1, 2, kafka_string("GSSAPI")))  # not enabled: the list
        data = raw.recv(65536)
        assert struct.unpack_from(">h", data, 8)[0] == ErrorCode.unsupported_sasl_mechanism


@pytest.mark.system
def test_a_user_quota_throttles_only_that_user(pki):
    from confluent_kafka import Producer

    from broker.shared.events import Throttle
    from tests.wire import alter_client_quota

    overrides = sasl_broker(pki, **{"quota.window.num": "2", "quota.window.size.seconds": "1"})
    with BrokerProcess(workers=1, overrides=overrides) as broker:
        add_scram_user(broker.bootstrap, "bob", "bob-secret", "SCRAM-SHA-256")
        assert alter_client_quota(broker.listeners["PLAINTEXT"], {"user": "alice"},
                                  "producer_byte_rate", 20_000) == 0
        for user, password, mechanism in (("alice", "alice-secret", "PLAIN"),
                                          ("bob", "bob-secret", "SCRAM-SHA-256")):
            config = client_config(broker, "SASL_PLAINTEXT", mechanism, user, password)
            throttled = []
            producer = Producer(dict(config, **{"client.id": "same-client", "linger.ms": 0,
                                                "throttle_cb": throttled.append}))
            for _ in range(20):  # 200 KB each: ten times alice's rate
                producer.produce("quota", value=b"x" * 10_000)
                producer.flush(30)
                if user == "alice" and throttled:
                    break  # told to wait: the rest would only be waited out
            producer.flush(30)
        events_dir = os.path.join(broker.data_dir, "pybroker-events")

        def throttled_users():
            found = set()
            for path in glob.glob(os.path.join(events_dir, "*.jsonl")):
                with open(path, "rb") as handle:
                    found |= {event.user for event in map(decode_line, handle)
                              if isinstance(event, Throttle)}
            return found

        wait_until(lambda: "alice" in throttled_users(), timeout=10)
        assert throttled_users() == {"alice"}  # bob shares the client id, not the quota


@pytest.mark.system
def test_the_control_plane_may_be_a_sasl_listener(pki):
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry,
                                       ConfigResource)

    overrides = {
        "listeners": "PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:0",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:SASL_SSL",
        "control.plane.listener.name": "CONTROLLER",
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config": SASL_JAAS,
        "ssl.keystore.location": pki["server"],
    }

    def alter(config: dict):
        resource = ConfigResource("broker", "0", incremental_configs=[ConfigEntry(
            "max.connections", "100", incremental_operation=AlterConfigOpType.SET)])
        admin = AdminClient(config)  # held until the answer: a destroyed handle fails it
        admin.incremental_alter_configs([resource])[resource].result(timeout=20)

    with BrokerProcess(workers=1, overrides=overrides) as broker:
        alter(client_config(broker, "CONTROLLER", "PLAIN", "admin", "admin-secret", pki)
              | {"security.protocol": "SASL_SSL"})
        with pytest.raises(KafkaException, match="CLUSTER_AUTHORIZATION_FAILED"):
            alter({"bootstrap.servers": broker.bootstrap})  # data listener: still refused
        assert broker.metric("broker_authentication_total", listener="CONTROLLER",
                             mechanism="PLAIN", result="success") >= 1


@pytest.mark.system
def test_sessions_are_reauthenticated_or_closed_when_they_expire(pki):
    """KIP-368: librdkafka re-authenticates within the lifetime it is told and keeps producing;
    a client that does not is closed once its session expires; a re-authentication as another
    user is refused."""
    from confluent_kafka import Producer

    overrides = sasl_broker(pki, **{"connections.max.reauth.ms": "2000"})
    with BrokerProcess(workers=1, overrides=overrides) as broker:
        alice = client_config(broker, "SASL_PLAINTEXT", "PLAIN", "alice", "alice-secret")
        producer = Producer(dict(alice, **{"linger.ms": 0}))

        def successes() -> float:
            return broker.metric("broker_authentication_total", listener="SASL_PLAINTEXT",
                                 mechanism="PLAIN", result="success")

        # Producing until the sessions were renewed (at most 7 s), then once more after.
        errors, started, renewed, checked = [], time.monotonic(), False, 0.0
        while time.monotonic() - started < 7 and not renewed:
            producer.produce("reauth", value=b"x",
                             on_delivery=lambda error, _m: errors.append(error) if error else 0)
            producer.flush(10)
            if time.monotonic() - checked > 0.25:
                renewed, checked = successes() >= 4, time.monotonic()
        producer.produce("reauth", value=b"x",
                         on_delivery=lambda error, _m: errors.append(error) if error else 0)
        producer.flush(10)
        assert errors == []
        assert successes() >= 4  # the first of each connection, then again every 2 s
        assert broker.metric("broker_connections_closed_total", listener="SASL_PLAINTEXT",
                             reason="session_expired") == 0
        with KafkaSocket(broker.listeners["SASL_PLAINTEXT"]) as sock:
            sock.send(raw_request(17, 1, 2, kafka_string("PLAIN")))
            sock.receive()
            code, body = authenticate(sock, b"\x00alice\x00alice-secret")
            assert code == ErrorCode.none and struct.unpack_from(">q", body, len(body) - 8)[0] == 2000
            sock.send(raw_request(17, 1, 4, kafka_string("PLAIN")))  # again, as admin: refused
            sock.receive()
            assert authenticate(sock, b"\x00admin\x00admin-secret")[0] == \
                ErrorCode.sasl_authentication_failed
        with KafkaSocket(broker.listeners["SASL_PLAINTEXT"]) as sock:
            sock.send(raw_request(17, 1, 2, kafka_string("PLAIN")))
            sock.receive()
            assert authenticate(sock, b"\x00alice\x00alice-secret")[0] == ErrorCode.none
            authenticated = time.monotonic()
            assert peer_closed(sock.sock, wait=6)  # never re-authenticates
            assert time.monotonic() - authenticated >= 1.9
        wait_until(lambda: broker.metric("broker_connections_closed_total",
                                         listener="SASL_PLAINTEXT",
                                         reason="session_expired") == 1)
        producer.flush(5)


@pytest.mark.system
def test_connections_per_principal_are_limited_across_workers_and_changed_at_run_time(pki):
    """pybroker.max.connections.per.user (alice: 2) counted across two workers, the creation
    rate per user (carol: 1/s), confluent-kafka refused then admitted once the limit is raised
    through IncrementalAlterConfigs."""
    from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry,
                                       ConfigResource)

    jaas = SASL_JAAS.replace(';', ' user_carol="carol-secret";')
    overrides = sasl_broker(pki, **{
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas,
        "pybroker.max.connections.per.user.overrides": "alice:2",
        "pybroker.max.connection.creation.rate.per.user.overrides": "carol:1",
        "quota.window.num": "2",  # a fresh rate sensor lets exactly one connection through
        "connection.failed.authentication.delay.ms": "400"})
    with BrokerProcess(workers=2, overrides=overrides) as broker:
        address = broker.listeners["SASL_PLAINTEXT"]
        held = [plain_session(address, "alice", "alice-secret") for _ in range(2)]
        assert [code for _sock, code, _body in held] == [ErrorCode.none, ErrorCode.none]
        sock, code, body = plain_session(address, "alice", "alice-secret")
        answered = time.monotonic()
        assert code == ErrorCode.sasl_authentication_failed
        assert b"Connection limit of user alice reached: 2" in body
        assert peer_closed(sock.sock, wait=5) and time.monotonic() - answered >= 0.3
        sock.close()
        alice = client_config(broker, "SASL_PLAINTEXT", "PLAIN", "alice", "alice-secret")
        assert refused(alice)  # a real client is refused the same way
        admin_user = client_config(broker, "SASL_PLAINTEXT", "PLAIN", "admin", "admin-secret")
        assert not refused(admin_user)  # another principal, from the same address
        held[0][0].close()  # one of alice's closes: her next connection gets its slot

        def admitted_once_more() -> bool:
            sock, code, _body = plain_session(address, "alice", "alice-secret")
            sock.close()
            return code == ErrorCode.none

        wait_until(admitted_once_more)

        first = plain_session(address, "carol", "carol-secret")
        second = plain_session(address, "carol", "carol-secret")
        assert first[1] == 0 and second[1] == ErrorCode.sasl_authentication_failed
        assert b"Connection creation rate of user carol" in second[2]

        resource = ConfigResource("broker", "0", incremental_configs=[ConfigEntry(
            "pybroker.max.connections.per.user.overrides", "alice:10",
            incremental_operation=AlterConfigOpType.SET)])
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.incremental_alter_configs([resource])[resource].result(timeout=20)
        assert len(produce_and_consume(alice, "per-user", 20)) == 20

        for reason in ("per_user_limit", "per_user_rate"):
            assert broker.metric("broker_connections_rejected_total",
                                 listener="SASL_PLAINTEXT", reason=reason) >= 1
        wait_until(lambda: broker.metric("broker_connections_closed_total",
                                         listener="SASL_PLAINTEXT",
                                         reason="per_user_rate") == 1)
        assert broker.metric("broker_authentication_total", listener="SASL_PLAINTEXT",
                             mechanism="PLAIN", result="refused") >= 3
        for sock, *_ in held[1:] + [first]:
            sock.close()


# --- unit: the answer waits for the parent's verdict -------------------------------------------

def _authenticator_with_claims(reauth_ms: int = 0):
    from broker.shared.ipc import UserVerdict
    from broker.shared.sasl import SaslSettings
    from workers.authenticator import Authenticator

    loop = asyncio.new_event_loop()
    claims, results = [], []

    class Conn:
        closed = None
        ip = "127.0.0.1"

        def close_later(self, delay, reason):
            self.closed = reason

    def claim(conn, user):
        claims.append((user, loop.create_future()))
        return claims[-1][1]

    settings = SaslSettings("SASL", ("PLAIN",), {"alice": "pw"})
    auth = Authenticator(Conn(), settings, lambda mechanism, user: None,
                         lambda request, listener, *user: b"routed",
                         lambda _auth, _mechanism, user, result: results.append((user, result)),
                         0.1, reauth_ms, claim=claim)
    return loop, auth, claims, results, UserVerdict


def _code(answer: bytes) -> int:
    """The error code of a framed v1 SASL answer: after the size and the correlation id."""
    return struct.unpack_from(">h", answer, 8)[0]


def _plain_exchange(auth, password: str = "pw"):
    assert _code(auth.handle(raw_request(17, 1, 1, kafka_string("PLAIN"))[4:], 0)) == ErrorCode.none
    token = f"\x00alice\x00{password}".encode()
    return auth.handle(raw_request(36, 1, 2, struct.pack(">i", len(token)) + token)[4:], 0)


def test_a_successful_exchange_is_answered_only_once_the_parent_admits_the_user():
    loop, auth, claims, results, verdict = _authenticator_with_claims()
    try:
        answer = _plain_exchange(auth)
        assert isinstance(answer, asyncio.Future) and not answer.done()
        assert [user for user, _ in claims] == ["alice"] and auth.user is None and results == []
        claims[0][1].set_result(verdict(conn_id=1))
        loop.run_until_complete(asyncio.sleep(0))
        assert _code(answer.result()) == ErrorCode.none
        assert auth.user == "alice" and results == [("alice", "success")]
        assert auth.handle(raw_request(3, 12, 3)[4:], 0) == b"routed"
    finally:
        loop.close()


def test_a_refused_user_gets_the_authentication_failure_naming_the_limit():
    loop, auth, claims, results, verdict = _authenticator_with_claims()
    try:
        answer = _plain_exchange(auth)
        claims[0][1].set_result(verdict(conn_id=1, refused="per_user_limit", limit=3))
        loop.run_until_complete(asyncio.sleep(0))
        body = answer.result()
        assert _code(body) == ErrorCode.sasl_authentication_failed
        assert b"Connection limit of user alice reached: 3" in body
        assert auth.user is None and results == [("alice", "per_user_limit")]
        assert auth.handle(raw_request(3, 12, 3)[4:], 0) is None  # nothing more is answered
        wrong = _authenticator_with_claims()
        # A wrong password is not asked about: answered at once.
        assert _code(_plain_exchange(wrong[1], "guess")) == ErrorCode.sasl_authentication_failed
        assert wrong[2] == [] and wrong[1].conn.closed == "authentication_failed"
        wrong[0].close()
    finally:
        loop.close()


def test_a_reauthentication_keeps_its_count_and_is_not_asked_again():
    loop, auth, claims, results, verdict = _authenticator_with_claims(reauth_ms=60_000)
    try:
        answer = _plain_exchange(auth)
        claims[0][1].set_result(verdict(conn_id=1))
        loop.run_until_complete(asyncio.sleep(0))
        assert answer.done()
        again = _plain_exchange(auth)  # KIP-368: the same principal, on the same connection
        assert isinstance(again, bytes) and _code(again) == ErrorCode.none
        assert len(claims) == 1 and results[-1] == ("alice", "success")
    finally:
        loop.close()


# --- KIP-368: what a re-authentication may not change ----------------------------------------

def _sasl_handshake(sock: KafkaSocket, mechanism: str, correlation_id: int = 2) -> int:
    sock.send(raw_request(17, 1, correlation_id, kafka_string(mechanism)))
    return struct.unpack_from(">h", sock.receive(), 4)[0]


def _scram_session(sock: KafkaSocket, mechanism: str, user: str, password: str) -> int:
    """A whole SCRAM exchange over SaslHandshake v1 and SaslAuthenticate v1: the last code."""
    from scramp import ScramClient

    from tests.wire import decode_response

    assert _sasl_handshake(sock, mechanism) == ErrorCode.none
    client = ScramClient([mechanism], user, password)
    code, body = authenticate(sock, client.get_client_first().encode())
    if code != ErrorCode.none:
        return code
    client.set_server_first(decode_response(36, 1, body)[1].auth_bytes.decode())
    code, body = authenticate(sock, client.get_client_final().encode())
    if code == ErrorCode.none:
        client.set_server_final(decode_response(36, 1, body)[1].auth_bytes.decode())
    return code


def _served(sock: KafkaSocket, correlation_id: int) -> bool:
    sock.send(metadata_request(12, correlation_id=correlation_id))
    return struct.unpack_from(">i", sock.receive())[0] == correlation_id


@pytest.mark.system
def test_a_reauthentication_may_change_neither_mechanism_nor_principal(pki):
    """As Kafka: the re-authentication's SaslHandshake naming another mechanism is answered,
    its first token fails and the connection closes after the delay; the same mechanism and
    principal re-authenticate, at most once a second; a SaslAuthenticate outside an exchange
    is refused and the session goes on."""
    overrides = sasl_broker(pki, **{"connections.max.reauth.ms": "60000",
                                    "connection.failed.authentication.delay.ms": "300"})
    with BrokerProcess(workers=1, overrides=overrides) as broker:
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            add_scram_user(broker.bootstrap, "alice", "alice-secret", mechanism)
        address = broker.listeners["SASL_PLAINTEXT"]
        changes = [("PLAIN", "SCRAM-SHA-256"), ("SCRAM-SHA-256", "SCRAM-SHA-512"),
                   ("SCRAM-SHA-512", "PLAIN")]
        for first, then in changes:
            with KafkaSocket(address) as sock:
                if first == "PLAIN":
                    assert _sasl_handshake(sock, "PLAIN") == ErrorCode.none
                    assert authenticate(sock, b"\x00alice\x00alice-secret")[0] == ErrorCode.none
                else:
                    assert _scram_session(sock, first, "alice", "alice-secret") == ErrorCode.none
                assert _served(sock, 11)
                assert _sasl_handshake(sock, then, 12) == ErrorCode.none  # answered, as Kafka does
                token = b"\x00alice\x00alice-secret" if then == "PLAIN" else \
                    b"n,,n=alice,r=abcdefghijklmnop"
                code, body = authenticate(sock, token)
                assert code == ErrorCode.sasl_authentication_failed, (first, then)
                assert f"SASL mechanism '{then}' requested by client is not supported for " \
                       f"re-authentication of mechanism '{first}'".encode() in body
                assert peer_closed(sock.sock, wait=5)
        wait_until(lambda: broker.metric("broker_connections_closed_total",
                                         listener="SASL_PLAINTEXT",
                                         reason="authentication_failed") == len(changes))
        with KafkaSocket(address) as sock:  # the same mechanism and user: once a second
            assert _scram_session(sock, "SCRAM-SHA-256", "alice", "alice-secret") == ErrorCode.none
            assert _scram_session(sock, "SCRAM-SHA-256", "alice", "alice-secret") == ErrorCode.none
            assert _served(sock, 21)
            assert _sasl_handshake(sock, "SCRAM-SHA-256", 22) == ErrorCode.illegal_sasl_state
            assert _served(sock, 23)
            sock.send(raw_request(36, 1, 24, struct.pack(">i", 1) + b"x"))  # outside one
            assert struct.unpack_from(">h", sock.receive(), 4)[0] == ErrorCode.illegal_sasl_state
            assert _served(sock, 25)
        assert broker.metric("broker_connections_closed_total", listener="SASL_PLAINTEXT",
                             reason="authentication_failed") == len(changes)


@pytest.mark.system
def test_sasl_requests_out_of_order_are_answered_then_closed(pki):
    """An unsupported mechanism, a token before SaslHandshake, a second SaslHandshake: Kafka
    answers and closes the connection, and so does the broker, after the delay."""
    overrides = sasl_broker(pki, **{"connection.failed.authentication.delay.ms": "300"})
    with BrokerProcess(workers=1, overrides=overrides) as broker:
        address = broker.listeners["SASL_PLAINTEXT"]
        with KafkaSocket(address) as sock:
            assert _sasl_handshake(sock, "GSSAPI") == 33  # UNSUPPORTED_SASL_MECHANISM
            assert peer_closed(sock.sock, wait=5)
        with KafkaSocket(address) as sock:
            assert authenticate(sock, b"\x00alice\x00alice-secret")[0] == \
                ErrorCode.illegal_sasl_state
            assert peer_closed(sock.sock, wait=5)
        with KafkaSocket(address) as sock:
            assert _sasl_handshake(sock, "PLAIN") == ErrorCode.none
            assert _sasl_handshake(sock, "PLAIN", 3) == ErrorCode.illegal_sasl_state
            assert peer_closed(sock.sock, wait=5)
        wait_until(lambda: broker.metric("broker_connections_closed_total",
                                         listener="SASL_PLAINTEXT",
                                         reason="authentication_failed") == 3)
        broker.wait_for_line(r"SASL from 127\.0\.0\.1: SASL mechanism 'GSSAPI' is not enabled")
