"""A synthetic event log of a given size, for timing the PySpark pipeline (`make bench`).

The mix looks like an hour with connection storms: mostly connection accepted/closed/rejected
events from 200 IPs, per-second request aggregates for 500 client ids on both planes,
throttles, and the parent's per-second acceptor and broker figures.  Written with the real
event classes (broker/shared/events.py), so the pipeline reads exactly what a broker writes.
"""

from __future__ import annotations

import os
import random

import msgspec

from broker.shared import events

FILE_BYTES = 64 * 1024 * 1024
START_MS = 1_790_000_000_000


def _event(rng: random.Random, offset: int) -> events.Event:
    second = START_MS // 1000 + offset
    ts = second * 1000 + rng.randrange(1000)
    ip = f"10.0.{rng.randrange(200) // 250}.{rng.randrange(200)}"
    client = f"client-{rng.randrange(500)}"
    roll = rng.random()
    if roll < 0.35:
        return events.ConnectionAccepted(ts=ts, listener="PLAINTEXT", ip=ip, port=40000,
                                         conn_id=rng.randrange(1 << 30))
    if roll < 0.65:
        return events.ConnectionClosed(ts=ts, listener="PLAINTEXT", ip=ip, conn_id=1,
                                       reason="client", client_id=client, lifetime_ms=12,
                                       bytes_in=rng.randrange(10000), bytes_out=2000)
    if roll < 0.75:
        return events.ConnectionRejected(ts=ts, listener="PLAINTEXT", ip=ip,
                                         reason=rng.choice(("per_ip_limit", "per_ip_rate")))
    if roll < 0.95:
        plane = "control" if rng.random() < 0.1 else "data"
        return events.Requests(ts=second * 1000, second=second, listener="PLAINTEXT",
                               plane=plane, api="Produce", client_id=client, count=50,
                               bytes_in=51200, bytes_out=2500, latency_us_sum=25000,
                               latency={40: 45, 48: 4, 60: 1})
    if roll < 0.98:
        return events.Throttle(ts=ts, client_id=client, quota="producer_byte_rate",
                               throttle_ms=rng.randrange(1, 1000))
    if roll < 0.99:
        return events.AcceptorBlocked(ts=second * 1000, listener="PLAINTEXT",
                                      reason="connection_limit", episodes=3, blocked_ms=420.0)
    return events.BrokerStats(ts=second * 1000, active={"PLAINTEXT": rng.randrange(1000)},
                              pool_used=1 << 20, pool_limit=1 << 24, pool_waiting=0,
                              depleted_ms=rng.random() * 1000)


def generate(directory: str, total_bytes: int, seconds: int = 3600, seed: int = 7):
    """Write about `total_bytes` of events into `directory`; return (events, bytes)."""
    os.makedirs(directory, exist_ok=True)
    rng = random.Random(seed)
    encoder = msgspec.json.Encoder()
    written, count, part = 0, 0, 0
    while written < total_bytes:
        part += 1
        buffer = bytearray()
        while len(buffer) < FILE_BYTES and written + len(buffer) < total_bytes:
            for _ in range(1000):
                event = _event(rng, rng.randrange(seconds))
                event.node, event.proc = 0, "data-0"
                encoder.encode_into(event, buffer, -1)
                buffer += b"\n"
                count += 1
        with open(os.path.join(directory, f"events-{part:06d}.jsonl"), "wb") as handle:
            handle.write(buffer)
        written += len(buffer)
    return count, written
