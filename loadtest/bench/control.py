"""control: KIP-291, Metadata and DescribeConfigs, one every 10 ms each on its own connection,
while loadtest/flood.py keeps 12 connections x 2 Produce requests of 1 MiB in flight (every data
worker busy, the 8 MiB pool exhausted, max.connections=12 reached by the flood), sent on the
control-plane listener; the baseline sends them on the data listener of a broker without a
control plane under the same load (its max.connections is 14, so the probes get in).  A run
where requests did not wait for pool memory at least half the time counts as an error (not
saturated)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from loadtest.bench.common import Broker, metadata_frame

MIB = 1 << 20
SATURATING = {"queued.max.request.bytes": str(8 * MIB), "socket.request.max.bytes": str(2 * MIB),
              "message.max.bytes": str(2 * MIB), "log.segment.bytes": str(16 * MIB),
              "log.retention.bytes": str(32 * MIB), "log.retention.check.interval.ms": "1000"}
WITH_CONTROL_PLANE = {"listeners": "PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:0",
                      "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                      "control.plane.listener.name": "CONTROLLER", "max.connections": "12"}


def describe_configs_frame(node_id: int = 0) -> bytes:
    from tests.wire import describe_configs_request

    return describe_configs_request(correlation_id=7, broker=str(node_id))


def timed_requests(address, frame: bytes, seconds: float, every: float = 0.01) -> list[float]:
    """Round-trip times of one request sent every `every` seconds on one connection."""
    from tests.wire import KafkaSocket

    times = []
    with KafkaSocket(address, timeout=30) as client:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            started = time.perf_counter()
            client.send(frame)
            client.receive()
            times.append(time.perf_counter() - started)
            time.sleep(max(0.0, every - (time.perf_counter() - started)))
    return times


class Flood:
    """loadtest/flood.py against 127.0.0.1:`port` for `seconds`, started on entry (after which
    it has had a second to connect and fill the pool); its JSON figures in `.figures` after
    the exit."""

    def __init__(self, port: int, topic: str, seconds: float, connections: int = 12):
        self.argv = [sys.executable, "-m", "loadtest.flood", "--address", f"127.0.0.1:{port}",
                     "--topic", topic, "--connections", str(connections),
                     "--seconds", str(seconds)]
        self.seconds = seconds
        self.figures: dict = {}

    def __enter__(self) -> "Flood":
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, text=True)
        time.sleep(1.0)  # the flood connects and exhausts the pool
        return self

    def __exit__(self, *exc) -> None:
        output = self.proc.communicate(timeout=self.seconds + 30)[0]
        self.figures = json.loads(output) if output else {"errors": 1, "sent_bytes": 0}


def probe_all(address, frames: dict[str, bytes], seconds: float) -> dict[str, list[float]]:
    """Round-trip times of each frame, every 10 ms on its own connection, all at once; an
    empty list for a probe whose connection failed."""
    import threading

    results: dict[str, list[float]] = {}

    def probe(name):
        try:
            results[name] = timed_requests(address, frames[name], seconds)
        except OSError:
            results[name] = []

    probes = [threading.Thread(target=probe, args=(name,)) for name in frames]
    for thread in probes:
        thread.start()
    for thread in probes:
        thread.join(seconds + 30)
    return {name: results.get(name, []) for name in frames}


def percentiles_ms(times: list[float]) -> dict[str, float]:
    """p50 and p99 of round-trip times, in ms (NaN if there are none)."""
    times = sorted(times) or [float("nan")]
    return {"p50_ms": times[len(times) // 2] * 1e3, "p99_ms": times[int(len(times) * 0.99)] * 1e3}


def control_plane_latency(seconds: float) -> dict[str, dict]:
    """Admin requests while the data plane is saturated, with and without a control plane."""
    from tests.wire import create_topic

    frames = {"Metadata": metadata_frame(), "DescribeConfigs": describe_configs_frame()}
    figures = {}
    for plane, overrides in (("control plane", WITH_CONTROL_PLANE),
                             ("data listener, no control plane", {"max.connections": "14"})):
        broker = Broker(2, dict(SATURATING, **overrides))
        admin = broker.process.listeners.get("CONTROLLER", broker.process.listeners["PLAINTEXT"])
        try:
            create_topic(f"127.0.0.1:{admin[1]}", "flood")
            with Flood(broker.port, "flood", seconds + 3) as flood:
                depleted = broker.process.metric("broker_request_memory_depleted_seconds_total")
                results = probe_all(admin, frames, seconds)
                # Saturated means requests waited for pool memory during most of the probing.
                depleted = broker.process.metric(
                    "broker_request_memory_depleted_seconds_total") - depleted
            loaded = flood.figures
        finally:
            broker.close()
        unsaturated = depleted < 0.5 * seconds
        for name in frames:
            times = results[name]
            figures[f"{plane} {name}"] = dict(
                percentiles_ms(times), count=len(times),
                flood_mb_s=loaded["sent_bytes"] / 1e6 / (seconds + 3), depleted_s=depleted,
                errors=loaded["errors"] + (not times) + unsaturated)
    return figures
