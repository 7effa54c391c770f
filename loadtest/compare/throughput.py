"""produce, consume and latency: the data path with two clients, Kafka's Java perf tools and
confluent-kafka (loadtest/kafka_load.py), on one broker start per side.

  produce  1 KiB and 16 KiB records, acks=1 and acks=all idempotent, no compression, linger
           5 ms, 1 MiB batches, to a topic of 2 partitions: MB/s and the broker's CPU per MB.
           The Java runs are sized to last about --seconds at the rate a warm-up run of the
           same tool reached on that broker (which also warms Kafka's JIT); confluent-kafka
           runs for --seconds.
  consume  the records of the 1 KiB acks=1 Java run read back from the start, by
           kafka-consumer-perf-test (its fetch time: the group join left out) and by
           confluent-kafka (assigned partitions): MB/s and the broker's CPU per MB.
  recompress  confluent-kafka's uncompressed 1 KiB records (acks=1, as in produce) to a topic
           whose compression.type is zstd, so the broker compresses every batch again at
           append: MB/s and the broker's CPU per MB.
  latency  kafka-producer-perf-test at LATENCY_RATE records/s of 1 KiB (well below either
           broker's saturation), acks=all, linger 0: p50, p99 and p99.9 of the steady state
           after a warm-up of LATENCY_WARMUP_SECONDS.
MB is 10^6 bytes; CPU is the broker's processes' utime + stime over the run.
"""

from __future__ import annotations

import json

from loadtest.bench.log import measured
from loadtest.compare import java_perf
from loadtest.compare.rows import Reading, Row, attempt, join, measure_both

PARTS = ("produce", "consume", "recompress", "latency")
SIZES = (1024, 16384)
ACKS = {"acks=1": {"acks": "1", "enable.idempotence": "false"},
        "acks=all idempotent": {"acks": "all", "enable.idempotence": "true"}}
BATCHING = {"linger.ms": "5", "batch.size": str(1 << 20), "compression.type": "none"}
CONSUMER = {"fetch.max.bytes": str(50 << 20), "max.partition.fetch.bytes": str(8 << 20)}
CLIENTS = ("Java", "confluent-kafka")
PARTITIONS = 2
OVERRIDES = {"group.initial.rebalance.delay.ms": "0"}
WARMUP_RECORDS = 30_000
MIN_BYTES, MAX_BYTES = 5e6, 2e9
LATENCY_RATE = 1000
LATENCY_WARMUP_SECONDS = 3
MB = 1e6
RECOMPRESS = "produce 1 KiB acks=1 uncompressed to a compression.type=zstd topic, confluent-kafka"


def _kib(size: int) -> str:
    return f"{size // 1024} KiB"


def _produce_name(size: int, acks: str, client: str) -> str:
    return f"produce {_kib(size)} {acks}, {client}"


def _rows(parts) -> list[Row]:
    rows = []
    if "produce" in parts:
        for client in CLIENTS:
            for size in SIZES:
                for acks in ACKS:
                    name = _produce_name(size, acks, client)
                    rows += [Row(name, "MB/s", "higher"),
                             Row(f"{name}: broker CPU", "CPU ms/MB", "lower")]
    if "consume" in parts:
        for client in CLIENTS:
            rows += [Row(f"consume 1 KiB, {client}", "MB/s", "higher"),
                     Row(f"consume 1 KiB, {client}: broker CPU", "CPU ms/MB", "lower")]
    if "recompress" in parts:
        rows += [Row(RECOMPRESS, "MB/s", "higher", "values of one repeated byte, as in produce"),
                 Row(f"{RECOMPRESS}: broker CPU", "CPU ms/MB", "lower")]
    if "latency" in parts:
        rows += [Row(f"produce latency {label}, 1 KiB at {LATENCY_RATE}/s, acks=all", "ms",
                     "lower", "kafka-producer-perf-test, whole milliseconds")
                 for label in ("p50", "p99", "p99.9")]
    return rows


def run(parts, seconds: float) -> list[dict]:
    rows = _rows(parts)
    return join(rows, measure_both(rows, lambda broker: _measure(broker, parts, seconds),
                                   OVERRIDES))


def _figures(name: str, moved_bytes: float, seconds: float, server_cpu: float,
             note: str = "") -> dict[str, Reading]:
    megabytes = moved_bytes / MB
    if megabytes <= 0 or seconds <= 0:
        raise RuntimeError(f"{name}: nothing moved ({moved_bytes:.0f} bytes in {seconds:.2f} s)")
    return {name: Reading(megabytes / seconds, note),
            f"{name}: broker CPU": Reading(server_cpu * 1e3 / megabytes)}


def _java_produce(broker, topic: str, records: int, size: int, acks: str) -> dict:
    return java_perf.produce(broker.bootstrap, broker.pids, topic, records, size,
                             dict(BATCHING, **ACKS[acks]))


def _measure(broker, parts, seconds: float) -> dict[str, Reading]:
    """Every selected run on one broker, in order: the warm-up, the produce runs (the first
    writes the topic the consumers read), the consumers, the latency run."""
    from tests.wire import create_topic

    topics = iter(f"topic-{n}" for n in range(100))

    def topic() -> str:
        name = next(topics)
        create_topic(broker.bootstrap, name, PARTITIONS)
        return name

    warm = _java_produce(broker, topic(), WARMUP_RECORDS, 1024, "acks=1")
    volume = min(MAX_BYTES, max(MIN_BYTES, warm["rate"] * 1024 * seconds))
    readings: dict[str, Reading] = {}
    consumed = topic()
    if "produce" in parts:
        runs = [(size, acks) for size in SIZES for acks in ACKS]
    else:  # the consumers' topic only
        runs = [(1024, "acks=1")] if "consume" in parts else []
    for size, acks in runs:
        name = _produce_name(size, acks, "Java")
        where = consumed if (size, acks) == (1024, "acks=1") else topic()
        attempt(readings, [name, f"{name}: broker CPU"], lambda: _java_produce_figures(
            broker, where, int(volume / size), size, acks))
        if "produce" in parts:
            name = _produce_name(size, acks, "confluent-kafka")
            attempt(readings, [name, f"{name}: broker CPU"], lambda: _confluent_produce(
                broker, topic(), seconds, size, acks))
    if "consume" in parts:
        readings.update(_consume(broker, consumed, int(volume / 1024)))
    if "recompress" in parts:
        attempt(readings, [RECOMPRESS, f"{RECOMPRESS}: broker CPU"], lambda: _confluent_produce(
            broker, _zstd_topic(broker), seconds, 1024, "acks=1", RECOMPRESS))
    if "latency" in parts:
        attempt(readings, [row.name for row in _rows(["latency"])],
                lambda: _latency(broker, topic(), seconds))
    return readings


def _java_produce_figures(broker, topic: str, records: int, size: int,
                          acks: str) -> dict[str, Reading]:
    run = _java_produce(broker, topic, records, size, acks)
    note = f"{run['errors']:.0f} send errors" if run["errors"] else ""
    return _figures(_produce_name(size, acks, "Java"), run["records"] * size,
                    run["records"] / run["rate"], run["server_cpu"], note)


def _zstd_topic(broker) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("zstd-topic", PARTITIONS, 1, config={
        "compression.type": "zstd"})])["zstd-topic"].result(timeout=30)
    return "zstd-topic"


def _confluent_produce(broker, topic: str, seconds: float, size: int,
                       acks: str, name: str | None = None) -> dict[str, Reading]:
    settings = dict(ACKS[acks])  # librdkafka takes a boolean here
    settings["enable.idempotence"] = settings["enable.idempotence"] == "true"
    run = measured(broker, "produce", broker.bootstrap, topic, seconds, size, json.dumps(settings))
    note = f"client CPU {run['client_cpu'] / run['seconds']:.2f} s/s"
    if run["failed"]:
        note += f", {run['failed']} failed"
    return _figures(name or _produce_name(size, acks, "confluent-kafka"), run["bytes"],
                    run["seconds"], run["server_cpu"], note)


def _consume(broker, topic: str, records: int) -> dict[str, Reading]:
    readings: dict[str, Reading] = {}
    name = "consume 1 KiB, Java"
    attempt(readings, [name, f"{name}: broker CPU"],
            lambda: _java_consume(broker, topic, name, records))
    name = "consume 1 KiB, confluent-kafka"
    attempt(readings, [name, f"{name}: broker CPU"],
            lambda: _confluent_consume(broker, topic, name, records))
    return readings


def _java_consume(broker, topic: str, name: str, records: int) -> dict[str, Reading]:
    run = java_perf.consume(broker.bootstrap, broker.pids, topic, records, CONSUMER)
    note = f"{records - run['records']} missing" if run["records"] < records else ""
    return _figures(name, run["records"] * 1024, run["seconds"], run["server_cpu"], note)


def _confluent_consume(broker, topic: str, name: str, records: int) -> dict[str, Reading]:
    run = measured(broker, "consume", broker.bootstrap, topic, records)
    note = f"{run['missing']} missing" if run["missing"] else ""
    return _figures(name, run["bytes"], run["seconds"], run["server_cpu"], note)


def _latency(broker, topic: str, seconds: float) -> dict[str, Reading]:
    warmup = LATENCY_RATE * LATENCY_WARMUP_SECONDS
    run = java_perf.produce(broker.bootstrap, broker.pids, topic,
                            warmup + int(LATENCY_RATE * 2 * seconds), 1024,
                            dict(ACKS["acks=all idempotent"], **{"linger.ms": "0"}),
                            rate=LATENCY_RATE, warmup=warmup)
    note = f"{run['records']:.0f} records at {run['rate']:.0f}/s"
    return {name: Reading(run[key], note) for name, key in zip(
        [row.name for row in _rows(["latency"])], ("p50", "p99", "p999"))}
