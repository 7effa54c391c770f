"""The structured event log: what the network layer did, one JSON object per line.

This module is the one place the schema lives.  Every event is a msgspec Struct below; its
`type` field names it, `v` is SCHEMA_VERSION, `ts` the time in epoch milliseconds, `node` the
broker's node.id and `proc` the process that wrote it ("parent", "data-0", "control-plane").
The PySpark pipeline (pipeline/schema.py) derives its reading schema from these classes, so a
field added here is read there.  Change a field's meaning or remove one: bump SCHEMA_VERSION.

    type                 written by  when                          fields beyond the common ones
    worker_started       parent      a worker process was spawned   worker, pid, plane
    worker_exited        parent      a worker was reaped            worker, pid, cause, lived_ms
    connection_accepted  parent      admitted and handed off        listener, ip, port, conn_id
    connection_rejected  parent      refused by admission           listener, ip, reason
                                     (per_ip_limit, per_ip_rate,    (per_ip_limit, per_ip_rate,
                                     evicted), or once              evicted, per_user_limit,
                                     authenticated (per_user_*);    per_user_rate, proxy_*,
                                     dry_run: a limit in shadow     max_connections,
                                     mode would have (admitted)     creation_rate), principal,
                                                                    dry_run
    connection_closed    worker      a registered connection ended  listener, ip, conn_id, reason,
                                                                    client_id, principal,
                                                                    lifetime_ms,
                                                                    bytes_in, bytes_out
    acceptor_blocked     parent      per second with blocking       listener, reason
                                                                    (handoff_full,
                                                                    connection_limit,
                                                                    creation_rate, descriptors),
                                                                    episodes, blocked_ms
    pool_depleted        parent      a depletion period ended       started, duration_ms
    broker_stats         parent      every second                   active {listener: n},
                                                                    pool_used, pool_limit,
                                                                    pool_waiting, depleted_ms
    memory_mutes         worker      per second with any            muted, unmuted
    throttle             worker      a client was throttled         client_id, user, quota,
                                                                    throttle_ms
                                                                    (quotas are broker-wide)
    authentication_      worker      a SASL authentication failed   listener, ip, mechanism, user
      failed                                                        (the name tried, if any)
    authorization_       both        per second with denials, per   second, listener, ip, principal,
      denied                         (who, API, resource, op)       api, resource_type, resource,
                                                                    operation, count
    transactional_id_    parent      per second with refusals, per  second, listener, ip, principal,
      refused                        (holder, reason): InitProducerId reason (share, full), held,
                                     found no room for a new id     count
    group_rebalance      parent      a group's assignment must      group, group_type (classic,
                                     change: a classic rebalance    consumer), epoch (the
                                     starts, a consumer group's     generation or group epoch it
                                     group epoch is bumped          leads to), members, reason
    share_deliveries     parent      per second with any, per       second, group, topic,
                                     share partition (KIP-932)      partition, acquired,
                                                                    redelivered, accepted,
                                                                    released, rejected,
                                                                    lock_expired, delivery_limit
    config_changed       parent      a dynamic change was applied   listener, peer, kind (config,
                                                                    quota), changes {key: value}
    requests             worker      per second, per (listener,     second, listener, plane, api,
                                     api, client id)                client_id, count, bytes_in,
                                                                    bytes_out, latency_us_sum,
                                                                    latency {bucket: count}
    slow_request         worker      a request over the threshold   listener, plane, api,
                                     (not one that waited on
                                     purpose: long poll, rebalance)
                                     (pybroker.event.log.slow.      client_id, peer, latency_ms,
                                     request.ms)                    bytes_in

Latency sketches are log-linear histograms in microseconds: a latency of us < 8 is bucket us;
above, with t = floor(log2(us)), it is bucket 4t + q for the quarter q of [2**t, 2**(t+1)) it
falls in, whose exclusive upper bound is 2**t * (5 + q) / 4.  So four buckets per doubling, a
bucket at most 25 % wide; buckets from any process and second add up, which is what the
pipeline's percentiles need (it reports a bucket's upper bound).

`EventLog` is the writer: one per process, one file at a time per process (the only writer of
that file), buffered and flushed at least every second, rotated past
`pybroker.event.log.file.bytes`.  When the directory holds more than
`pybroker.event.log.total.bytes`, the oldest rotated files are deleted; a file still being
written is held under a shared flock, which the deleter's non-blocking exclusive flock respects,
so no process deletes another's open file.  Open files are not deleted, so the directory may
exceed the cap by up to one file (`file.bytes` + 64 KiB) per process.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time

import msgspec

from broker.shared.clock import now_ms

log = logging.getLogger("broker.shared.events")

SCHEMA_VERSION = 1
BUFFER_BYTES = 64 * 1024
SUFFIX = ".jsonl"


class Event(msgspec.Struct, tag_field="type", kw_only=True):
    v: int = SCHEMA_VERSION
    ts: int = 0
    node: int = 0
    proc: str = ""


class WorkerStarted(Event, tag="worker_started", kw_only=True):
    worker: str
    pid: int
    plane: str


class WorkerExited(Event, tag="worker_exited", kw_only=True):
    worker: str
    pid: int
    cause: str  # "exit 0", "signal SIGKILL", ...
    lived_ms: int


class ConnectionAccepted(Event, tag="connection_accepted", kw_only=True):
    listener: str
    ip: str
    port: int
    conn_id: int


class ConnectionRejected(Event, tag="connection_rejected", kw_only=True):
    listener: str
    ip: str
    reason: str
    principal: str | None = None  # per_user_limit, per_user_rate: who was over the limit
    dry_run: bool = False  # shadow mode: admitted; this is what the limit would have done


class ConnectionClosed(Event, tag="connection_closed", kw_only=True):
    listener: str
    ip: str
    conn_id: int
    reason: str
    client_id: str | None = None
    principal: str = "User:ANONYMOUS"  # TLS: the client certificate's mapped name
    lifetime_ms: int
    bytes_in: int
    bytes_out: int


class AuthenticationFailed(Event, tag="authentication_failed", kw_only=True):
    listener: str
    ip: str
    mechanism: str
    user: str | None = None  # the name the client tried, if it got that far


class AuthorizationDenied(Event, tag="authorization_denied", kw_only=True):
    second: int  # epoch seconds the denials happened in
    listener: str
    ip: str
    principal: str
    api: str
    resource_type: str  # TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID
    resource: str
    operation: str  # READ, WRITE, DESCRIBE, ...
    count: int


class TransactionalIdRefused(Event, tag="transactional_id_refused", kw_only=True):
    second: int  # epoch seconds the refusals happened in
    listener: str
    ip: str
    principal: str
    reason: str  # share: the holder's share is busy; full: every id of the table is busy
    held: int  # ids the holder held at its last refusal of the second
    count: int


class GroupRebalance(Event, tag="group_rebalance", kw_only=True):
    group: str
    group_type: str  # "classic" or "consumer" (KIP-848)
    epoch: int  # the generation (classic) or group epoch (consumer) it leads to
    members: int
    reason: str  # "member joined", "session expired", "subscription changed", ...


class ShareDeliveries(Event, tag="share_deliveries", kw_only=True):
    """A second of one share partition's records: acquired by members (redelivered: of those,
    the ones delivered before), and how acquisitions ended: accepted, released (to be
    delivered again), rejected, their lock expired, or archived past
    group.share.delivery.count.limit."""

    second: int
    group: str
    topic: str
    partition: int
    acquired: int = 0
    redelivered: int = 0
    accepted: int = 0
    released: int = 0
    rejected: int = 0
    lock_expired: int = 0
    delivery_limit: int = 0


class AcceptorBlocked(Event, tag="acceptor_blocked", kw_only=True):
    listener: str
    reason: str
    episodes: int
    blocked_ms: float


class PoolDepleted(Event, tag="pool_depleted", kw_only=True):
    started: int  # epoch ms
    duration_ms: float


class BrokerStats(Event, tag="broker_stats", kw_only=True):
    active: dict[str, int]
    pool_used: int = 0
    pool_limit: int = 0
    pool_waiting: int = 0
    depleted_ms: float = 0.0


class MemoryMutes(Event, tag="memory_mutes", kw_only=True):
    muted: int
    unmuted: int


class Throttle(Event, tag="throttle", kw_only=True):
    client_id: str | None = None
    user: str = "ANONYMOUS"  # the principal's name (SASL, or a client certificate)
    quota: str
    throttle_ms: int
    dry_run: bool = False  # shadow mode: not applied; this is what the quota would have done


class ConfigChanged(Event, tag="config_changed", kw_only=True):
    listener: str
    peer: str
    kind: str  # "config" or "quota"
    changes: dict[str, str | None]


class Requests(Event, tag="requests", kw_only=True):
    second: int  # epoch seconds the requests were answered in
    listener: str
    plane: str
    api: str
    client_id: str | None = None
    count: int
    bytes_in: int
    bytes_out: int
    latency_us_sum: int
    latency: dict[int, int]


class SlowRequest(Event, tag="slow_request", kw_only=True):
    listener: str
    plane: str
    api: str
    client_id: str | None = None
    peer: str
    latency_ms: float
    bytes_in: int


EVENT_TYPES = (WorkerStarted, WorkerExited, ConnectionAccepted, ConnectionRejected,
               ConnectionClosed, AcceptorBlocked, PoolDepleted, BrokerStats, MemoryMutes,
               Throttle, ConfigChanged, Requests, SlowRequest, AuthenticationFailed,
               AuthorizationDenied, TransactionalIdRefused, GroupRebalance, ShareDeliveries)
AnyEvent = (WorkerStarted | WorkerExited | ConnectionAccepted | ConnectionRejected |
            ConnectionClosed | AcceptorBlocked | PoolDepleted | BrokerStats | MemoryMutes |
            Throttle | ConfigChanged | Requests | SlowRequest | AuthenticationFailed |
            AuthorizationDenied | TransactionalIdRefused | GroupRebalance | ShareDeliveries)


def latency_bucket(microseconds: int) -> int:
    """The sketch bucket of a latency (see the module docstring)."""
    if microseconds < 8:
        return max(0, microseconds)
    top = microseconds.bit_length() - 1  # 2**top <= us < 2**(top + 1)
    return 4 * top + ((microseconds - (1 << top)) >> (top - 2))


def bucket_upper(bucket: int) -> float:
    """Exclusive upper bound, in microseconds, of a sketch bucket."""
    if bucket < 8:
        return float(bucket + 1)
    return 2 ** (bucket // 4) * (5 + bucket % 4) / 4


class SecondTicker:
    """Calls `on_second(second)` once per wall-clock second, for the second that just ended
    (the one before the boundary the call was scheduled for, even if it runs late): how both
    kinds of process write their per-second events.  `stop()` ends it."""

    def __init__(self, loop, on_second):
        self._loop = loop
        self._on_second = on_second
        self._handle = None

    def start(self) -> None:
        self._schedule()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _schedule(self) -> None:
        now = time.time()
        following = int(now) + 1
        self._handle = self._loop.call_later(following - now, self._tick, following)

    def _tick(self, boundary: int) -> None:
        self._on_second(boundary - 1)
        self._schedule()


def decode_line(line: bytes) -> Event:
    """Parse one line (tests and tools; the pipeline reads with Spark)."""
    return msgspec.json.decode(line, type=AnyEvent)


class EventLog:
    """Buffered, rotated writer of one process's events; never raises into the caller."""

    def __init__(self, directory: str, proc: str, node: int, file_bytes: int,
                 total_bytes: int):
        self.directory = directory
        self.proc = proc
        self.node = node
        self.file_bytes = file_bytes
        self.total_bytes = total_bytes
        self._encoder = msgspec.json.Encoder()
        self._buffer = bytearray()
        self._file = None
        self._written = 0
        self._sequence = 0
        self.dropped = 0  # events lost to I/O errors
        os.makedirs(directory, exist_ok=True)

    def emit(self, event: Event) -> None:
        event.ts = event.ts or time.time_ns() // 1_000_000
        event.node, event.proc = self.node, self.proc
        self._encoder.encode_into(event, self._buffer, -1)
        self._buffer += b"\n"
        if len(self._buffer) >= BUFFER_BYTES:
            self.flush()

    def flush(self) -> None:
        if not self._buffer:
            return
        try:
            if self._file is None or self._written >= self.file_bytes:
                self._rotate()
            self._file.write(self._buffer)
            self._file.flush()
            self._written += len(self._buffer)
        except OSError as error:
            self.dropped += self._buffer.count(b"\n")
            log.warning("event log: %d events dropped: %s", self.dropped, error)
        self._buffer.clear()

    def close(self) -> None:
        self.flush()
        if self._file is not None:
            self._file.close()  # releases the flock
            self._file = None

    def _rotate(self) -> None:
        if self._file is not None:
            self._file.close()
        self._sequence += 1
        name = f"events-{now_ms():013d}-{self.proc}-{os.getpid()}-{self._sequence}{SUFFIX}"
        self._file = open(os.path.join(self.directory, name), "ab", buffering=0)
        fcntl.flock(self._file.fileno(), fcntl.LOCK_SH)  # "still being written"
        self._written = 0
        self._enforce_cap()

    def _enforce_cap(self) -> None:
        """Delete the oldest closed files while the directory is over its cap."""
        try:
            names = sorted(name for name in os.listdir(self.directory) if name.endswith(SUFFIX))
        except OSError:
            return
        sizes = {}
        for name in names:
            try:
                sizes[name] = os.stat(os.path.join(self.directory, name)).st_size
            except FileNotFoundError:
                pass
        total = sum(sizes.values())
        for name in sizes:  # oldest first: names start with the creation time
            if total <= self.total_bytes:
                return
            if self._delete_if_closed(os.path.join(self.directory, name)):
                total -= sizes[name]

    @staticmethod
    def _delete_if_closed(path: str) -> bool:
        try:
            with open(path, "rb") as handle:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.unlink(path)
                return True
        except (BlockingIOError, FileNotFoundError):
            return False
        except OSError as error:
            log.warning("event log: cannot delete %s: %s", path, error)
            return False
