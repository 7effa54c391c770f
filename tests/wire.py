"""Raw Kafka wire helpers for tests: requests encoded by kafka-python, responses decoded by kio."""

from __future__ import annotations

import socket
import struct

from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader

from broker.shared.protocol.codec import build, encode_entity


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


def request(api_key: int, version: int, values: dict, client_id: str = "test") -> bytes:
    """A request (header and body, no size) encoded by kio from its values, correlation id 7."""
    cls = load_request_schema(api_key, version)
    header = build(cls.__header_schema__, {"request_api_key": api_key, "request_api_version":
                                           version, "correlation_id": 7, "client_id": client_id})
    return encode_entity(header) + encode_entity(build(cls, values))


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

    def __init__(self, address: tuple[str, int], timeout: float = 5.0, source: str | None = None):
        self.sock = socket.create_connection(address, timeout=timeout,
                                             source_address=None if source is None else (source, 0))
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
        return peer_closed(self.sock)


def peer_closed(sock: socket.socket, wait: float | None = None) -> bool:
    """Read until EOF or reset (True) or until the socket's timeout, or `wait`, runs out."""
    if wait is not None:
        sock.settimeout(wait)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def produce_request(topic: str, records: bytes, partition: int = 0, acks: int = 1,
                    correlation_id: int = 1, version: int = 9) -> bytes:
    from kafka.protocol.producer.produce import ProduceRequest

    data = ProduceRequest.TopicProduceData
    request = ProduceRequest[version](transactional_id=None, acks=acks, timeout_ms=5000, topic_data=[
        data(name=topic, partition_data=[data.PartitionProduceData(index=partition,
                                                                    records=records)])])
    request.with_header(correlation_id=correlation_id, client_id="test")
    return frame(bytes(request.encode(header=True)))


def fetch_request(topic: str, offset: int = 0, partition: int = 0, max_wait_ms: int = 0,
                  min_bytes: int = 1, correlation_id: int = 1, version: int = 12) -> bytes:
    from kafka.protocol.consumer.fetch import FetchRequest

    topic_entry = FetchRequest.FetchTopic
    request = FetchRequest[version](
        replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=1 << 20,
        isolation_level=0, session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="",
        topics=[topic_entry(topic=topic, partitions=[topic_entry.FetchPartition(
            partition=partition, current_leader_epoch=-1, fetch_offset=offset,
            last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)])])
    request.with_header(correlation_id=correlation_id, client_id="test")
    return frame(bytes(request.encode(header=True)))


def produce_errors(body: bytes, version: int = 9) -> list[tuple[int, int]]:
    """[(error code, base offset)] of every partition in a Produce response frame body."""
    _, response = decode_response(0, version, body)
    return [(int(p.error_code), p.base_offset) for topic in response.responses
            for p in topic.partition_responses]


def produce_batch(client: KafkaSocket, topic: str, batch: bytes,
                  correlation_id: int = 1) -> tuple[int, int]:
    """Produce one batch to partition 0 of `topic`: (error code, base offset)."""
    client.send(produce_request(topic, batch, correlation_id=correlation_id))
    (answer,) = produce_errors(client.receive())
    return answer


def create_topic(bootstrap: str, name: str, partitions: int = 1) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    finally:
        admin.close()


def alter_client_quota(address, entity: dict, key: str, value: float, remove: bool = False) -> int:
    """AlterClientQuotas for one entity ({'client-id': 'x'}, {'user': None}, ...); error code."""
    from kafka.protocol.admin.client_quotas import AlterClientQuotasRequest

    entry = AlterClientQuotasRequest.EntryData
    request = AlterClientQuotasRequest[1](validate_only=False, entries=[entry(
        entity=[entry.EntityData(entity_type=kind, entity_name=name) for kind, name in entity.items()],
        ops=[entry.OpData(key=key, value=float(value), remove=remove)])])
    request.with_header(correlation_id=1, client_id="test-admin")
    with KafkaSocket(address) as client:
        client.send(frame(bytes(request.encode(header=True))))
        _, response = decode_response(49, 1, client.receive())
    return int(response.entries[0].error_code)


def alter_raw(address, resource_name, key, value, operation=0) -> int:
    """IncrementalAlterConfigs on a BROKER resource, as bytes on the wire (clients refuse "")."""
    from kafka.protocol.admin.configs import IncrementalAlterConfigsRequest

    resource = IncrementalAlterConfigsRequest.AlterConfigsResource
    request = IncrementalAlterConfigsRequest[1](validate_only=False, resources=[resource(
        resource_type=4, resource_name=resource_name,
        configs=[resource.AlterableConfig(name=key, config_operation=operation, value=value)])])
    request.with_header(correlation_id=1, client_id="test")
    with KafkaSocket(address) as client:
        client.send(frame(bytes(request.encode(header=True))))
        _, response = decode_response(44, 1, client.receive())
    return int(response.responses[0].error_code)


def describe_configs_request(keys=("max.connections",), correlation_id: int = 1,
                             broker: str = "0", documentation: bool = False) -> bytes:
    """DescribeConfigs v4 of this broker's resource, for the given keys."""
    from kafka.protocol.admin.configs import DescribeConfigsRequest

    resource = DescribeConfigsRequest.DescribeConfigsResource
    request = DescribeConfigsRequest[4](resources=[resource(
        resource_type=4, resource_name=broker, configuration_keys=list(keys))],
        include_synonyms=False, include_documentation=documentation)
    request.with_header(correlation_id=correlation_id, client_id="test")
    return frame(bytes(request.encode(header=True)))
