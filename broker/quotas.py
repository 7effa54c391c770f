"""Client quotas (Kafka's ClientQuotaManager): which quota applies, and broker-wide sensors.

**Which quota.**  For a request from (user, client-id) and a quota type, the first of Kafka's
eight entity levels that has a value wins:

    user=U,client-id=C   user=U,client-id=<default>   user=U
    user=<default>,client-id=C   user=<default>,client-id=<default>   user=<default>
    client-id=C   client-id=<default>

then the static defaults (`quota.producer.default`, `quota.consumer.default`,
`pybroker.quota.request.percentage.default`).  As in Kafka, a `<default>` level gives each
user or client its own allowance: the sensor is keyed by the real names.  The user is
ANONYMOUS until authentication exists.

**Broker-wide sensors.**  A client's connections may sit on several workers, so its rate is
summed over all of them: each sensor is an entity of the shared block's quota table (a hash of
its key, claimed under `quota_lock`), and each worker counts into its own slot's windows of it
(one writer per cell).  Windows are aligned to multiples of `quota.window.size.seconds`, so
every worker agrees on them; the rate and the throttle time follow Kafka's Rate (see
broker.rates): sum of the last `quota.window.num` windows over the time since the oldest,
never less than `pybroker.quota.burst.windows` windows, and throttle = (O - T) / T x that time.
"""

from __future__ import annotations

import hashlib
import math
import time

from shm.block import QUOTA_ENTITIES, QUOTA_TYPES, QUOTA_WINDOWS, SharedBlock

ANONYMOUS = "ANONYMOUS"
DEFAULT = "<default>"
PRODUCE, FETCH, REQUEST = range(3)
QUOTA_KEYS = QUOTA_TYPES  # the AlterClientQuotas keys, in sensor-type order
ENTITY_TYPES = ("user", "client-id")


def entity_key(user: str | None, client: str | None) -> str:
    """The store's name of an entity: 'user=a', 'client-id=<default>', 'user=a,client-id=b'."""
    parts = []
    if user is not None:
        parts.append(f"user={user}")
    if client is not None:
        parts.append(f"client-id={client}")
    return ",".join(parts)


def resolve(quotas: dict[str, dict[str, float]], static: dict[str, float], user: str,
            client: str, key: str) -> tuple[float, str] | None:
    """(limit, sensor key) of the quota `key` for (user, client), or None when unlimited."""
    levels = (
        (user, client, user, client), (user, DEFAULT, user, client), (user, None, user, None),
        (DEFAULT, client, user, client), (DEFAULT, DEFAULT, user, client),
        (DEFAULT, None, user, None), (None, client, None, client), (None, DEFAULT, None, client),
    )
    for config_user, config_client, sensor_user, sensor_client in levels:
        values = quotas.get(entity_key(config_user, config_client))
        if values is not None and key in values:
            return values[key], entity_key(sensor_user, sensor_client)
    if key in static:
        return static[key], entity_key(None, client)
    return None


class QuotaSensors:
    """Broker-wide windowed rates, one per (quota type, entity); `slot` is this worker's."""

    def __init__(self, block: SharedBlock, slot: int, window_seconds: float, samples: int,
                 burst_windows: int | None, slots: int | None = None):
        if samples > QUOTA_WINDOWS:
            raise ValueError(f"quota.window.num {samples} is above {QUOTA_WINDOWS}")
        self.block = block
        self.slot = slot
        self.words = block.words
        self.window_ns = int(window_seconds * 1e9)
        self.samples = samples
        self.burst = samples - 1 if burst_windows is None else burst_windows
        self._entities: dict[str, int] = {}
        self._slots = range(block.slots if slots is None else slots)  # data workers only
        self._window_base = [block.worker_cell(s, "quota_window", 0, 0, 0) for s in self._slots]
        self._count_base = [block.worker_cell(s, "quota_count", 0, 0, 0) for s in self._slots]

    # --- entities ---------------------------------------------------------------------------

    def entity(self, key: str) -> int:
        index = self._entities.get(key)
        if index is None:
            index = self._claim(key)
            self._entities[key] = index
        return index

    def _claim(self, key: str) -> int:
        wanted = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")
        wanted = (wanted >> 1) or 1
        words, block = self.words, self.block
        with block.quota_lock():
            for probe in range(QUOTA_ENTITIES - 1):
                index = (wanted + probe) % (QUOTA_ENTITIES - 1)
                cell = block.parent_cell("quota_entity", index)
                if words[cell] == wanted:
                    return index
                if words[cell] == 0:
                    words[cell] = wanted
                    return index
        return QUOTA_ENTITIES - 1  # the table is full: the rest share the last sensor

    # --- recording and measuring ----------------------------------------------------------

    def _offset(self, quota: int, entity: int) -> int:
        return (quota * QUOTA_ENTITIES + entity) * QUOTA_WINDOWS

    def record(self, quota: int, entity: int, value: float, now_ns: int | None = None) -> None:
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        window = now_ns // self.window_ns
        offset = self._offset(quota, entity) + window % self.samples
        words = self.words
        where = self._window_base[self.slot] + offset
        count = self._count_base[self.slot] + offset
        if words[where] != window:
            words[where] = window
            words[count] = 0
        words[count] += int(value)

    def measure(self, quota: int, entity: int, now_ns: int | None = None) -> tuple[float, float]:
        """(rate per second over the kept windows, the window size in seconds it used)."""
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        current = now_ns // self.window_ns
        words, offset = self.words, self._offset(quota, entity)
        total, oldest = 0, current
        for slot in self._slots:
            windows = self._window_base[slot] + offset
            counts = self._count_base[slot] + offset
            for n in range(self.samples):
                window = words[windows + n]
                if current - self.samples < window <= current and words[counts + n]:
                    total += words[counts + n]
                    oldest = min(oldest, window)
        elapsed = (now_ns - oldest * self.window_ns) / 1e9
        window_seconds = self.window_ns / 1e9
        whole = math.floor(elapsed / window_seconds)
        if whole < self.burst:
            elapsed += (self.burst - whole) * window_seconds
        size = max(elapsed, 0.001)
        return total / size, size

    def throttle(self, quota: int, entity: int, limit: float, now_ns: int | None = None) -> float:
        """Seconds the client must wait for its rate to fall back to `limit` (0 if within)."""
        rate, size = self.measure(quota, entity, now_ns)
        if rate <= limit:
            return 0.0
        return (rate - limit) / limit * size if limit > 0 else size
