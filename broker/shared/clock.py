"""The wall clock in Kafka's unit: milliseconds since the epoch, the time of committed offsets,
transactions, groups and events, kept across restarts (so never the monotonic clock).  The
log store's produce path reads the clock inline (`time.time_ns() // 1_000_000`): a call
there runs once per batch."""

from __future__ import annotations

import time


def now_ms() -> int:
    return time.time_ns() // 1_000_000
