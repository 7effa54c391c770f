"""A uvloop load client for the TLS and SASL benchmark (`make bench`, loadtest/bench/security.py).

    python -m loadtest.secure_client requests   HOST PORT SECONDS CONNS DEPTH [--ca CA]
    python -m loadtest.secure_client handshakes HOST PORT SECONDS CONCURRENCY [--ca CA]
    python -m loadtest.secure_client scram      HOST PORT SECONDS CONCURRENCY USER PASSWORD [--ca CA]
    python -m loadtest.secure_client fetch      HOST PORT SECONDS CONNS DEPTH USER PASSWORD TOPIC

requests: CONNS connections each keeping DEPTH ApiVersions in flight; handshakes: connect (and
the TLS handshake with --ca), one ApiVersions, close, CONCURRENCY at a time; scram: connect,
SaslHandshake, the SCRAM-SHA-256 exchange, close; fetch: CONNS connections that authenticate
with PLAIN, then each keep DEPTH Fetch requests (max_wait 0) for partition 0 of TOPIC in
flight (an empty topic: the cost of a request, not of its bytes).  Prints one JSON line:
count, seconds, errors.  The same client runs on both sides of every ratio, so its own cost cancels out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import struct
import sys
import time

_API_VERSIONS = (struct.pack(">hhih", 18, 3, 7, 5) + b"bench" + b"\x00"
                 + b"\x06bench" + b"\x041.0" + b"\x00")
_FRAME = struct.pack(">i", len(_API_VERSIONS)) + _API_VERSIONS


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    return await reader.readexactly(size)


async def _pipelined(conns: int, seconds: float, connect, frame: bytes, depth: int) -> dict:
    """CONNS connections, each set up by `connect()` -> (reader, writer), then keeping DEPTH
    copies of `frame` in flight until the deadline."""
    count, errors = [0], [0]
    deadline = time.monotonic() + seconds

    async def one():
        try:
            reader, writer = await connect()
            writer.write(frame * depth)
            while time.monotonic() < deadline:
                await _read_frame(reader)
                count[0] += 1
                writer.write(frame)
            writer.close()
        except (OSError, ValueError, asyncio.IncompleteReadError):
            errors[0] += 1

    started = time.monotonic()
    await asyncio.gather(*(one() for _ in range(conns)))
    return {"count": count[0], "seconds": time.monotonic() - started, "errors": errors[0]}


async def requests(host, port, seconds, conns, depth, context) -> dict:
    def connect():
        return asyncio.open_connection(host, port, ssl=context,
                                       server_hostname=host if context else None)

    return await _pipelined(conns, seconds, connect, _FRAME, depth)


async def _sessions(seconds, concurrency, session) -> dict:
    count, errors = [0], [0]
    deadline = time.monotonic() + seconds

    async def worker():
        while time.monotonic() < deadline:
            try:
                await session()
                count[0] += 1
            except (OSError, asyncio.IncompleteReadError, ValueError):
                errors[0] += 1

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return {"count": count[0], "seconds": time.monotonic() - started, "errors": errors[0]}


async def handshakes(host, port, seconds, concurrency, context) -> dict:
    async def session():
        reader, writer = await asyncio.open_connection(host, port, ssl=context,
                                                       server_hostname=host if context else None)
        writer.write(_FRAME)
        await _read_frame(reader)
        writer.close()

    return await _sessions(seconds, concurrency, session)


def _sasl_request(api_key: int, version: int, body: bytes) -> bytes:
    payload = struct.pack(">hhih", api_key, version, 1, 5) + b"bench" + body
    return struct.pack(">i", len(payload)) + payload


async def scram(host, port, seconds, concurrency, user, password, context) -> dict:
    from scramp import ScramClient

    async def session():
        reader, writer = await asyncio.open_connection(host, port, ssl=context,
                                                       server_hostname=host if context else None)
        mechanism = b"SCRAM-SHA-256"
        writer.write(_sasl_request(17, 1, struct.pack(">h", len(mechanism)) + mechanism))
        await _read_frame(reader)
        client = ScramClient(["SCRAM-SHA-256"], user, password)
        for message in (client.get_client_first, None):
            token = (message or client.get_client_final)().encode()
            writer.write(_sasl_request(36, 1, struct.pack(">i", len(token)) + token))
            body = await _read_frame(reader)
            if struct.unpack_from(">h", body, 4)[0] != 0:
                raise ValueError("authentication failed")
            length = struct.unpack_from(">h", body, 6)[0]
            offset = 8 + max(0, length)
            size = struct.unpack_from(">i", body, offset)[0]
            reply = body[offset + 4:offset + 4 + size].decode()
            if message is not None:
                client.set_server_first(reply)
            else:
                client.set_server_final(reply)
        writer.close()

    return await _sessions(seconds, concurrency, session)


def _fetch_frame(topic: str) -> bytes:
    from kafka.protocol.consumer.fetch import FetchRequest

    entry = FetchRequest.FetchTopic
    request = FetchRequest[12](
        replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 16, isolation_level=0,
        session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="",
        topics=[entry(topic=topic, partitions=[entry.FetchPartition(
            partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
            log_start_offset=-1, partition_max_bytes=1 << 16)])])
    request.with_header(correlation_id=7, client_id="bench")
    payload = bytes(request.encode(header=True))
    return struct.pack(">i", len(payload)) + payload


async def fetches(host, port, seconds, conns, depth, user, password, topic) -> dict:
    token = f"\0{user}\0{password}".encode()

    async def connect():
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(_sasl_request(17, 1, struct.pack(">h", 5) + b"PLAIN"))
        await _read_frame(reader)
        writer.write(_sasl_request(36, 1, struct.pack(">i", len(token)) + token))
        if struct.unpack_from(">h", await _read_frame(reader), 4)[0] != 0:
            raise ValueError("authentication failed")
        return reader, writer

    return await _pipelined(conns, seconds, connect, _fetch_frame(topic), depth)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.secure_client")
    parser.add_argument("mode", choices=["requests", "handshakes", "scram", "fetch"])
    parser.add_argument("rest", nargs="+")
    parser.add_argument("--ca")
    args = parser.parse_args(argv)
    context = ssl.create_default_context(cafile=args.ca) if args.ca else None
    host, port, seconds, *rest = args.rest
    port, seconds = int(port), float(seconds)
    import uvloop

    if args.mode == "requests":
        coroutine = requests(host, port, seconds, int(rest[0]), int(rest[1]), context)
    elif args.mode == "handshakes":
        coroutine = handshakes(host, port, seconds, int(rest[0]), context)
    elif args.mode == "fetch":
        coroutine = fetches(host, port, seconds, int(rest[0]), int(rest[1]), *rest[2:5])
    else:
        coroutine = scram(host, port, seconds, int(rest[0]), rest[1], rest[2], context)
    print(json.dumps(uvloop.run(coroutine)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
