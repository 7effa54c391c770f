"""X.500 names and client certificates built byte by byte (so any tag, order or malformation
can be tried), and what Java 17 prints for each name: the cases of the certificate principal
tests, and the seeds of the `names` fuzz target.

Expected strings come from Java 17 (OpenJDK 17.0.15): `new X500Principal(der).getName()`.
"""

from __future__ import annotations

import datetime

import trustme

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



# --- certificates ------------------------------------------------------------------------------

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
