"""quotas: how exactly a producer_byte_rate quota of 1 MB/s is held.

For each quota.window.num in WINDOW_NUMS, one broker of 2 workers; on it, one client id per
(connections, record size) of the matrix, all at once, each with its own 1 MB/s quota and
topic.  A client is `connections` confluent-kafka producers sharing its client id (linger
5 ms, at most 5 requests in flight, offering far more than the quota), spread by the acceptor
over both workers.  The held rate is what the client's topic grows by on disk (record batches,
which the quota counts with their requests' few header bytes) between WARM and WARM + MEASURE
seconds, once the burst of quota.window.num - 1 windows is spent.  Target: within
ACCURACY of the quota for every cell.
"""

from __future__ import annotations

import os
import threading
import time

from tests.harness import BrokerProcess
from tests.wire import alter_client_quota, create_topic

LIMIT = 1_000_000
CONNECTIONS = (1, 3, 10)
RECORD_BYTES = (100, 10_240, 102_400)
WINDOW_NUMS = (2, 5, 11)
MEASURE_SECONDS = 30.0
ACCURACY = 0.05


def log_bytes(logs_dir: str, topic: str) -> int:
    """Bytes of partition 0's segments of `topic` in a log directory (Kafka's layout, which
    this broker's is too)."""
    directory = os.path.join(logs_dir, f"{topic}-0")
    return sum(os.path.getsize(os.path.join(directory, name))
               for name in os.listdir(directory) if name.endswith(".log"))


class _Client:
    """`connections` producers of one client id, kept busy by one feeding thread."""

    def __init__(self, bootstrap: str, name: str, connections: int, record_bytes: int):
        from confluent_kafka import Producer

        self.name, self.errors, self.closing = name, 0, False
        self.value = b"x" * record_bytes
        self.producers = [Producer({
            "bootstrap.servers": bootstrap, "client.id": name, "acks": 1, "linger.ms": 5,
            "max.in.flight.requests.per.connection": 5, "batch.size": 262144,
            "queue.buffering.max.kbytes": 2048, "message.timeout.ms": 300000})
            for _ in range(connections)]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._feed, name=f"feed-{name}", daemon=True)

    def _delivered(self, error, _message) -> None:
        if error is not None and not self.closing:  # purged at the end: not a failure
            self.errors += 1

    def _feed(self) -> None:
        while not self.stop.is_set():
            for producer in self.producers:
                for _ in range(64):
                    try:
                        producer.produce(self.name, self.value, on_delivery=self._delivered)
                    except BufferError:
                        break
                producer.poll(0)
            self.stop.wait(0.002)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        self.closing = True
        for producer in self.producers:
            producer.purge()  # the backlog offered beyond the quota is not measured
            producer.flush(30)
        self.producers.clear()  # gone while the broker still runs: no reconnect noise


def held_rates(address: tuple[str, int], logs_dir: str, cells: list[tuple[str, int, int]],
               warm: float, measure: float) -> dict[str, dict]:
    """On a running broker (any: its log directory is read), one client per cell (client id,
    connections, record bytes) with its own LIMIT quota and topic, all at once: the rate each
    topic grew by during `measure` seconds after `warm` seconds of load."""
    bootstrap = f"{address[0]}:{address[1]}"
    clients = []
    for name, connections, size in cells:
        error = alter_client_quota(address, {"client-id": name}, "producer_byte_rate", LIMIT)
        if error:
            raise RuntimeError(f"AlterClientQuotas for {name} answered error {error}")
        create_topic(bootstrap, name)
        clients.append(_Client(bootstrap, name, connections, size))
    for client in clients:
        client.thread.start()
    try:
        time.sleep(warm)
        before = {client.name: log_bytes(logs_dir, client.name) for client in clients}
        started = time.monotonic()
        time.sleep(measure)
        after = {client.name: log_bytes(logs_dir, client.name) for client in clients}
        took = time.monotonic() - started
    finally:
        for client in clients:
            client.close()
    return {client.name: {"rate": (after[client.name] - before[client.name]) / took,
                          "limit": LIMIT, "errors": client.errors} for client in clients}


def _one_broker(windows: int) -> dict[str, dict]:
    cells = {f"quota {windows}w {connections}c {size}B": (
        f"quota-{windows}w-{connections}c-{size}b", connections, size)
        for connections in CONNECTIONS for size in RECORD_BYTES}
    with BrokerProcess(workers=2, overrides={"quota.window.num": str(windows)}) as broker:
        # the burst (windows - 1 of them) spent: steady state
        rates = held_rates(broker.listeners["PLAINTEXT"], os.path.join(broker.data_dir, "logs"),
                           list(cells.values()), windows + 5.0, MEASURE_SECONDS)
    return {label: rates[cell[0]] for label, cell in cells.items()}


def quota_accuracy() -> dict[str, dict]:
    """Held rate per (quota.window.num, connections, record size); see the module's text."""
    figures = {}
    for windows in WINDOW_NUMS:
        figures.update(_one_broker(windows))
    return figures


def print_quota_accuracy(figures: dict[str, dict]) -> tuple[int, int]:
    """The table and the verdict: (targets missed, client errors)."""
    print(f"\n{'producer_byte_rate 1 MB/s, held':32} {'MB/s':>8} {'held / quota':>13}  target")
    missed = errors = 0
    for name, figure in figures.items():
        ratio = figure["rate"] / figure["limit"]
        met = abs(ratio - 1) <= ACCURACY
        missed += not met
        errors += figure["errors"]
        print(f"{name:32} {figure['rate'] / 1e6:>8.3f} {ratio:>13.3f}  1 +- {ACCURACY} "
              f"{'met' if met else 'MISSED'}{'' if not figure['errors'] else ' ERRORS'}")
    return missed, errors


if __name__ == "__main__":
    import sys

    missed, errors = print_quota_accuracy(quota_accuracy())
    sys.exit(1 if missed or errors else 0)
