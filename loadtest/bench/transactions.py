"""transactions: confluent-kafka producing 1 KiB records to a topic of 3 partitions for
--seconds, as an idempotent producer (acks=all) and as a transactional one committing every 100
records, on the same broker: records/s of each, their ratio, and the commit
latency (flushing the transaction's records, then EndTxn) p50/p99."""

from __future__ import annotations

import statistics

from loadtest.bench.common import Broker
from loadtest.bench.log import measured

PER_TRANSACTION = 100


def transaction_figures(seconds: float) -> dict[str, dict]:
    from tests.wire import create_topic

    broker = Broker(2)
    try:
        bootstrap = broker.process.bootstrap
        create_topic(bootstrap, "bench-idempotent", 3)
        create_topic(bootstrap, "bench-transactions", 3)
        idempotent = measured(broker, "produce", bootstrap, "bench-idempotent", seconds, 1024,
                               '{"enable.idempotence": true, "acks": "all"}')
        transactional = measured(broker, "transactions", bootstrap, "bench-transactions",
                                  seconds, 1024, PER_TRANSACTION)
    finally:
        broker.close()
    commits = sorted(transactional.pop("commits")) or [0.0]
    transactional.update(
        errors=transactional["failed"], commit_p50_ms=1000 * statistics.median(commits),
        commit_p99_ms=1000 * commits[min(len(commits) - 1, int(0.99 * len(commits)))],
        transactions=len(commits))
    return {"txn idempotent": dict(idempotent, errors=idempotent["failed"]),
            "txn transactional": transactional}


def print_transactions(passes: list[dict[str, dict]]) -> int:
    """The table; returns the errors seen (no target: the issue asks for the figures)."""
    def rate(figure):
        return figure["records"] / figure["seconds"]

    idempotent = [p["txn idempotent"] for p in passes]
    transactional = [p["txn transactional"] for p in passes]
    print(f"\n{'transactions (1 KiB, 3 partitions)':40} {'median':>10} {'min':>10} {'max':>10}")
    rows = (("idempotent records/s", [rate(f) for f in idempotent]),
            (f"transactional records/s ({PER_TRANSACTION}/txn)", [rate(f) for f in transactional]),
            ("transactional / idempotent", [rate(t) / max(1e-9, rate(i))
                                            for t, i in zip(transactional, idempotent)]),
            ("commit latency p50 ms", [f["commit_p50_ms"] for f in transactional]),
            ("commit latency p99 ms", [f["commit_p99_ms"] for f in transactional]))
    for name, values in rows:
        print(f"{name:40} {statistics.median(values):>10.2f} {min(values):>10.2f} "
              f"{max(values):>10.2f}")
    return sum(f["errors"] for f in idempotent + transactional)
