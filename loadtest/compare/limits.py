"""storm, burst, quotas, control: the KIPs' own scenarios, with the same limits configured on
both brokers (Kafka's keys, which this broker takes too), each on a broker started for it.

  storm    KIP-402/612: p99 of ApiVersions on 20 existing connections paced at one request
           per 5 ms each, while two connclient processes open connections as fast as they
           can (loadtest/bench/fairness.py), under STORM_LIMITS;
  burst    KIP-72: peak resident memory while 200 connections each send two 1 MiB Produce
           requests at once (loadtest/bench/memory.py), queued.max.request.bytes 16 MiB;
  quotas   producer_byte_rate of 1 MB/s per client id, set with AlterClientQuotas on both
           (Kafka's quota.window.num and window size defaults, which are ours too): the rate
           each client's topic grew by once the first windows' burst is spent, as the error
           |held / quota - 1| (loadtest/bench/quotas.py);
  control  KIP-291: Metadata and DescribeConfigs round trips, one every 10 ms each, while
           loadtest/flood.py keeps 12 connections x 2 Produce requests of 1 MiB in flight with
           an 8 MiB request pool (loadtest/bench/control.py).  Apache Kafka 4 (KRaft) has no
           control-plane listener for clients (control.plane.listener.name went with
           ZooKeeper), so both are measured on their one data listener; ours on its own
           control-plane listener is in the notes.
"""

from __future__ import annotations

import tempfile

from loadtest.bench.common import metadata_frame, write_frames
from loadtest.bench.control import (SATURATING, WITH_CONTROL_PLANE, Flood, describe_configs_frame,
                                    percentiles_ms, probe_all)
from loadtest.bench.fairness import quiet_and_storm
from loadtest.bench.memory import LARGE_REQUESTS, POOL, burst
from loadtest.bench.quotas import LIMIT, held_rates
from loadtest.compare.brokers import NODE_ID, running
from loadtest.compare.rows import Reading, Row, join, measure_both

PARTS = ("storm", "burst", "quotas", "control")
STORM_LIMITS = {"max.connections": "1000", "max.connections.per.ip": "200",
                "max.connection.creation.rate": "500"}
STORM = "ApiVersions p99 of 20 existing connections during a connection storm"
BURST = "peak resident memory, burst of 400 x 1 MiB Produce requests"
BURST_GROWTH = "resident memory growth, burst of 400 x 1 MiB Produce requests"
BURST_TIME = "time to answer the burst of 400 x 1 MiB Produce requests"
QUOTA_CELLS = {"1 producer, 10 KiB records": ("quota-1p-10k", 1, 10_240),
               "3 producers of one client id, 100 B records": ("quota-3p-100", 3, 100)}
QUOTA_WINDOWS = 11  # quota.window.num's default on both
CONTROL_OVERRIDES = dict(SATURATING, **{"max.connections": "14"})
CONTROL_PROBES = ("Metadata", "DescribeConfigs")


def _quota_name(cell: str) -> str:
    return f"quota error |held / quota - 1|, {cell}"


def _control_name(probe: str) -> str:
    return f"{probe} p99 while the data plane is saturated"


def run(parts, seconds: float) -> list[dict]:
    records = []
    for part, rows, measure, overrides in _parts(seconds):
        if part in parts:
            records += join(rows, measure_both(rows, measure, overrides))
    if "control" in parts:
        _note_control_plane(records, seconds)
    return records


def _parts(seconds: float):
    """Each part as (its name, its rows, measure(broker), the overrides both start with)."""
    limits = ", ".join(f"{key}={value}" for key, value in STORM_LIMITS.items())
    yield ("storm", [Row(STORM, "ms", "lower", f"{limits} on both")],
           lambda broker: _storm(broker, seconds), STORM_LIMITS)
    pool = "queued.max.request.bytes=16 MiB, socket.request.max.bytes=2 MiB on both"
    yield ("burst", [Row(BURST, "MiB", "lower", pool), Row(BURST_GROWTH, "MiB", "lower"),
                     Row(BURST_TIME, "s", "lower")], _burst, dict(LARGE_REQUESTS, **POOL))
    yield ("quotas", [Row(_quota_name(cell), "%", "lower",
                          f"producer_byte_rate={LIMIT} per client id, confluent-kafka")
                      for cell in QUOTA_CELLS], lambda broker: _quotas(broker, seconds), None)
    saturated = "8 MiB pool, max.connections=14, 12 x 2 x 1 MiB Produce in flight, both"
    yield ("control", [Row(_control_name(probe), "ms", "lower",
                           f"{saturated} on the one data listener")
                       for probe in CONTROL_PROBES],
           lambda broker: _control(broker, seconds), CONTROL_OVERRIDES)


def _storm(broker, seconds: float) -> dict[str, Reading]:
    with tempfile.TemporaryDirectory(prefix="pybroker-compare-") as tmp:
        frame = write_frames(tmp)["apiversions"]
        # No untimed storm first: one beyond the creation rate pauses the acceptor until the
        # rate falls back under it (seconds: the rate is measured over quota.window.num
        # windows), and the paced clients would not get in.
        quiet, storm = quiet_and_storm(broker.address[1], frame, seconds)
    note = (f"quiet p99 {quiet['p99_us'] / 1e3:.2f} ms, storm {storm['storm_rate']:.0f} "
            f"connections/s accepted, {storm['storm_errors']} storm connections failed")
    if quiet["errors"] or storm["errors"]:
        note += f", {quiet['errors'] + storm['errors']} paced requests failed"
    return {STORM: Reading(storm["p99_us"] / 1e3, note)}


def _burst(broker) -> dict[str, Reading]:
    figures = burst(broker.address, broker.pids)
    note = f"{figures['errors']} unanswered" if figures["errors"] else ""
    return {BURST: Reading(figures["peak_rss"] / 2**20, note),
            BURST_GROWTH: Reading((figures["peak_rss"] - figures["baseline_rss"]) / 2**20,
                                  f"from {figures['baseline_rss'] / 2**20:.0f} MiB"),
            BURST_TIME: Reading(figures["seconds"])}


def _quotas(broker, seconds: float) -> dict[str, Reading]:
    # the burst of the first quota.window.num - 1 windows spent, then at least 10 s measured
    rates = held_rates(broker.address, broker.logs_dir, list(QUOTA_CELLS.values()),
                       warm=QUOTA_WINDOWS + 1.0, measure=max(10.0, 3 * seconds))
    readings = {}
    for cell, (client, *_) in QUOTA_CELLS.items():
        held = rates[client]["rate"] / LIMIT
        note = f"held {held:.3f} x quota"
        if rates[client]["errors"]:
            note += f", {rates[client]['errors']} delivery errors"
        readings[_quota_name(cell)] = Reading(abs(held - 1) * 100, note)
    return readings


def _control(broker, seconds: float, address=None) -> dict[str, Reading]:
    from tests.wire import create_topic

    address = address or broker.address
    frames = {"Metadata": metadata_frame(), "DescribeConfigs": describe_configs_frame(NODE_ID)}
    create_topic(f"{address[0]}:{address[1]}", "flood")  # topics: on the admin listener
    with Flood(broker.address[1], "flood", seconds + 3) as flood:
        times = probe_all(address, frames, seconds)
    readings = {}
    for probe in CONTROL_PROBES:
        if not times[probe]:
            readings[_control_name(probe)] = Reading(None, "the probe's connection failed")
            continue
        figures = percentiles_ms(times[probe])
        readings[_control_name(probe)] = Reading(
            figures["p99_ms"], f"p50 {figures['p50_ms']:.1f} ms, flood "
            f"{flood.figures['sent_bytes'] / 1e6 / (seconds + 3):.0f} MB/s"
            + (f", {flood.figures['errors']} flood errors" if flood.figures["errors"] else ""))
    return readings


def _note_control_plane(records: list[dict], seconds: float) -> None:
    """Ours again, the probes on its control-plane listener (Kafka has no counterpart): their
    p99 goes into the notes of the control rows."""
    overrides = dict(CONTROL_OVERRIDES, **WITH_CONTROL_PLANE)
    try:
        with running("ours", overrides) as broker:
            found = _control(broker, seconds, broker.process.listeners["CONTROLLER"])
    except Exception as error:  # noqa: BLE001 - a note, never a figure
        found = {_control_name(probe): Reading(None, str(error)[:200])
                 for probe in CONTROL_PROBES}
    for record in records:
        reading = found.get(record["name"])
        if reading is not None:
            figure = "none" if reading.value is None else f"p99 {reading.value:.1f} ms"
            record["notes"] += f"; ours on its control-plane listener: {figure}"
