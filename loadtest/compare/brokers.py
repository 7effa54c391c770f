"""The two brokers a comparison runs, behind one face: this broker and Apache Kafka, each
started with the same Kafka config keys on 127.0.0.1, one at a time (never both at once: they
would share the two cores), stopped by pid.

Worker counts are each broker's own for this machine: ours num.network.threads=2 (one worker
process per core), Kafka its defaults (num.network.threads=3, num.io.threads=8, a 1 GiB heap
as kafka-server-start.sh gives).  Both run with node.id=1, so a request naming the broker
(DescribeConfigs) is the same bytes for both.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback

from loadtest.apache_kafka import ApacheKafka, free_port
from tests.harness import BrokerProcess

WORKERS = 2
NODE_ID = 1
SIDES = ("ours", "kafka")
MAX_WARMUP_SECONDS = 3.0
WORKER_NOTE = (f"ours: num.network.threads={WORKERS} on {os.cpu_count()} cores; Kafka: its "
               "defaults, num.network.threads=3 and num.io.threads=8, 1 GiB heap")


class Ours:
    """This broker (parent and WORKERS worker processes) on a port chosen before it starts."""

    side = "ours"

    def __init__(self, overrides: dict[str, str] | None = None):
        self.port = free_port()
        settings = {"listeners": f"PLAINTEXT://127.0.0.1:{self.port}", "node.id": str(NODE_ID)}
        settings.update(overrides or {})
        self.process = BrokerProcess(workers=WORKERS, overrides=settings)

    def start(self) -> "Ours":
        self.process.start()
        return self

    def stop(self) -> None:
        self.process.__exit__(None, None, None)  # stopped, and its data directory removed

    @property
    def address(self) -> tuple[str, int]:
        return self.process.listeners["PLAINTEXT"]

    @property
    def bootstrap(self) -> str:
        return self.process.bootstrap

    @property
    def pids(self) -> list[int]:
        return [self.process.pid, *self.process.worker_pids.values()]

    @property
    def logs_dir(self) -> str:
        return os.path.join(self.process.data_dir, "logs")


class Kafka:
    """Apache Kafka, one KRaft node (broker and controller in one JVM).  Clients use the
    PLAINTEXT listener; inter-broker traffic (none, on one node) has a listener of its own,
    INTERNAL, as in a real deployment: Kafka exempts its inter-broker listener from the
    broker-wide connection limits (max.connections, max.connection.creation.rate), which on
    a shared listener would not bind the clients at all."""

    side = "kafka"

    def __init__(self, overrides: dict[str, str] | None = None):
        self.node = ApacheKafka()
        self.port = self.node.port
        internal = f"INTERNAL://127.0.0.1:{free_port()}"
        self.node.overrides.update({
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},{internal},"
                         f"CONTROLLER://127.0.0.1:{self.node.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port},{internal}",
            "listener.security.protocol.map":
                "PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "INTERNAL", "node.id": str(NODE_ID)})
        self.node.overrides.update(overrides or {})

    def start(self) -> "Kafka":
        self.node.start()
        return self

    def stop(self) -> None:
        self.node.stop()

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.node.port)

    @property
    def bootstrap(self) -> str:
        return self.node.bootstrap

    @property
    def pids(self) -> list[int]:
        return self.node.pids

    @property
    def logs_dir(self) -> str:
        return os.path.join(self.node.directory, "logs")


def warmup_seconds(seconds: float) -> float:
    """How long an untimed run of a load goes before its timed run: Kafka's JIT compiles
    the paths a load takes while it runs (its accept rate triples over three runs of two
    seconds on a cold JVM), and both brokers get the same."""
    return min(seconds, MAX_WARMUP_SECONDS)


def create(side: str, overrides: dict[str, str] | None = None) -> Ours | Kafka:
    """The broker of `side`, configured but not started."""
    return {"ours": Ours, "kafka": Kafka}[side](overrides)


@contextlib.contextmanager
def running(side: str, overrides: dict[str, str] | None = None):
    broker = create(side, overrides).start()
    try:
        yield broker
    finally:
        broker.stop()


def failure(error: BaseException) -> str:
    """The reason a measurement has no figure: the error's last line, the trace on stderr."""
    traceback.print_exception(error, file=sys.stderr)
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[-1] if text else ''}"[:300]


def on_each(measure, overrides: dict[str, str] | None = None) -> dict[str, dict | str]:
    """`measure(broker)` on ours, then on Kafka, each started with `overrides` for it and
    stopped after: {side: what it returned, or the reason it returned nothing}."""
    results: dict[str, dict | str] = {}
    for side in SIDES:
        try:
            with running(side, overrides) as broker:
                results[side] = measure(broker)
        except Exception as error:  # noqa: BLE001 - reported in the table, never invented
            results[side] = failure(error)
    return results
