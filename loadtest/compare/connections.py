"""accepts, connects, idle: what connections cost.

  accepts   connections per second from loadtest/bin/connclient (two processes, 32 connects
            in flight each, 200 source addresses), each connect, ApiVersions, answer, close
            (loadtest/bench/accepts.py), and the broker's CPU per connection;
  connects  SEQUENTIAL connections opened one after another by one client and held, with and
            without one ApiVersions round trip each (loadtest/bench/connects.py);
  idle      the growth of the broker's resident memory (ours: parent and workers; Kafka: the
            JVM) per connection while IDLE answered connections are held by four client
            processes, on a broker started for it (memory the earlier runs touched would hide
            what the connections take).  IDLE is 20,000, or less where the hard open-files
            limit (RLIMIT_NOFILE; raised if this process may) leaves no room for them and the
            broker's own files.
"""

from __future__ import annotations

import resource
import tempfile

from loadtest.bench.accepts import run_accept
from loadtest.bench.common import api_versions_frame, write_frames
from loadtest.bench.connects import SEQUENTIAL, Holding, raise_open_files, timed_connects
from loadtest.bench.memory import resident_bytes
from loadtest.compare.brokers import warmup_seconds
from loadtest.compare.rows import Reading, Row, attempt, join, measure_both

PARTS = ("accepts", "connects", "idle")
WANTED_IDLE = 20_000
IDLE_HEADROOM = 1_000  # descriptors the broker needs besides the connections
# Kafka's default listen backlog is 50 (ours min(somaxconn, 4096)): past 50 connections not
# yet accepted the kernel drops SYNs, and a dropped SYN costs its client a second
BACKLOG = {"socket.listen.backlog.size": "4096"}
IDLE_OVERRIDES = dict(BACKLOG, **{"connections.max.idle.ms": "3600000"})
WARMUP_CONNECTS = 1_000
ACCEPTS = "accepted connections/s, each connect + ApiVersions + close"
CONNECTS = f"{SEQUENTIAL:,} sequential connects, held"
CONNECTS_REQUEST = f"{SEQUENTIAL:,} sequential connects + one ApiVersions each, held"


def idle_count() -> int:
    """WANTED_IDLE, or what the hard open-files limit leaves room for."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY:
        return WANTED_IDLE
    return max(1_000, min(WANTED_IDLE, hard - IDLE_HEADROOM))


def _idle_name() -> str:
    return f"memory per idle connection, {idle_count():,} held"


def _rows(parts) -> list[Row]:
    rows = []
    if "accepts" in parts:
        rows += [Row(ACCEPTS, "connections/s", "higher",
                     "connclient, 2 x 32 in flight; socket.listen.backlog.size=4096 on both"),
                 Row(f"{ACCEPTS}: broker CPU", "CPU us/connection", "lower")]
    if "connects" in parts:
        backlog = ("socket.listen.backlog.size=4096 on both (Kafka's default, 50, drops SYNs "
                   "when its acceptor falls 50 behind: 1 s each)")
        rows += [Row(CONNECTS, "s", "lower", backlog), Row(CONNECTS_REQUEST, "s", "lower")]
    if "idle" in parts:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        rows.append(Row(_idle_name(), "KiB", "lower",
                        f"growth of resident memory (RSS) / connections; hard RLIMIT_NOFILE "
                        f"{hard}, connections.max.idle.ms=3600000 on both"))
    return rows


def run(parts, seconds: float) -> list[dict]:
    if "idle" in parts:  # both brokers inherit it (raising the hard limit takes root)
        raise_open_files(WANTED_IDLE + IDLE_HEADROOM)
    rows = _rows(parts)
    results = None
    if "accepts" in parts or "connects" in parts:
        results = measure_both(rows, lambda broker: _measure(broker, parts, seconds), BACKLOG)
    if "idle" in parts:
        results = measure_both([row for row in rows if row.name == _idle_name()], _idle,
                               IDLE_OVERRIDES, into=results)
    return join(rows, results)


def _measure(broker, parts, seconds: float) -> dict[str, Reading]:
    """Each load once untimed (brokers.warmup_seconds, or WARMUP_CONNECTS), then timed."""
    readings: dict[str, Reading] = {}
    port = broker.address[1]
    if "accepts" in parts:
        with tempfile.TemporaryDirectory(prefix="pybroker-compare-") as tmp:
            frame = write_frames(tmp)["apiversions"]
            run_accept(port, broker.pids, "req", frame, warmup_seconds(seconds))
            attempt(readings, [ACCEPTS, f"{ACCEPTS}: broker CPU"], lambda: _accepts(
                run_accept(port, broker.pids, "req", frame, seconds)))
    if "connects" in parts:
        for name, frame in ((CONNECTS, None), (CONNECTS_REQUEST, api_versions_frame())):
            timed_connects(broker.address, WARMUP_CONNECTS, frame)
            attempt(readings, [name], lambda: _connects(
                name, timed_connects(broker.address, SEQUENTIAL, frame)))
    return readings


def _accepts(figures: dict) -> dict[str, Reading]:
    if figures["connections"] <= 0:
        raise RuntimeError(f"no connection completed ({figures['errors']} errors)")
    note = f"{figures['errors']} errors" if figures["errors"] else ""
    return {ACCEPTS: Reading(figures["rate"], note),
            f"{ACCEPTS}: broker CPU": Reading(figures["server_cpu"] * 1e6
                                              / figures["connections"])}


def _connects(name: str, figures: dict) -> dict[str, Reading]:
    note = f"{figures['stalls']} connects over 0.5 s" if figures["stalls"] else ""
    return {name: Reading(figures["seconds"], note)}


def _idle(broker) -> dict[str, Reading]:
    count = idle_count()
    before = resident_bytes(broker.pids)
    with Holding(broker.address, count) as held:
        after = resident_bytes(broker.pids)
    if held.connections < count:
        raise RuntimeError(f"only {held.connections} of {count} connections were answered")
    return {_idle_name(): Reading((after - before) / 1024 / held.connections,
                                  f"opened in {held.seconds:.1f} s, RSS "
                                  f"{before / 2**20:.0f} -> {after / 2**20:.0f} MiB")}
