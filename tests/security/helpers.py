"""Helpers of the security tests, shared with the other components' tests that need a SASL,
TLS or ACL broker: the listeners' settings, PLAIN users, raw SASL exchanges, TLS clients and
ACLs through confluent-kafka's admin client."""

from __future__ import annotations

import socket
import ssl
import struct

from tests.wire import KafkaSocket, api_versions_request, raw_request

# --- SASL ----------------------------------------------------------------------------------

# PLAIN users of the SASL tests' listeners.
SASL_JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
             'username="admin" password="admin-secret" user_admin="admin-secret" '
             'user_alice="alice-secret";')


def sasl_broker(pki, **extra) -> dict[str, str]:
    """PLAINTEXT for the admin client, SASL_PLAINTEXT and SASL_SSL for the tests."""
    settings = {
        "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,"
                     "SASL_SSL://127.0.0.1:0",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": SASL_JAAS,
        "listener.name.sasl_ssl.plain.sasl.jaas.config": SASL_JAAS,
        "ssl.keystore.location": pki["server"],
        # A group's first member joins at once (Kafka waits 3 s for more): these tests are
        # about who may connect, not about the join delay.
        "group.initial.rebalance.delay.ms": "0",
    }
    settings.update(extra)
    return settings


def kafka_string(text: str) -> bytes:
    """A Kafka STRING: int16 length, then the bytes."""
    return struct.pack(">h", len(text)) + text.encode()


def authenticate(sock: KafkaSocket, token: bytes) -> tuple[int, bytes]:
    """SaslAuthenticate v1: (error code, body after it)."""
    sock.send(raw_request(36, 1, 3, struct.pack(">i", len(token)) + token))
    body = sock.receive()
    return struct.unpack_from(">h", body, 4)[0], body


def plain_session(address, user: str, password: str) -> tuple[KafkaSocket, int, bytes]:
    """A raw connection that authenticated (or tried to) with PLAIN: (socket, code, body)."""
    sock = KafkaSocket(address)
    sock.send(raw_request(17, 1, 2, kafka_string("PLAIN")))
    sock.receive()
    code, body = authenticate(sock, f"\x00{user}\x00{password}".encode())
    return sock, code, body


def add_scram_user(bootstrap: str, user: str, password: str, mechanism: str) -> None:
    from confluent_kafka.admin import (AdminClient, ScramCredentialInfo, ScramMechanism,
                                       UserScramCredentialUpsertion)

    admin = AdminClient({"bootstrap.servers": bootstrap})
    kind = getattr(ScramMechanism, mechanism.replace("-", "_"))
    futures = admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
        user, ScramCredentialInfo(kind, 4096), password.encode())])
    for future in futures.values():
        future.result(timeout=20)


# --- ACLs ----------------------------------------------------------------------------------

STANDARD = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
# PLAIN users of the ACL tests' listeners: each user's password is "<user>-secret".
ACL_JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
            'username="admin" password="admin-secret" user_admin="admin-secret" '
            'user_alice="alice-secret" user_bob="bob-secret" user_ops="ops-secret";')


def client(broker, user: str, listener: str = "SASL_PLAINTEXT", **extra) -> dict:
    """confluent-kafka's config of `user` (an ACL_JAAS user) on a SASL_PLAINTEXT listener."""
    host, port = broker.listeners[listener]
    return {"bootstrap.servers": f"{host}:{port}", "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN", "sasl.username": user, "sasl.password": f"{user}-secret",
            **extra}


def create_acls(config: dict, *bindings) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(config)
    for future in admin.create_acls(list(bindings)).values():
        future.result(timeout=20)


def binding(kind: str, name: str, pattern: str, principal: str, operation: str,
            permission: str = "ALLOW"):
    from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType,
                                       ResourcePatternType, ResourceType)

    return AclBinding(ResourceType[kind], name, ResourcePatternType[pattern], principal, "*",
                      AclOperation[operation], AclPermissionType[permission])


# --- TLS -----------------------------------------------------------------------------------

TLS_ONLY = {"listeners": "SSL://127.0.0.1:0", "inter.broker.listener.name": "SSL"}


def tls_settings(pki, **extra) -> dict[str, str]:
    return dict(TLS_ONLY, **{"ssl.keystore.location": pki["server"]}, **extra)


def client_context(pki, cert: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=pki["ca"])
    if cert is not None:
        context.load_cert_chain(pki[cert])
    return context


def tls_api_versions(address, context: ssl.SSLContext) -> int:
    """One ApiVersions over TLS; returns the correlation id answered."""
    with socket.create_connection(address, timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
            sock.sendall(api_versions_request(3, correlation_id=7))
            data = b""
            while len(data) < 8:
                chunk = sock.recv(65536)
                if not chunk:
                    raise ConnectionError("closed")
                data += chunk
            return struct.unpack_from(">i", data, 4)[0]
