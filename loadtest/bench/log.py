"""log: confluent-kafka (loadtest/kafka_load.py) producing 1 KiB records (acks=1, no
compression) to a topic of 2 partitions for --seconds, then a consumer reading them all back
(zero-copy fetch), then the same consumer on the same log with `pybroker.fetch.zero.copy=false`
(records copied through Python); and the same producer on a broker where other clients have quotas (the cost of quota
accounting).  Reported in MB/s, records/s and broker CPU seconds (all processes) per MB.
No baseline."""

from __future__ import annotations

import json
import mmap
import os
import resource
import subprocess
import sys
import tempfile

from loadtest.bench.common import HERE, Broker, cpu_seconds


def run_kafka_load(*args) -> dict:
    """The client's figures, with the CPU seconds it used ("client_cpu": a client at one
    core's worth of its elapsed time is what bounds MB/s, not the broker)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-m", "loadtest.kafka_load", *map(str, args)],
                         capture_output=True, text=True, timeout=300,
                         cwd=os.path.dirname(HERE))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return dict(json.loads(out.stdout), client_cpu=after.ru_utime + after.ru_stime
                - before.ru_utime - before.ru_stime)


def file_write_floor(directory: str, megabytes: float) -> float:
    """CPU seconds this process spends appending `megabytes` to a new file in `directory`
    with one pwritev per MiB, as the log does: the kernel's part of produce on this machine
    (taking fresh pages for the page cache is most of it, and costs 0.2 to 2 ms per MB here
    depending on whether the VM touched those pages before)."""
    chunk = mmap.mmap(-1, 1 << 20)
    chunk[:] = os.urandom(1 << 20)
    path = os.path.join(directory, "floor.bin")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        before = resource.getrusage(resource.RUSAGE_SELF)
        for index in range(max(1, int(megabytes * 1e6) >> 20)):
            os.pwritev(fd, (b"\0" * 8, memoryview(chunk)[8:]), index << 20)
        after = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        os.close(fd)
        os.unlink(path)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def measured(broker, *args) -> dict:
    """A kafka_load run's figures with the CPU seconds the processes of `broker` (anything
    with `.pids`) spent meanwhile ("server_cpu"), of which "server_user" in user mode (for
    this broker Python's part; the rest is the kernel's)."""
    before, user_before = cpu_seconds(broker.pids), cpu_seconds(broker.pids, system=False)
    figures = run_kafka_load(*args)
    return dict(figures, server_cpu=cpu_seconds(broker.pids) - before,
                server_user=cpu_seconds(broker.pids, system=False) - user_before)


def produce_consume(seconds: float) -> dict[str, dict]:
    from tests.wire import alter_client_quota, create_topic

    with tempfile.TemporaryDirectory(prefix="pybroker-bench-log-") as data_dir:
        broker = Broker(2, data_dir=data_dir)
        try:
            bootstrap = broker.process.bootstrap
            create_topic(bootstrap, "bench", 2)
            produced = measured(broker, "produce", bootstrap, "bench", seconds, 1024)
            os.sync()  # both consumers start with the log written back, not one mid-writeback
            consumed = measured(broker, "consume", bootstrap, "bench", produced["records"])
        finally:
            broker.close()
        floor = file_write_floor(data_dir, produced["records"] * 1024 / 1e6)
        broker = Broker(2, {"pybroker.fetch.zero.copy": "false"}, data_dir=data_dir)
        try:
            copied = measured(broker, "consume", broker.process.bootstrap, "bench",
                               produced["records"])
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
        quoted = measured(broker, "produce", broker.process.bootstrap, "bench", seconds, 1024)
    finally:
        broker.close()
    return {"produce 1KiB acks=1": dict(produced, errors=produced["failed"], write_floor=floor),
            "consume 1KiB": dict(consumed, errors=consumed["missing"]),
            "consume 1KiB, copying": dict(copied, errors=copied["missing"]),
            "produce 1KiB, others quoted": dict(quoted, errors=quoted["failed"])}
