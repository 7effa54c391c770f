"""memory: 200 connections each sending two 1 MiB Produce requests at once, with the KIP-72
pool on (queued.max.request.bytes 16 MiB) and off: peak resident memory of all broker
processes together (sampled from /proc) and the time until all are answered."""

from __future__ import annotations

import threading
import time

from loadtest.bench.common import Broker
from tests.harness import rss

MIB = 1 << 20
CONNECTIONS = 200
# What a burst of 1 MiB requests needs let through: requests of up to 2 MiB.
LARGE_REQUESTS = {"socket.request.max.bytes": str(2 * MIB), "message.max.bytes": str(2 * MIB)}
POOL = {"queued.max.request.bytes": str(16 * MIB)}


def resident_bytes(pids: list[int]) -> int:
    return sum(rss(pid) for pid in pids)


class PeakSampler:
    """The largest resident total of `pids`, sampled every 5 ms on a thread until stopped."""

    def __init__(self, pids: list[int]):
        self.pids = list(pids)
        self.peak = resident_bytes(self.pids)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, resident_bytes(self.pids))
            time.sleep(0.005)

    def __enter__(self) -> "PeakSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def burst(address: tuple[str, int], pids: list[int]) -> dict:
    """The burst against a running broker at `address` (any broker: `pids` are sampled):
    CONNECTIONS clients each send two 1 MiB Produce requests to topic "burst" at once."""
    from tests.batches import make_batch
    from tests.wire import KafkaSocket, create_topic, produce_request

    create_topic(f"{address[0]}:{address[1]}", "burst", 4)
    frames = [produce_request("burst", make_batch(1, value_size=MIB - 200), partition=p,
                              correlation_id=p) for p in range(4)]
    clients = [KafkaSocket(address, timeout=120) for _ in range(CONNECTIONS)]
    try:
        baseline = resident_bytes(pids)
        with PeakSampler(pids) as sampler:
            started = time.monotonic()
            senders = [threading.Thread(target=c.send, args=(frames[i % 4] * 2,))
                       for i, c in enumerate(clients)]
            for sender in senders:
                sender.start()
            answered = sum(1 for c in clients for _ in range(2) if c.receive())
            elapsed = time.monotonic() - started
    finally:
        for client in clients:
            client.close()
    return {"peak_rss": sampler.peak, "baseline_rss": baseline, "seconds": elapsed,
            "answered": answered, "errors": 2 * CONNECTIONS - answered}


def memory_burst(pool: bool) -> dict:
    broker = Broker(2, dict(LARGE_REQUESTS, **(POOL if pool else {})))
    try:
        return burst(broker.process.listeners["PLAINTEXT"], broker.pids)
    finally:
        broker.close()
