"""Client certificate principals: the subject printed as Java's X500Principal.getName() prints
it (escaped, most specific RDN first), ssl.principal.mapping.rules as Kafka applies them, and
certificates whose subjects try to pass for someone else on a real SSL listener.

Expected strings come from Java 17 (OpenJDK 17.0.15): `new X500Principal(der).getName()` for
the names, `X509Certificate.getSubjectX500Principal().getName()` for whole certificates, and a
transcription of Kafka's SslPrincipalMapper for the rules.  Names and certificates are built
byte by byte (tests/security/subjects.py), so any tag, order or malformation can be tried.
"""

from __future__ import annotations

import base64
import socket
import ssl
import struct

import pytest
import trustme
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.shared.tls import PrincipalRules
from broker.shared.x500 import KEYWORDS, STRING_TAGS, java_utf8, rfc2253, subject_name
from tests.harness import BrokerProcess, wait_until
from tests.security.subjects import (BMP, CN, DC, EMAIL, JAVA_17, ST, STREET, UID, UTF8, L, O, OU,
                                     ava, certificate, name, one, tlv, u)
from tests.wire import api_versions_request, metadata_request, raw_request

# --- unit: the name, against Java ---------------------------------------------------------------

@pytest.mark.parametrize("case", sorted(JAVA_17))
def test_names_print_as_java_17_prints_them(case):
    der, expected = JAVA_17[case]
    if expected is None:
        with pytest.raises(ValueError):
            rfc2253(der)
    else:
        assert rfc2253(der) == expected


def test_truncated_names_are_refused_at_every_cut():
    der = JAVA_17["plain"][0]
    for cut in range(len(der)):
        with pytest.raises(ValueError):
            rfc2253(der[:cut])


def read_rfc2253(text: str) -> list[list[tuple[str, str, bool]]]:
    """Java's output read back: RDNs of (type, value, whether the value is `#` and hex) in
    printed order.  `\\` escapes the next character, `\\00` is NUL (the only hex pair Java
    writes), an unescaped `,` ends an RDN and `+` an attribute, the first unescaped `=` ends a
    type, and an unescaped `#` first in a value makes it hex."""
    rdns: list[list[tuple[str, str, bool]]] = []
    if not text:
        return rdns
    avas, kind, chars, hexed, position = [], None, [], False, 0
    while position <= len(text):
        char = text[position] if position < len(text) else ","
        position += 1
        if char == "\\":
            if text[position:position + 2] == "00":
                chars.append("\x00")
                position += 2
            else:
                chars.append(text[position])
                position += 1
        elif char == "=" and kind is None:
            kind, chars = "".join(chars), []
        elif char == "#" and kind is not None and not chars and not hexed:
            hexed = True
        elif char in ",+":
            avas.append((kind, "".join(chars), hexed))
            kind, chars, hexed = None, [], False
            if char == ",":
                rdns.append(avas)
                avas = []
        else:
            chars.append(char)
    return rdns


def expected_reading(rdns: list[list[tuple[str, int, bytes]]]
                     ) -> list[list[tuple[str, str, bool]]]:
    """What Java's printing of these (oid, tag, contents) RDNs must read back as."""
    reading = []
    for rdn in reversed(rdns):
        avas = []
        for dotted, tag, value in rdn:
            keyword = KEYWORDS.get(dotted)
            if keyword is not None and tag in STRING_TAGS:
                avas.append((keyword, java_utf8(value), False))
            else:
                avas.append((keyword or dotted, tlv(tag, value).hex(), True))
        reading.append(avas)
    return reading


SPECIALS = [",", "+", "=", "\\", '"', "<", ">", ";", "#", " ", "\r", "\x00", "a", "\u00e9",
            "\U0001f600", "\\00", "\\,", "#0c0161"]
_oids = st.sampled_from(sorted(KEYWORDS) + [EMAIL, "2.5.4.5", "1.2.3.4", "2.999.3"]) | st.builds(
    lambda first, second, rest: ".".join(map(str, [first, second, *rest])),
    st.integers(0, 2), st.integers(0, 39), st.lists(st.integers(0, 2 ** 64), max_size=4))
_values = (st.lists(st.sampled_from(SPECIALS), max_size=8).map(lambda parts: u("".join(parts)))
           | st.text(max_size=12).map(u) | st.binary(max_size=12))
_attributes = st.tuples(_oids, st.sampled_from(sorted(STRING_TAGS) + [0x04, 0x1C, 0x1A, 0x02]),
                        _values)
_names = st.lists(st.lists(_attributes, min_size=1, max_size=3), max_size=5)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_names)
def test_any_name_prints_without_raising_and_reads_back_as_it_was(rdns):
    der = name(*([ava(*attribute) for attribute in rdn] for rdn in rdns))
    printed = rfc2253(der)
    assert read_rfc2253(printed) == expected_reading(rdns)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([CN, O, OU, L, ST, STREET, DC, UID, EMAIL]),
                          st.text(min_size=1, max_size=12)), max_size=5))
def test_any_cryptography_name_prints_without_raising(attributes):
    from cryptography import x509
    from cryptography.x509.name import _ASN1Type
    from cryptography.x509.oid import ObjectIdentifier

    built = x509.Name([x509.NameAttribute(ObjectIdentifier(dotted), value, _ASN1Type.UTF8String)
                       for dotted, value in attributes])
    printed = rfc2253(built.public_bytes())
    assert read_rfc2253(printed) == expected_reading(
        [[(dotted, UTF8, u(value))] for dotted, value in attributes])


# --- unit: certificates ------------------------------------------------------------------------

def test_the_subject_is_read_from_the_certificate():
    ca = trustme.CA()
    for case in ("spoof_comma", "multi", "bmp", "email", "plain"):
        der, expected = JAVA_17[case]
        assert subject_name(certificate(ca, der)[0]) == expected
    cert, _key = certificate(ca, JAVA_17["plain"][0])
    for cut in (0, 10, len(cert) // 2):
        with pytest.raises(ValueError):
            subject_name(cert[:cut])


def test_a_certificate_naming_no_one_is_refused():
    from broker.shared.tls import CertificateRefused, certificate_principal

    ca, rules = trustme.CA(), PrincipalRules("RULE:^CN=(admin),O=Corp$/$1/")
    assert certificate_principal(rules, certificate(ca, one((O, UTF8, b"Corp"),
                                                            (CN, UTF8, b"admin")))[0]) == \
        "User:admin"
    with pytest.raises(CertificateRefused, match="no ssl.principal.mapping.rules rule applies "
                                                 "to 'CN=admin'"):
        certificate_principal(rules, certificate(ca, one((CN, UTF8, b"admin")))[0])
    # OpenSSL refuses such certificates before a handshake ends; refused here all the same.
    unreadable = certificate(ca, JAVA_17["oid_not_minimal"][0])[0]
    with pytest.raises(CertificateRefused, match="unreadable client certificate subject"):
        certificate_principal(PrincipalRules("DEFAULT"), unreadable)


# --- unit: the rules, against Kafka --------------------------------------------------------------

# (rules, name, what Kafka's SslPrincipalMapper gives: a user, None for no rule, or
# ValueError where Kafka fails, at start-up here)
KAFKA_RULES = [
    ("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,RULE:^CN=(.*?),OU=(.*?),O=(.*?)$/$1@$2/L, DEFAULT",
     "CN=Alice,OU=Payments,O=Example", "alice@payments"),
    ("RULE:^CN=(.*?),O=Corp$/$1/", "CN=admin\\,OU\\=ServiceUsers,O=Corp",
     "admin\\,OU\\=ServiceUsers"),
    ("RULE:^CN=(.*?),O=Corp$/$1/", "CN=x", None),
    ("RULE:^CN=(.*)$/$1/U", "CN=\u00df", "SS"),
    ("RULE:^CN=(.*)$/$1/L", "CN=\u0130STANBUL", "i\u0307stanbul"),
    ("RULE:(.*)/x$1y$12z$10/", "abc", "xabcyabc2zabc0xy2z0"),
    ("RULE:(a)(b)(c)(d)(e)(f)(g)(h)(i)(j)(k)(l)/$12$13$1$01$0/", "abcdefghijkl",
     "la3aaabcdefghijkl"),
    ("RULE:.*/x/", "abc", "xx"),
    ("RULE:^CN=(.*)\\/x$/$1/", "CN=a/x", "a"),
    ("RULE:^CN=(.*)\\\\/x/", "CN=a\\\\", "x"),
    ("RULE:(a)|(b)/[$1|$2]/", "b", "[|b]"),
    ("RULE:(a)/\\$1/", "a", "$1"),
    ("RULE:(?<n>a)/${n}/", "a", "a"),
    ("  DEFAULT  ,  RULE:a/b/ ", "a", "a"),
    ("RULE:a/b/,,DEFAULT", "c", "c"),
    ("", "a", None),
    ("RULE:^CN=([^,\\\\]*)(\\\\.*)?,O=(.*)$/$1-$3 \\$5 $4 $0/", "CN=a,O=c", ValueError),
    ("RULE:a/$1/", "a", ValueError),
    ("RULE:(a)/$/", "a", ValueError),
    ("RULE:(a)/${n}/", "a", ValueError),
    ("RULE:(a)/a\\/", "a", ValueError),
    ("RULE:a/b/Lx", "a", ValueError),
    ("DEFAULT,RULE:x", "a", ValueError),
    ("RULE:(/x/", "a", ValueError),
]


@pytest.mark.parametrize("rules, subject, expected", KAFKA_RULES)
def test_mapping_rules_give_what_kafka_gives(rules, subject, expected):
    if expected is ValueError:
        with pytest.raises(ValueError):
            PrincipalRules(rules)
    else:
        assert PrincipalRules(rules).user(subject) == expected


# --- real brokers, real clients -------------------------------------------------------------------

ADMIN = one((O, UTF8, u("Corp")), (OU, UTF8, u("ServiceUsers")), (CN, UTF8, u("admin")))
OPS = name([ava(O, UTF8, u("Corp"))], [ava(CN, UTF8, u("ops")), ava(UID, UTF8, u("1"))])
# Subjects that, their names joined without escaping, read as ADMIN's or OPS's, or as what an
# RFC 2253 reader unquotes or decodes into them: (subject, the name Java 17 gives it, the
# principal RULES make of that name).
SPOOFS = {
    "comma": (one((O, UTF8, u("Corp")), (CN, UTF8, u("admin,OU=ServiceUsers"))),
              "CN=admin\\,OU\\=ServiceUsers,O=Corp", "User:CN=admin\\,OU\\=ServiceUsers,O=Corp"),
    "plus": (one((O, UTF8, u("Corp")), (CN, UTF8, u("ops+UID=1"))), "CN=ops\\+UID\\=1,O=Corp",
             "User:CN=ops\\+UID\\=1,O=Corp"),
    "quotes": (one((O, UTF8, u("Corp")), (CN, UTF8, u('"admin",OU="ServiceUsers"'))),
               'CN=\\"admin\\"\\,OU\\=\\"ServiceUsers\\",O=Corp',
               'User:CN=\\"admin\\"\\,OU\\=\\"ServiceUsers\\",O=Corp'),
    "backslash": (one((O, UTF8, u("Corp")), (OU, UTF8, u("ServiceUsers")),
                      (CN, UTF8, u("admin\\"))), "CN=admin\\\\,OU=ServiceUsers,O=Corp",
                  "User:admin\\\\"),
    "hash": (one((O, UTF8, u("Corp")), (OU, UTF8, u("ServiceUsers")),
                 (CN, UTF8, u("#0c0561646d696e"))), "CN=\\#0c0561646d696e,OU=ServiceUsers,O=Corp",
             "User:\\#0c0561646d696e"),
    "spaces": (one((O, UTF8, u("Corp")), (OU, UTF8, u("ServiceUsers")), (CN, UTF8, u(" admin "))),
               "CN=\\ admin\\ ,OU=ServiceUsers,O=Corp", "User:\\ admin\\ "),
    "bmp": (one((O, UTF8, u("Corp")), (OU, UTF8, u("ServiceUsers")),
                (CN, BMP, "admin".encode("utf-16-be"))),
            "CN=\\00a\\00d\\00m\\00i\\00n,OU=ServiceUsers,O=Corp",
            "User:\\00a\\00d\\00m\\00i\\00n"),
}
RULES = "RULE:^CN=([^,+]*),OU=ServiceUsers,O=Corp$/$1/,DEFAULT"


def test_each_spoof_has_the_name_java_gives_and_the_principal_kafka_maps_it_to():
    rules = PrincipalRules(RULES)
    for der, printed, principal in SPOOFS.values():
        assert rfc2253(der) == printed
        assert "User:" + rules.user(printed) == principal


@pytest.fixture(scope="module")
def pems(pki, tmp_path_factory) -> dict[str, str]:
    """The test CA's and the broker's PEM files, and a client certificate for each subject."""
    directory = tmp_path_factory.mktemp("principals")
    paths = {"ca": pki["ca"], "server": pki["server"]}
    subjects = {"admin": ADMIN, "ops": OPS, "nobody": one((CN, UTF8, u("nobody")))}
    subjects.update({key: der for key, (der, _name, _principal) in SPOOFS.items()})
    for serial, (key, subject) in enumerate(subjects.items(), start=2):
        paths[key] = _write_pem(directory / f"{key}.pem", *certificate(pki.ca, subject, serial))
    return paths


def _write_pem(path, cert: bytes, key) -> str:
    from cryptography.hazmat.primitives import serialization

    body = base64.encodebytes(cert).decode().replace("\n", "")
    lines = [body[index:index + 64] for index in range(0, len(body), 64)]
    pem = "-----BEGIN CERTIFICATE-----\n" + "\n".join(lines) + "\n-----END CERTIFICATE-----\n"
    path.write_text(pem + key.private_bytes(serialization.Encoding.PEM,
                                            serialization.PrivateFormat.PKCS8,
                                            serialization.NoEncryption()).decode())
    return str(path)


def mutual_tls(pems, **extra) -> dict[str, str]:
    return {"listeners": "SSL://127.0.0.1:0", "inter.broker.listener.name": "SSL",
            "ssl.keystore.location": pems["server"], "ssl.client.auth": "required",
            "ssl.truststore.location": pems["ca"], **extra}


def admin_config(broker, pems, who: str) -> dict:
    host, port = broker.listeners["SSL"]
    return {"bootstrap.servers": f"{host}:{port}", "security.protocol": "SSL",
            "ssl.ca.location": pems["ca"], "ssl.certificate.location": pems[who],
            "ssl.key.location": pems[who], "socket.timeout.ms": 5000}


def create_topic_error(config: dict, topic: str) -> str | None:
    """None if the topic was created, else the error's name."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(config)
    try:
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=20)
    except KafkaException as error:
        return error.args[0].name()
    return None


@pytest.mark.system
def test_subjects_made_to_look_like_a_super_user_get_their_own_escaped_principal(pems):
    """ADMIN (CN=admin,OU=ServiceUsers,O=Corp, mapped to `admin`) and OPS (the multi-valued
    CN=ops+UID=1,O=Corp, kept whole) are super users; each spoof is refused CreateTopics and is
    known by the principal Java would give it."""
    overrides = mutual_tls(pems, **{
        "ssl.principal.mapping.rules": RULES,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:admin;User:CN=ops+UID=1,O=Corp"})
    with BrokerProcess(workers=2, overrides=overrides) as broker:
        assert create_topic_error(admin_config(broker, pems, "admin"), "by-admin") is None
        assert create_topic_error(admin_config(broker, pems, "ops"), "by-ops") is None
        for spoof in SPOOFS:
            assert create_topic_error(admin_config(broker, pems, spoof), f"by-{spoof}") == \
                "TOPIC_AUTHORIZATION_FAILED", spoof
        from broker.shared.events import AuthorizationDenied

        expected = {f"by-{spoof}": principal for spoof, (_der, _name, principal)
                    in SPOOFS.items()}

        def denied() -> dict[str, str]:
            return {event.resource: event.principal
                    for event in broker.events(AuthorizationDenied)}

        wait_until(lambda: len(denied()) >= len(expected), timeout=15)
        assert denied() == expected
        assert broker.metric("broker_worker_restarts_total") == 0


def _tls_exchange(address, context: ssl.SSLContext, *requests: bytes) -> list[bytes]:
    """Each request sent once the answer to the one before came (the first the moment the
    handshake ends): the answers, up to where the broker closed."""
    answers = []
    with context.wrap_socket(socket.create_connection(address, timeout=5),
                             server_hostname="127.0.0.1") as sock:
        data = b""
        for request in requests:
            sock.sendall(request)
            try:
                while len(data) < 4 or len(data) < 4 + struct.unpack_from(">i", data)[0]:
                    chunk = sock.recv(65536)
                    if not chunk:
                        return answers
                    data += chunk
            except (ConnectionResetError, ssl.SSLError):
                return answers
            size = 4 + struct.unpack_from(">i", data)[0]
            answers.append(data[:size])
            data = data[size:]
    return answers


def _correlation_ids(answers: list[bytes]) -> list[int]:
    return [struct.unpack_from(">i", answer, 4)[0] for answer in answers]


@pytest.mark.system
def test_a_certificate_no_rule_maps_is_closed_unserved(pems):
    """As Kafka: without DEFAULT, a subject no rule matches names no principal on an SSL
    listener; the connection closes without an answer, even to a request sent the moment the
    handshake ended.  On SASL_SSL, SASL names the principal: the rules do not apply."""
    jaas = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
            'user_alice="alice-secret";')
    overrides = mutual_tls(pems, **{
        "listeners": "SSL://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
        "listener.name.sasl_ssl.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": jaas,
        "ssl.principal.mapping.rules": "RULE:^CN=([^,+]*),OU=ServiceUsers,O=Corp$/$1/"})
    with BrokerProcess(workers=1, overrides=overrides) as broker:
        address = broker.listeners["SSL"]

        def context(who: str) -> ssl.SSLContext:
            made = ssl.create_default_context(cafile=pems["ca"])
            made.load_cert_chain(pems[who])
            return made

        versions = api_versions_request(3, correlation_id=5)
        assert _correlation_ids(_tls_exchange(address, context("admin"), versions)) == [5]
        assert _tls_exchange(address, context("nobody"), versions) == []
        broker.wait_for_line(r"closing connection \d+ from 127\.0\.0\.1:\d+: no "
                             r"ssl\.principal\.mapping\.rules rule applies to 'CN=nobody'")
        assert _tls_exchange(address, context("comma"), versions) == []  # escaped: no rule
        wait_until(lambda: broker.metric("broker_connections_closed_total", listener="SSL",
                                         reason="authentication_failed") == 2)
        assert _correlation_ids(_tls_exchange(address, context("admin"), versions)) == [5]
        token = b"\x00alice\x00alice-secret"
        plain = [raw_request(17, 1, 6, struct.pack(">h", 5) + b"PLAIN"),
                 raw_request(36, 1, 7, struct.pack(">i", len(token)) + token),
                 metadata_request(12, correlation_id=8)]
        assert _correlation_ids(_tls_exchange(broker.listeners["SASL_SSL"], context("nobody"),
                                              *plain)) == [6, 7, 8]
        assert broker.metric("broker_worker_restarts_total") == 0
