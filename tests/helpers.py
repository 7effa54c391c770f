"""Helpers shared by the test modules, each defined here once.

What lives where:
- tests/harness.py: the broker subprocess (`BrokerProcess`), `wait_until`, process memory.
- tests/wire.py: raw Kafka requests and responses on a socket (`KafkaSocket`, frames, decoding).
- tests/batches.py, tests/raw_batches.py: record batches built by hand.
- tests/conftest.py: the shared fixtures (`pki`, `block`, `default_broker`, `broker`); a
  component's own in its conftest.py (tests/observability: the session's Spark).
- tests/<component>/helpers.py: what that component's tests share (and lend to others).
- here: a free port, the test PKI, topics and records through real clients, raw requests to a
  running broker (`ask`, `stable_group`, `timed_create_topic`, `produce_acked`,
  `new_producers`), and fakes of a worker's collaborators for a `Connection` without a broker
  (`make_router`, `FakeTransport`, `FakeWorker`, `connect`, `feed`).
"""

from __future__ import annotations

import datetime
import socket
import struct
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from crc32c import crc32c
from kio.schema.errors import ErrorCode

from broker.shared.apis import QUEUED_WHILE_FORWARDED
from broker.shared.config import load_config
from broker.shared.log.settings import LogSettings
from broker.shared.log.topics import Epoch, TopicRegistry
from tests.batches import make_batch
from tests.wire import (KafkaSocket, decode_response, frame, produce_errors, produce_request,
                        request)
from workers.apis import Services, build_apis
from workers.backpressure import RequestQueue
from workers.connection import Connection
from workers.fetch_sessions import FetchSessionCache
from workers.frame_maps import FrameMaps
from workers.router import BrokerView, Router


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def node_port_base(node_ids, tries: int = 200) -> int:
    """A front-end's pybroker.frontend.node.port.base whose ports for these upstream node ids
    were all free a moment ago (a random base, so two front-ends rarely meet)."""
    import random

    for _ in range(tries):
        base = random.randrange(20000, 60000)
        held = []
        try:
            for node_id in node_ids:
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", base + node_id))
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
        return base
    raise RuntimeError(f"no free ports for nodes {list(node_ids)} in {tries} tries")


# --- the test PKI --------------------------------------------------------------------------

class Pki:
    """A trustme CA and PEM files written to `directory`: "ca", "server" (the broker's key and
    certificate for 127.0.0.1 and localhost) and "alice" (a client's, CN=alice,
    OU=Payments, O=Example); `pki[name]` is a file's path."""

    def __init__(self, directory: Path):
        import trustme

        self.directory = directory
        self.ca = trustme.CA()
        self.server_cert = self.ca.issue_cert("127.0.0.1", "localhost")
        alice = self.ca.issue_cert("alice@example.com", common_name="alice",
                                   organization_name="Example", organization_unit_name="Payments")
        self.paths = {name: str(directory / f"{name}.pem") for name in ("ca", "server", "alice")}
        self.ca.cert_pem.write_to_path(self.paths["ca"])
        self.server_cert.private_key_and_cert_chain_pem.write_to_path(self.paths["server"])
        alice.private_key_and_cert_chain_pem.write_to_path(self.paths["alice"])

    def __getitem__(self, name: str) -> str:
        return self.paths[name]


# --- topics and records through real clients -------------------------------------------------

def create_topics(client: dict | str, *names: str, partitions: int = 1,
                  timeout: float = 20) -> None:
    """Create each topic (replication factor 1) with confluent-kafka's admin client and wait
    for it; `client` is the client's config or a bootstrap address.  An error raises."""
    from confluent_kafka.admin import AdminClient, NewTopic

    config = {"bootstrap.servers": client} if isinstance(client, str) else client
    admin = AdminClient(config)  # held: the futures fail once their client is collected
    for future in admin.create_topics([NewTopic(name, partitions, 1) for name in names]).values():
        future.result(timeout=timeout)


def produce(bootstrap: str, topic: str, values: Sequence[bytes | str],
            partitions: Sequence[int] = (0,), keys: Sequence[bytes] | None = None,
            linger_ms: int = 0, **config) -> None:
    """Each value (str encoded) with confluent-kafka, the i-th to partitions[i % len], keyed by
    keys[i] if given; every one acknowledged without error."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": linger_ms, **config})
    failed = []
    for index, value in enumerate(values):
        producer.produce(topic, value.encode() if isinstance(value, str) else value,
                         key=None if keys is None else keys[index],
                         partition=partitions[index % len(partitions)],
                         on_delivery=lambda error, _m: failed.append(error) if error else None)
    assert producer.flush(30) == 0 and failed == []


def consume_all(bootstrap: str, topic: str, isolation: str, expected: int, group: str,
                timeout: float = 20) -> list[bytes]:
    """Values read from the beginning until `expected` arrived and nothing more came for a
    while (a read_committed consumer must also get past aborted records and markers)."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest", "isolation.level": isolation,
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    values, deadline, quiet_until = [], time.monotonic() + timeout, None
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                values.append(message.value())
                quiet_until = None
            if len(values) >= expected:
                quiet_until = quiet_until or time.monotonic() + 1.0
                if time.monotonic() > quiet_until:
                    break
    finally:
        consumer.close()
    return values


# --- raw requests to a running broker ------------------------------------------------------

# A member's metadata by default: large, so that an answer repeating it per member is costly.
MEMBER_METADATA = 110_000


def ask(sock: KafkaSocket, api_key: int, version: int, values: dict):
    """(answer bytes, decoded answer, seconds the broker took) of one raw request."""
    data = frame(request(api_key, version, values))
    started = time.monotonic()
    sock.send(data)
    body = sock.receive()
    took = time.monotonic() - started
    return len(body), decode_response(api_key, version, body)[1], took


def join_group(sock: KafkaSocket, group: str, metadata: bytes):
    """A JoinGroup v2 (no member id round trip); returns once it is answered."""
    return ask(sock, 11, 2, {
        "group_id": group, "session_timeout": datetime.timedelta(seconds=60),
        "rebalance_timeout": datetime.timedelta(seconds=60), "member_id": "",
        "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": metadata}]})[1]


def stable_group(sock: KafkaSocket, group: str, metadata: bytes = b"m" * MEMBER_METADATA) -> str:
    """A group of one member, Stable (its metadata is described only then, as Kafka)."""
    joined = join_group(sock, group, metadata)
    assert joined.error_code == ErrorCode.none
    synced = ask(sock, 14, 2, {"group_id": group, "generation_id": joined.generation_id,
                               "member_id": joined.member_id,
                               "assignments": [{"member_id": joined.member_id,
                                                "assignment": b"a"}]})[1]
    assert synced.error_code == ErrorCode.none
    return joined.member_id


def timed_create_topic(broker, name: str, partitions: int,
                       timeout: float = 60) -> tuple[int, float]:
    """CreateTopics v5 of one topic on a raw connection: (error code, seconds to the answer)."""
    from kafka.protocol.admin.topics import CreateTopicsRequest

    request = CreateTopicsRequest[5](topics=[
        CreateTopicsRequest[5].CreatableTopic(name=name, num_partitions=partitions,
                                              replication_factor=1, assignments=[], configs=[])],
        timeout_ms=60000, validate_only=False)
    request.with_header(correlation_id=8, client_id="admin")
    with KafkaSocket(broker.listeners["PLAINTEXT"], timeout=timeout) as client:
        started = time.monotonic()
        client.send(frame(bytes(request.encode(header=True))))
        _, response = decode_response(19, 5, client.receive())
        return int(response.topics[0].error_code), time.monotonic() - started


def produce_acked(address, topic: str, count: int, prefix: bytes) -> list[int]:
    """The offsets of `count` records produced one request at a time (keys `prefix` + i),
    each acknowledged without error."""
    with KafkaSocket(address) as client:
        acked = []
        for i in range(count):
            client.send(produce_request(topic, make_batch(1, key_prefix=prefix + b"%d-" % i),
                                        correlation_id=i))
            [(code, base)] = produce_errors(client.receive())
            assert code == ErrorCode.none
            acked.append(base)
        return acked


def with_producer(batch: bytes, producer_id: int) -> bytes:
    """`batch` as producer `producer_id` sends it (its id and CRC rewritten)."""
    patched = bytearray(batch)
    struct.pack_into(">q", patched, 43, producer_id)
    struct.pack_into(">I", patched, 17, crc32c(bytes(patched[21:])))
    return bytes(patched)


def new_producers(clients: list[KafkaSocket], topic: str, producer_ids, in_flight: int = 32,
                  partition: int = 0) -> float:
    """Seconds to append a first batch (sequence 0) for each producer id, `in_flight`
    requests at a time on each client; the requests are built before the clock starts."""
    template = make_batch(1, producer_id=0, epoch=0, sequence=0)
    frames = [produce_request(topic, with_producer(template, producer_id), partition=partition,
                              correlation_id=n) for n, producer_id in enumerate(producer_ids)]
    start = time.perf_counter()
    for first in range(0, len(frames), in_flight * len(clients)):
        chunks = [frames[at:at + in_flight]
                  for at in range(first, first + in_flight * len(clients), in_flight)]
        for client, chunk in zip(clients, chunks):
            client.send(b"".join(chunk))
        for client, chunk in zip(clients, chunks):
            for _ in chunk:
                assert produce_errors(client.receive())[0][0] == ErrorCode.none
    return time.perf_counter() - start


# --- a Connection over fakes ---------------------------------------------------------------

def make_router(log_dir: str) -> Router:
    """The worker's real router over a log directory of its own (no shared memory)."""
    view = BrokerView(node_id=0, cluster_id="c", advertised=(("h", 1),))
    registry = TopicRegistry((log_dir,), LogSettings(), Epoch())
    props = load_config({}).props
    sessions = FetchSessionCache(100, 100, 0, 1, props.pybroker_request_max_entries, 100_000)
    return Router(build_apis(Services(view=view, props=props, registry=registry,
                                      sessions=sessions)))


class FakeTransport:
    def __init__(self):
        self.writes, self.reading, self.closed = [], True, False
        self.unsent = 0  # bytes written and not yet taken by the client
        self.aborted = False

    def write(self, data):
        self.writes.append(bytes(data))

    def pause_reading(self):
        self.reading = False

    def resume_reading(self):
        self.reading = True

    def close(self):
        self.closed = True

    def abort(self):
        self.closed = self.aborted = True

    def is_closing(self):
        return self.closed

    def get_write_buffer_size(self):
        return self.unsent

    def get_extra_info(self, name, default=None):
        return default  # no real socket behind it

    def responses(self):
        data, out = b"".join(self.writes), []
        while data:
            size = struct.unpack_from(">i", data)[0]
            out.append(struct.unpack_from(">i", data, 4)[0])  # correlation id
            data = data[4 + size:]
        return out


class FakeWorker:
    """A ConnectionHost (workers.connection): the real router and request queue, no pool."""

    def __init__(self, max_request_bytes=1 << 20, large_frame_bytes=1024):
        self._log_dir = tempfile.TemporaryDirectory(prefix="pybroker-conn-test-")
        self.router = make_router(self._log_dir.name)
        self.max_request_bytes = max_request_bytes
        self.large_frame_bytes = large_frame_bytes
        self.scratch = memoryview(bytearray(4096))
        self.served, self.invalid, self.closed = [], [], []
        self.stats = self
        self.events = None  # no event log
        self.receive_timeout = 30.0
        self.max_unsent_bytes = 1 << 20
        self.send_stall_seconds = 10.0
        self.sasl_max_receive_bytes = 524288
        self.queue = RequestQueue(1 << 30, self.stats)  # never full here
        self.queued_keys = QUEUED_WHILE_FORWARDED
        self.memory = None
        self.frame_maps = FrameMaps(256 * 1024, 8 << 20)

    def muted(self, reason, change):
        pass

    def queued_requests(self, count):
        pass

    def connection_registered(self, conn):
        pass

    def principal_of(self, listener, transport):
        return "User:ANONYMOUS"

    def authenticator(self, conn):
        return None  # a PLAINTEXT listener

    def connection_closed(self, conn, reason):
        self.closed.append(reason)

    def requests_served(self, conn, api_keys, received_at, parked=False):
        self.served.extend(api_keys)

    def invalid_request(self, reason):
        self.invalid.append(reason)


def connect(**worker_options):
    worker, transport = FakeWorker(**worker_options), FakeTransport()
    conn = Connection(worker, 1, 0, "127.0.0.1:1")
    conn.connection_made(transport)
    return conn, transport, worker


def feed(conn, data: bytes, chunk: int | None = None):
    """Deliver `data` the way the event loop would: get_buffer, copy, buffer_updated."""
    view = memoryview(data)
    while view:
        buffer = conn.get_buffer(-1)
        n = min(len(buffer), len(view), chunk or len(view))
        buffer[:n] = view[:n]
        conn.buffer_updated(n)
        view = view[n:]
