"""frontend: this broker as a front-end before Apache Kafka, against the same Kafka reached
directly.  One Kafka node (its defaults, a 1 GiB heap) is started once; each scenario runs
with confluent-kafka (loadtest/kafka_load.py) straight to it ("kafka" column) and through a
front-end of two workers before it ("ours" column), so the ratio is what the front-end costs:

  produce  1 KiB records, acks=1, linger 5 ms, 1 MiB batches, to a topic of 2 partitions: MB/s
  consume  those records read back from the start (assigned partitions): MB/s
  latency  1 KiB records at LATENCY_RATE a second (well below saturation), acks=all, linger 0:
           p50 and p99 of send-to-acknowledgement, and what the front-end adds to each

A warm-up produce straight to Kafka runs first (Kafka's JIT), then the two sides alternate
on each scenario.  Latency runs LATENCY_ROUNDS alternating rounds and keeps each side's least
disturbed round (the lowest of each percentile): on two cores shared by Kafka's JVM, the
front-end and the client, one round's p99 swings tenfold (2 to 30 ms measured straight to
Kafka).  Everything shares the machine's cores: the front-end's CPU is taken from what Kafka
and the client would have had, as on a host that runs both.
"""

from __future__ import annotations

from loadtest.bench.log import run_kafka_load
from loadtest.apache_kafka import free_port
from loadtest.compare.brokers import NODE_ID, WORKERS, Kafka, failure
from loadtest.compare.rows import Reading, Row, attempt, join
from tests.harness import BrokerProcess

PARTS = ("frontend",)
PARTITIONS = 2
SIZE = 1024
LATENCY_RATE = 1000
LATENCY_ROUNDS = 3
MB = 1e6
PRODUCE = "front-end: produce 1 KiB acks=1, confluent-kafka"
CONSUME = "front-end: consume 1 KiB, confluent-kafka"
P50 = f"front-end: produce latency p50, 1 KiB at {LATENCY_RATE}/s, acks=all"
P99 = f"front-end: produce latency p99, 1 KiB at {LATENCY_RATE}/s, acks=all"
ADDED_P50 = "front-end: p50 latency added (ours - Kafka's)"
ADDED = "front-end: p99 latency added (ours - Kafka's)"
ROWS = [Row(PRODUCE, "MB/s", "higher", "ours: through the front-end; Kafka: straight to it; "
            "target ratio >= 0.8"),
        Row(CONSUME, "MB/s", "higher", "target ratio >= 0.8"),
        Row(P50, "ms", "lower"), Row(P99, "ms", "lower"), Row(ADDED_P50, "ms", "lower"),
        Row(ADDED, "ms", "lower", "target <= 1 ms")]


def run(parts, seconds: float) -> list[dict]:
    readings: dict[str, dict[str, Reading]] = {"ours": {}, "kafka": {}}
    try:
        kafka = Kafka({"group.initial.rebalance.delay.ms": "0"}).start()
    except Exception as error:  # noqa: BLE001 - reported in the table, never invented
        reason = failure(error)
        return join(ROWS, {side: {row.name: Reading(None, reason) for row in ROWS}
                           for side in readings})
    try:
        front = BrokerProcess({"pybroker.upstream.bootstrap.servers": kafka.bootstrap,
                               "pybroker.frontend.node.port.base": str(free_port() - NODE_ID)},
                              workers=WORKERS).start()
        try:
            _measure(kafka.bootstrap, front.bootstrap, seconds, readings)
        finally:
            front.stop()
    finally:
        kafka.stop()
    return join(ROWS, readings)


def _measure(direct: str, through: str, seconds: float, readings) -> None:
    from tests.wire import create_topic

    sides = {"kafka": direct, "ours": through}
    for topic in ("fe-warm", *(f"fe-{side}" for side in sides)):
        create_topic(direct, topic, PARTITIONS)
    run_kafka_load("produce", direct, "fe-warm", min(seconds, 3.0), SIZE)  # Kafka's JIT
    produced = {}
    for side, bootstrap in sides.items():
        attempt(readings[side], [PRODUCE], lambda: _produce(side, bootstrap, seconds, produced))
    for side, bootstrap in sides.items():
        attempt(readings[side], [CONSUME], lambda: _consume(side, bootstrap, produced))
    rounds: dict[str, list[dict]] = {side: [] for side in sides}
    for _ in range(LATENCY_ROUNDS):
        for side, bootstrap in sides.items():
            attempt(readings[side], [P50, P99],
                    lambda: _latency(side, bootstrap, seconds, rounds[side]))
    for row, percentile in ((ADDED_P50, P50), (ADDED, P99)):
        ours, theirs = readings["ours"].get(percentile), readings["kafka"].get(percentile)
        if ours is not None and theirs is not None and None not in (ours.value, theirs.value):
            readings["ours"][row] = Reading(ours.value - theirs.value)
        else:
            readings["ours"][row] = Reading(None, "a percentile is missing")


def _produce(side: str, bootstrap: str, seconds: float, produced: dict) -> dict[str, Reading]:
    run = run_kafka_load("produce", bootstrap, f"fe-{side}", seconds, SIZE)
    produced[side] = run["records"]
    note = f"{run['failed']} failed" if run["failed"] else ""
    return {PRODUCE: Reading(run["bytes"] / MB / run["seconds"], note)}


def _consume(side: str, bootstrap: str, produced: dict) -> dict[str, Reading]:
    run = run_kafka_load("consume", bootstrap, f"fe-{side}", produced[side])
    note = f"{run['missing']} missing" if run["missing"] else ""
    return {CONSUME: Reading(run["bytes"] / MB / run["seconds"], note)}


def _latency(side: str, bootstrap: str, seconds: float, runs: list[dict]) -> dict[str, Reading]:
    """One more round; the readings are the lowest of each percentile over the rounds."""
    runs.append(run_kafka_load("latency", bootstrap, f"fe-{side}", seconds, LATENCY_RATE, SIZE))
    p99s = ", ".join(f"{run['p99']:.1f}" for run in runs)
    note = f"{len(runs)} rounds of {runs[0]['records']} records, p99 by round {p99s} ms"
    failed = sum(run["failed"] for run in runs)
    if failed:
        note += f", {failed} failed"
    return {P50: Reading(min(run["p50"] for run in runs), note),
            P99: Reading(min(run["p99"] for run in runs), note)}
