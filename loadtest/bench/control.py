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


def describe_configs_frame() -> bytes:
    from tests.wire import describe_configs_request

    return describe_configs_request(correlation_id=7)


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


def control_plane_latency(seconds: float) -> dict[str, dict]:
    """Admin requests while the data plane is saturated, with and without a control plane."""
    import threading

    from tests.wire import create_topic

    frames = {"Metadata": metadata_frame(), "DescribeConfigs": describe_configs_frame()}
    figures = {}
    for plane, overrides in (("control plane", WITH_CONTROL_PLANE),
                             ("data listener, no control plane", {"max.connections": "14"})):
        broker = Broker(2, dict(SATURATING, **overrides))
        admin = broker.process.listeners.get("CONTROLLER", broker.process.listeners["PLAINTEXT"])
        try:
            create_topic(f"127.0.0.1:{admin[1]}", "flood")
            results: dict[str, list[float]] = {}

            def probe(name):
                try:
                    results[name] = timed_requests(admin, frames[name], seconds)
                except OSError:
                    results[name] = []  # counted as an error below

            probes = [threading.Thread(target=probe, args=(name,)) for name in frames]
            flood = subprocess.Popen(
                [sys.executable, "-m", "loadtest.flood", "--address",
                 f"127.0.0.1:{broker.port}", "--topic", "flood", "--connections", "12",
                 "--seconds", str(seconds + 3)], stdout=subprocess.PIPE, text=True)
            time.sleep(1.0)  # the flood connects and exhausts the pool
            depleted = broker.process.metric("broker_request_memory_depleted_seconds_total")
            for thread in probes:
                thread.start()
            for thread in probes:
                thread.join(seconds + 30)
            # Saturated means requests waited for pool memory during most of the probing.
            depleted = broker.process.metric(
                "broker_request_memory_depleted_seconds_total") - depleted
            loaded = json.loads(flood.communicate(timeout=seconds + 30)[0])
        finally:
            broker.close()
        unsaturated = depleted < 0.5 * seconds
        for name in frames:
            times = sorted(results.get(name, []))
            failed = loaded["errors"] + (not times) + unsaturated
            times = times or [float("nan")]
            figures[f"{plane} {name}"] = {
                "p50_ms": times[len(times) // 2] * 1e3, "p99_ms": times[int(len(times) * 0.99)] * 1e3,
                "count": len(times), "flood_mb_s": loaded["sent_bytes"] / 1e6 / (seconds + 3),
                "depleted_s": depleted, "errors": failed}
    return figures
