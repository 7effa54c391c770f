"""The PROXY protocol header reader (broker/parent/proxy_header.py): HAProxy's v1 and v2
formats, byte by byte, health checks, bounds and garbage; trusted proxy addresses."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.parent.proxy_header import (V1_MAX_BYTES, ProxyHeader, ProxyHeaderError,
                                        TrustedProxies, parse)
from tests.admission.helpers import SIGNATURE, V2_LOCAL, V2_TCP4, V2_TCP6, tlv, v2

KAFKA = b"\x00\x00\x00\x15\x00\x12\x00\x03"  # the client's first bytes, after the header


@pytest.mark.parametrize("header, client", [
    (b"PROXY TCP4 192.0.2.7 10.0.0.1 40000 9092\r\n", ("192.0.2.7", 40000)),
    (b"PROXY TCP6 2001:db8::7 2001:db8::1 40000 9092\r\n", ("2001:db8::7", 40000)),
    (b"PROXY UNKNOWN\r\n", None),  # HAProxy's v1 health check
    (b"PROXY UNKNOWN ffff:f...f:ffff ffff:f...f:ffff 65535 65535\r\n", None),
    (V2_TCP4, ("198.51.100.9", 51234)),
    (V2_TCP6, ("2001:db8::7", 40000)),
    (V2_LOCAL, None),  # v2 health check: the proxy's own connection
])
def test_haproxy_headers_give_the_client_and_leave_the_kafka_bytes(header, client):
    assert parse(header + KAFKA) == ProxyHeader(len(header), client)
    for cut in range(len(header)):  # arriving a byte at a time: incomplete until whole
        assert parse(header[:cut]) is None
    assert parse(header) == ProxyHeader(len(header), client)


@pytest.mark.parametrize("data", [
    KAFKA,  # a client speaking Kafka where a PROXY header is required
    b"PROXX TCP4",
    b"GET / HTTP/1.1\r\n",
    b"PROXY TCP4 192.0.2.7 10.0.0.1 40000\r\n",  # a field missing
    b"PROXY TCP4 192.0.2.999 10.0.0.1 40000 9092\r\n",
    b"PROXY " + b"9" * V1_MAX_BYTES,  # no line end within the longest v1 line
    SIGNATURE + b"\x31\x11\x00\x0c" + b"\0" * 12,  # version 3
    v2(1, 0x11, b"\0" * 4),  # shorter than its addresses
    SIGNATURE + b"\x21\x11\xff\xff",  # 65,535 bytes claimed: past the bound, never waited for
])
def test_anything_else_is_refused(data):
    with pytest.raises(ProxyHeaderError):
        parse(data)


def test_a_v2_header_past_the_callers_bound_is_refused_before_it_arrives():
    header = v2(1, 0x11, b"\0" * 12, tlv(0x02, b"x" * 600))
    assert parse(header, max_v2_bytes=1024) == ProxyHeader(len(header), ("0.0.0.0", 0))
    with pytest.raises(ProxyHeaderError):
        parse(header[:16], max_v2_bytes=512)


def test_only_trusted_proxies_are_believed():
    trusted = TrustedProxies(["10.0.0.0/8", " 2001:db8::/32", ""])
    assert trusted.trusts("10.1.2.3") and trusted.trusts("::ffff:10.1.2.3")
    assert trusted.trusts("2001:db8::42")
    assert not trusted.trusts("192.0.2.1") and not trusted.trusts("not an ip")
    assert not TrustedProxies([]).trusts("127.0.0.1")
    with pytest.raises(ValueError, match="not a CIDR"):
        TrustedProxies(["10.0.0.0/33"])


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.binary(max_size=300),
                 st.binary(max_size=120).map(lambda tail: SIGNATURE + tail),
                 st.binary(max_size=120).map(lambda tail: b"PROXY " + tail)))
def test_any_bytes_give_a_header_more_to_wait_for_or_a_refusal(data):
    try:
        header = parse(data)
    except ProxyHeaderError:
        return
    assert header is None or 0 < header.length <= len(data)
