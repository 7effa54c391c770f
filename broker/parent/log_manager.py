"""The parent's duties for the log: start-up recovery, retention, timed flush, clean shutdown.

Start-up (before any worker runs): leftovers of interrupted topic creations and deletions are
removed; if the previous broker did not leave `.pybroker-clean-shutdown` behind, every
partition is recovered from its files (torn trailing batches are cut).  A partition whose
`dirty` or `offline` flag is set, or whose state file disagrees with its segments (missing,
zeroed, another size), is recovered in any case; one that cannot be recovered is marked
offline and the broker starts without it.  At shutdown, after the workers are gone, every
partition is fsynced and the marker written.  Retention, the timed flush (each topic's
flush.ms, else log.flush.interval.ms, checked as often as the smallest asks) and the removal of
deleted topics' directories (within a second of the deletion, off every request path) run on
a thread of the parent, compaction on another, each on registries of their own.

Descriptors: the parent's registries (its loop's, maintenance's, the cleaner's) share a
quarter of the open-files limit, a third each (broker.shared.log.files), and the duties over
every partition (recovery, retention, flushes, shutdown) close each handle when done with it,
so neither descriptors nor mappings grow with the partitions.  A duty that fails on one
partition (out of descriptors, a disk error) is logged and counted, and the others go on: the
threads never stop before the broker does.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time

from broker.shared.config import BrokerConfig
from broker.shared.log import compaction, topic_config
from broker.shared.log.files import MIN_CAPACITY, OpenFiles, default_capacity
from broker.shared.log.partition_state import W_DIRTY
from broker.shared.log.settings import log_settings
from broker.shared.log.topics import (Epoch, TopicInfo, TopicRegistry, forget_offline,
                                     remove_deleted, remove_leftovers)

log = logging.getLogger("broker.parent.log_manager")

CLEAN_SHUTDOWN = ".pybroker-clean-shutdown"
REGISTRIES = 3  # the parent's registries at once: its loop's, maintenance's, the cleaner's
SWEEP_EVERY_S = 1.0  # deleted topics' directories are removed within about this long
_FAILURE_LOG_EVERY_S = 60.0  # one line per duty this often, whatever the failures


class LogManager:
    def __init__(self, config: BrokerConfig, epoch: Epoch):
        self.config = config
        self.epoch = epoch
        self.settings = log_settings(config)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cleaner: threading.Thread | None = None
        self.failures = 0  # partition duties that failed (broker_log_duty_failures_total)
        self._failure_logged: dict[str, float] = {}
        self.open_files: list[OpenFiles] = []  # of the registries alive, for /metrics
        self._closed_files = [0, 0]  # evictions and failures of the registries gone

    def registry(self) -> TopicRegistry:
        """A registry for one of the parent's threads, with its share of the descriptors
        (closed by `close_registry`)."""
        files = OpenFiles(max(default_capacity() // REGISTRIES, MIN_CAPACITY))
        self.open_files = self.open_files + [files]  # replaced whole: the metrics thread reads
        return TopicRegistry(self.config.log_dirs, self.settings, self.epoch, self.config.props,
                             files)

    def close_registry(self, registry: TopicRegistry) -> None:
        registry.close()
        files = registry.files
        self._closed_files = [self._closed_files[0] + files.evicted,
                              self._closed_files[1] + files.failures]
        self.open_files = [held for held in self.open_files if held is not files]

    def descriptor_figures(self) -> tuple[int, int, int]:
        """(log files open, evictions, failed opens) over the parent's registries."""
        alive = self.open_files
        return (sum(files.held for files in alive),
                self._closed_files[0] + sum(files.evicted for files in alive),
                self._closed_files[1] + sum(files.failures for files in alive))

    def _each_partition(self, registry: TopicRegistry, duty: str, action, topics=None) -> None:
        """`action(partition)` on every partition (of `topics`, else of every topic), each
        handle closed after it; a failure is this partition's (logged, counted), never the
        duty's."""
        for topic in list(registry.topics().values()) if topics is None else topics:
            for index in range(topic.partitions):
                if self._stop.is_set() and duty != "shutdown flush":
                    return
                try:
                    partition = registry.partition(topic.name, index)
                    if partition is not None:
                        action(topic, index, partition)
                except Exception as error:  # noqa: BLE001 - one partition pays, not the duty
                    self._failed(duty, f"{topic.name}-{index}", error)
                finally:
                    registry.forget(topic.name, index)

    def _failed(self, duty: str, where: str, error: BaseException) -> None:
        self.failures += 1
        now = time.monotonic()
        if now - self._failure_logged.get(duty, -_FAILURE_LOG_EVERY_S) >= _FAILURE_LOG_EVERY_S:
            self._failure_logged[duty] = now
            log.error("log %s failed on partition %s: %s (%d failures so far; it goes on with "
                      "the others and tries again next time)", duty, where, error, self.failures)

    # --- start-up and shutdown ------------------------------------------------------------

    def _recover_one(self, registry: TopicRegistry, name: str, index: int, clean: bool) -> str:
        """Start-up: recover one partition if in doubt; "checked", "recovered" or "offline"."""
        try:
            partition = registry.partition(name, index)
        except OSError as error:  # its state file cannot even be opened
            log.error("partition %s-%d is offline: it cannot be opened: %s", name, index, error)
            registry.record_offline(name, index)
            return "offline"
        doubt = partition.consistent()
        if clean and not partition.state[W_DIRTY] and not partition.offline and doubt is None:
            return "checked"
        if clean and doubt is not None:  # the marker says clean, the files do not
            log.warning("partition %s-%d: %s; recovering it from its segments", name, index,
                        doubt)
        try:
            cut = partition.recover()
        except Exception as error:  # one bad partition must not stop the broker
            partition.mark_offline(error)
            return "offline"
        if cut:
            log.warning("partition %s-%d: cut %d bytes of torn or corrupt data at the end of "
                        "the log", name, index, cut)
        return "recovered"


    def startup(self) -> None:
        for name in remove_leftovers(self.config.log_dirs):
            log.info("removed unfinished topic directory %s", name)
        forget_offline(self.config.log_dirs)
        markers = [os.path.join(d, CLEAN_SHUTDOWN) for d in self.config.log_dirs]
        clean = all(os.path.exists(marker) for marker in markers)
        registry = self.registry()
        outcomes = {"checked": 0, "recovered": 0, "offline": 0}
        try:
            for topic in registry.topics().values():
                for index in range(topic.partitions):
                    try:
                        outcomes[self._recover_one(registry, topic.name, index, clean)] += 1
                    finally:
                        registry.forget(topic.name, index)  # start-up holds one at a time
        finally:
            self.close_registry(registry)
        recovered, offline = outcomes["recovered"] + outcomes["offline"], outcomes["offline"]
        if offline:
            log.error("log recovery: %d partitions are offline (see above); the others serve",
                      offline)
        for marker in markers:
            if os.path.exists(marker):
                os.unlink(marker)
        log.info("log recovery: %d partitions checked (%s shutdown before)", recovered,
                 "clean" if clean else "unclean")

    def shutdown(self) -> None:
        """After the workers exited: stop maintenance, fsync everything, leave the marker."""
        self._stop.set()
        for thread in (self._thread, self._cleaner):
            if thread is not None:
                thread.join(30)
        registry = self.registry()
        failures = self.failures
        try:
            self._each_partition(registry, "shutdown flush",
                                 lambda _topic, _index, partition: partition.flush(always=True))
        finally:
            self.close_registry(registry)
        if self.failures > failures:  # something unflushed: the next start checks everything
            log.error("shutdown: %d partitions could not be flushed; no clean-shutdown marker, "
                      "so the next start recovers every partition", self.failures - failures)
            return
        for log_dir in self.config.log_dirs:
            with open(os.path.join(log_dir, CLEAN_SHUTDOWN), "w", encoding="utf-8"):
                pass

    # --- maintenance thread ---------------------------------------------------------------

    def start_maintenance(self) -> None:
        self._thread = threading.Thread(target=self._maintain, name="log-maintenance", daemon=True)
        self._thread.start()
        if self.config.props.log_cleaner_enable:  # compaction: a thread of its own, so a long
            self._cleaner = threading.Thread(target=self._clean_loop,  # clean delays no flush
                                             name="log-cleaner", daemon=True)
            self._cleaner.start()

    def _clean_loop(self) -> None:
        """Every log.cleaner.backoff.ms: one compaction round of every compacted topic."""
        props = self.config.props
        registry = self.registry()
        try:
            while not self._stop.wait(props.log_cleaner_backoff_ms / 1000):
                try:
                    self._compact(registry)
                except Exception as error:  # noqa: BLE001 - e.g. the topics could not be listed
                    self._failed("compaction", "(all)", error)
        finally:
            self.close_registry(registry)

    def _compact(self, registry: TopicRegistry) -> None:
        props = self.config.props
        rate = props.log_cleaner_io_max_bytes_per_second or float("inf")

        def clean(topic, index, partition) -> None:
            values = topic_config.effective(props, registry.configs(topic.name))
            if "compact" not in values["cleanup.policy"].split(",") or partition.offline:
                return
            done = compaction.clean(partition, int(time.time() * 1000),
                                    int(values["min.compaction.lag.ms"]),
                                    int(values["delete.retention.ms"]), rate,
                                    float(values["min.cleanable.dirty.ratio"]))
            if done.segments:
                log.info("partition %s-%d: compaction rewrote %d segments, %d records "
                         "removed", topic.name, index, done.segments, done.removed)

        self._each_partition(registry, "compaction", clean)

    def _maintain(self) -> None:
        props = self.config.props
        retention_every = props.log_retention_check_interval_ms / 1000
        next_retention = time.monotonic() + retention_every
        flush_every = next_flush = float("inf")  # set from the topics' flush.ms at the first look
        timed: list[tuple[TopicInfo, float]] = []
        registry = self.registry()
        swept_epoch = None
        try:
            while not self._stop.wait(max(0.01, min(next_retention, next_flush,
                                                    time.monotonic() + SWEEP_EVERY_S)
                                          - time.monotonic())):
                now = time.monotonic()
                if self.epoch.get() != swept_epoch:  # topics changed: deleted ones' files go
                    swept_epoch = self.epoch.get()
                    self._round("deletion", lambda _registry: remove_deleted(
                        self.config.log_dirs), registry)
                    timed = self._timed_flushes(registry)
                    flush_every = min((limit for _topic, limit in timed), default=float("inf"))
                    next_flush = min(next_flush, now + flush_every)
                if now >= next_retention:
                    next_retention = now + retention_every
                    self._round("retention", self._retain, registry)
                if now >= next_flush:
                    next_flush = now + flush_every
                    self._round("flush", lambda held: self._flush(held, timed, flush_every),
                                registry)
        finally:
            self.close_registry(registry)

    def _round(self, duty: str, run, registry: TopicRegistry) -> None:
        try:
            run(registry)
        except Exception as error:  # noqa: BLE001 - e.g. the topics could not be listed
            self._failed(duty, "(all)", error)

    def _retain(self, registry: TopicRegistry) -> None:
        """Each topic's retention: its own retention.ms / retention.bytes, else the broker's;
        a topic whose cleanup.policy lacks delete is left alone."""
        def retain(topic, index, partition) -> None:
            limits = topic_config.retention(self.config.props, registry.configs(topic.name))
            if limits is None or (limits[0] < 0 and limits[1] < 0):
                return
            deleted = partition.enforce_retention(limits[0], limits[1], time.time())
            if deleted:
                log.info("partition %s-%d: retention deleted %d segments; log starts at %d",
                         topic.name, index, deleted, partition.log_start_offset)

        self._each_partition(registry, "retention", retain)

    def _timed_flushes(self, registry: TopicRegistry) -> list[tuple[TopicInfo, float]]:
        """(topic, its flush.ms in seconds) of the topics flushed by time: those whose
        flush.ms (their own, else log.flush.interval.ms) is not Kafka's never; looked up
        again whenever the topics or their configs change."""
        props = self.config.props
        timed = []
        try:
            for topic in list(registry.topics().values()):
                limit = topic_config.flush_ms(props, registry.configs(topic.name))
                if limit < topic_config.LONG_MAX:
                    timed.append((topic, limit / 1000))
        except Exception as error:  # noqa: BLE001 - e.g. the topics could not be listed
            self._failed("flush", "(all)", error)
        return timed

    def _flush(self, registry: TopicRegistry, timed: list[tuple[TopicInfo, float]],
               period: float) -> None:
        """fsync each partition with appends whose topic's flush.ms would pass before the next
        round (`period` from now): no append waits longer than flush.ms after the partition's
        last fsync (the topic with the smallest flush.ms has its partitions flushed every
        round, as log.flush.interval.ms did for all)."""
        now = time.time_ns()
        for topic, limit in timed:
            self._each_partition(registry, "flush",
                                 functools.partial(_flush_if_due, now, (limit - period) * 1e9),
                                 [topic])


def _flush_if_due(now_ns: int, after_ns: float, _topic, _index, partition) -> None:
    """fsync a partition with appends whose last fsync is at least `after_ns` old."""
    if partition.unflushed_messages() and now_ns - partition.last_flush_ns() >= after_ns:
        partition.flush()
