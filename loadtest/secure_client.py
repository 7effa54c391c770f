"""A uvloop load client for the TLS and SASL benchmark (`make bench`, loadtest/bench/security.py).

    python -m loadtest.secure_client requests   HOST PORT SECONDS CONNS DEPTH [--ca CA]
    python -m loadtest.secure_client handshakes HOST PORT SECONDS CONCURRENCY [--ca CA]
    python -m loadtest.secure_client scram      HOST PORT SECONDS CONCURRENCY USER PASSWORD [--ca CA]

requests: CONNS connections each keeping DEPTH ApiVersions in flight; handshakes: connect (and
the TLS handshake with --ca), one ApiVersions, close, CONCURRENCY at a time; scram: connect,
SaslHandshake, the SCRAM-SHA-256 exchange, close.  Prints one JSON line: count, seconds,
errors.  The same client runs on both sides of every ratio, so its own cost cancels out.
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


async def requests(host, port, seconds, conns, depth, context) -> dict:
    count, errors = [0], [0]
    deadline = time.monotonic() + seconds

    async def one():
        try:
            reader, writer = await asyncio.open_connection(host, port, ssl=context,
                                                           server_hostname=host if context else None)
            writer.write(_FRAME * depth)
            while time.monotonic() < deadline:
                await _read_frame(reader)
                count[0] += 1
                writer.write(_FRAME)
            writer.close()
        except (OSError, asyncio.IncompleteReadError):
            errors[0] += 1

    started = time.monotonic()
    await asyncio.gather(*(one() for _ in range(conns)))
    return {"count": count[0], "seconds": time.monotonic() - started, "errors": errors[0]}


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


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.secure_client")
    parser.add_argument("mode", choices=["requests", "handshakes", "scram"])
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
    else:
        coroutine = scram(host, port, seconds, int(rest[0]), rest[1], rest[2], context)
    print(json.dumps(uvloop.run(coroutine)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
