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

**Broker-wide sensors.**  A client's connections may sit on several workers, so its usage is
summed over all of them: each sensor is an entity of the shared block's quota table (a hash of
its key, claimed under `quota_lock`), and each worker writes only its own slot's cells of it.

**The throttle: a token bucket in time units (GCRA).**  Kafka's windowed Rate lets a client
overshoot: its estimate lags behind a burst, samples expire during long throttles, and
connections of one client on other workers keep sending while one is muted.  Here a sensor
keeps a "due" time instead: the moment the client's usage so far is paid for at its limit.

    due      = max over workers of origin_w  +  sum over workers of spent_w
    charge   : spent_self += amount / limit          (nanoseconds of quota; monotonic)
    full     : due >= now - burst, else origin_self = now - burst - sum spent   (before charging)
    throttle = due - now, when positive

`burst` is `pybroker.quota.burst.windows` x `quota.window.size.seconds` (Kafka's fresh-sensor
burst: limit x (N-1) x W events pass at once).  Every request is charged at the limit in force
when it is served, so a changed quota applies from then on; a debt more than one rate span
past `pybroker.quota.max.throttle.ms` is forgiven (as Kafka's samples expire), so a lowered or
raised quota, or a sensor taken over by a new client, cannot carry an unbounded past.  Because
each worker's spent only grows and the origin only moves forward, no update is lost to a race
between workers, and a connection's throttle counts what the client's other connections sent:
the held rate is the limit, give or take the requests in flight, for any number of connections.
The parent archives a dead worker's spent (summed) and origin (the latest), so what a client
owes survives a worker's restart.

**The measured rate** (the `broker_quota_rate` metric) still follows Kafka's Rate over windows
aligned to multiples of `quota.window.size.seconds`: sum of the last `quota.window.num` windows
over the time since the oldest, never less than the burst windows (see broker.parent.rates).
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


def quota_in_force(quotas: dict[str, dict[str, float]], static: dict[str, float], user: str,
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
                 burst_windows: int | None, slots: int | None = None, *,
                 max_throttle_seconds: float):
        if samples > block.quota_windows:
            raise ValueError(f"quota.window.num {samples} is above the block's "
                             f"{block.quota_windows} windows")
        self.block = block
        self.slot = slot
        self.words = block.words
        self.window_ns = int(window_seconds * 1e9)
        self.samples = samples
        self.burst = samples - 1 if burst_windows is None else burst_windows
        self.burst_ns = self.burst * self.window_ns
        self.most_owed_ns = int(max_throttle_seconds * 1e9) + samples * self.window_ns
        self.entities = block.quota_entities
        self._windows = block.quota_windows
        self._entities: dict[str, tuple[int, int]] = {}  # key -> (index, hash), checked on use
        self._slots = range(block.slots if slots is None else slots)  # data workers only
        self._window_base = [block.worker_cell(s, "quota_window", 0, 0, 0) for s in self._slots]
        self._count_base = [block.worker_cell(s, "quota_count", 0, 0, 0) for s in self._slots]
        self._last_base = [block.worker_cell(s, "quota_last", 0) for s in self._slots]
        bucket_slots = (*self._slots, block.archive_slot)  # a dead worker's bucket is archived
        self._origin_base = [block.worker_cell(s, "quota_origin_ns", 0, 0) for s in bucket_slots]
        self._spent_base = [block.worker_cell(s, "quota_spent_ns", 0, 0) for s in bucket_slots]
        self._carry: dict[int, float] = {}  # bucket cell -> fraction of a nanosecond not charged
        self._table = block.parent_cell("quota_entity", 0)

    @classmethod
    def of(cls, block: SharedBlock, slot: int, props) -> "QuotaSensors":
        """The sensors of worker `slot` (-1: the parent's read-only view) for a config's
        ServerProperties."""
        return cls(block, slot, props.quota_window_size_seconds, props.quota_window_num,
                   props.pybroker_quota_burst_windows, props.num_network_threads,
                   max_throttle_seconds=props.pybroker_quota_max_throttle_ms / 1000)

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
                if reusable is None and self._idle(index, idle_before, now_ns):
                    reusable = index
            if reusable is None:
                return None, wanted
            words[table + reusable] = wanted
            return reusable, wanted

    def _idle(self, index: int, before_window: int, now_ns: int) -> bool:
        """Nothing counted for a whole rate span and nothing owed: a new key may take it."""
        words = self.words
        if any(words[last + index] >= before_window for last in self._last_base):
            return False
        return all(self._due(quota * self.entities + index) <= now_ns
                   for quota in range(len(QUOTA_KEYS)))

    def in_use(self) -> int:
        """Sensors counted into within the last rate span (for the metrics)."""
        now_ns = time.monotonic_ns()
        idle_before = now_ns // self.window_ns - self.samples + 1
        return sum(1 for index in range(self.entities)
                   if self.words[self._table + index]
                   and not self._idle(index, idle_before, now_ns))

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

    # --- the token bucket -------------------------------------------------------------------

    def _bucket(self, cell: int) -> tuple[int, int]:
        """(origin, spent) of a bucket cell: its due time is their sum (monotonic ns)."""
        words = self.words
        return (max(words[base + cell] for base in self._origin_base),
                sum(words[base + cell] for base in self._spent_base))

    def _due(self, cell: int) -> int:
        return sum(self._bucket(cell))

    def charge(self, quota: int, entity: int, amount: float, limit: float,
               now_ns: int | None = None) -> float:
        """Count `amount` against a quota of `limit` per second: the seconds the client now owes
        (its throttle, 0 within the quota).  Also counted into the measured rate."""
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        self.record(quota, entity, amount, now_ns)
        if limit <= 0:
            return self.most_owed_ns / 1e9
        words, cell = self.words, quota * self.entities + entity
        spent = self._spent_base[self.slot] + cell
        origin, spent_by_all = self._bucket(cell)
        due, full = origin + spent_by_all, now_ns - self.burst_ns
        if due < full:  # a bucket holds no more than the burst: this origin becomes the latest
            words[self._origin_base[self.slot] + cell] = full - spent_by_all
            due = full
        cost = amount / limit * 1e9 + self._carry.pop(cell, 0.0)
        whole = int(cost)
        if len(self._carry) >= _CACHED_SENSORS:
            self._carry.clear()
        self._carry[cell] = cost - whole
        words[spent] += whole
        due += whole
        if due - now_ns > self.most_owed_ns:  # forgive what lies beyond the longest debt
            words[spent] -= due - now_ns - self.most_owed_ns
            due = now_ns + self.most_owed_ns
        return max(0, due - now_ns) / 1e9

    def owed(self, quota: int, entity: int, now_ns: int | None = None) -> float:
        """Seconds the client still owes (0 when within its quota), charging nothing."""
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        return max(0, self._due(quota * self.entities + entity) - now_ns) / 1e9
