"""Helpers of the admission tests, shared with the tests of other components that count
connections: an ApiVersions probe that tells served from refused and closed, and HAProxy's
PROXY headers as a trusted balancer sends them."""

from __future__ import annotations

import socket
import struct

from kio.schema.errors import ErrorCode

from tests.wire import KafkaSocket, api_versions_request, peer_closed

# --- a client connection, served or refused ------------------------------------------------

POLICY_VIOLATION = ErrorCode.policy_violation.to_bytes(2, "big")  # as the wire carries it


class Probe:
    """One client connection: connected, then asked ApiVersions; tells what happened."""

    def __init__(self, address, source: str | None = None, timeout: float = 5.0):
        self.sock = socket.socket()
        self.sock.settimeout(timeout)
        if source is not None:
            self.sock.bind((source, 0))
        self.sock.connect(address)
        self.sock.sendall(api_versions_request(3, correlation_id=1))

    def outcome(self, wait: float) -> str:
        """'served', 'refused' (the answer is POLICY_VIOLATION: over the IP's limit, see
        broker/parent/refusal_answer.py), 'closed' (EOF or reset) or 'pending' after waiting
        `wait` seconds."""
        self.sock.settimeout(wait)
        data = b""
        try:
            while len(data) < 10:  # size, correlation id, error code
                chunk = self.sock.recv(10 - len(data))
                if not chunk:
                    return "closed"
                data += chunk
        except socket.timeout:
            return "pending" if not data else "closed"
        except ConnectionResetError:
            return "closed"
        return "refused" if data[8:10] == POLICY_VIOLATION else "served"

    def request(self, correlation: int = 2) -> bool:
        """Another round trip on a served connection; False if the broker closed it."""
        try:
            self.sock.recv(65536)  # the rest of the first answer, if any
            self.sock.settimeout(5)
            self.sock.sendall(api_versions_request(3, correlation_id=correlation))
            return len(self.sock.recv(8)) == 8
        except OSError:
            return False

    def is_closed(self, wait: float = 2.0) -> bool:
        return peer_closed(self.sock, wait)

    def close(self):
        self.sock.close()


def served_probes(address, count, source=None):
    probes = [Probe(address, source) for _ in range(count)]
    assert [p.outcome(5) for p in probes] == ["served"] * count
    return probes


# --- PROXY protocol headers ------------------------------------------------------------

SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"


def v2(command: int, family: int, addresses: bytes, tlvs: bytes = b"") -> bytes:
    """A v2 header as HAProxy's send-proxy-v2 writes it."""
    body = addresses + tlvs
    return SIGNATURE + bytes([0x20 | command, family]) + struct.pack(">H", len(body)) + body


def tlv(kind: int, value: bytes) -> bytes:
    return bytes([kind]) + struct.pack(">H", len(value)) + value


V2_TCP4 = v2(1, 0x11, socket.inet_aton("198.51.100.9") + socket.inet_aton("10.0.0.1")
             + struct.pack(">HH", 51234, 9092),
             tlv(0x01, b"kafka") + tlv(0x02, b"broker.example") + tlv(0x04, b"\0" * 5))


V2_TCP6 = v2(1, 0x21, socket.inet_pton(socket.AF_INET6, "2001:db8::7")
             + socket.inet_pton(socket.AF_INET6, "2001:db8::1") + struct.pack(">HH", 40000, 9092))


V2_LOCAL = v2(0, 0x00, b"")


BALANCER = "127.0.0.2"  # the only trusted proxy address


def v1_header(ip: str, port: int = 40000) -> bytes:
    family = "TCP6" if ":" in ip else "TCP4"
    return f"PROXY {family} {ip} 127.0.0.1 {port} 9092\r\n".encode()


def v2_header(ip: str, port: int = 40000) -> bytes:
    return v2(1, 0x11, socket.inet_aton(ip) + socket.inet_aton("127.0.0.1")
              + struct.pack(">HH", port, 9092))


def balancer_socket(broker, header: bytes) -> KafkaSocket:
    """A connection from the trusted balancer's address, its header sent."""
    client = KafkaSocket.__new__(KafkaSocket)
    client.sock = socket.create_connection(broker.listeners["PLAINTEXT"], timeout=5,
                                           source_address=(BALANCER, 0))
    client._buffer = b""
    client.send(header)
    return client
