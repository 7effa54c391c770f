"""fairness: p99 latency of ApiVersions on 20 long-lived connections (1 in flight each, one
request per 5 ms per connection) alone, then during a storm of new connections (two connclient
processes, 8 connects in flight each), with the KIP-402 bounds (hand-off 20, 20 registrations
per loop turn), with both set to 10000 (the baseline), and with the bounds plus
max.connection.creation.rate=500 (KIP-612 holding the storm back); and the accept rate with
non-binding limits enabled (counts, per-IP, creation rates) versus none."""

from __future__ import annotations

import json
import os
import subprocess

from loadtest.bench.accepts import run_accept
from loadtest.bench.common import BIN, Broker


def run_paced(port: int, frame_path: str, seconds: float) -> dict:
    out = subprocess.run([os.path.join(BIN, "rrclient"), "127.0.0.1", str(port), "20", "1",
                          str(seconds), frame_path, "0.5", "kafka", "5000"],
                         capture_output=True, text=True, timeout=seconds + 30)
    return json.loads(out.stdout)


def quiet_and_storm(port: int, frame_path: str, seconds: float) -> tuple[dict, dict]:
    """The paced clients' figures alone, then during the storm (any broker on 127.0.0.1:
    `port`); the storm's connections per second are in the second's "storm_rate"."""
    quiet = run_paced(port, frame_path, seconds)
    storm = [subprocess.Popen([os.path.join(BIN, "connclient"), "127.0.0.1", str(port), "8",
                               str(seconds + 1.5), "req", frame_path, str(base)],
                              stdout=subprocess.PIPE, text=True)
             for base in (2, 122)]
    stormy = run_paced(port, frame_path, seconds)
    storms = [json.loads(proc.communicate(timeout=seconds + 30)[0]) for proc in storm]
    stormy["storm_rate"] = sum(s["rate"] for s in storms)
    stormy["storm_errors"] = sum(s["errors"] for s in storms)
    return quiet, stormy


def storm_fairness(frame_path: str, seconds: float) -> dict[str, dict]:
    figures = {}
    unbounded = {"pybroker.handoff.queue.size": "10000", "pybroker.registrations.per.turn": "10000"}
    rate_limited = {"max.connection.creation.rate": "500"}
    for label, overrides in (("bounded", None), ("unbounded", unbounded),
                             ("bounded, creation rate 500/s", rate_limited)):
        broker = Broker(2, overrides)
        try:
            quiet, storm = quiet_and_storm(broker.port, frame_path, seconds)
        finally:
            broker.close()
        figures[f"p99 quiet {label}"], figures[f"p99 storm {label}"] = quiet, storm
    limits = {"max.connections": "1000000", "max.connections.per.ip": "1000000",
              "max.connection.creation.rate": "1000000000",
              "max.connection.creation.rate.per.ip": "1000000000"}
    broker = Broker(2, limits)
    try:
        figures["accept limits on"] = run_accept(broker.port, broker.pids, "req", frame_path, seconds)
    finally:
        broker.close()
    return figures
