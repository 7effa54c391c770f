"""A worker's counters in its own slot of the shared block, which the parent's /metrics sums.

One writer per slot (this worker), so every update is a plain store or add to a word of shared
memory, no lock (~70 ns).  The cells are looked up once, at start; the methods are called on
the hot path (`requests` once per read) or on state changes (mutes, closes, throttles), and
`tick` once a second for CPU time and the idle ratio.
"""

from __future__ import annotations

import time
from functools import partial

from shm.block import (AUTH_RESULTS, CLOSE_REASONS, DURATION_BOUNDS_NS, INVALID_REASONS,
                       MUTE_REASONS, SASL_MECHANISMS, SharedBlock, duration_bucket)
from workers.counts import count_requests

_BUCKETS = len(DURATION_BOUNDS_NS) + 1


def _cpu_and_wait_ns() -> tuple[int, int]:
    """CPU time of this process's main thread and its time runnable but not running."""
    try:
        with open("/proc/self/schedstat", "rb") as handle:
            cpu, waited, _slices = handle.read().split()
        return int(cpu), int(waited)
    except (OSError, ValueError):
        return time.process_time_ns(), 0


class WorkerStats:
    """Writes this worker's counters into its own slot of the shared block (one writer)."""

    def __init__(self, block: SharedBlock, slot: int):
        self.words = block.words
        listeners = range(block.listeners)
        self._registered = [block.worker_cell(slot, "connections_registered", i) for i in listeners]
        self._closed = [{reason: block.worker_cell(slot, "connections_closed", i, n)
                         for n, reason in enumerate(CLOSE_REASONS)} for i in listeners]
        # Per listener, the cells of its API 0: requests, duration buckets, duration sum.
        self._request_cells = tuple((block.worker_cell(slot, "requests", i, 0),
                                     block.worker_cell(slot, "request_duration_bucket", i, 0, 0),
                                     block.worker_cell(slot, "request_duration_ns", i, 0))
                                    for i in listeners)
        # requests(listener, api_keys, elapsed_ns) counts the requests of one read, answered
        # `elapsed_ns` after it (workers.counts): a C call bound here, with no Python frame
        # between, for it runs once a read.
        self.requests = partial(count_requests, self.words, self._request_cells,
                                DURATION_BOUNDS_NS)
        self._cpu_ns = block.worker_cell(slot, "cpu_ns")
        self._idle_ppm = block.worker_cell(slot, "idle_ppm")
        self._last_tick = (time.monotonic_ns(), *_cpu_and_wait_ns())
        self._invalid = {reason: block.worker_cell(slot, "invalid_requests", n)
                         for n, reason in enumerate(INVALID_REASONS)}
        self._delayed_fetches = block.worker_cell(slot, "delayed_fetches")
        self._queued_requests = block.worker_cell(slot, "queued_requests")
        self._quota_untracked = block.worker_cell(slot, "quota_untracked")
        self._fetch_sessions = block.worker_cell(slot, "fetch_sessions")
        self._fetch_session_partitions = block.worker_cell(slot, "fetch_session_partitions")
        self._fetch_session_evictions = block.worker_cell(slot, "fetch_session_evictions")
        self._descriptors = [block.worker_cell(slot, name) for name in (
            "log_files", "log_file_evictions", "log_descriptor_failures", "fetch_regions",
            "fetch_regions_read")]
        self._muted = {reason: block.worker_cell(slot, "muted_channels", n)
                       for n, reason in enumerate(MUTE_REASONS)}
        self._throttle_ns = block.worker_cell(slot, "throttle_ns", 0)
        self._throttle_dry_run_ns = block.worker_cell(slot, "throttle_dry_run_ns", 0)
        self._throttle_buckets = block.worker_cell(slot, "throttle_bucket", 0, 0)
        self._block, self._slot = block, slot

    def denied(self, api_key: int) -> None:
        """A request (one resource of it) the ACLs refused."""
        self.words[self._block.worker_cell(self._slot, "authorization_denied", api_key)] += 1

    def registered(self, listener: int) -> None:
        self.words[self._registered[listener]] += 1

    def closed(self, listener: int, reason: str) -> None:
        self.words[self._closed[listener][reason]] += 1

    def invalid(self, reason: str) -> None:
        self.words[self._invalid[reason]] += 1

    def delayed_fetches(self, count: int) -> None:
        self.words[self._delayed_fetches] = count

    def queued_requests(self, count: int) -> None:
        self.words[self._queued_requests] = count

    def authentication(self, listener: int, mechanism: str, result: str) -> None:
        """result: one of AUTH_RESULTS (refused: the credentials were right, the user's
        connection limits were not)."""
        self.words[self._block.worker_cell(self._slot, "authentications", listener,
                                           SASL_MECHANISMS.index(mechanism),
                                           AUTH_RESULTS.index(result))] += 1

    def fetch_sessions(self, sessions: int, partitions: int, evictions: int) -> None:
        """The fetch session cache's gauges, and its evictions so far (a running total)."""
        words = self.words
        words[self._fetch_sessions] = sessions
        words[self._fetch_session_partitions] = partitions
        words[self._fetch_session_evictions] = evictions

    def upstream(self, connections: int, requests: int, failures: int) -> None:
        """Front-end mode: links open now, and requests sent and failed so far."""
        words, block, slot = self.words, self._block, self._slot
        words[block.worker_cell(slot, "upstream_connections")] = connections
        words[block.worker_cell(slot, "upstream_requests")] = requests
        words[block.worker_cell(slot, "upstream_failures")] = failures

    def descriptors(self, files, regions) -> None:
        """The log's open files (an OpenFiles) and the answers' regions (a RegionBudget)."""
        for cell, value in zip(self._descriptors, (files.held, files.evicted, files.failures,
                                                   regions.held, regions.read_instead)):
            self.words[cell] = value

    def quota_untracked(self) -> None:
        self.words[self._quota_untracked] += 1

    def muted(self, reason: str, change: int) -> None:
        self.words[self._muted[reason]] += change

    def throttled(self, quota: int, seconds: float, dry_run: bool = False) -> None:
        nanoseconds = int(seconds * 1e9)
        words = self.words
        if dry_run:  # shadow mode: what the quota would have imposed, kept apart
            words[self._throttle_dry_run_ns + quota] += nanoseconds
            return
        words[self._throttle_ns + quota] += nanoseconds
        words[self._throttle_buckets + quota * _BUCKETS + duration_bucket(nanoseconds)] += 1

    def tick(self) -> None:
        """Refresh CPU time and the idle ratio: the share of wall time the event loop neither
        ran nor waited for a CPU (so a worker starved of CPU does not look idle)."""
        wall, (cpu, waited) = time.monotonic_ns(), _cpu_and_wait_ns()
        last_wall, last_cpu, last_waited = self._last_tick
        self._last_tick = (wall, cpu, waited)
        self.words[self._cpu_ns] = cpu
        if wall > last_wall:
            busy = min(1.0, (cpu - last_cpu + waited - last_waited) / (wall - last_wall))
            self.words[self._idle_ppm] = int((1.0 - busy) * 1_000_000)

