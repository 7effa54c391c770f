"""The shared-memory counter block: one file in /dev/shm, mapped by the parent and every worker.

Byte layout (all integers are native-endian signed 64-bit, 8-byte aligned):

    offset 0    header, 128 bytes
        0   8s  magic  b"PYBRKSH1"
        8   q   layout version (LAYOUT_VERSION)
        16  q   number of slots (worker slots, then one archive slot)
        24  q   number of listeners
        32  q   bytes per slot
        40  q   parent pid
        48  q   creation time, unix ns; its 8 bytes carry the quota table's lockf lock
        56  q   reserved; its 8 bytes carry the memory pool's lockf lock
        64  q   quota entities (pybroker.quota.max.sensors)
        72  q   quota windows (quota.window.num)
        80  q   memory pool waiters per listener (pybroker.pool.max.waiters)
        88..127 reserved
    offset 128  slot 0 .. slot n-1: one per worker process (data workers, then others)
    then        the archive slot: what dead workers had counted, folded in by the parent
    then        the parent region

A slot (SLOT_BYTES, a multiple of 64 bytes):
        0   q   pid of the worker using the slot (written by the parent before spawning)
        8   q   generation: how many times the slot was (re)started (parent)
        16  q   state: 0 free, 1 booting, 2 serving, 3 draining (worker)
        24  q   heartbeat, CLOCK_MONOTONIC ns, refreshed about once a second (worker)
        32  q   counters: the cells of WORKER_COUNTERS, in order (worker)

The parent region holds the cells of PARENT_COUNTERS, written by the parent only.

One writer per cell: a worker writes only its own slot, the parent only its region, the archive
and the two first words of a slot whose worker is not running.  Three exceptions, each written
only under a cross-process lock: the metadata epoch (the topics flock), the memory pool's
cells (`pool_lock`, see broker/shared/pool.py) and the quota entity table (`quota_lock`).
Cells are written through a memoryview cast to 'q', an aligned 8-byte store, so a reader never
sees a torn value; readers sum the slots.  Python has no atomic fetch-add across processes, hence no shared cell is ever
incremented by two processes.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import mmap
import os
import struct
import time
from dataclasses import dataclass

MAGIC = b"PYBRKSH1"
LAYOUT_VERSION = 10
HEADER_BYTES = 128
HEADER = struct.Struct("=8sqqqqqqqqqq")
SLOT_FIELDS = 4  # pid, generation, state, heartbeat

STATE_FREE, STATE_BOOTING, STATE_SERVING, STATE_DRAINING = range(4)

# Dimensions of the counter cells.  "api" is indexed by the Kafka API key itself.
MAX_API_KEY = 127
CLOSE_REASONS = ("client", "idle", "invalid", "error", "shutdown", "worker_exit", "evicted",
                 "receive_timeout", "pool_queue_full", "tls_handshake_failed",
                 "tls_handshake_timeout", "authentication_failed", "session_expired",
                 "per_user_limit", "per_user_rate", "send_stalled", "unsent_bytes",
                 "upstream")
INVALID_REASONS = ("size_negative", "size_too_large", "frame_too_small", "unknown_api",
                   "unsupported_version", "malformed_header", "malformed_body", "produce_failed",
                   "too_many_entries", "not_authenticated", "response_too_large",
                   "forward_backlog")
# Request duration histogram upper bounds, seconds; the last cell is +Inf.
DURATION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                    0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
DURATION_BOUNDS_NS = tuple(int(bound * 1e9) for bound in DURATION_BUCKETS)


def duration_bucket(nanoseconds: int) -> int:
    """Index of the histogram cell for a duration (len(DURATION_BUCKETS) is +Inf)."""
    return bisect.bisect_left(DURATION_BOUNDS_NS, nanoseconds)


def _zeros(count: int) -> memoryview:
    """`count` zero words, to clear a run of cells in one slice assignment."""
    return memoryview(bytes(8 * count)).cast("q")


# name -> dimensions, in layout order.
WORKER_COUNTERS = (
    ("connections_registered", ("listener",)),
    ("connections_closed", ("listener", "close_reason")),
    ("requests", ("listener", "api")),
    ("request_duration_bucket", ("listener", "api", "bucket")),
    ("request_duration_ns", ("listener", "api")),
    ("invalid_requests", ("invalid_reason",)),
    ("delayed_fetches", ()),  # a gauge: fetches waiting for data right now
    ("queued_requests", ()),  # a gauge: requests counted against queued.max.requests
    ("throttle_ns", ("quota_type",)),  # throttle time handed out (KIP-219)
    ("throttle_bucket", ("quota_type", "bucket")),  # histogram of single throttles
    ("throttle_dry_run_ns", ("quota_type",)),  # shadow mode: throttle time not applied
    ("muted_channels", ("mute_reason",)),  # gauges
    ("cpu_ns", ()),  # CPU time this worker process used, refreshed every tick
    ("idle_ppm", ()),  # a gauge: share of the last tick not spent on CPU, in millionths
    # Client quota sensors (broker/shared/client_quotas.py): this worker's share of each
    # entity's windows (the measured rate) and of its token bucket (the throttle).
    ("quota_window", ("quota_type", "quota_entity", "quota_window")),  # window id of the count
    ("quota_count", ("quota_type", "quota_entity", "quota_window")),
    ("quota_last", ("quota_entity",)),  # the last window this worker counted for the entity
    ("quota_spent_ns", ("quota_type", "quota_entity")),  # quota time this worker charged
    ("quota_origin_ns", ("quota_type", "quota_entity")),  # its latest bucket origin (a maximum)
    ("quota_untracked", ()),  # requests of clients the full sensor table could not track
    ("authentications", ("listener", "sasl_mechanism", "auth_result")),  # SASL outcomes
    ("authorization_denied", ("api",)),  # requests (resources) the ACLs refused
    ("fetch_sessions", ()),  # a gauge: incremental fetch sessions held (KIP-227)
    ("fetch_session_partitions", ()),  # a gauge: partitions those sessions remember
    ("fetch_session_evictions", ()),
    # Descriptors (broker/shared/log/files.py, workers/fetch_response.py): log files held
    # and answers' file regions held (gauges), and running totals of evictions, opens that
    # failed for want of descriptors, and regions read into answers past the region budget.
    ("log_files", ()),
    ("log_file_evictions", ()),
    ("log_descriptor_failures", ()),
    ("fetch_regions", ()),
    ("fetch_regions_read", ()),
    # Front-end mode (workers/upstream.py): links open to upstream nodes (a gauge), requests
    # sent upstream, and those that failed for the upstream (refused, lost, unanswered).
    ("upstream_connections", ()),
    ("upstream_requests", ()),
    ("upstream_failures", ()),
)
# Cells whose readers take the greatest over the slots: the archive keeps the greatest.
WORKER_MAXIMA = frozenset({"quota_origin_ns"})
# Cells that hold a current value, not a running total: a dead worker's are dropped, not archived.
WORKER_GAUGES = frozenset({"delayed_fetches", "queued_requests", "muted_channels", "cpu_ns",
                           "idle_ppm", "quota_window", "quota_count", "quota_last",

                           "fetch_sessions", "fetch_session_partitions", "log_files",
                           "fetch_regions", "upstream_connections"})
QUOTA_TYPES = ("producer_byte_rate", "consumer_byte_rate", "request_percentage")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
AUTH_RESULTS = ("success", "failure", "refused")  # refused: over a per-user limit
QUOTA_ENTITIES = 4096  # default of pybroker.quota.max.sensors: sensors tracked at once
QUOTA_WINDOWS = 32  # the most samples a quota may keep (quota.window.num)
MUTE_REASONS = ("memory", "in_flight", "throttle", "queue")
POOL_RING = 4096  # default of pybroker.pool.max.waiters: memory waiters per listener
REJECT_REASONS = ("per_ip_limit", "per_ip_rate", "evicted", "per_user_limit", "per_user_rate",
                  "proxy_untrusted", "proxy_invalid", "proxy_timeout")
# What a limit in shadow mode would have done (broker/parent/admission.py SHADOW_FAMILIES).
DRY_RUN_REASONS = ("max_connections", "per_ip_limit", "per_user_limit", "per_ip_rate",
                   "creation_rate", "per_user_rate")
PARENT_COUNTERS = (
    ("metadata_epoch", ()),  # bumped under the topics lock by whoever changes topics
    ("connections_accepted", ("listener",)),
    ("connections_active", ("listener",)),  # a gauge: slots held, as admission counts them
    ("connections_rejected", ("listener", "reject_reason")),
    ("connections_dry_run", ("listener", "dry_run_reason")),  # shadow mode: would have been
    ("acceptor_blocked_ns", ("listener",)),
    ("accept_throttle_ns", ("listener",)),
    ("authorization_denied", ("api",)),  # the parent's own: forwarded requests it refused
    ("worker_restarts", ()),
    ("worker_spawn_failures", ()),  # restarts that failed to spawn (retried with back-off)
    # Memory pool state (broker/shared/pool.py), changed under the pool lock by any process: two
    # copies of it, and which one is current (a change is committed by flipping that word);
    # the request rings are written beyond their tails, so they need no copy.
    ("pool_current", ()),
    ("pool_state", ("pool_copy", "pool_word")),
    ("pool_ring", ("listener", "ring", "ring_field")),  # (ticket, worker slot, size)
    # Client quota entities: a 63-bit hash of each sensor's key, 0 when free (quota lock).
    ("quota_entity", ("quota_entity",)),
)


def pool_state_words(slots: int, listeners: int) -> int:
    """Words of one copy of the pool state: 5 scalars (shared bytes available, last ticket,
    requests waiting, depleted since, depleted total), per listener the reservation available
    and the ring's head and tail, per (worker slot, listener) the bytes leased and the grants."""
    return 5 + 3 * listeners + 2 * slots * listeners


def _dimension_sizes(listeners: int, quota_entities: int = QUOTA_ENTITIES,
                     quota_windows: int = QUOTA_WINDOWS, slots: int = 1,
                     pool_ring: int = POOL_RING) -> dict[str, int]:
    return {
        "pool_copy": 2,
        "pool_word": pool_state_words(slots, listeners),
        "listener": listeners,
        "close_reason": len(CLOSE_REASONS),
        "api": MAX_API_KEY + 1,
        "bucket": len(DURATION_BUCKETS) + 1,
        "invalid_reason": len(INVALID_REASONS),
        "reject_reason": len(REJECT_REASONS),
        "dry_run_reason": len(DRY_RUN_REASONS),
        "mute_reason": len(MUTE_REASONS),
        "ring": pool_ring,
        "ring_field": 3,
        "quota_type": len(QUOTA_TYPES),
        "quota_entity": quota_entities,
        "quota_window": quota_windows,
        "sasl_mechanism": len(SASL_MECHANISMS),
        "auth_result": len(AUTH_RESULTS),
    }


@dataclass(frozen=True)
class CounterTable:
    """Where each named counter cell lives inside a region, in 8-byte words."""

    base: dict[str, int]
    strides: dict[str, tuple[int, ...]]
    words: int

    @classmethod
    def build(cls, counters, sizes: dict[str, int], first_word: int = 0) -> "CounterTable":
        base, strides, word = {}, {}, first_word
        for name, dims in counters:
            extents = [sizes[dim] for dim in dims]
            stride, steps = 1, []
            for extent in reversed(extents):
                steps.append(stride)
                stride *= extent
            base[name], strides[name] = word, tuple(reversed(steps))
            word += stride
        return cls(base, strides, word)

    def index(self, name: str, *coords: int) -> int:
        word = self.base[name]
        for coord, stride in zip(coords, self.strides[name], strict=True):
            word += coord * stride
        return word


class SharedBlock:
    """A mapped counter block; `create` in the parent, `attach` in a worker."""

    def __init__(self, path: str, mapping: mmap.mmap, slots: int, listeners: int, fd: int,
                 quota_entities: int = QUOTA_ENTITIES, quota_windows: int = QUOTA_WINDOWS,
                 pool_ring: int = POOL_RING):
        self.path = path
        self.fd = fd  # kept open for the pool lock (lockf on the header's reserved word)
        self.slots = slots  # worker slots; the archive slot comes after them
        self.listeners = listeners
        self.quota_entities = quota_entities
        self.quota_windows = quota_windows
        self.pool_ring = pool_ring
        sizes = _dimension_sizes(listeners, quota_entities, quota_windows, slots, pool_ring)
        self.worker_table = CounterTable.build(WORKER_COUNTERS, sizes, SLOT_FIELDS)
        self.slot_words = -(-self.worker_table.words // 8) * 8  # round up to 64 bytes
        self.parent_table = CounterTable.build(PARENT_COUNTERS, sizes)
        self._map = mapping
        self.words = memoryview(mapping).cast("q")
        self._slot0 = HEADER_BYTES // 8
        self._parent0 = self._slot0 + (slots + 1) * self.slot_words

    # --- lifecycle ------------------------------------------------------------------------

    @staticmethod
    def size_for(slots: int, listeners: int, quota_entities: int = QUOTA_ENTITIES,
                 quota_windows: int = QUOTA_WINDOWS, pool_ring: int = POOL_RING) -> int:
        sizes = _dimension_sizes(listeners, quota_entities, quota_windows, slots, pool_ring)
        slot_words = -(-CounterTable.build(WORKER_COUNTERS, sizes, SLOT_FIELDS).words // 8) * 8
        parent_words = CounterTable.build(PARENT_COUNTERS, sizes).words
        return HEADER_BYTES + 8 * ((slots + 1) * slot_words + parent_words)

    @classmethod
    def create(cls, path: str, slots: int, listeners: int, quota_entities: int = QUOTA_ENTITIES,
               quota_windows: int = QUOTA_WINDOWS, pool_ring: int = POOL_RING) -> "SharedBlock":
        size = cls.size_for(slots, listeners, quota_entities, quota_windows, pool_ring)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            mapping = mmap.mmap(fd, size)
        except OSError:
            os.close(fd)
            raise
        block = cls(path, mapping, slots, listeners, fd, quota_entities, quota_windows, pool_ring)
        HEADER.pack_into(mapping, 0, MAGIC, LAYOUT_VERSION, slots, listeners,
                         block.slot_words * 8, os.getpid(), time.time_ns(), 0, quota_entities,
                         quota_windows, pool_ring)
        return block

    @classmethod
    def attach(cls, path: str) -> "SharedBlock":
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_BYTES:
                raise RuntimeError(f"shared block {path} is too small ({size} bytes)")
            mapping = mmap.mmap(fd, size)
        except Exception:
            os.close(fd)
            raise
        (magic, version, slots, listeners, slot_bytes, _pid, _created, _reserved, entities,
         windows, ring) = HEADER.unpack_from(mapping, 0)
        if magic != MAGIC or version != LAYOUT_VERSION:
            raise RuntimeError(f"shared block {path} has magic {magic!r} version {version}; "
                               f"expected {MAGIC!r} version {LAYOUT_VERSION}")
        block = cls(path, mapping, slots, listeners, fd, entities, windows, ring)
        if block.slot_words * 8 != slot_bytes or \
                cls.size_for(slots, listeners, entities, windows, ring) != size:
            raise RuntimeError(f"shared block {path} layout does not match this code")
        return block

    def close(self) -> None:
        self.words.release()
        self._map.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    @contextlib.contextmanager
    def quota_lock(self):
        """Guards the quota entity table: a POSIX record lock on header word 6."""
        fcntl.lockf(self.fd, fcntl.LOCK_EX, 8, 48)
        try:
            yield
        finally:
            fcntl.lockf(self.fd, fcntl.LOCK_UN, 8, 48)

    @contextlib.contextmanager
    def pool_lock(self):
        """The memory pool's cross-process lock: a POSIX record lock on header word 7.

        The kernel drops it when its holder dies, so a killed worker cannot wedge the pool.
        """
        fcntl.lockf(self.fd, fcntl.LOCK_EX, 8, 56)
        try:
            yield
        finally:
            fcntl.lockf(self.fd, fcntl.LOCK_UN, 8, 56)

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    # --- addressing -----------------------------------------------------------------------

    @property
    def archive_slot(self) -> int:
        return self.slots

    def _cells_of(self, name: str) -> range:
        """Word offsets (within a slot) of every cell of a worker counter."""
        table = self.worker_table
        names = [entry[0] for entry in WORKER_COUNTERS]
        following = names.index(name) + 1
        end = table.base[names[following]] if following < len(names) else table.words
        return range(table.base[name], end)

    def slot_base(self, slot: int) -> int:
        """Word index of the first word of a slot (0..slots; `slots` is the archive)."""
        if not 0 <= slot <= self.slots:
            raise IndexError(f"slot {slot} out of range 0..{self.slots}")
        return self._slot0 + slot * self.slot_words

    def worker_cell(self, slot: int, name: str, *coords: int) -> int:
        return self.slot_base(slot) + self.worker_table.index(name, *coords)

    def parent_cell(self, name: str, *coords: int) -> int:
        return self._parent0 + self.parent_table.index(name, *coords)

    # --- slot header words ----------------------------------------------------------------

    def slot_pid(self, slot: int) -> int:
        return self.words[self.slot_base(slot)]

    def slot_generation(self, slot: int) -> int:
        return self.words[self.slot_base(slot) + 1]

    def slot_state(self, slot: int) -> int:
        return self.words[self.slot_base(slot) + 2]

    def slot_heartbeat(self, slot: int) -> int:
        return self.words[self.slot_base(slot) + 3]

    def claim_slot(self, slot: int, pid: int) -> None:
        """Parent, before a worker runs in `slot`: zero it, record pid and generation."""
        base = self.slot_base(slot)
        generation = self.words[base + 1]
        self.words[base:base + self.slot_words] = memoryview(bytes(8 * self.slot_words)).cast("q")
        self.words[base] = pid
        self.words[base + 1] = generation + 1
        self.words[base + 3] = time.monotonic_ns()

    def set_state(self, slot: int, state: int) -> None:
        self.words[self.slot_base(slot) + 2] = state

    def beat(self, slot: int) -> None:
        self.words[self.slot_base(slot) + 3] = time.monotonic_ns()

    # --- reading --------------------------------------------------------------------------

    def worker_total(self, name: str, *coords: int) -> int:
        """Sum of one worker counter cell over every slot, the archive included."""
        offset = self.worker_table.index(name, *coords)
        return sum(self.words[self.slot_base(slot) + offset] for slot in range(self.slots + 1))

    def archive_slot_counters(self, slot: int) -> None:
        """Parent, after a worker died: add its counters to the archive, then free the slot.

        Counter by counter: most of a slot's words are gauges (the quota sensors' windows,
        about 800,000 words at the default sizes), zeroed in one slice assignment; a word at a
        time they cost the parent 0.15 s of CPU at each worker's exit."""
        base, archive = self.slot_base(slot), self.slot_base(self.archive_slot)
        words = self.words
        for name, _dims in WORKER_COUNTERS:
            cells = self._cells_of(name)
            if name in WORKER_MAXIMA:
                for word in cells:
                    words[archive + word] = max(words[archive + word], words[base + word])
            elif name not in WORKER_GAUGES:
                for word in cells:
                    words[archive + word] += words[base + word]
            words[base + cells.start:base + cells.stop] = _zeros(len(cells))
        words[base + 2] = STATE_FREE
