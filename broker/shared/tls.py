"""TLS for SSL listeners: Kafka's `ssl.*` keys resolved per listener, the server context built
from them, and the principal a client certificate maps to.

Each key may be set broker-wide (`ssl.keystore.location`) or for one listener
(`listener.name.<lower-case name>.ssl.keystore.location`), which wins, as in Kafka.  The parent
builds every listener's context once while loading the config, so a bad key stops start-up
with one line naming it; each worker builds its own from the same settings (an SSLContext
does not cross processes) and does the handshakes, after the fd hand-off.

Key stores: PEM (a file holding the private key and the certificate chain, or both inline in
`ssl.keystore.key` and `ssl.keystore.certificate.chain`; `ssl.key.password` for an encrypted
key) and PKCS12 (`ssl.keystore.password`, through the `cryptography` package).  Trust stores:
PEM, as a file or inline.  JKS, Kafka's default type, is Java's own format and is refused.
"""

from __future__ import annotations

import os
import re
import ssl
import tempfile

import msgspec

from broker.shared.x500 import subject_name

# The keys, as Kafka names them, that may be set per listener.
TLS_KEYS = ("ssl.keystore.type", "ssl.keystore.location", "ssl.keystore.password",
            "ssl.keystore.key", "ssl.keystore.certificate.chain", "ssl.key.password",
            "ssl.truststore.type", "ssl.truststore.location", "ssl.truststore.certificates",
            "ssl.client.auth", "ssl.enabled.protocols", "ssl.cipher.suites",
            "ssl.principal.mapping.rules")
TLS_PROTOCOLS = ("SSL", "SASL_SSL")
# Never shown by DescribeConfigs (Kafka's PASSWORD type: value null, is_sensitive true).
SECRET_KEYS = frozenset({"ssl.keystore.password", "ssl.key.password", "ssl.keystore.key",
                         "pybroker.upstream.sasl.password"})
ANONYMOUS = "User:ANONYMOUS"

_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
_CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL,
                "required": ssl.CERT_REQUIRED}


class TlsConfigError(ValueError):
    """A TLS setting that cannot be used; `key` is the full key to name."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key


class TlsSettings(msgspec.Struct, frozen=True):
    """One listener's TLS keys, resolved (listener prefix over broker-wide over default)."""

    listener: str
    values: dict[str, str]  # key (without the listener prefix) -> value, set ones only
    prefixed: frozenset[str] = frozenset()  # the keys given with the listener prefix

    def get(self, key: str, default: str = "") -> str:
        return self.values.get(key, default)

    def name_of(self, key: str) -> str:
        """The key as the operator wrote it, for error lines."""
        if key in self.prefixed:
            return f"listener.name.{self.listener.lower()}.{key}"
        return key


def server_context(settings: TlsSettings) -> ssl.SSLContext:
    """The server SSLContext of one listener; TlsConfigError names the key at fault."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _protocols(context, settings)
    _keystore(context, settings)
    _truststore_and_client_auth(context, settings)
    ciphers = settings.get("ssl.cipher.suites")
    if ciphers:
        try:
            context.set_ciphers(":".join(openssl_cipher(name) for name in _csv(ciphers)))
        except (ssl.SSLError, ValueError) as error:
            raise TlsConfigError(settings.name_of("ssl.cipher.suites"),
                                 f"no usable cipher suite in {ciphers!r} ({error})") from None
    return context


def _csv(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def _protocols(context: ssl.SSLContext, settings: TlsSettings) -> None:
    names = _csv(settings.get("ssl.enabled.protocols", "TLSv1.2,TLSv1.3"))
    unknown = [name for name in names if name not in _VERSIONS]
    if unknown or not names:
        raise TlsConfigError(settings.name_of("ssl.enabled.protocols"),
                             f"{', '.join(unknown) or 'nothing'} is not one of TLSv1.2, TLSv1.3")
    versions = sorted(_VERSIONS[name] for name in names)
    context.minimum_version, context.maximum_version = versions[0], versions[-1]


def _keystore(context: ssl.SSLContext, settings: TlsSettings) -> None:
    kind = settings.get("ssl.keystore.type", "PEM").upper()
    location = settings.get("ssl.keystore.location")
    key, chain = settings.get("ssl.keystore.key"), settings.get("ssl.keystore.certificate.chain")
    if kind not in ("PEM", "PKCS12"):
        raise TlsConfigError(settings.name_of("ssl.keystore.type"),
                             f"{kind} is not supported (PEM or PKCS12)")
    if kind == "PKCS12":
        if not location:
            raise TlsConfigError(settings.name_of("ssl.keystore.location"),
                                 f"required for PKCS12 on listener {settings.listener}")
        key, chain = _pkcs12_as_pem(settings, location)
        _load_pem_chain(context, settings, key + chain, None)
    elif location:
        _load_pem_file(context, settings, location, settings.get("ssl.key.password") or None)
    elif key and chain:
        _load_pem_chain(context, settings, key + "\n" + chain,
                        settings.get("ssl.key.password") or None)
    else:
        missing = "ssl.keystore.certificate.chain" if key else (
            "ssl.keystore.key" if chain else "ssl.keystore.location")
        raise TlsConfigError(settings.name_of(missing),
                             f"required for SSL listener {settings.listener}")


def _load_pem_file(context, settings: TlsSettings, path: str, password: str | None) -> None:
    try:
        context.load_cert_chain(path, password=password)
    except FileNotFoundError:
        raise TlsConfigError(settings.name_of("ssl.keystore.location"),
                             f"{path} does not exist") from None
    except (ssl.SSLError, OSError) as error:
        key = "ssl.key.password" if "password" in str(error).lower() or \
            "decrypt" in str(error).lower() else "ssl.keystore.location"
        raise TlsConfigError(settings.name_of(key),
                             f"cannot load the key and certificates of {path}: {error}") from None


def _load_pem_chain(context, settings: TlsSettings, pem: str, password: str | None) -> None:
    """ssl loads key stores from files only: an inline one goes through a private file that
    lives for the call."""
    with tempfile.TemporaryDirectory(prefix="pybroker-tls-") as directory:
        path = os.path.join(directory, "keystore.pem")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
            handle.write(pem)
        try:
            context.load_cert_chain(path, password=password)
        except (ssl.SSLError, OSError) as error:
            raise TlsConfigError(settings.name_of("ssl.keystore.key"),
                                 f"cannot load the inline key and certificate chain: {error}"
                                 ) from None


def _pkcs12_as_pem(settings: TlsSettings, location: str) -> tuple[str, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.serialization import pkcs12

    password = settings.get("ssl.keystore.password")
    try:
        with open(location, "rb") as handle:
            key, cert, extra = pkcs12.load_key_and_certificates(
                handle.read(), password.encode() if password else None)
    except FileNotFoundError:
        raise TlsConfigError(settings.name_of("ssl.keystore.location"),
                             f"{location} does not exist") from None
    except ValueError as error:
        raise TlsConfigError(settings.name_of("ssl.keystore.password"),
                             f"cannot open {location}: {error}") from None
    if key is None or cert is None:
        raise TlsConfigError(settings.name_of("ssl.keystore.location"),
                             f"{location} holds no private key and certificate")
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    chain = "".join(item.public_bytes(serialization.Encoding.PEM).decode()
                    for item in [cert, *(extra or [])])
    return key_pem, chain


def _truststore_and_client_auth(context: ssl.SSLContext, settings: TlsSettings) -> None:
    auth = settings.get("ssl.client.auth", "none").lower()
    if auth not in _CLIENT_AUTH:
        raise TlsConfigError(settings.name_of("ssl.client.auth"),
                             f"{auth!r} is not one of none, requested, required")
    kind = settings.get("ssl.truststore.type", "PEM").upper()
    location = settings.get("ssl.truststore.location")
    inline = settings.get("ssl.truststore.certificates")
    if (location or inline) and kind != "PEM":
        raise TlsConfigError(settings.name_of("ssl.truststore.type"),
                             f"{kind} is not supported (PEM)")
    try:
        if location:
            context.load_verify_locations(cafile=location)
        elif inline:
            context.load_verify_locations(cadata=inline)
    except (ssl.SSLError, OSError) as error:
        key = "ssl.truststore.location" if location else "ssl.truststore.certificates"
        raise TlsConfigError(settings.name_of(key), f"cannot load trusted certificates: "
                                                    f"{error}") from None
    if auth != "none" and not (location or inline):
        raise TlsConfigError(settings.name_of("ssl.truststore.location"),
                             f"required with ssl.client.auth={auth} on listener "
                             f"{settings.listener}")
    context.verify_mode = _CLIENT_AUTH[auth]


# --- cipher suite names --------------------------------------------------------------------

_KEY_EXCHANGE = {"ECDHE_RSA": "ECDHE-RSA-", "ECDHE_ECDSA": "ECDHE-ECDSA-", "DHE_RSA": "DHE-RSA-",
                 "RSA": ""}
_BULK = {"AES_128_GCM": "AES128-GCM", "AES_256_GCM": "AES256-GCM",
         "CHACHA20_POLY1305": "CHACHA20-POLY1305", "AES_128_CBC": "AES128",
         "AES_256_CBC": "AES256"}


def openssl_cipher(name: str) -> str:
    """Kafka names suites as IANA does (TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256); OpenSSL, which
    does the work, as ECDHE-RSA-AES128-GCM-SHA256.  An OpenSSL name passes as it is."""
    if not name.startswith("TLS_") or "_WITH_" not in name:
        return name
    exchange, _, rest = name[4:].partition("_WITH_")
    for bulk, openssl in _BULK.items():
        if rest.startswith(bulk + "_"):
            mac = rest[len(bulk) + 1:]
            if exchange not in _KEY_EXCHANGE:
                break
            if bulk == "CHACHA20_POLY1305":
                return _KEY_EXCHANGE[exchange] + openssl
            return f"{_KEY_EXCHANGE[exchange]}{openssl}-{mac}"
    raise ValueError(f"unknown cipher suite {name}")


# --- principals ----------------------------------------------------------------------------

# Kafka's own grammar (SslPrincipalMapper): rules split on commas, `\` escapes a character in
# a pattern or a replacement, anything else is an invalid rule.
_RULE = r"(DEFAULT)|RULE:((\\.|[^\\/])*)/((\\.|[^\\/])*)/([LU]?).*?|(.*?)"
_RULE_SPLITTER = re.compile(r"\s*(" + _RULE + r")\s*(,\s*|$)")
_RULE_PARSER = re.compile(_RULE)


class CertificateRefused(ValueError):
    """A verified client certificate that names no principal: its subject cannot be read, or
    no ssl.principal.mapping.rules rule matches it.  Kafka closes such a connection."""


def certificate_principal(rules: PrincipalRules, certificate: bytes) -> str:
    """`User:<name>` of a DER client certificate: its subject as Java prints it (RFC 2253,
    escaped: broker.shared.x500) through the rules; CertificateRefused if it names no one."""
    try:
        subject = subject_name(certificate)
    except ValueError as error:
        raise CertificateRefused(f"unreadable client certificate subject ({error})") from None
    user = rules.user(subject)
    if user is None:
        raise CertificateRefused(f"no ssl.principal.mapping.rules rule applies to {subject!r}")
    return "User:" + user


class PrincipalRules:
    """`ssl.principal.mapping.rules`, as Kafka reads and applies them: `DEFAULT` and
    `RULE:pattern/replacement/[LU]`, the first rule whose pattern matches the whole
    distinguished name gives the user name (`$1` a group, as Java's replaceAll), and no rule
    matching names no one: Kafka closes such a connection."""

    def __init__(self, text: str = "DEFAULT"):
        self.rules: list[_Rule | None] = []  # None is DEFAULT
        for found in _RULE_SPLITTER.finditer(text.strip()):
            rule = found.group(1)
            match = _RULE_PARSER.match(rule)
            if match.end() != len(rule):
                raise ValueError(f"invalid rule {rule!r}")
            if match.group(1) is not None:
                self.rules.append(None)
            elif match.group(2) is not None:
                self.rules.append(_Rule(match.group(2), match.group(4), match.group(6)))

    def user(self, distinguished_name: str) -> str | None:
        """The user name the first matching rule gives; None when no rule matches."""
        for rule in self.rules:
            if rule is None:
                return distinguished_name
            name = rule.apply(distinguished_name)
            if name is not None:
                return name
        return None


class _Rule:
    """One `RULE:pattern/replacement/[LU]`: the pattern in Java's syntax (named groups
    `(?<name>...)` included), the replacement as Java's replaceAll reads it after Kafka made
    references past the last group literal; a replacement Java would refuse on every match is
    refused here, once."""

    def __init__(self, pattern: str, replacement: str, case: str):
        try:
            self.pattern = re.compile(_JAVA_NAMED_GROUP.sub(
                lambda m: f"(?P<{m.group(1)}>" if m.group(1) else m.group(0), pattern))
        except re.error as error:
            raise ValueError(f"invalid pattern {pattern!r}: {error}") from None
        self.parts = _java_replacement(_literal_back_references(replacement, self.pattern.groups),
                                       self.pattern)
        self.case = case

    def apply(self, distinguished_name: str) -> str | None:
        if self.pattern.fullmatch(distinguished_name) is None:
            return None
        name = self.pattern.sub(self._expand, distinguished_name)
        return name.lower() if self.case == "L" else name.upper() if self.case == "U" else name

    def _expand(self, match: re.Match) -> str:
        return "".join(part if type(part) is str else match.group(part) or ""
                       for part in self.parts)


_JAVA_NAMED_GROUP = re.compile(r"\\.|\(\?<([A-Za-z][A-Za-z0-9]*)>", re.DOTALL)
_BACK_REFERENCE = re.compile(r"\$([0-9]+)")
_DIGITS = "0123456789"


def _literal_back_references(text: str, groups: int) -> str:
    """Kafka's escapeLiteralBackReferences, as it is: `$n` past the last group (n shortened
    digit by digit while above it) gets a backslash, the positions found in the text as
    given even after an insertion has shifted them."""
    if groups == 0:
        return text
    value = text
    for found in _BACK_REFERENCE.finditer(text):
        digits = found.group(1)
        if digits.startswith("0"):
            continue
        number = int(digits)
        while number > groups and number >= 10:
            number //= 10
        if number > groups:
            start = found.start(1)
            value = value[:start - 1] + "\\" + value[start - 1:]
    return value


def _java_replacement(text: str, pattern: re.Pattern) -> list[str | int]:
    """Literal text and group numbers (`$n`, `${name}`) of a Java replacement string;
    ValueError where Java's appendReplacement would throw."""
    parts, literal, position = [], [], 0
    while position < len(text):
        char = text[position]
        if char == "\\":
            if position + 1 == len(text):
                raise ValueError(f"replacement {text!r} ends with a lone backslash")
            literal.append(text[position + 1])
            position += 2
        elif char == "$":
            group, position = _group_reference(text, position + 1, pattern)
            parts += ["".join(literal), group]
            literal = []
        else:
            literal.append(char)
            position += 1
    parts.append("".join(literal))
    return [part for part in parts if part != ""]


def _group_reference(text: str, position: int, pattern: re.Pattern) -> tuple[int, int]:
    """(group, position after it) of the reference after a `$`: `{name}`, or as many digits
    as still name a group, as Java reads it."""
    if text.startswith("{", position):
        close = text.find("}", position)
        name = text[position + 1:close] if close > 0 else ""
        if name not in pattern.groupindex:
            raise ValueError(f"replacement {text!r}: no group named {name!r}")
        return pattern.groupindex[name], close + 1
    groups = pattern.groups
    if position == len(text) or text[position] not in _DIGITS or int(text[position]) > groups:
        raise ValueError(f"replacement {text!r}: {text[position - 1:]!r} names no group of "
                         f"{pattern.pattern!r}")
    group, position = int(text[position]), position + 1
    while position < len(text) and text[position] in _DIGITS \
            and group * 10 + int(text[position]) <= groups:
        group, position = group * 10 + int(text[position]), position + 1
    return group, position
