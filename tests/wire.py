"""Raw Kafka wire helpers for tests: requests encoded by kafka-python, responses decoded by kio."""

from __future__ import annotations

import socket
import struct

from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from kio.index import load_response_schema
from kio.serial import entity_reader


def api_versions_request(version: int = 3, correlation_id: int = 1, client_id: str = "test") -> bytes:
    """A size-prefixed ApiVersions request frame."""
    if version >= 3:
        request = ApiVersionsRequest[version](client_software_name="pybroker-tests",
                                              client_software_version="1.0")
    else:
        request = ApiVersionsRequest[version]()
    request.with_header(correlation_id=correlation_id, client_id=client_id)
    return frame(bytes(request.encode(header=True)))


def metadata_request(version: int = 12, correlation_id: int = 1, topics=None) -> bytes:
    topic = MetadataRequest.MetadataRequestTopic
    fields = {"topic_id": None} if version >= 10 else {}
    request = MetadataRequest[version](
        topics=None if topics is None else [topic(name=name, **fields) for name in topics],
        allow_auto_topic_creation=False, include_topic_authorized_operations=False,
        include_cluster_authorized_operations=False)
    request.with_header(correlation_id=correlation_id, client_id="test")
    return frame(bytes(request.encode(header=True)))


def raw_request(api_key: int, api_version: int, correlation_id: int, rest: bytes = b"") -> bytes:
    """A frame with a v1 request header (client id 'raw') followed by `rest`."""
    header = struct.pack(">hhih", api_key, api_version, correlation_id, 3) + b"raw"
    return frame(header + rest)


def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def decode_response(api_key: int, version: int, body: bytes):
    """(correlation id, response entity) from a response frame body (no size prefix)."""
    cls = load_response_schema(api_key, version)
    header, offset = entity_reader(cls.__header_schema__)(body, 0)
    response, _ = entity_reader(cls)(body, offset)
    return header.correlation_id, response


class KafkaSocket:
    """A blocking client socket speaking size-prefixed frames."""

    def __init__(self, address: tuple[str, int], timeout: float = 5.0):
        self.sock = socket.create_connection(address, timeout=timeout)
        self._buffer = b""

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _read(self) -> bytes:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed by the broker")
        return chunk

    def receive(self) -> bytes:
        """One response frame body (without the size prefix)."""
        while len(self._buffer) < 4:
            self._buffer += self._read()
        size = struct.unpack_from(">i", self._buffer)[0]
        while len(self._buffer) < 4 + size:
            self._buffer += self._read()
        body, self._buffer = self._buffer[4:4 + size], self._buffer[4 + size:]
        return body

    def is_closed_by_peer(self) -> bool:
        """True once the broker has closed the connection (EOF or reset) within the timeout."""
        try:
            while True:
                if not self.sock.recv(65536):
                    return True
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False
