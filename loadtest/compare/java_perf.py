"""Kafka's own load tools, kafka-producer-perf-test and kafka-consumer-perf-test, run against
either broker with the JVM options their scripts give (a 512 MiB heap, G1, full JIT), and
their summaries parsed."""

from __future__ import annotations

import re
import subprocess

from loadtest.apache_kafka import SERVER_JVM, TOOLS, java_command
from loadtest.bench.common import cpu_seconds

PERF_JVM = ["-Xmx512M", *SERVER_JVM[2:]]
# "N records sent, R records/sec (M MB/sec), A ms avg latency, X ms max latency, P ms 50th,
# ... ms 95th, ... ms 99th, ... ms 99.9th." (the steady-state line says "steady state records")
_SUMMARY = re.compile(
    r"(?P<records>\d+) (?:steady state )?records sent, (?P<rate>[\d.]+) records/sec .*?"
    r"(?P<avg>[\d.]+) ms avg latency, (?P<max>[\d.]+) ms max latency, (?P<p50>\d+) ms 50th, "
    r"(?P<p95>\d+) ms 95th, (?P<p99>\d+) ms 99th, (?P<p999>\d+) ms 99\.9th")


def _run(tool: str, args: list[str], pids: list[int], timeout: float) -> tuple[str, str, float]:
    """The tool's stdout and stderr, and the CPU seconds `pids` spent while it ran."""
    before = cpu_seconds(pids)
    result = subprocess.run(java_command(TOOLS[tool], args, PERF_JVM), capture_output=True,
                            text=True, timeout=timeout)
    spent = cpu_seconds(pids) - before
    if result.returncode != 0:
        raise RuntimeError(f"{tool} exited {result.returncode}: {result.stderr.strip()[-500:]}")
    return result.stdout, result.stderr, spent


def parse_producer_summary(stdout: str) -> dict:
    """The last summary line (the steady state's when there was a warm-up): records,
    records/s and latencies in ms."""
    found = [match for match in map(_SUMMARY.search, stdout.splitlines()) if match]
    if not found:
        raise RuntimeError(f"no summary line in kafka-producer-perf-test's output: "
                           f"{stdout.strip()[-300:]!r}")
    return {key: float(value) for key, value in found[-1].groupdict().items()}


def produce(bootstrap: str, pids: list[int], topic: str, records: int, size: int,
            settings: dict[str, str], rate: int = -1, warmup: int = 0) -> dict:
    """kafka-producer-perf-test: its summary, the broker CPU seconds spent meanwhile
    ("server_cpu"), and the send errors it printed ("errors")."""
    args = ["--topic", topic, "--num-records", str(records), "--record-size", str(size),
            "--throughput", str(rate), "--command-property", f"bootstrap.servers={bootstrap}",
            *(f"{key}={value}" for key, value in settings.items())]
    if warmup:
        args += ["--warmup-records", str(warmup)]
    stdout, stderr, spent = _run("kafka-producer-perf-test", args, pids,
                                 timeout=120 + records * size / 1e6)
    return dict(parse_producer_summary(stdout), server_cpu=spent,
                errors=stderr.count("Exception"))


def parse_consumer_summary(stdout: str) -> dict:
    """kafka-consumer-perf-test's CSV (a header, then one line of values) as a dict."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    for header, values in zip(lines, lines[1:]):
        if header.startswith("start.time"):
            keys = [key.strip() for key in header.split(",")]
            return dict(zip(keys, (value.strip() for value in values.split(","))))
    raise RuntimeError(f"no summary in kafka-consumer-perf-test's output: {stdout[-300:]!r}")


def consume(bootstrap: str, pids: list[int], topic: str, records: int,
            settings: dict[str, str]) -> dict:
    """kafka-consumer-perf-test reading `records` records (in a group of its own): records
    read, fetch seconds (the group's join excluded) and the broker CPU seconds spent."""
    args = ["--bootstrap-server", bootstrap, "--topic", topic, "--num-records", str(records),
            "--timeout", "30000"]
    if settings:
        args += ["--command-property", *(f"{key}={value}" for key, value in settings.items())]
    stdout, _, spent = _run("kafka-consumer-perf-test", args, pids, timeout=300)
    summary = parse_consumer_summary(stdout)
    return {"records": int(summary["data.consumed.in.nMsg"]),
            "seconds": float(summary["fetch.time.ms"]) / 1e3, "server_cpu": spent}
