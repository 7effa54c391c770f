"""events: ApiVersions with the event log on (the default, measured by requests) against a
broker with pybroker.event.log.enable=false, same shapes (the goal: cost <= 5 %).  The PySpark
pipeline over the event log is timed by pipeline."""

from __future__ import annotations

from loadtest.bench.common import SHAPES, Broker, run_rr


def event_log_off(frames: dict[str, str], seconds: float) -> dict[str, dict]:
    """The baseline: ApiVersions against 1 worker with the event log off."""
    figures = {}
    broker = Broker(1, {"pybroker.event.log.enable": "false"})
    try:
        for shape in SHAPES:
            figures[f"apiversions 1w {shape}, event log off"] = run_rr(
                broker.port, broker.pids, frames["apiversions"], shape, seconds, "kafka")
    finally:
        broker.close()
    return figures
