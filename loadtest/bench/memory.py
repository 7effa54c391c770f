"""memory: 200 connections each sending two 1 MiB Produce requests at once, with the KIP-72
pool on (queued.max.request.bytes 16 MiB) and off: peak resident memory of all broker
processes together (sampled from /proc) and the time until all are answered."""

from __future__ import annotations

import time

from loadtest.bench.common import Broker
from tests.harness import rss


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
