"""`make bench`: the broker against baselines measured in the same run, printed as ratios.

Load comes from the C generators in loadtest/ (a Python client reaches only a fraction of what
a uvloop server serves on this 2-core machine):

  requests  rrclient, ApiVersions v3 (memoized answer) and Metadata v12 (decoded every time),
            100 connections x 1 in flight and 10 connections x 50 pipelined, against the broker
            with 1 and 2 workers, and the same frames against loadtest/echo_server.py;
  accepts   two connclient processes (disjoint source addresses), each connection doing
            connect, ApiVersions, answer, close against the broker, versus connect and wait
            for the server's close against loadtest/accept_close_server.py;
  fairness  p99 latency of ApiVersions on 20 long-lived connections (1 in flight each, one
            request per 5 ms per connection) alone, then during a storm of new connections
            (two connclient processes, 8 connects in flight each), with the KIP-402 bounds (hand-off 20, 20 registrations
            per loop turn), with both set to 10000 (the baseline), and with the bounds plus
            max.connection.creation.rate=500 (KIP-612 holding the storm back); and the accept rate with
            non-binding limits enabled (counts, per-IP, creation rates) versus none;
  memory    200 connections each sending two 1 MiB Produce requests at once, with the KIP-72
            pool on (queued.max.request.bytes 16 MiB) and off: peak resident memory of all
            broker processes together (sampled from /proc) and the time until all are answered;
  control   KIP-291: Metadata and DescribeConfigs, one every 10 ms each on its own connection,
            while loadtest/flood.py keeps 12 connections x 2 Produce requests of 1 MiB in flight
            (every data worker busy, the 8 MiB pool exhausted, max.connections=12 reached by
            the flood), sent on the control-plane listener; the baseline sends them on the
            data listener of a broker without a control plane under the same load (its
            max.connections is 14, so the probes get in).  A run where requests did not wait
            for pool memory at least half the time counts as an error (not saturated);
  events    ApiVersions with the event log on (the default) against a broker with
            pybroker.event.log.enable=false, same shapes (issue 8: cost <= 5 %); and once per
            run, the PySpark pipeline over a synthetic event log of --pipeline-gb GB
            (loadtest/events_gen.py): events per second, JVM start-up included;
  groups    a third confluent-kafka consumer joining a stable group of two (heartbeats every
            100 ms): seconds until all three hold their partitions; OffsetCommit round-trip
            p50/p99 on one connection for --seconds (issue 9; no baseline);
  log       confluent-kafka producing 1 KiB records (acks=1, no compression) to a topic of
            2 partitions for a few seconds, then a consumer reading them all back; reported
            in MB/s, records/s and broker CPU seconds (all processes) per MB.  No baseline.

Every configuration runs once per pass, passes interleave, and ratios are taken within a pass;
the table shows medians (min-max).  Exit status 1 if a target is missed or a client saw errors.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time

from loadtest.harness import BrokerProcess, rss

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.join(HERE, "bin")
# The project's goals (issue 2): (broker configurations, baseline, minimum ratio).  A goal is
# met when the best of its broker configurations reaches the ratio in the median pass.
TARGETS = (
    (("apiversions 1w 100x1", "apiversions 2w 100x1"), "echo 100x1", 0.8),
    (("apiversions 1w 10x50", "apiversions 2w 10x50"), "echo 10x50", 0.4),
    (("accept+handoff+register 2w",), "raw accept+close", 0.6),
    # Issue 8: writing the event log costs at most 5 % of small-request throughput.
    (("apiversions 1w 100x1",), "apiversions 1w 100x1, event log off", 0.95),
    (("apiversions 1w 10x50",), "apiversions 1w 10x50, event log off", 0.95),
)
UNTARGETED = (("metadata 2w 100x1", "echo 100x1"),
              ("accept limits on", "accept+handoff+register 2w"),
              ("produce 1KiB, others quoted", "produce 1KiB acks=1"))
FAIRNESS_TARGET = 2.0  # p99 during a storm / p99 without one, with the KIP-402 bounds
CONTROL_PLANE_P99_MS = 20.0  # issue 7: admin requests on the control plane while saturated
SHAPES = {"100x1": (100, 1), "10x50": (10, 50)}


def api_versions_frame() -> bytes:
    from kafka.protocol.metadata import ApiVersionsRequest

    request = ApiVersionsRequest[3](client_software_name="bench", client_software_version="1.0")
    request.with_header(correlation_id=7, client_id="bench")
    body = bytes(request.encode(header=True))
    return struct.pack(">i", len(body)) + body


def metadata_frame() -> bytes:
    from kafka.protocol.metadata import MetadataRequest

    request = MetadataRequest[12](topics=None, allow_auto_topic_creation=False,
                                  include_topic_authorized_operations=False)
    request.with_header(correlation_id=7, client_id="bench")
    body = bytes(request.encode(header=True))
    return struct.pack(">i", len(body)) + body


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


class Server:
    """A baseline server script from loadtest/, started and stopped by pid."""

    def __init__(self, script: str):
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, script)],
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        self.port = int(line.rsplit(":", 1)[1])
        self.pids = [self.proc.pid]

    def close(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(10)


class Broker:
    def __init__(self, workers: int, overrides: dict[str, str] | None = None):
        self.process = BrokerProcess(workers=workers, overrides=overrides).start()
        self.port = self.process.port
        self.pids = [self.process.pid] + list(self.process.worker_pids.values())

    def close(self):
        self.process.stop()


def run_rr(port: int, pids, frame_path: str, shape: str, seconds: float, mode: str):
    conns, depth = SHAPES[shape]
    before = cpu_seconds(pids)
    out = subprocess.run([os.path.join(BIN, "rrclient"), "127.0.0.1", str(port), str(conns),
                          str(depth), str(seconds), frame_path, "0.5", mode],
                         capture_output=True, text=True, timeout=seconds + 30)
    result = json.loads(out.stdout)
    result["server_cpu"] = cpu_seconds(pids) - before
    return result


def resident_bytes(pids: list[int]) -> int:
    return sum(rss(pid) for pid in pids)


def memory_burst(pool: bool) -> dict:
    import threading

    from tests.batches import make_batch
    from tests.wire import KafkaSocket, create_topic, produce_request

    mib = 1 << 20
    overrides = {"socket.request.max.bytes": str(2 * mib), "message.max.bytes": str(2 * mib)}
    if pool:
        overrides["queued.max.request.bytes"] = str(16 * mib)
    broker = Broker(2, overrides)
    try:
        create_topic(broker.process.bootstrap, "burst", 4)
        frames = [produce_request("burst", make_batch(1, value_size=mib - 200), partition=p,
                                  correlation_id=p) for p in range(4)]
        clients = [KafkaSocket(broker.process.listeners["PLAINTEXT"], timeout=120)
                   for _ in range(200)]
        baseline = resident_bytes(broker.pids)
        peak, stop = [baseline], threading.Event()

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], resident_bytes(broker.pids))
                time.sleep(0.005)

        sampler = threading.Thread(target=sample)
        sampler.start()
        started = time.monotonic()
        senders = [threading.Thread(target=c.send, args=(frames[i % 4] * 2,))
                   for i, c in enumerate(clients)]
        for sender in senders:
            sender.start()
        answered = sum(1 for c in clients for _ in range(2) if c.receive())
        elapsed = time.monotonic() - started
        stop.set()
        sampler.join()
        for client in clients:
            client.close()
    finally:
        broker.close()
    return {"peak_rss": peak[0], "baseline_rss": baseline, "seconds": elapsed,
            "answered": answered, "errors": 400 - answered}


def run_paced(port: int, frame_path: str, seconds: float) -> dict:
    out = subprocess.run([os.path.join(BIN, "rrclient"), "127.0.0.1", str(port), "20", "1",
                          str(seconds), frame_path, "0.5", "kafka", "5000"],
                         capture_output=True, text=True, timeout=seconds + 30)
    return json.loads(out.stdout)


def storm_fairness(frame_path: str, seconds: float) -> dict[str, dict]:
    figures = {}
    unbounded = {"pybroker.handoff.queue.size": "10000", "pybroker.registrations.per.turn": "10000"}
    rate_limited = {"max.connection.creation.rate": "500"}
    for label, overrides in (("bounded", None), ("unbounded", unbounded),
                             ("bounded, creation rate 500/s", rate_limited)):
        broker = Broker(2, overrides)
        try:
            figures[f"p99 quiet {label}"] = run_paced(broker.port, frame_path, seconds)
            storm = [subprocess.Popen([os.path.join(BIN, "connclient"), "127.0.0.1",
                                       str(broker.port), "8", str(seconds + 1.5), "req",
                                       frame_path, str(base)], stdout=subprocess.PIPE, text=True)
                     for base in (2, 122)]
            figures[f"p99 storm {label}"] = run_paced(broker.port, frame_path, seconds)
            storms = [json.loads(proc.communicate(timeout=seconds + 30)[0]) for proc in storm]
            figures[f"p99 storm {label}"]["storm_rate"] = sum(s["rate"] for s in storms)
        finally:
            broker.close()
    limits = {"max.connections": "1000000", "max.connections.per.ip": "1000000",
              "max.connection.creation.rate": "1000000000",
              "max.connection.creation.rate.per.ip": "1000000000"}
    broker = Broker(2, limits)
    try:
        figures["accept limits on"] = run_accept(broker.port, broker.pids, "req", frame_path, seconds)
    finally:
        broker.close()
    return figures


def run_accept(port: int, pids, mode: str, frame_path: str, seconds: float):
    before = cpu_seconds(pids)
    procs = [subprocess.Popen([os.path.join(BIN, "connclient"), "127.0.0.1", str(port), "32",
                               str(seconds), mode, frame_path, str(base)],
                              stdout=subprocess.PIPE, text=True) for base in (2, 122)]
    results = [json.loads(proc.communicate(timeout=seconds + 30)[0]) for proc in procs]
    return {"rate": sum(r["rate"] for r in results), "errors": sum(r["errors"] for r in results),
            "server_cpu": cpu_seconds(pids) - before,
            "connections": sum(r["connections"] for r in results)}


def run_kafka_load(*args) -> dict:
    out = subprocess.run([sys.executable, "-m", "loadtest.kafka_load", *map(str, args)],
                         capture_output=True, text=True, timeout=300,
                         cwd=os.path.dirname(HERE))
    return json.loads(out.stdout)


def produce_consume(seconds: float) -> dict[str, dict]:
    from tests.wire import alter_client_quota, create_topic

    broker = Broker(2)
    try:
        create_topic(broker.process.bootstrap, "bench", 2)
        before = cpu_seconds(broker.pids)
        produced = run_kafka_load("produce", broker.process.bootstrap, "bench", seconds, 1024)
        middle = cpu_seconds(broker.pids)
        consumed = run_kafka_load("consume", broker.process.bootstrap, "bench", produced["records"])
        after = cpu_seconds(broker.pids)
    finally:
        broker.close()
    # The cost of quota accounting: the same producer, unthrottled, on a fresh broker where
    # other clients have quotas (so every request resolves its quotas).
    broker = Broker(2)
    try:
        create_topic(broker.process.bootstrap, "bench", 2)
        address = broker.process.listeners["PLAINTEXT"]
        for key in ("producer_byte_rate", "consumer_byte_rate", "request_percentage"):
            alter_client_quota(address, {"client-id": "someone-else"}, key, 1000)
        quoted_before = cpu_seconds(broker.pids)
        quoted = run_kafka_load("produce", broker.process.bootstrap, "bench", seconds, 1024)
        quoted_after = cpu_seconds(broker.pids)
    finally:
        broker.close()
    return {"produce 1KiB acks=1": dict(produced, server_cpu=middle - before,
                                        errors=produced["failed"]),
            "consume 1KiB": dict(consumed, server_cpu=after - middle, errors=consumed["missing"]),
            "produce 1KiB, others quoted": dict(quoted, server_cpu=quoted_after - quoted_before,
                                                errors=quoted["failed"])}


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


def commit_frame(correlation: int) -> bytes:
    """OffsetCommit v8 of one partition's offset for a group without members."""
    from kafka.protocol.consumer.group import OffsetCommitRequest

    topic = OffsetCommitRequest.OffsetCommitRequestTopic
    request = OffsetCommitRequest[8](
        group_id="bench-commits", generation_id_or_member_epoch=-1, member_id="",
        group_instance_id=None, topics=[topic(name="bench-groups", partitions=[
            topic.OffsetCommitRequestPartition(partition_index=0, committed_offset=correlation,
                                               committed_leader_epoch=-1,
                                               committed_metadata=None)])])
    request.with_header(correlation_id=correlation, client_id="bench")
    body = bytes(request.encode(header=True))
    return struct.pack(">i", len(body)) + body


def group_figures(seconds: float) -> dict[str, dict]:
    """Issue 9: a third member joining a stable group of two (confluent-kafka, heartbeats every
    100 ms) until all three hold partitions; and OffsetCommit round trips on one connection."""
    from confluent_kafka import Consumer

    from tests.wire import KafkaSocket, create_topic

    broker = Broker(2, {"group.initial.rebalance.delay.ms": "0"})
    figures = {}
    consumers = []
    try:
        create_topic(broker.process.bootstrap, "bench-groups", 6)

        def member():
            consumer = Consumer({"bootstrap.servers": broker.process.bootstrap,
                                 "group.id": "bench-group", "heartbeat.interval.ms": 100,
                                 "session.timeout.ms": 6000, "enable.auto.commit": False})
            consumer.subscribe(["bench-groups"])
            consumers.append(consumer)
            return consumer

        def settled(count: int, deadline: float) -> bool:
            while time.monotonic() < deadline:
                for consumer in consumers:
                    consumer.poll(0.01)
                if len(consumers) == count and all(len(c.assignment()) == 6 // count
                                                   for c in consumers):
                    return True
            return False

        member(), member()
        ok = settled(2, time.monotonic() + 30)
        started = time.monotonic()
        member()
        ok = settled(3, time.monotonic() + 30) and ok
        figures["group join"] = {"seconds": time.monotonic() - started, "errors": int(not ok)}
        times = []
        with KafkaSocket(broker.process.listeners["PLAINTEXT"]) as client:
            deadline = time.monotonic() + seconds
            correlation = 0
            while time.monotonic() < deadline:
                correlation += 1
                frame = commit_frame(correlation)
                began = time.perf_counter()
                client.send(frame)
                client.receive()
                times.append(time.perf_counter() - began)
        times.sort()
        figures["offset commit"] = {"p50_ms": times[len(times) // 2] * 1e3,
                                    "p99_ms": times[int(len(times) * 0.99)] * 1e3,
                                    "count": len(times), "errors": 0}
    finally:
        for consumer in consumers:
            consumer.close()
        broker.close()
    return figures


def one_pass(frames: dict[str, str], seconds: float) -> dict[str, dict]:
    figures = {}
    echo = Server("echo_server.py")
    try:
        for shape in SHAPES:
            figures[f"echo {shape}"] = run_rr(echo.port, echo.pids, frames["apiversions"], shape,
                                              seconds, "echo")
    finally:
        echo.close()
    broker = Broker(1, {"pybroker.event.log.enable": "false"})
    try:
        for shape in SHAPES:
            figures[f"apiversions 1w {shape}, event log off"] = run_rr(
                broker.port, broker.pids, frames["apiversions"], shape, seconds, "kafka")
    finally:
        broker.close()
    for workers in (1, 2):
        broker = Broker(workers)
        try:
            for shape in SHAPES:
                figures[f"apiversions {workers}w {shape}"] = run_rr(
                    broker.port, broker.pids, frames["apiversions"], shape, seconds, "kafka")
            if workers == 2:
                figures["metadata 2w 100x1"] = run_rr(broker.port, broker.pids,
                                                      frames["metadata"], "100x1", seconds, "kafka")
                figures["accept+handoff+register 2w"] = run_accept(
                    broker.port, broker.pids, "req", frames["apiversions"], seconds)
        finally:
            broker.close()
    figures.update(produce_consume(seconds))
    figures.update(storm_fairness(frames["apiversions"], seconds))
    figures.update(control_plane_latency(seconds))
    figures.update(group_figures(seconds))
    figures["burst pool on"] = memory_burst(pool=True)
    figures["burst pool off"] = memory_burst(pool=False)
    raw = Server("accept_close_server.py")
    try:
        figures["raw accept+close"] = run_accept(raw.port, raw.pids, "fin", "-", seconds)
    finally:
        raw.close()
    return figures


def summarize(passes: list[dict[str, dict]]) -> int:
    def spread(values):
        return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"

    print(f"\n{'configuration':32} {'per second, median (min-max)':>34} {'server us/op':>13} errors")
    errors = 0
    for name in [n for n in passes[0] if "1KiB" not in n and not n.startswith(
            ("p99", "burst", "control plane", "data listener", "group join", "offset commit"))]:
        rates = [p[name].get("rps", p[name].get("rate")) for p in passes]
        ops = [p[name].get("responses", p[name].get("connections")) for p in passes]
        cost = statistics.median(p[name]["server_cpu"] / max(1, n) * 1e6
                                 for p, n in zip(passes, ops))
        failed = sum(p[name]["errors"] for p in passes)
        errors += failed
        print(f"{name:32} {spread(rates):>34} {cost:>13.2f} {failed}")
    print(f"\n{'log (confluent-kafka, 2 partitions)':32} {'MB/s':>16} {'records/s':>16} "
          f"{'CPU s/MB':>10} errors")
    for name in [n for n in passes[0] if "1KiB" in n]:
        megabytes = [p[name]["bytes"] / 1e6 / p[name]["seconds"] for p in passes]
        rates = [p[name]["records"] / p[name]["seconds"] for p in passes]
        cost = statistics.median(p[name]["server_cpu"] / max(1e-9, p[name]["bytes"] / 1e6)
                                 for p in passes)
        failed = sum(p[name]["errors"] for p in passes)
        errors += failed
        print(f"{name:32} {statistics.median(megabytes):>16,.1f} {statistics.median(rates):>16,.0f} "
              f"{cost:>10.4f} {failed}")
    print(f"\n{'200 x 2 x 1 MiB produce burst':32} {'peak RSS MiB':>14} {'idle RSS MiB':>14} "
          f"{'seconds':>9} errors")
    for name in ("burst pool on", "burst pool off"):
        peak = statistics.median(p[name]["peak_rss"] for p in passes) / 2**20
        idle = statistics.median(p[name]["baseline_rss"] for p in passes) / 2**20
        took = statistics.median(p[name]["seconds"] for p in passes)
        failed = sum(p[name]["errors"] for p in passes)
        errors += failed
        print(f"{name:32} {peak:>14,.0f} {idle:>14,.0f} {took:>9.2f} {failed}")
    print(f"\n{'latency on 20 existing connections':32} {'p99 us quiet':>14} {'p99 us storm':>14} "
          f"{'ratio':>7} {'storm conn/s':>13}")
    for label in ("bounded", "unbounded", "bounded, creation rate 500/s"):
        quiet = [p[f"p99 quiet {label}"]["p99_us"] for p in passes]
        stormy = [p[f"p99 storm {label}"]["p99_us"] for p in passes]
        ratio = statistics.median(s / max(q, 1e-9) for q, s in zip(quiet, stormy))
        rate = statistics.median(p[f"p99 storm {label}"]["storm_rate"] for p in passes)
        errors += sum(p[f"p99 {kind} {label}"]["errors"] for p in passes for kind in ("quiet", "storm"))
        print(f"{label:32} {statistics.median(quiet):>14,.0f} {statistics.median(stormy):>14,.0f} "
              f"{ratio:>7.2f} {rate:>13,.0f}")
    missed, failed = _print_control_plane(passes)
    errors += failed
    errors += _print_groups(passes)
    print(f"\n{'ratio (same pass)':58} {'median (min-max)':>18}  target")
    for measured_names, baseline, target in TARGETS:
        best = 0.0
        for measured in measured_names:
            best = max(best, _print_ratio(passes, measured, baseline, f">= {target}"))
        met = best >= target
        missed += not met
        print(f"{'':58} {'goal ' + ('met' if met else 'MISSED'):>18}")
    for measured, baseline in UNTARGETED:
        _print_ratio(passes, measured, baseline, "(no target)")
    fairness = statistics.median(p["p99 storm bounded"]["p99_us"] / max(p["p99 quiet bounded"]["p99_us"], 1e-9)
                                 for p in passes)
    met = fairness <= FAIRNESS_TARGET
    missed += not met
    print(f"{'storm p99 / quiet p99, bounded':58} {fairness:>6.2f}{'':13}  <= {FAIRNESS_TARGET}  "
          f"{'goal met' if met else 'goal MISSED'}")
    return 1 if missed or errors else 0


def _print_groups(passes) -> int:
    """Print the consumer-group figures; return the errors seen."""
    joins = [p["group join"]["seconds"] for p in passes]
    commits = [p["offset commit"] for p in passes]
    print(f"\n{'consumer groups':48} {'median':>8} {'min':>8} {'max':>8}")
    print(f"{'3rd member joins a group of 2: all assigned, s':48} {statistics.median(joins):>8.3f} "
          f"{min(joins):>8.3f} {max(joins):>8.3f}")
    for key in ("p50_ms", "p99_ms"):
        values = [c[key] for c in commits]
        print(f"{'OffsetCommit round trip ' + key.replace('_', ' '):48} "
              f"{statistics.median(values):>8.3f} {min(values):>8.3f} {max(values):>8.3f}")
    return sum(p["group join"]["errors"] + p["offset commit"]["errors"] for p in passes)


def _print_control_plane(passes) -> tuple[int, int]:
    """Print the KIP-291 latencies; return (goals missed, errors)."""
    print(f"\n{'admin requests, data plane saturated':48} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'samples':>8} {'flood MB/s':>11} {'depleted s':>11} errors")
    errors, missed = 0, 0
    for plane in ("control plane", "data listener, no control plane"):
        for api in ("Metadata", "DescribeConfigs"):
            name = f"{plane} {api}"
            p50 = statistics.median(p[name]["p50_ms"] for p in passes)
            p99 = statistics.median(p[name]["p99_ms"] for p in passes)
            count = statistics.median(p[name]["count"] for p in passes)
            flood = statistics.median(p[name]["flood_mb_s"] for p in passes)
            depleted = statistics.median(p[name]["depleted_s"] for p in passes)
            failed = sum(p[name]["errors"] for p in passes)
            errors += failed
            print(f"{name:48} {p50:>8.2f} {p99:>8.2f} {count:>8.0f} {flood:>11,.0f} "
                  f"{depleted:>11.1f} {failed}")
            if plane == "control plane":
                met = p99 <= CONTROL_PLANE_P99_MS
                missed += not met
                print(f"{'':48} p99 <= {CONTROL_PLANE_P99_MS:.0f} ms: "
                      f"{'goal met' if met else 'goal MISSED'}")
    return missed, errors


def _print_ratio(passes, measured: str, baseline: str, note: str) -> float:
    ratios = [_rate(p[measured]) / _rate(p[baseline]) for p in passes]
    median = statistics.median(ratios)
    print(f"{measured + ' / ' + baseline:58} {median:>6.2f} ({min(ratios):.2f}-{max(ratios):.2f})  "
          f"{note}")
    return median


def _rate(result: dict) -> float:
    if "rps" in result or "rate" in result:
        return result.get("rps", result.get("rate"))
    return result["bytes"] / result["seconds"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--pipeline-gb", type=float, default=1.0,
                        help="size of the synthetic event log for the pipeline (0 skips it)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pybroker-bench-") as tmp:
        frames = {}
        for name, data in (("apiversions", api_versions_frame()), ("metadata", metadata_frame())):
            frames[name] = os.path.join(tmp, f"{name}.bin")
            with open(frames[name], "wb") as handle:
                handle.write(data)
        passes = []
        for number in range(args.passes):
            started = time.monotonic()
            passes.append(one_pass(frames, args.seconds))
            print(f"pass {number + 1}/{args.passes} done in {time.monotonic() - started:.0f}s",
                  flush=True)
        pipeline = pipeline_throughput(args.pipeline_gb, tmp) if args.pipeline_gb > 0 else None
    status = summarize(passes)
    if pipeline is not None:
        print(f"\n{'PySpark pipeline, local[*]':32} {'GB':>6} {'events':>12} {'seconds':>9} "
              f"{'events/s':>10} {'MB/s':>7}")
        print(f"{'synthetic event log':32} {pipeline['bytes'] / 1e9:>6.2f} "
              f"{pipeline['events']:>12,} {pipeline['seconds']:>9.1f} "
              f"{pipeline['events'] / pipeline['seconds']:>10,.0f} "
              f"{pipeline['bytes'] / 1e6 / pipeline['seconds']:>7.1f}")
        if not pipeline["ok"]:
            print("pipeline: the job failed or miscounted its input")
            status = 1
    return status


def pipeline_throughput(gigabytes: float, tmp: str) -> dict:
    """Generate an event log of `gigabytes`, run `python -m pipeline` on it, time it."""
    from loadtest.events_gen import generate

    directory = os.path.join(tmp, "events")
    lines, size = generate(directory, int(gigabytes * 1e9))
    out = os.path.join(tmp, "pipeline-out")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pipeline", "--events", directory, "--out", out],
                          capture_output=True, text=True, timeout=3600)
    took = time.monotonic() - started
    ok = done.returncode == 0
    if ok:
        with open(os.path.join(out, "summary.json")) as handle:
            ok = json.load(handle)["events"] == lines
    else:
        print(done.stderr[-2000:])
    return {"events": lines, "bytes": size, "seconds": took, "ok": ok}


if __name__ == "__main__":
    sys.exit(main())
