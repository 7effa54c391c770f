"""The PROXY protocol header (HAProxy's v1 text line and v2 binary block) that a load balancer
sends before a client's first Kafka bytes: how many bytes it takes, and whose address it
carries.

Framing and bounds are ours (a header is at most `V1_MAX_BYTES`, or 16 bytes plus a length
capped by the caller, so a client cannot make the reader wait for or hold more); the fields are
parsed by the `proxy-protocol` library, given exactly the header's bytes.

A header from the proxy's own health checks (v2 LOCAL, v1 UNKNOWN) carries no client: the
connection is the proxy's, and its own address stands.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

from proxyprotocol import ProxyProtocolIncompleteError
from proxyprotocol.detect import ProxyProtocolDetect

V1_PREFIX = b"PROXY "
V1_MAX_BYTES = 107  # the specification's longest v1 line, CRLF included
V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
V2_FIXED_BYTES = 16  # signature, version and command, family, length
_PARSER = ProxyProtocolDetect()


class ProxyHeaderError(ValueError):
    """What the connection sent first is not a PROXY header this listener accepts."""


@dataclass(frozen=True)
class ProxyHeader:
    length: int  # bytes the header took: the client's Kafka bytes start after them
    client: tuple[str, int] | None  # the original client's (ip, port); None: the proxy's own


def header_length(data: bytes, max_v2_bytes: int) -> int | None:
    """How many bytes the header at the start of `data` takes; None while more must come."""
    if not data:
        return None
    if data[:1] == V1_PREFIX[:1]:
        if data[:len(V1_PREFIX)] != V1_PREFIX[:len(data)]:
            raise ProxyHeaderError("no PROXY protocol signature")
        end = data.find(b"\r\n", 0, V1_MAX_BYTES)
        if end >= 0:
            return end + 2
        if len(data) >= V1_MAX_BYTES:
            raise ProxyHeaderError(f"a v1 header longer than {V1_MAX_BYTES} bytes")
        return None
    if data[:len(V2_SIGNATURE)] != V2_SIGNATURE[:len(data)]:
        raise ProxyHeaderError("no PROXY protocol signature")
    if len(data) < V2_FIXED_BYTES:
        return None
    length = V2_FIXED_BYTES + struct.unpack_from(">H", data, 14)[0]
    if length > max_v2_bytes:
        raise ProxyHeaderError(f"a v2 header of {length} bytes (at most {max_v2_bytes})")
    return length if len(data) >= length else None


def parse(data: bytes, max_v2_bytes: int = 2048) -> ProxyHeader | None:
    """The header at the start of `data`, or None while it is incomplete; raises
    ProxyHeaderError for anything else (the connection is to be closed)."""
    length = header_length(data, max_v2_bytes)
    if length is None:
        return None
    try:
        result = _PARSER.unpack(bytes(data[:length]))
    except ProxyProtocolIncompleteError:
        raise ProxyHeaderError("a PROXY header shorter than it says") from None
    except (ValueError, struct.error, IndexError) as error:  # the library's syntax and
        raise ProxyHeaderError(f"a malformed PROXY header: {error}") from None  # size errors
    if not result.proxied or not isinstance(result.source, tuple):
        return ProxyHeader(length, None)  # LOCAL / UNKNOWN: a health check of the proxy
    address, port = result.source
    return ProxyHeader(length, (str(address), int(port)))


class TrustedProxies:
    """The addresses whose PROXY headers are believed (CIDRs, IPv4 and IPv6)."""

    def __init__(self, cidrs: list[str]):
        try:
            self.networks = tuple(ipaddress.ip_network(cidr.strip(), strict=False)
                                  for cidr in cidrs if cidr.strip())
        except ValueError as error:
            raise ValueError(f"not a CIDR: {error}") from None

    def trusts(self, ip: str) -> bool:
        try:
            address = ipaddress.ip_address(ip)
        except ValueError:
            return False
        if address.version == 6 and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in network for network in self.networks)
