"""`make report`: a short incident on a real broker, then the PySpark report about it.

Starts a broker on 127.0.0.1 (memory pool 8 MiB, max.connections.per.ip 50, a control
plane), and while a well-behaved client ("steady", 127.0.0.1, a small Produce every 100 ms)
runs throughout, plays three incidents, each bounded in time and count, aimed at the broker on
127.0.0.1 only, with a few quiet seconds between them so the report tells them apart:
  1. a connection storm from 127.0.0.2: 100 connections at a time in waves (half are
     refused for max.connections.per.ip);
  2. a quota-violating producer: client id "greedy" under a 200 kB/s producer_byte_rate
     quota, producing 50 kB requests as fast as its throttles let it;
  3. a large-request burst: loadtest.flood, 12 connections x 2 x 1 MiB Produce (client id
     "flood"), which exhausts the memory pool;
then stops the broker, runs `python -m pipeline` on its event log and prints the report path.
tests/observability/test_report.py plays the same incident, shorter (`Phases`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from tests.harness import BrokerProcess, wait_until

MIB = 1 << 20
STORM_SOURCE = "127.0.0.2"  # loopback too: the storm's own address, apart from the others
OVERRIDES = {
    "listeners": "PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:0",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    "control.plane.listener.name": "CONTROLLER",
    "queued.max.request.bytes": str(8 * MIB), "socket.request.max.bytes": str(2 * MIB),
    "message.max.bytes": str(2 * MIB), "max.connections.per.ip": "50",
    "log.segment.bytes": str(16 * MIB), "log.retention.bytes": str(32 * MIB),
    "log.retention.check.interval.ms": "1000",
    # Throttle after one window's worth, not Kafka's ten: the demo is short.
    "quota.window.num": "2", "pybroker.quota.burst.windows": "1",
}
GREEDY_QUOTA = 200_000  # bytes per second


@dataclass(frozen=True)
class Phases:
    """How long each part of the incident lasts."""
    storm_waves: int = 4  # about a second each
    greedy_seconds: float = 4.0
    flood_seconds: float = 3.0
    quiet_seconds: float = 3.0  # between parts: more than the pipeline's one-second gap


def storm(address, waves: int, per_wave: int = 100, source: str = STORM_SOURCE) -> int:
    """Waves of connections from `source`, each held half a second; how many could not even
    connect."""
    refused = 0
    for _ in range(waves):
        held = []
        for _ in range(per_wave):
            try:
                held.append(socket.create_connection(address, timeout=2,
                                                     source_address=(source, 0)))
            except OSError:
                refused += 1
        time.sleep(0.5)  # held open: the limit counts them
        for sock in held:
            sock.close()
        time.sleep(0.5)
    return refused


def produce_frame(client_id: str, topic: str, correlation: int, records: int,
                  value_size: int) -> bytes:
    from kafka.protocol.producer.produce import ProduceRequest

    from tests.batches import make_batch
    from tests.wire import frame

    data = ProduceRequest.TopicProduceData
    request = ProduceRequest[9](transactional_id=None, acks=1, timeout_ms=5000, topic_data=[
        data(name=topic, partition_data=[data.PartitionProduceData(
            index=0, records=make_batch(records, value_size=value_size))])])
    request.with_header(correlation_id=correlation, client_id=client_id)
    return frame(bytes(request.encode(header=True)))


def greedy_producer(address, seconds: float) -> int:
    """50 kB Produce requests as client "greedy", one at a time, for `seconds`."""
    from tests.wire import KafkaSocket

    sent = 0
    deadline = time.monotonic() + seconds
    with KafkaSocket(address, timeout=30) as client:
        while time.monotonic() < deadline:
            client.send(produce_frame("greedy", "demo", sent, records=50, value_size=1000))
            client.receive()
            sent += 1
    return sent


class SteadyClient:
    """A well-behaved producer: one small request every `interval` seconds until stopped (or
    `limit` seconds at most); the report asks whether the incidents hurt it."""

    def __init__(self, address, interval: float = 0.1, limit: float = 300.0):
        self.address, self.interval, self.limit = address, interval, limit
        self.answered = 0
        self.slowest_ms = 0.0  # as the client sees it, waits before the broker reads included
        self.error: Exception | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steady", daemon=True)

    def __enter__(self) -> "SteadyClient":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=35)

    def _run(self) -> None:
        from tests.wire import KafkaSocket

        deadline = time.monotonic() + self.limit
        try:
            with KafkaSocket(self.address, timeout=30) as client:
                while not self._stop.wait(self.interval) and time.monotonic() < deadline:
                    sent = time.monotonic()
                    client.send(produce_frame("steady", "steady", self.answered, records=5,
                                              value_size=100))
                    client.receive()
                    self.answered += 1
                    self.slowest_ms = max(self.slowest_ms, (time.monotonic() - sent) * 1000)
        except OSError as error:  # reported by play(); the demo goes on
            self.error = error


def play(broker: BrokerProcess, phases: Phases = Phases()) -> dict:
    """The incident on a running broker started with OVERRIDES; what each part did."""
    from loadtest.flood import flood
    from tests.wire import alter_client_quota, create_topic

    address, control = broker.listeners["PLAINTEXT"], broker.listeners["CONTROLLER"]
    for topic in ("demo", "flood", "steady"):
        create_topic(f"127.0.0.1:{control[1]}", topic)
    alter_client_quota(control, {"client-id": "greedy"}, "producer_byte_rate", GREEDY_QUOTA)
    done = {}
    with SteadyClient(address) as steady:
        # Quiet seconds first: the steady client's latency before the first incident.
        wait_until(lambda: steady.answered >= 10 * phases.quiet_seconds or steady.error,
                   timeout=30)
        with _timed(done, "storm"):
            done["storm_unconnected"] = storm(address, phases.storm_waves)
        time.sleep(phases.quiet_seconds)  # quiet on purpose: incidents apart
        with _timed(done, "greedy"):
            done["greedy_requests"] = greedy_producer(address, phases.greedy_seconds)
        time.sleep(phases.quiet_seconds)
        with _timed(done, "flood"):
            done["flood"] = flood("127.0.0.1", address[1], "flood", connections=12,
                                  seconds=phases.flood_seconds, depth=2, record_bytes=MIB,
                                  client_id="flood")
        time.sleep(1.0)  # the flood's last second written before the broker stops
    done["steady_requests"], done["steady_error"] = steady.answered, steady.error
    done["steady_slowest_ms"] = steady.slowest_ms
    return done


@contextlib.contextmanager
def _timed(done: dict, part: str):
    """done[part + "_span"]: the wall-clock times (epoch seconds) the part began and ended."""
    begun = time.time()
    yield
    done[f"{part}_span"] = (begun, time.time())


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.demo")
    parser.add_argument("--out", default="reports/demo")
    parser.add_argument("--baseline", help="an earlier report directory to compare with")
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    for ours in ("broker", "report"):  # a fresh run: no events of an earlier one
        shutil.rmtree(os.path.join(out, ours), ignore_errors=True)
    os.makedirs(out, exist_ok=True)
    with BrokerProcess(workers=2, overrides=OVERRIDES,
                       data_dir=os.path.join(out, "broker")) as broker:
        done = play(broker)
    print(f"storm from {STORM_SOURCE}: {done['storm_unconnected']} connections could not even "
          f"connect; greedy: {done['greedy_requests']} requests; flood: {done['flood']}; "
          f"steady: {done['steady_requests']} requests, the slowest answered in "
          f"{done['steady_slowest_ms']:.0f} ms", flush=True)
    command = [sys.executable, "-m", "pipeline", "--events",
               os.path.join(out, "broker", "pybroker-events"), "--out",
               os.path.join(out, "report")]
    if args.baseline:
        command += ["--baseline", args.baseline]
    return subprocess.run(command).returncode


if __name__ == "__main__":
    sys.exit(main())
