"""protections: what the protections beyond Kafka's cost or spare, on one broker of 2 workers each.

  never readers   another client's ApiVersions round trips (one connection, one at a time)
                  while 300 clients each hold a 256 KiB Fetch answer they never read, against
                  the same client with none of them: p99 during / p99 before (the never
                  readers are cut off only after pybroker.connection.send.stall.ms, 60 s here,
                  so they are all there throughout)
  refusals        connclient storms (50 in flight, from 127.0.0.2-101) against a per-IP limit
                  of 0: refused connections per second and the parent's CPU per refused
                  connection, with answers (POLICY_VIOLATION, held 1 s) and without (closed)
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time

from loadtest.bench.common import cpu_seconds
from tests.batches import make_batch
from tests.harness import BrokerProcess
from tests.wire import (KafkaSocket, api_versions_request, create_topic, fetch_request,
                        produce_request)

NEVER_READERS = 300
ROUND_TRIPS = 3000
CONNCLIENT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "bin", "connclient")


def _round_trips(address, count: int) -> list[float]:
    """Seconds per ApiVersions round trip, `count` of them, one at a time."""
    took = []
    with KafkaSocket(address) as client:
        for correlation in range(count):
            started = time.perf_counter()
            client.send(api_versions_request(correlation_id=correlation))
            client.receive()
            took.append(time.perf_counter() - started)
    return took


def _p99_us(took: list[float]) -> float:
    ordered = sorted(took)
    return ordered[int(0.99 * (len(ordered) - 1))] * 1e6


def never_readers() -> dict[str, dict]:
    overrides = {"pybroker.connection.send.stall.ms": "60000",
                 "socket.send.buffer.bytes": "8192"}
    with BrokerProcess(workers=2, overrides=overrides) as broker:
        address = broker.listeners["PLAINTEXT"]
        create_topic(broker.bootstrap, "never-read")
        with KafkaSocket(address) as client:
            client.send(produce_request("never-read", make_batch(64, value_size=4000)))
            client.receive()
        quiet = _round_trips(address, ROUND_TRIPS)
        holders = []
        try:
            for _ in range(NEVER_READERS):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.connect(address)
                sock.sendall(fetch_request("never-read"))
                holders.append(sock)
            busy = _round_trips(address, ROUND_TRIPS)
            errors = int(broker.metric("broker_connections_closed_total", listener="PLAINTEXT",
                                       reason="send_stalled"))  # none may be cut off yet
        finally:
            for sock in holders:
                sock.close()
    return {"never readers quiet": {"p99_us": _p99_us(quiet), "errors": 0},
            "never readers 300": {"p99_us": _p99_us(busy), "errors": errors}}


def refusal_costs(seconds: float) -> dict[str, dict]:
    figures = {}
    with tempfile.TemporaryDirectory(prefix="pybroker-bench-refusal-") as tmp:
        frame = os.path.join(tmp, "apiversions.bin")
        with open(frame, "wb") as handle:
            handle.write(api_versions_request(version=3))
        for label, answer, mode in (("answered", "true", "req"), ("closed", "false", "fin")):
            overrides = {"max.connections.per.ip.overrides": "127.0.0.0/24:0",
                         "pybroker.connection.refusal.answer.enable": answer}
            with BrokerProcess(workers=2, overrides=overrides) as broker:
                host, port = broker.listeners["PLAINTEXT"]
                before = cpu_seconds([broker.pid])
                done = subprocess.run([CONNCLIENT, host, str(port), "50", str(seconds), mode,
                                       frame], capture_output=True, text=True,
                                      timeout=seconds + 60)
                spent = cpu_seconds([broker.pid]) - before
                refused = broker.metric("broker_connections_rejected_total",
                                        listener="PLAINTEXT", reason="per_ip_limit")
            figures[f"refusals {label}"] = {"count": int(refused), "seconds": seconds,
                                            "server_cpu": spent,
                                            "errors": int(done.returncode != 0)}
    return figures
