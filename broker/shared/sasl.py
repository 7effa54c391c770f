"""SASL for SASL_PLAINTEXT and SASL_SSL listeners: the settings, PLAIN users from Kafka's JAAS
syntax, and SCRAM credentials as Kafka stores them (salted, never the password).

Per listener, as Kafka's broker reads them:

    listener.name.<l>.sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256   (or sasl.enabled.mechanisms)
    listener.name.<l>.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule \
        required username="admin" password="admin-secret" user_alice="alice-secret";

SCRAM users are created, changed and deleted through AlterUserScramCredentials, which carries
the salted password the client computed (RFC 5802's Hi); the parent keeps the stored key and
server key derived from it (broker.parent.scram) and tells every worker.
"""

from __future__ import annotations

import hashlib
import hmac
import re

import msgspec

SASL_PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SCRAM_HASHES = {"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512}
SCRAM_TYPES = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}  # Kafka's ScramMechanism ids
MIN_ITERATIONS, MAX_ITERATIONS = 4096, 16384  # Kafka's bounds
PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"

_JAAS = re.compile(r'\s*([\w.$]+)\s+(required|requisite|sufficient|optional)\s*(.*?);?\s*',
                   re.DOTALL)
_OPTION = re.compile(r'\s*([\w.-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^\s;]+)')


class SaslSettings(msgspec.Struct, frozen=True):
    """One SASL listener's mechanisms and PLAIN users."""

    listener: str
    mechanisms: tuple[str, ...]
    plain_users: dict[str, str] = {}  # user -> password, from the PLAIN JAAS config


class ScramCredential(msgspec.Struct, frozen=True, array_like=True):
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


def parse_jaas(text: str) -> tuple[str, dict[str, str]]:
    """`Module required key="value" ...;` -> (module, options); ValueError if malformed."""
    match = _JAAS.fullmatch(text)
    if match is None:
        raise ValueError("expected `<LoginModule> required key=\"value\" ...;`")
    options, position, rest = {}, 0, match.group(3)
    while position < len(rest.strip()):
        option = _OPTION.match(rest, position)
        if option is None:
            raise ValueError(f"cannot read the options at {rest[position:].strip()!r}")
        value = option.group(2)
        if value.startswith('"'):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        options[option.group(1)] = value
        position = option.end()
        while position < len(rest) and rest[position].isspace():
            position += 1
    return match.group(1), options


def plain_users(text: str) -> dict[str, str]:
    """The `user_<name>="<password>"` options of a PlainLoginModule JAAS config."""
    module, options = parse_jaas(text)
    if module != PLAIN_MODULE:
        raise ValueError(f"{module} is not {PLAIN_MODULE}")
    users = {key[5:]: value for key, value in options.items() if key.startswith("user_")}
    if not users:
        raise ValueError("no user_<name>=\"<password>\" option: nobody could authenticate")
    return users


def scram_credential(mechanism: str, salt: bytes, salted_password: bytes,
                     iterations: int) -> ScramCredential:
    """What a server keeps of a SCRAM password (RFC 5802): StoredKey = H(HMAC(SaltedPassword,
    "Client Key")) and ServerKey = HMAC(SaltedPassword, "Server Key")."""
    digest = SCRAM_HASHES[mechanism]
    client_key = hmac.new(salted_password, b"Client Key", digest).digest()
    return ScramCredential(salt=salt, stored_key=digest(client_key).digest(),
                           server_key=hmac.new(salted_password, b"Server Key", digest).digest(),
                           iterations=iterations)
