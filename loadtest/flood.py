"""Saturate a broker's data plane with large Produce requests, for a bounded time.

`python -m loadtest.flood --address 127.0.0.1:PORT --topic T --connections 12 --seconds 8`

Opens the connections (127.0.0.1 only) and keeps `--depth` Produce requests of one
`--record-bytes` record in flight on each, from one thread with a selector, until the time is
up; then prints one JSON line: requests answered, bytes sent, answers carrying a throttle
time, the largest throttle time, and errors.  Used by the control-plane test and `make bench`
to keep every data worker busy and the memory pool exhausted while other requests are timed.
"""

from __future__ import annotations

import argparse
import json
import selectors
import socket
import struct
import time

_SIZE = struct.Struct(">i")


def produce_frame(topic: str, record_bytes: int, client_id: str, correlation_id: int) -> bytes:
    """A Produce v9 request (acks=1) carrying one record of `record_bytes`."""
    from kafka.protocol.producer.produce import ProduceRequest
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=record_bytes + 1024)
    builder.append(0, timestamp=int(time.time() * 1000), key=None, value=b"x" * record_bytes,
                   headers=[])
    data = ProduceRequest.TopicProduceData
    request = ProduceRequest[9](transactional_id=None, acks=1, timeout_ms=30000, topic_data=[
        data(name=topic, partition_data=[data.PartitionProduceData(
            index=0, records=bytes(builder.build()))])])
    request.with_header(correlation_id=correlation_id, client_id=client_id)
    body = bytes(request.encode(header=True))
    return _SIZE.pack(len(body)) + body


class _Conn:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.outbox = memoryview(b"")
        self.pending: list[bytes] = []
        self.inbox = bytearray()
        self.in_flight = 0
        self.events = selectors.EVENT_READ | selectors.EVENT_WRITE

    def wanted(self) -> int:
        """Watch for writability only with something to write: no busy loop."""
        if self.outbox or self.pending:
            return selectors.EVENT_READ | selectors.EVENT_WRITE
        return selectors.EVENT_READ


def _throttle_ms(frame: bytes) -> int:
    """throttle_time_ms of a Produce v9 response: the 4 bytes before its empty tagged fields."""
    return struct.unpack_from(">i", frame, len(frame) - 5)[0]


def flood(host: str, port: int, topic: str, connections: int, seconds: float, depth: int,
          record_bytes: int, client_id: str) -> dict:
    request = produce_frame(topic, record_bytes, client_id, 1)
    selector = selectors.DefaultSelector()
    stats = {"answered": 0, "sent_bytes": 0, "throttled": 0, "max_throttle_ms": 0,
             "errors": 0, "connections": 0}
    conns = []
    for _ in range(connections):
        try:
            sock = socket.create_connection((host, port), timeout=5)
        except OSError:
            stats["errors"] += 1
            continue
        sock.setblocking(False)
        conn = _Conn(sock)
        conns.append(conn)
        selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
    stats["connections"] = len(conns)
    deadline = time.monotonic() + seconds
    for conn in conns:
        conn.pending = [request] * depth
        conn.in_flight = depth
    while conns and time.monotonic() < deadline:
        for key, events in selector.select(timeout=0.05):
            conn = key.data
            try:
                if events & selectors.EVENT_WRITE:
                    _write(conn, stats)
                if events & selectors.EVENT_READ:
                    _read(conn, stats)
                    while conn.in_flight < depth:
                        conn.pending.append(request)
                        conn.in_flight += 1
                if conn.wanted() != conn.events:
                    conn.events = conn.wanted()
                    selector.modify(conn.sock, conn.events, conn)
            except OSError:
                stats["errors"] += 1
                selector.unregister(conn.sock)
                conn.sock.close()
                conns.remove(conn)
    for conn in conns:
        conn.sock.close()
    selector.close()
    return stats


def _write(conn: _Conn, stats: dict) -> None:
    if not conn.outbox and conn.pending:
        conn.outbox = memoryview(conn.pending.pop(0))
    if conn.outbox:
        sent = conn.sock.send(conn.outbox)
        stats["sent_bytes"] += sent
        conn.outbox = conn.outbox[sent:]


def _read(conn: _Conn, stats: dict) -> None:
    data = conn.sock.recv(1 << 16)
    if not data:
        raise ConnectionResetError("closed by the broker")
    conn.inbox += data
    while len(conn.inbox) >= 4:
        size = _SIZE.unpack_from(conn.inbox)[0]
        if len(conn.inbox) < 4 + size:
            break
        frame = bytes(conn.inbox[4:4 + size])
        del conn.inbox[:4 + size]
        conn.in_flight -= 1
        stats["answered"] += 1
        throttle = _throttle_ms(frame)
        if throttle > 0:
            stats["throttled"] += 1
            stats["max_throttle_ms"] = max(stats["max_throttle_ms"], throttle)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.flood")
    parser.add_argument("--address", required=True, help="127.0.0.1:PORT of a data listener")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--connections", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--depth", type=int, default=2, help="requests in flight per connection")
    parser.add_argument("--record-bytes", type=int, default=1 << 20)
    parser.add_argument("--client-id", default="flood")
    args = parser.parse_args()
    host, _, port = args.address.rpartition(":")
    if host not in ("127.0.0.1", "localhost"):
        parser.error("the flood only targets 127.0.0.1")
    print(json.dumps(flood(host, int(port), args.topic, args.connections,
                           min(args.seconds, 120.0), args.depth, args.record_bytes,
                           args.client_id)), flush=True)


if __name__ == "__main__":
    main()
