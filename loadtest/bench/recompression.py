"""recompression: the append cost of a topic's compression.type, in one process.

    python -m loadtest.bench.recompression [--megabytes 64] [--record-bytes 1024] [--json]

Batches of 1 MiB of records (librdkafka's batch.size) with values of random capital letters
(kafka-producer-perf-test's payload) are appended to a partition in a temporary directory
exactly as a worker appends them (Partition.check, its steps, Partition.append), once per
(batch codec, topic compression.type): `producer` stores them as they come, any other codec
recompresses them.  Reported: MB/s of records appended per CPU second (the records'
uncompressed bytes), and the stored bytes per record byte.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time

from broker.shared.log.settings import LogSettings
from broker.shared.log.topics import Epoch, TopicRegistry
from tests.batches import compressed
from tests.raw_batches import batch_of, record

SOURCES = {"none": 0, "lz4": 3}
TOPIC_TYPES = ("producer", "zstd", "lz4", "snappy", "gzip", "uncompressed")
BATCH_BYTES = 1 << 20
STEP_RECORDS = 10_000  # as the worker's SLICE_RECORDS


def batches(megabytes: int, record_bytes: int, codec: int) -> tuple[list[bytes], int]:
    """Batches holding `megabytes` of records, and the records' bytes."""
    rng = random.Random(1)
    per_batch = max(1, BATCH_BYTES // record_bytes)
    made, total = [], 0
    while total < megabytes << 20:
        body = b"".join(record(index, 0, bytes(rng.choices(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ",
                                                            k=record_bytes)), b"key-%d" % index)
                        for index in range(per_batch))
        batch = batch_of(body, per_batch, int(time.time() * 1000))
        made.append(compressed(batch, codec) if codec else batch)
        total += len(body)
    return made, total


def append_all(made: list[bytes], topic_type: str) -> tuple[float, int]:
    """(CPU seconds, bytes stored) of appending every batch to a fresh partition."""
    with tempfile.TemporaryDirectory(prefix="pybroker-recompress-") as directory:
        registry = TopicRegistry((directory,), LogSettings(max_message_bytes=64 << 20), Epoch())
        registry.create("bench", 1)
        registry.set_configs("bench", {"compression.type": topic_type})
        partition = registry.partition("bench", 0)
        started = time.process_time()
        for batch in made:
            check = partition.check(batch)
            while not check.step(STEP_RECORDS):
                pass
            result = partition.append(check.stored or batch, checked=check.batch)
            assert result.error is None, result
        spent = time.process_time() - started
        stored = sum(os.path.getsize(os.path.join(partition.directory, name))
                     for name in os.listdir(partition.directory) if name.endswith(".log"))
        registry.close()
    return spent, stored


def measure(megabytes: int, record_bytes: int) -> dict[str, dict]:
    figures = {}
    for source, codec in SOURCES.items():
        made, total = batches(megabytes, record_bytes, codec)
        for topic_type in TOPIC_TYPES:
            spent, stored = append_all(made, topic_type)
            figures[f"{source} -> {topic_type}"] = {
                "mb_per_cpu_s": total / 1e6 / spent, "stored_per_byte": stored / total,
                "cpu_s": spent, "records_mb": total / 1e6}
    return figures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench.recompression")
    parser.add_argument("--megabytes", type=int, default=64)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    figures = measure(args.megabytes, args.record_bytes)
    if args.json:
        print(json.dumps(figures))
        return 0
    print(f"{'batch -> compression.type':28s} {'MB/s (CPU)':>10s} {'stored/record byte':>19s}")
    for name, row in figures.items():
        print(f"{name:28s} {row['mb_per_cpu_s']:10.0f} {row['stored_per_byte']:19.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
