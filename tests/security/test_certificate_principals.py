"""Client certificate principals: the subject printed as Java's X500Principal.getName() prints
it (escaped, most specific RDN first), ssl.principal.mapping.rules as Kafka applies them, and
certificates whose subjects try to pass for someone else on a real SSL listener.

Expected strings come from Java 17 (OpenJDK 17.0.15): `new X500Principal(der).getName()` for
the names, `X509Certificate.getSubjectX500Principal().getName()` for whole certificates, and a
transcription of Kafka's SslPrincipalMapper for the rules.  Names and certificates are built
here byte by byte, so any tag, order or malformation can be tried.
"""

from __future__ import annotations

import base64
import datetime
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
from tests.wire import api_versions_request, metadata_request, raw_request

# --- DER, by hand ------------------------------------------------------------------------------


def _length(size: int) -> bytes:
    if size < 0x80:
        return bytes([size])
    octets = size.to_bytes((size.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(octets)]) + octets


def tlv(tag: int, body: bytes) -> bytes:
    return bytes([tag]) + _length(len(body)) + body


def oid(dotted: str) -> bytes:
    arcs = [int(part) for part in dotted.split(".")]
    out = bytearray()
    for arc in [arcs[0] * 40 + arcs[1]] + arcs[2:]:
        septets = [arc & 0x7F]
        while arc > 0x7F:
            arc >>= 7
            septets.append(0x80 | arc & 0x7F)
        out += bytes(reversed(septets))
    return tlv(0x06, bytes(out))


def ava(attribute: str | bytes, tag: int | None, value: bytes) -> bytes:
    """One attribute: a dotted OID (or its raw TLV), and the value's tag and contents (tag
    None: `value` is the raw TLV)."""
    kind = oid(attribute) if isinstance(attribute, str) else attribute
    return tlv(0x30, kind + (value if tag is None else tlv(tag, value)))


def name(*rdns: list[bytes]) -> bytes:
    """RDNs in DER order (least specific first), each a list of encoded attributes."""
    return tlv(0x30, b"".join(tlv(0x31, b"".join(rdn)) for rdn in rdns))


def one(*attributes: tuple) -> bytes:
    """A name of single-valued RDNs, in DER order."""
    return name(*([ava(*attribute)] for attribute in attributes))


CN, O, OU, C, L, ST, STREET = ("2.5.4.3", "2.5.4.10", "2.5.4.11", "2.5.4.6", "2.5.4.7",
                               "2.5.4.8", "2.5.4.9")
DC, UID, EMAIL = "0.9.2342.19200300.100.1.25", "0.9.2342.19200300.100.1.1", \
    "1.2.840.113549.1.9.1"
UTF8, PRINTABLE, T61, IA5, BMP, UNIVERSAL, VISIBLE, GENERAL = 12, 19, 20, 22, 30, 28, 26, 27


def u(text: str) -> bytes:
    return text.encode()


# (name, what Java 17's X500Principal.getName() prints; None: Java refuses to parse it)
JAVA_17 = {
    "spoof_comma": (one((O, UTF8, u("Corp")), (CN, UTF8, u("admin,OU=ServiceUsers"))),
                    "CN=admin\\,OU\\=ServiceUsers,O=Corp"),
    "plain": (one((C, PRINTABLE, b"US"), (ST, UTF8, u("CA")), (L, UTF8, u("SF")),
                  (O, UTF8, u("Example")), (OU, UTF8, u("Payments")), (CN, UTF8, u("alice"))),
              "CN=alice,OU=Payments,O=Example,L=SF,ST=CA,C=US"),
    "plus": (one((O, UTF8, u("Corp")), (CN, UTF8, u("a+OU=b"))), "CN=a\\+OU\\=b,O=Corp"),
    "backslash": (one((CN, UTF8, u("a\\b"))), "CN=a\\\\b"),
    "backslash_comma": (one((O, UTF8, u("Corp")), (CN, UTF8, u("admin\\,OU=x"))),
                        "CN=admin\\\\\\,OU\\=x,O=Corp"),
    "quotes": (one((CN, UTF8, u('"admin"'))), 'CN=\\"admin\\"'),
    "hash_lead": (one((CN, UTF8, u("#admin"))), "CN=\\#admin"),
    "hash_mid": (one((CN, UTF8, u("a#b"))), "CN=a\\#b"),
    "hash_only": (one((CN, UTF8, u("#"))), "CN=\\#"),
    "spaces": (one((CN, UTF8, u(" admin "))), "CN=\\ admin\\ "),
    "two_spaces": (one((CN, UTF8, u("  a  "))), "CN=\\ \\ a\\ \\ "),
    "only_space": (one((CN, UTF8, u(" "))), "CN=\\ "),
    "only_spaces": (one((CN, UTF8, u("   "))), "CN=\\ \\ \\ "),
    "space_hash": (one((CN, UTF8, u(" #a"))), "CN=\\ \\#a"),
    "hash_after_space": (one((CN, UTF8, u("a #b "))), "CN=a \\#b\\ "),
    "lt_gt_semi": (one((CN, UTF8, u("<a>;b"))), "CN=\\<a\\>\\;b"),
    "equals": (one((CN, UTF8, u("a=b"))), "CN=a\\=b"),
    "plus_lead": (one((CN, UTF8, u("+a"))), "CN=\\+a"),
    "comma_only": (one((CN, UTF8, u(","))), "CN=\\,"),
    "escape_like": (one((CN, UTF8, u("\\2C"))), "CN=\\\\2C"),
    "trailing_backslash_space": (one((CN, UTF8, u("a\\ "))), "CN=a\\\\\\ "),
    "empty": (one((CN, UTF8, b"")), "CN="),
    "nul": (one((CN, UTF8, b"a\x00b")), "CN=a\\00b"),
    "lead_nul": (one((CN, UTF8, b"\x00 a \x00")), "CN=\\00 a \\00"),
    "space_nul_space": (one((CN, UTF8, b" \x00 ")), "CN=\\ \\00\\ "),
    "controls": (one((CN, UTF8, b"a\tb\nc\x7fd\x1b")), "CN=a\tb\nc\x7fd\x1b"),
    "cr": (one((CN, UTF8, b"\ra\r")), "CN=\\\ra\\\r"),
    "cr_only": (one((CN, UTF8, b"\r")), "CN=\\\r"),
    "ws_cr_mix": (one((CN, UTF8, b" \r a \r ")), "CN=\\ \\\r\\ a\\ \\\r\\ "),
    "tab_edges": (one((CN, UTF8, b"\ta\t")), "CN=\ta\t"),
    "nbsp": (one((CN, UTF8, u("\u00a0a\u00a0"))), "CN=\u00a0a\u00a0"),
    "zero_width": (one((CN, UTF8, u("ad\u200bmin"))), "CN=ad\u200bmin"),
    "ascii_other": (one((CN, UTF8, u("a&*@!$%^_|~`{}[]b'()?:/.-"))),
                    "CN=a&*@!$%^_|~`{}[]b'()?:/.-"),
    "unicode": (one((O, UTF8, u("J\u00fcrgen & S\u00f6hne")),
                    (CN, UTF8, u("\u540d\u524d\U0001f600"))),
                "CN=\u540d\u524d\U0001f600,O=J\u00fcrgen & S\u00f6hne"),
    "multi": (name([ava(O, UTF8, u("Corp"))], [ava(CN, UTF8, u("alice")), ava(UID, UTF8, u("42"))]),
              "CN=alice+UID=42,O=Corp"),
    "multi_unsorted": (name([ava(UID, UTF8, u("42")), ava(CN, UTF8, u("alice"))]),
                       "UID=42+CN=alice"),
    "multi_three": (name([ava(OU, UTF8, u("b")), ava(CN, UTF8, u("a+b")), ava(O, UTF8, u("c"))]),
                    "OU=b+CN=a\\+b+O=c"),
    "dup_avas": (name([ava(CN, UTF8, b"a"), ava(CN, UTF8, b"a")]), "CN=a+CN=a"),
    "nested_rdn_list": (one((CN, UTF8, b"a"), (CN, UTF8, b"b"), (CN, UTF8, b"c")),
                        "CN=c,CN=b,CN=a"),
    "keywords": (one((DC, IA5, b"com"), (DC, IA5, b"example"), (STREET, UTF8, u("1 Main St")),
                     (UID, UTF8, u("alice")), (CN, UTF8, u("alice"))),
                 "CN=alice,UID=alice,STREET=1 Main St,DC=example,DC=com"),
    "country_utf8": (one((C, UTF8, u("U,S"))), "C=U\\,S"),
    "state": (one((ST, UTF8, b"x")), "ST=x"),
    "dc_printable": (one((DC, PRINTABLE, b"com")), "DC=com"),
    "ia5_dc": (one((DC, IA5, b"Ex,A")), "DC=Ex\\,A"),
    "uid_printable": (one((UID, PRINTABLE, b"u1")), "UID=u1"),
    "email": (one((CN, UTF8, u("alice")), (EMAIL, IA5, b"alice@example.com")),
              "1.2.840.113549.1.9.1=#1611616c696365406578616d706c652e636f6d,CN=alice"),
    "serial_title": (one(("2.5.4.5", PRINTABLE, b"1234"), ("2.5.4.12", UTF8, u("Boss")),
                         ("2.5.4.42", UTF8, u("Al")), ("2.5.4.4", UTF8, u("Ice")),
                         (CN, UTF8, u("x"))),
                     "CN=x,2.5.4.4=#0c03496365,2.5.4.42=#0c02416c,2.5.4.12=#0c04426f7373,"
                     "2.5.4.5=#130431323334"),
    "unknown_oid": (one(("1.2.3.4", UTF8, u("x,y")), (CN, UTF8, u("a"))),
                    "CN=a,1.2.3.4=#0c03782c79"),
    "big_oid": (one(("1.3.6.1.4.1.99999.4294967296.1", UTF8, u("v"))),
                "1.3.6.1.4.1.99999.4294967296.1=#0c0176"),
    "oid_2_999": (one(("2.999.1", UTF8, b"x")), "2.999.1=#0c0178"),
    "oid_1_39": (one(("1.39.5", UTF8, b"x")), "1.39.5=#0c0178"),
    "oid_0_0": (one(("0.0", UTF8, b"x")), "0.0=#0c0178"),
    "oid_one_octet": (name([ava(b"\x06\x01\x55", UTF8, b"x")]), "2.5=#0c0178"),
    "bitstring": (one(("2.5.4.45", 3, b"\x00\xab")), "2.5.4.45=#030200ab"),
    "hex_upper_bytes": (one(("1.2.3", UTF8, b"\xff\xab")), "1.2.3=#0c02ffab"),
    # BMPString and TeletexString bytes are read as UTF-8, as Java 17 does.
    "bmp": (one((CN, BMP, "admin".encode("utf-16-be"))), "CN=\\00a\\00d\\00m\\00i\\00n"),
    "bmp_unicode": (one((CN, BMP, "J\u00e9".encode("utf-16-be"))), "CN=\\00J\\00\ufffd"),
    "t61_latin": (one((CN, T61, b"caf\xe9")), "CN=caf\ufffd"),
    "t61_ascii": (one((CN, T61, b"cafe,x")), "CN=cafe\\,x"),
    "ia5": (one((CN, IA5, b"a,b")), "CN=a\\,b"),
    "printable": (one((CN, PRINTABLE, b"a+b")), "CN=a\\+b"),
    "general": (one((CN, GENERAL, b"g,s")), "CN=g\\,s"),
    "universal": (one((CN, UNIVERSAL, "ab".encode("utf-32-be"))), "CN=#1c080000006100000062"),
    "visible": (one((CN, VISIBLE, b"vis,ible")), "CN=#1a087669732c69626c65"),
    "octets": (one((CN, 0x04, b"\x01\x02")), "CN=#04020102"),
    "integer": (one((CN, 0x02, b"\x05")), "CN=#020105"),
    "null_value": (one((CN, 0x05, b"")), "CN=#0500"),
    "bool_value": (one((CN, 0x01, b"\xff")), "CN=#0101ff"),
    "sequence_value": (one((CN, 0x30, tlv(UTF8, b"x"))), "CN=#30030c0178"),
    "context_tag": (one((CN, 0x80, b"x")), "CN=#800178"),
    "constructed_utf8": (one((CN, 0x2C, tlv(UTF8, b"x"))), "CN=#2c030c0178"),
    "length_not_minimal": (name([ava(CN, None, b"\x0c\x81\x01x")]), "CN=x"),
    "hex_length_not_minimal": (name([ava(CN, None, b"\x04\x81\x01x")]), "CN=#040178"),
    "utf8_invalid": (one((CN, UTF8, b"a\xe9b")), "CN=a\ufffdb"),
    "utf8_surrogate": (one((CN, UTF8, b"a\xed\xa0\x80b")), "CN=a\ufffdb"),
    "utf8_truncated": (one((CN, UTF8, b"a\xf0\x9f\x98")), "CN=a\ufffd"),
    "utf8_overlong": (one((CN, UTF8, b"a\xc0\x80b\xc1\xbf")), "CN=a\ufffd\ufffdb\ufffd\ufffd"),
    "utf8_f5": (one((CN, UTF8, b"\xf5\x80\x80\x80x\xff")), "CN=\ufffd\ufffd\ufffd\ufffdx\ufffd"),
    "utf8_mixed": (one((CN, UTF8, b"\xe2\x82x\xe2\x28\xa1\xf0\x90\x28\xbc")),
                   "CN=\ufffdx\ufffd(\ufffd\ufffd(\ufffd"),
    "utf8_replacement_char": (one((CN, UTF8, u("\ufffd"))), "CN=\ufffd"),
    "long": (one((CN, UTF8, b"x" * 300)), "CN=" + "x" * 300),
    "empty_name": (tlv(0x30, b""), ""),
    "empty_rdn": (tlv(0x30, tlv(0x31, b"")), ""),
    "empty_rdn_first": (name([], [ava(CN, UTF8, b"a")]), "CN=a,"),
    "empty_rdn_last": (name([ava(CN, UTF8, b"a")], []), ",CN=a"),
    "empty_rdn_mid": (name([ava(CN, UTF8, b"a")], [], [ava(O, UTF8, b"b")]), "O=b,,CN=a"),
    "bytes_after_the_name": (one((CN, UTF8, b"a")) + b"\x00", "CN=a"),
    # What Java refuses to parse.
    "extra_value": (name([ava(CN, None, tlv(UTF8, b"a") + tlv(UTF8, b"b"))]), None),
    "high_tag_number": (name([ava(CN, None, b"\x1f\x21\x01x")]), None),
    "indefinite_length": (name([ava(CN, None, b"\x0c\x80x\x00\x00")]), None),
    "oid_not_minimal": (name([ava(b"\x06\x03\x55\x80\x03", UTF8, b"x")]), None),
    "oid_empty": (name([ava(b"\x06\x00", UTF8, b"x")]), None),
    "oid_truncated": (name([ava(b"\x06\x02\x55\x84", UTF8, b"x")]), None),
    "attribute_without_value": (name([tlv(0x30, oid(CN))]), None),
    "attribute_not_a_sequence": (name([tlv(0x31, oid(CN) + tlv(UTF8, b"x"))]), None),
    "rdn_not_a_set": (tlv(0x30, tlv(0x30, ava(CN, UTF8, b"x"))), None),
    "bytes_after_an_attribute": (tlv(0x30, tlv(0x31, ava(CN, UTF8, b"a") + b"\x05")), None),
}


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

ECDSA_SHA256 = tlv(0x30, oid("1.2.840.10045.4.3.2"))


def certificate(ca: trustme.CA, subject: bytes, serial: int = 0x1234) -> tuple[bytes, object]:
    """A client certificate with exactly this subject, signed by `ca`: (DER, private key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    issuer = x509.load_pem_x509_certificate(ca.cert_pem.bytes()).subject.public_bytes()
    now = datetime.datetime.now(datetime.timezone.utc)
    yesterday = (now - datetime.timedelta(days=1)).strftime("%y%m%d%H%M%SZ")
    validity = tlv(0x30, tlv(0x17, u(yesterday)) + tlv(0x18, b"20991231235959Z"))
    public = key.public_key().public_bytes(serialization.Encoding.DER,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    number = tlv(0x02, serial.to_bytes(serial.bit_length() // 8 + 1, "big"))  # positive, minimal
    tbs = tlv(0x30, tlv(0xA0, tlv(0x02, b"\x02")) + number + ECDSA_SHA256 + issuer + validity
              + subject + public)
    signer = serialization.load_pem_private_key(ca.private_key_pem.bytes(), password=None)
    signature = signer.sign(tbs, ec.ECDSA(hashes.SHA256()))
    return tlv(0x30, tbs + ECDSA_SHA256 + tlv(0x03, b"\x00" + signature)), key


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
