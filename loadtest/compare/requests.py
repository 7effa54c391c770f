"""apiversions, metadata: request rates from the C generator loadtest/bin/rrclient (the frames
and shapes of loadtest/bench: ApiVersions v3 and Metadata v12 for all topics of an empty
broker; 100 connections x 1 in flight and 10 connections x 50 pipelined), and the broker's
CPU per request, after a one-second warm-up of each frame (Kafka's JIT)."""

from __future__ import annotations

import tempfile

from loadtest.bench.common import SHAPES, run_rr, write_frames
from loadtest.compare.brokers import warmup_seconds
from loadtest.compare.rows import Reading, Row, attempt, join, measure_both

PARTS = ("apiversions", "metadata")
NAMES = {"apiversions": "ApiVersions v3", "metadata": "Metadata v12"}
RR_WARMUP_SECONDS = 0.5  # run_rr's: answers before it are not counted
SHAPE_NOTES = {"100x1": "100 connections x 1 in flight", "10x50": "10 connections x 50 pipelined"}


def _name(part: str, shape: str) -> str:
    return f"{NAMES[part]} requests, {SHAPE_NOTES[shape]}"


def _rows(parts) -> list[Row]:
    rows = []
    for part in parts:
        for shape in SHAPES:
            rows += [Row(_name(part, shape), "requests/s", "higher", "rrclient"),
                     Row(f"{_name(part, shape)}: broker CPU", "CPU us/request", "lower")]
    return rows


def run(parts, seconds: float) -> list[dict]:
    parts = [part for part in PARTS if part in parts]
    rows = _rows(parts)
    return join(rows, measure_both(rows, lambda broker: _measure(broker, parts, seconds)))


def _measure(broker, parts, seconds: float) -> dict[str, Reading]:
    readings: dict[str, Reading] = {}
    port = broker.address[1]
    with tempfile.TemporaryDirectory(prefix="pybroker-compare-") as tmp:
        frames = write_frames(tmp)
        for part in parts:
            for shape in SHAPES:
                run_rr(port, broker.pids, frames[part], shape, warmup_seconds(seconds), "kafka")
                name = _name(part, shape)
                attempt(readings, [name, f"{name}: broker CPU"],
                        lambda: _rate(name, run_rr(port, broker.pids, frames[part], shape,
                                                   seconds, "kafka")))
    return readings


def _rate(name: str, figures: dict) -> dict[str, Reading]:
    if figures["responses"] <= 0:
        raise RuntimeError(f"no answers ({figures['errors']} errors)")
    note = f"p99 {figures['p99_us']:.0f} us"
    if figures["errors"]:
        note += f", {figures['errors']} errors"
    # the CPU was counted over rrclient's warm-up too, the responses only after it
    answered = figures["rps"] * (figures["seconds"] + RR_WARMUP_SECONDS)
    return {name: Reading(figures["rps"], note),
            f"{name}: broker CPU": Reading(figures["server_cpu"] * 1e6 / answered)}
