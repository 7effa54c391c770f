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
broker.parent.rates): sum of the last `quota.window.num` windows over the time since the oldest,
never less than `pybroker.quota.burst.windows` windows, and throttle = (O - T) / T x that time.
"""

from __future__ import annotations

import hashlib
import math
import time

from shm.block import QUOTA_TYPES, SharedBlock

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


_CACHED_SENSORS = 8192  # keys a process remembers the sensor of (a miss claims again)


def _hash(key: str) -> int:
    """A sensor key's 63-bit hash, never 0 (0 marks a free cell)."""
    wanted = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")
    return (wanted >> 1) or 1


class QuotaSensors:
    """Broker-wide windowed rates, one per (quota type, entity); `slot` is this worker's.

    The entity table (`pybroker.quota.max.sensors` cells of the shared block) holds a hash of
    each sensor's key.  A sensor nobody counted into for a whole rate span (quota.window.num
    windows) holds no information any more, so a new key may take it over; a process that
    still names the old key sees the hash changed and claims again.  When every sensor is in
    use, a new key gets none: its client is not throttled until one frees up, and each such
    request is counted (`broker_quota_untracked_requests_total`) - strangers never share one.
    """

    def __init__(self, block: SharedBlock, slot: int, window_seconds: float, samples: int,
                 burst_windows: int | None, slots: int | None = None):
        if samples > block.quota_windows:
            raise ValueError(f"quota.window.num {samples} is above the block's "
                             f"{block.quota_windows} windows")
        self.block = block
        self.slot = slot
        self.words = block.words
        self.window_ns = int(window_seconds * 1e9)
        self.samples = samples
        self.burst = samples - 1 if burst_windows is None else burst_windows
        self.entities = block.quota_entities
        self._windows = block.quota_windows
        self._entities: dict[str, tuple[int, int]] = {}  # key -> (index, hash), checked on use
        self._slots = range(block.slots if slots is None else slots)  # data workers only
        self._window_base = [block.worker_cell(s, "quota_window", 0, 0, 0) for s in self._slots]
        self._count_base = [block.worker_cell(s, "quota_count", 0, 0, 0) for s in self._slots]
        self._last_base = [block.worker_cell(s, "quota_last", 0) for s in self._slots]
        self._table = block.parent_cell("quota_entity", 0)

    # --- entities ---------------------------------------------------------------------------

    def entity(self, key: str, now_ns: int | None = None) -> int | None:
        """The sensor of `key` (claimed if needed), or None when the table is full."""
        found = self._entities.get(key)
        if found is not None and self.words[self._table + found[0]] == found[1]:
            return found[0]
        index, wanted = self._claim(key, now_ns)
        if index is None:
            self._entities.pop(key, None)
            return None
        if len(self._entities) >= _CACHED_SENSORS:  # this process's view, bounded too
            self._entities.clear()
        self._entities[key] = (index, wanted)
        return index

    def find(self, key: str) -> int | None:
        """The sensor `key` holds now, claiming none (the metrics' read-only view)."""
        wanted = _hash(key)
        for probe in range(self.entities):
            index = (wanted + probe) % self.entities
            held = self.words[self._table + index]
            if held == wanted:
                return index
            if held == 0:
                return None
        return None

    def _claim(self, key: str, now_ns: int | None) -> tuple[int | None, int]:
        wanted = _hash(key)
        words, table, size = self.words, self._table, self.entities
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        idle_before = now_ns // self.window_ns - self.samples + 1  # outside every rate span
        with self.block.quota_lock():
            reusable = None
            for probe in range(size):  # cells are never emptied: a chain ends at a free one
                index = (wanted + probe) % size
                held = words[table + index]
                if held == wanted:
                    return index, wanted
                if held == 0:
                    reusable = index if reusable is None else reusable
                    break
                if reusable is None and self._idle(index, idle_before):
                    reusable = index
            if reusable is None:
                return None, wanted
            words[table + reusable] = wanted
            return reusable, wanted

    def _idle(self, index: int, before_window: int) -> bool:
        words = self.words
        return all(words[last + index] < before_window for last in self._last_base)

    def in_use(self) -> int:
        """Sensors counted into within the last rate span (for the metrics)."""
        idle_before = time.monotonic_ns() // self.window_ns - self.samples + 1
        return sum(1 for index in range(self.entities)
                   if self.words[self._table + index] and not self._idle(index, idle_before))

    # --- recording and measuring ----------------------------------------------------------

    def _offset(self, quota: int, entity: int) -> int:
        return (quota * self.entities + entity) * self._windows

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
        words[self._last_base[self.slot] + entity] = window

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
