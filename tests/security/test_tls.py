"""SSL listeners: Kafka's ssl.* keys, handshakes in the workers, client
certificates mapped to principals, and the plaintext/TLS mix-ups named in the log.

Certificates are made at test time with trustme; the clients are confluent-kafka, kafka-python
and Python's own ssl module speaking raw Kafka frames.
"""

from __future__ import annotations

import glob
import os
import socket
import ssl
import struct
import subprocess
import sys
import time

import pytest
import trustme

from broker.shared.config import ConfigError, load_config
from broker.shared.events import ConnectionClosed, decode_line
from broker.shared.tls import PrincipalRules, openssl_cipher
from tests.harness import BrokerProcess, check_system_marker, wait_until
from tests.security.helpers import TLS_ONLY, client_context, tls_api_versions, tls_settings
from tests.wire import api_versions_request, peer_closed


def closed_count(broker, reason: str, listener: str = "SSL") -> float:
    return broker.metric("broker_connections_closed_total", listener=listener, reason=reason)


# --- unit: rules, names, config --------------------------------------------------------------

def test_principal_mapping_rules_follow_kafkas_syntax():
    rules = PrincipalRules("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,"
                           "RULE:^CN=(.*?),OU=(.*?),O=(.*?)$/$1@$2/L, DEFAULT")
    assert rules.user("CN=Kafka,OU=ServiceUsers,O=Example") == "Kafka"
    assert rules.user("CN=Alice,OU=Payments,O=Example") == "alice@payments"
    assert rules.user("CN=bob,O=Example") == "CN=bob,O=Example"  # DEFAULT: the whole name
    assert PrincipalRules("RULE:^CN=(.*)$/$1/U").user("CN=eve") == "EVE"
    assert PrincipalRules("RULE:^CN=(.*)$/$1/").user("O=x") is None  # no rule: no one
    with pytest.raises(ValueError):
        PrincipalRules("RULE:no-slashes")


def test_iana_cipher_names_become_openssl_names():
    assert openssl_cipher("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256") == "ECDHE-RSA-AES128-GCM-SHA256"
    assert openssl_cipher("TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256") == \
        "ECDHE-ECDSA-CHACHA20-POLY1305"
    assert openssl_cipher("TLS_RSA_WITH_AES_256_CBC_SHA256") == "AES256-SHA256"
    assert openssl_cipher("ECDHE-RSA-AES256-GCM-SHA384") == "ECDHE-RSA-AES256-GCM-SHA384"


@pytest.mark.parametrize("extra, message", [
    ({}, "ssl.keystore.location: required for SSL listener SSL"),
    ({"ssl.keystore.type": "JKS", "ssl.keystore.location": "x.jks"},
     "ssl.keystore.type: JKS is not supported (PEM or PKCS12)"),
    ({"listener.name.ssl.ssl.keystore.location": "/nonexistent.pem"},
     "listener.name.ssl.ssl.keystore.location: /nonexistent.pem does not exist"),
    ({"ssl.keystore.key": "-----BEGIN PRIVATE KEY-----"},
     "ssl.keystore.certificate.chain: required for SSL listener SSL"),
    ({"SERVER": True, "ssl.client.auth": "required"},
     "ssl.truststore.location: required with ssl.client.auth=required on listener SSL"),
    ({"SERVER": True, "ssl.client.auth": "sometimes"},
     "ssl.client.auth: 'sometimes' is not one of none, requested, required"),
    ({"SERVER": True, "ssl.enabled.protocols": "TLSv1.1"},
     "ssl.enabled.protocols: TLSv1.1 is not one of TLSv1.2, TLSv1.3"),
    ({"SERVER": True, "ssl.cipher.suites": "TLS_NOT_A_SUITE_WITH_NOTHING_SHA"},
     "ssl.cipher.suites: no usable cipher suite"),
    ({"SERVER": True, "ssl.principal.mapping.rules": "RULE:broken"},
     "ssl.principal.mapping.rules: invalid rule"),
    ({"SERVER": True, "ssl.principal.mapping.rules": "RULE:(/x/"},
     "ssl.principal.mapping.rules: invalid pattern '('"),
    ({"SERVER": True, "ssl.principal.mapping.rules": "RULE:CN=x/$1/"},
     "ssl.principal.mapping.rules: replacement '$1'"),
    ({"SERVER": True, "listener.name.plaintext.ssl.client.auth": "required"},
     "listener.name.plaintext.ssl.*: listener PLAINTEXT is not in listeners"),
])
def test_bad_tls_settings_name_the_key(pki, tmp_path, extra, message):
    raw = dict(TLS_ONLY, **{"log.dirs": str(tmp_path)})
    if extra.pop("SERVER", False):
        raw["ssl.keystore.location"] = pki["server"]
    raw.update(extra)
    with pytest.raises(ConfigError) as caught:
        load_config(raw)
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.system
def test_a_bad_tls_setting_stops_start_up_with_one_line(tmp_path):
    check_system_marker()
    done = subprocess.run([sys.executable, "-m", "broker", "--override", "listeners=SSL://:0",
                           "--override", f"log.dirs={tmp_path}"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert done.stderr.strip() == ("config error: ssl.keystore.location: required for SSL "
                                   "listener SSL")


# --- real brokers, real clients -------------------------------------------------------------

@pytest.mark.system
def test_confluent_kafka_and_kafka_python_produce_and_consume_over_ssl(pki):
    from confluent_kafka import Consumer, Producer
    from kafka import KafkaProducer

    # The group forms without Kafka's 3 s wait for more members: TLS is under test, not it.
    overrides = tls_settings(pki, **{"group.initial.rebalance.delay.ms": "0"})
    with BrokerProcess(workers=2, overrides=overrides) as broker:
        host, port = broker.listeners["SSL"]
        common = {"bootstrap.servers": f"{host}:{port}", "security.protocol": "SSL",
                  "ssl.ca.location": pki["ca"]}
        producer = Producer(dict(common, **{"enable.idempotence": True}))
        for index in range(200):
            producer.produce("secure", value=f"record-{index}".encode())
        assert producer.flush(30) == 0
        legacy = KafkaProducer(bootstrap_servers=f"{host}:{port}", security_protocol="SSL",
                               ssl_cafile=pki["ca"], ssl_check_hostname=True)
        for index in range(200, 250):
            legacy.send("secure", f"record-{index}".encode())
        legacy.flush(30)
        legacy.close()
        consumer = Consumer(dict(common, **{"group.id": "tls", "auto.offset.reset": "earliest"}))
        consumer.subscribe(["secure"])
        seen = set()
        deadline = time.monotonic() + 30
        while len(seen) < 250 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                seen.add(message.value())
        consumer.close()
        assert seen == {f"record-{index}".encode() for index in range(250)}
        assert broker.metric("broker_worker_restarts_total") == 0


@pytest.mark.system
def test_inline_encrypted_key_and_pkcs12_key_stores(pki, tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.serialization import pkcs12

    server = pki.server_cert
    key = serialization.load_pem_private_key(server.private_key_pem.bytes(), password=None)
    encrypted = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.BestAvailableEncryption(b"s3cret")).decode()
    chain = "".join(blob.bytes().decode() for blob in server.cert_chain_pems)
    inline = dict(TLS_ONLY, **{"ssl.keystore.key": encrypted,
                               "ssl.keystore.certificate.chain": chain,
                               "ssl.key.password": "s3cret"})
    with BrokerProcess(workers=1, overrides=inline) as broker:
        assert tls_api_versions(broker.listeners["SSL"], client_context(pki)) == 7
        from confluent_kafka.admin import AdminClient, ConfigResource

        host, port = broker.listeners["SSL"]
        admin = AdminClient({"bootstrap.servers": f"{host}:{port}", "security.protocol": "SSL",
                             "ssl.ca.location": pki["ca"]})
        entries = admin.describe_configs([ConfigResource("broker", "0")])
        configs = next(iter(entries.values())).result(timeout=20)
        # Never shown: Kafka declares all three PASSWORD, the certificate chain too.
        for secret in ("ssl.keystore.key", "ssl.key.password", "ssl.keystore.certificate.chain"):
            assert configs[secret].value is None and configs[secret].is_sensitive
    from cryptography import x509

    bundle = pkcs12.serialize_key_and_certificates(
        b"broker", key, x509.load_pem_x509_certificate(server.cert_chain_pems[0].bytes()), None,
        serialization.BestAvailableEncryption(b"p12pass"))
    path = tmp_path / "broker.p12"
    path.write_bytes(bundle)
    p12 = dict(TLS_ONLY, **{"ssl.keystore.type": "PKCS12", "ssl.keystore.location": str(path),
                            "ssl.keystore.password": "p12pass"})
    with BrokerProcess(workers=1, overrides=p12) as broker:
        assert tls_api_versions(broker.listeners["SSL"], client_context(pki)) == 7
    wrong = dict(p12, **{"ssl.keystore.password": "nope"})
    with pytest.raises(ConfigError, match="^ssl.keystore.password: cannot open"):
        load_config(dict(wrong, **{"log.dirs": str(tmp_path)}))


@pytest.mark.system
def test_mutual_tls_maps_the_client_certificate_to_its_principal(pki):
    overrides = tls_settings(pki, **{
        "listener.name.ssl.ssl.client.auth": "required",
        "ssl.truststore.location": pki["ca"],
        "ssl.principal.mapping.rules": "RULE:^CN=([a-z]+),OU=.*$/$1/U,DEFAULT",
        "pybroker.max.connections.per.user.overrides": "ALICE:1",
        "connection.failed.authentication.delay.ms": "500"})
    with BrokerProcess(workers=2, overrides=overrides) as broker:
        address = broker.listeners["SSL"]
        assert tls_api_versions(address, client_context(pki, "alice")) == 7
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            tls_api_versions(address, client_context(pki))  # no certificate: refused
        wait_until(lambda: closed_count(broker, "tls_handshake_failed") == 1)
        events_dir = os.path.join(broker.data_dir, "pybroker-events")

        def principals():
            found = []
            for path in glob.glob(os.path.join(events_dir, "*.jsonl")):
                with open(path, "rb") as handle:
                    found += [event.principal for event in map(decode_line, handle)
                              if isinstance(event, ConnectionClosed)]
            return found

        wait_until(lambda: "User:ALICE" in principals(), timeout=10)
        # The per-principal limit (ALICE:1) holds for certificate principals too: a second
        # connection as ALICE completes its handshake, is never read, and closes after the delay.
        wait_until(lambda: broker.metric("broker_connections", listener="SSL") == 0)
        with client_context(pki, "alice").wrap_socket(socket.create_connection(
                address, timeout=5), server_hostname="127.0.0.1") as held:
            held.sendall(api_versions_request(3, correlation_id=8))
            assert len(held.recv(65536)) > 8  # admitted, served
            with client_context(pki, "alice").wrap_socket(socket.create_connection(
                    address, timeout=5), server_hostname="127.0.0.1") as second:
                second.sendall(api_versions_request(3, correlation_id=9))
                started = time.monotonic()
                assert read_to_end(second, wait=5) == b""  # no answer, then closed
                assert time.monotonic() - started >= 0.3
            wait_until(lambda: closed_count(broker, "per_user_limit") == 1)
            assert broker.metric("broker_connections_rejected_total", listener="SSL",
                                 reason="per_user_limit") == 1
            held.sendall(api_versions_request(3, correlation_id=10))
            assert len(held.recv(65536)) > 8  # the one counted keeps being served
        assert broker.metric("broker_worker_restarts_total") == 0


def read_to_end(sock, wait: float) -> bytes:
    """Everything the peer sends until it closes (TLS: a reset or an EOF counts as closed)."""
    sock.settimeout(wait)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (ConnectionResetError, ssl.SSLEOFError, ssl.SSLZeroReturnError):
        pass
    return data


@pytest.mark.system
def test_a_stalled_handshake_is_closed_at_its_deadline_without_holding_the_acceptor(pki):
    overrides = tls_settings(pki, **{"pybroker.ssl.handshake.timeout.ms": "3000",
                                     "pybroker.handoff.queue.size": "2"})
    with BrokerProcess(workers=1, overrides=overrides) as broker:
        address = broker.listeners["SSL"]
        silent = [socket.create_connection(address, timeout=5) for _ in range(6)]
        # Six sockets saying nothing, three times the hand-off queue: new clients still get in.
        started = time.monotonic()
        assert tls_api_versions(address, client_context(pki)) == 7
        assert time.monotonic() - started < 1.5
        for sock in silent:
            assert peer_closed(sock, wait=8)
            sock.close()
        assert time.monotonic() - started > 2  # closed at the deadline, not before
        wait_until(lambda: closed_count(broker, "tls_handshake_timeout") == 6, timeout=3,
                   message=broker.scrape())


@pytest.mark.system
def test_plaintext_and_tls_mixed_up_are_named_in_the_log(pki):
    overrides = {"listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
                 "ssl.keystore.location": pki["server"]}
    with BrokerProcess(workers=1, overrides=overrides) as broker:
        with socket.create_connection(broker.listeners["SSL"], timeout=5) as sock:
            sock.sendall(api_versions_request(3))  # a Kafka request where a ClientHello belongs
            assert peer_closed(sock, wait=5)
        broker.wait_for_line(r"TLS handshake failed .*the client spoke plaintext to a TLS "
                             r"listener")
        wait_until(lambda: closed_count(broker, "tls_handshake_failed") == 1)
        with socket.create_connection(broker.listeners["PLAINTEXT"], timeout=5) as raw:
            with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
                with client_context(pki).wrap_socket(raw, server_hostname="127.0.0.1"):
                    pass
        broker.wait_for_line(r"frame size 3692\d+ larger than socket.request.max.bytes .*"
                             r"the client speaks SSL to a plaintext listener")
        assert broker.metric("broker_invalid_requests_total", reason="size_too_large") == 1


@pytest.mark.system
def test_tls_with_the_memory_pool_serves_large_requests_and_returns_every_byte(pki):
    from confluent_kafka import Producer

    overrides = tls_settings(pki, **{"queued.max.request.bytes": str(8 << 20),
                                     "socket.request.max.bytes": str(4 << 20)})
    with BrokerProcess(workers=2, overrides=overrides) as broker:
        host, port = broker.listeners["SSL"]
        producer = Producer({"bootstrap.servers": f"{host}:{port}", "security.protocol": "SSL",
                             "ssl.ca.location": pki["ca"],
                             "message.max.bytes": 2 << 20, "linger.ms": 5})
        for _ in range(40):
            producer.produce("big", value=b"x" * 900_000)
        assert producer.flush(60) == 0
        wait_until(lambda: broker.metric("broker_request_memory_used_bytes") == 0)
        assert broker.metric("broker_worker_restarts_total") == 0


@pytest.mark.system
def test_a_certificate_rotated_on_sighup_serves_new_handshakes_and_keeps_open_connections(
        pki, tmp_path):
    import signal

    keystore = tmp_path / "broker.pem"
    keystore.write_bytes(open(pki["server"], "rb").read())
    with BrokerProcess(workers=2, overrides=dict(TLS_ONLY, **{
            "ssl.keystore.location": str(keystore)})) as broker:
        address = broker.listeners["SSL"]
        raw = socket.create_connection(address, timeout=5)
        kept = client_context(pki).wrap_socket(raw, server_hostname="127.0.0.1")
        kept.sendall(api_versions_request(3, correlation_id=1))
        assert kept.recv(65536)
        other_ca = trustme.CA()
        other_ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(
            str(keystore))
        mark = len(broker.lines)
        os.kill(broker.pid, signal.SIGHUP)
        for worker in ("data-0", "data-1"):
            broker.wait_for_line(rf"worker {worker}: new certificates for SSL", start=mark)
        renewed = ssl.create_default_context(cadata=other_ca.cert_pem.bytes().decode())
        assert tls_api_versions(address, renewed) == 7
        with pytest.raises(ssl.SSLError):
            tls_api_versions(address, client_context(pki))  # the old CA no longer vouches
        kept.sendall(api_versions_request(3, correlation_id=2))  # opened before: still served
        data = b""
        while len(data) < 8:
            data += kept.recv(65536)
        assert struct.unpack_from(">i", data, 4)[0] == 2
        kept.close()


@pytest.mark.system
def test_a_key_store_altered_through_the_admin_api_is_used_checked_and_kept(pki, tmp_path):
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    other_ca = trustme.CA()
    renewed_path = tmp_path / "renewed.pem"
    other_ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(
        str(renewed_path))
    renewed = ssl.create_default_context(cadata=other_ca.cert_pem.bytes().decode())
    data_dir = str(tmp_path / "data")
    overrides = dict(tls_settings(pki), listeners="SSL://127.0.0.1:0,PLAINTEXT://127.0.0.1:0",
                     **{"inter.broker.listener.name": "PLAINTEXT"})

    def alter(admin, path: str):
        resource = ConfigResource("broker", "0", incremental_configs=[ConfigEntry(
            "listener.name.ssl.ssl.keystore.location", path,
            incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([resource])[resource].result(timeout=20)

    with BrokerProcess(workers=2, overrides=overrides, data_dir=data_dir) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        with pytest.raises(KafkaException, match="does not exist"):
            alter(admin, str(tmp_path / "missing.pem"))  # checked before it is kept
        assert tls_api_versions(broker.listeners["SSL"], client_context(pki)) == 7
        alter(admin, str(renewed_path))
        wait_until(lambda: _answers(broker.listeners["SSL"], renewed))
        with pytest.raises(ssl.SSLError):
            tls_api_versions(broker.listeners["SSL"], client_context(pki))
    with BrokerProcess(workers=1, overrides=overrides, data_dir=data_dir) as broker:
        assert tls_api_versions(broker.listeners["SSL"], renewed) == 7  # kept across a restart


def _answers(address, context) -> bool:
    try:
        return tls_api_versions(address, context) == 7
    except (ssl.SSLError, OSError):
        return False
