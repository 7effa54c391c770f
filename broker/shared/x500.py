"""A client certificate's subject as the string Kafka maps to a principal: what Java's
`X500Principal.getName()` prints (RFC 2253 form), character for character.

Kafka's SSL principal is `ssl.principal.mapping.rules` applied to that string, and ACLs and
`super.users` name it; a name printed differently would let a certificate pass for another
(`CN=admin,OU=ServiceUsers` unescaped is two attributes).  So the subject is read from the
certificate's own DER, not from a decoded summary, and printed as Java 17 does:

- RDNs most specific first (the reverse of the DER order), joined by `,`; the attributes of a
  multi-valued RDN in their DER order, joined by `+`; an empty RDN prints as nothing.
- Keywords CN, C, L, ST, O, OU, STREET, DC and UID; any other attribute as its dotted OID.
- A dotted-OID attribute, or a value that is not a PrintableString, TeletexString, IA5String,
  GeneralString, BMPString or UTF8String, prints as `#` and the hex of its DER encoding.
- Other values: their bytes read as UTF-8 (Java does so for every one of these types, BMPString
  included), then `,` `=` `+` `<` `>` `#` `;` `"` `\\` escaped with a backslash, NUL as `\\00`,
  and leading and trailing spaces and carriage returns escaped with a backslash.

Malformed DER, and what Java refuses to parse (high tag numbers, indefinite lengths, badly
encoded OIDs, an attribute with extra bytes), raise ValueError: such a certificate names no one.
"""

from __future__ import annotations

import codecs

# Java's keyword table for RFC 2253 output (sun.security.x509.AVAKeyword, rfc2253Compliant).
KEYWORDS = {"2.5.4.3": "CN", "2.5.4.6": "C", "2.5.4.7": "L", "2.5.4.8": "ST", "2.5.4.10": "O",
            "2.5.4.11": "OU", "2.5.4.9": "STREET", "0.9.2342.19200300.100.1.25": "DC",
            "0.9.2342.19200300.100.1.1": "UID"}
# The value tags Java prints as text (AVA.isDerString, non-canonical): PrintableString,
# TeletexString, IA5String, GeneralString, BMPString, UTF8String.
STRING_TAGS = frozenset({0x13, 0x14, 0x16, 0x1B, 0x1E, 0x0C})
_SEQUENCE, _SET, _OID = 0x30, 0x31, 0x06
_MAX_LENGTH_OCTETS = 4  # as Java's DerInputStream
_ESCAPES = {ord(c): "\\" + c for c in ',=+<>#;"\\'} | {0: "\\00"}
_EDGE_SPACES = " \r"


def _java_utf8_replace(error: UnicodeDecodeError) -> tuple[str, int]:
    """Java replaces invalid UTF-8 as Python does (one U+FFFD per maximal invalid part) except
    for an encoded surrogate (ED A0..BF): one U+FFFD for the lead byte, the next and, if it is a
    continuation byte, the one after."""
    data, start = error.object, error.start
    if data[start] == 0xED and start + 1 < len(data) and 0xA0 <= data[start + 1] <= 0xBF:
        third = start + 2 < len(data) and 0x80 <= data[start + 2] <= 0xBF
        return "\ufffd", start + (3 if third else 2)
    return "\ufffd", error.end


_UTF8_ERRORS = "pybroker-java-utf8"
codecs.register_error(_UTF8_ERRORS, _java_utf8_replace)


def java_utf8(data: bytes) -> str:
    """`new String(data, UTF_8)` in Java: malformed input replaced by U+FFFD as Java does."""
    return data.decode("utf-8", _UTF8_ERRORS)


def subject_name(certificate: bytes) -> str:
    """The subject of a DER certificate, as X500Principal.getName() prints it."""
    _tag, start, end = _element(certificate, 0, len(certificate), _SEQUENCE)
    _tag, position, end = _element(certificate, start, end, _SEQUENCE)  # tbsCertificate
    if position < end and certificate[position] == 0xA0:  # [0] version, optional
        position = _element(certificate, position, end)[2]
    for _field in ("serialNumber", "signature", "issuer", "validity"):
        position = _element(certificate, position, end)[2]
    _tag, start, stop = _element(certificate, position, end, _SEQUENCE)
    return _name(certificate, start, stop)


def rfc2253(name: bytes) -> str:
    """A DER-encoded X.500 Name, as X500Principal.getName() prints it."""
    _tag, start, end = _element(name, 0, len(name), _SEQUENCE)
    return _name(name, start, end)


def _name(data: bytes, position: int, end: int) -> str:
    rdns = []
    while position < end:
        _tag, start, position = _element(data, position, end, _SET)
        avas = []
        while start < position:
            _tag, ava_start, start = _element(data, start, position, _SEQUENCE)
            avas.append(_attribute(data, ava_start, start))
        rdns.append("+".join(avas))
    return ",".join(reversed(rdns))


def _attribute(data: bytes, position: int, end: int) -> str:
    _tag, start, position = _element(data, position, end, _OID)
    oid = _dotted(data[start:position])
    tag, start, stop = _element(data, position, end)
    if stop != end:
        raise ValueError("bytes after an attribute's value")
    keyword = KEYWORDS.get(oid)
    if keyword is None or tag not in STRING_TAGS:
        # Java writes the value again: its tag, a minimal length, its contents.
        return f"{keyword or oid}=#{bytes([tag]).hex()}{_length(stop - start).hex()}" \
               f"{data[start:stop].hex()}"
    return f"{keyword}={escape(java_utf8(data[start:stop]))}"


def escape(value: str) -> str:
    """A value's text as Java escapes it in RFC 2253 output."""
    text = value.translate(_ESCAPES)
    stripped = text.lstrip(_EDGE_SPACES)
    core = stripped.rstrip(_EDGE_SPACES)
    if len(core) == len(text):
        return text
    lead, trail = text[:len(text) - len(stripped)], stripped[len(core):]
    return "".join("\\" + c for c in lead) + core + "".join("\\" + c for c in trail)


def _element(data: bytes, position: int, end: int, want: int | None = None
             ) -> tuple[int, int, int]:
    """(tag, start of contents, end of contents) of the DER element at `position`."""
    if position + 2 > end:
        raise ValueError("truncated DER element")
    tag, first = data[position], data[position + 1]
    if tag & 0x1F == 0x1F:
        raise ValueError("high tag number")
    if want is not None and tag != want:
        raise ValueError(f"tag {tag:#04x} where {want:#04x} belongs")
    position += 2
    if first & 0x80:
        count = first & 0x7F
        if count == 0 or count > _MAX_LENGTH_OCTETS:
            raise ValueError("indefinite or oversized DER length")
        if position + count > end:
            raise ValueError("truncated DER length")
        length = int.from_bytes(data[position:position + count], "big")
        position += count
    else:
        length = first
    if position + length > end:
        raise ValueError("DER element longer than what holds it")
    return tag, position, position + length


def _length(size: int) -> bytes:
    if size < 0x80:
        return bytes([size])
    octets = size.to_bytes((size.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(octets)]) + octets


def _dotted(encoded: bytes) -> str:
    """An OID's contents as Java prints them; Java's refusals raise ValueError."""
    if not encoded or encoded[-1] & 0x80:
        raise ValueError("empty or truncated OID")
    arcs, value, fresh = [], 0, True
    for byte in encoded:
        if fresh and byte == 0x80:
            raise ValueError("OID arc with a leading zero septet")
        value = value << 7 | byte & 0x7F
        fresh = not byte & 0x80
        if fresh:
            arcs.append(value)
            value = 0
    first = arcs[0]
    head = [first // 40, first % 40] if first < 80 else [2, first - 80]
    return ".".join(str(arc) for arc in head + arcs[1:])
