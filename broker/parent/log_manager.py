"""The parent's duties for the log: start-up recovery, retention, timed flush, clean shutdown.

Start-up (before any worker runs): leftovers of interrupted topic creations and deletions are
removed; if the previous broker did not leave `.pybroker-clean-shutdown` behind, every
partition is recovered from its files (torn trailing batches are cut).  A partition whose
`dirty` or `offline` flag is set, or whose state file disagrees with its segments (missing,
zeroed, another size), is recovered in any case; one that cannot be recovered is marked
offline and the broker starts without it.  At shutdown, after the workers are gone, every
partition is fsynced and the marker written.  Retention and the timed flush run on a thread
of the parent, on their own handles.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from broker.shared.config import BrokerConfig
from broker.shared.log import compaction, topic_config
from broker.shared.log.partition import W_DIRTY
from broker.shared.log.settings import log_settings
from broker.shared.log.topics import Epoch, TopicRegistry, forget_offline, remove_leftovers

log = logging.getLogger("broker.parent.log_manager")

CLEAN_SHUTDOWN = ".pybroker-clean-shutdown"


class LogManager:
    def __init__(self, config: BrokerConfig, epoch: Epoch):
        self.config = config
        self.epoch = epoch
        self.settings = log_settings(config)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cleaner: threading.Thread | None = None

    def registry(self) -> TopicRegistry:
        return TopicRegistry(self.config.log_dirs, self.settings, self.epoch, self.config.props)

    # --- start-up and shutdown ------------------------------------------------------------

    def startup(self) -> None:
        for name in remove_leftovers(self.config.log_dirs):
            log.info("removed unfinished topic directory %s", name)
        forget_offline(self.config.log_dirs)
        markers = [os.path.join(d, CLEAN_SHUTDOWN) for d in self.config.log_dirs]
        clean = all(os.path.exists(marker) for marker in markers)
        registry = self.registry()
        recovered = offline = 0
        try:
            for topic in registry.topics().values():
                for index in range(topic.partitions):
                    try:
                        partition = registry.partition(topic.name, index)
                    except OSError as error:  # its state file cannot even be opened
                        log.error("partition %s-%d is offline: it cannot be opened: %s",
                                  topic.name, index, error)
                        registry.record_offline(topic.name, index)
                        offline += 1
                        continue
                    doubt = partition.consistent()
                    if clean and not partition.state[W_DIRTY] and not partition.offline \
                            and doubt is None:
                        continue
                    if clean and doubt is not None:  # the marker says clean, the files do not
                        log.warning("partition %s-%d: %s; recovering it from its segments",
                                    topic.name, index, doubt)
                    recovered += 1
                    try:
                        cut = partition.recover()
                    except Exception as error:  # one bad partition must not stop the broker
                        partition.mark_offline(error)
                        offline += 1
                        continue
                    if cut:
                        log.warning("partition %s-%d: cut %d bytes of torn or corrupt data at "
                                    "the end of the log", topic.name, index, cut)
        finally:
            registry.close()
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
        try:
            for topic in registry.topics().values():
                for index in range(topic.partitions):
                    registry.partition(topic.name, index).flush(always=True)
        finally:
            registry.close()
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
                self._compact(registry)
        except Exception:  # the cleaner must never take the parent down
            log.exception("log cleaner stopped")
        finally:
            registry.close()

    def _compact(self, registry: TopicRegistry) -> None:
        props = self.config.props
        rate = props.log_cleaner_io_max_bytes_per_second or float("inf")
        for topic in list(registry.topics().values()):
            values = topic_config.effective(props, registry.configs(topic.name))
            if "compact" not in values["cleanup.policy"].split(","):
                continue
            for index in range(topic.partitions):
                partition = registry.partition(topic.name, index)
                if partition is None or partition.offline or self._stop.is_set():
                    continue
                done = compaction.clean(partition, int(time.time() * 1000),
                                        int(values["min.compaction.lag.ms"]),
                                        int(values["delete.retention.ms"]), rate,
                                        float(values["min.cleanable.dirty.ratio"]))
                if done.segments:
                    log.info("partition %s-%d: compaction rewrote %d segments, %d records "
                             "removed", topic.name, index, done.segments, done.removed)

    def _maintain(self) -> None:
        props = self.config.props
        retention_every = props.log_retention_check_interval_ms / 1000
        flush_every = (props.log_flush_interval_ms or 0) / 1000
        next_retention = time.monotonic() + retention_every
        next_flush = time.monotonic() + flush_every if flush_every else float("inf")
        registry = self.registry()
        try:
            while not self._stop.wait(max(0.01, min(next_retention, next_flush) - time.monotonic())):
                now = time.monotonic()
                if now >= next_retention:
                    self._retain(registry)
                    next_retention = now + retention_every
                if now >= next_flush:
                    self._flush(registry)
                    next_flush = now + flush_every
        except Exception:  # maintenance must never take the parent down; the next start recovers
            log.exception("log maintenance stopped")
        finally:
            registry.close()

    def _retain(self, registry: TopicRegistry) -> None:
        """Each topic's retention: its own retention.ms / retention.bytes, else the broker's;
        a topic whose cleanup.policy lacks delete is left alone."""
        for topic in list(registry.topics().values()):
            limits = topic_config.retention(self.config.props, registry.configs(topic.name))
            if limits is None or (limits[0] < 0 and limits[1] < 0):
                continue
            keep_bytes, keep_ms = limits
            for index in range(topic.partitions):
                partition = registry.partition(topic.name, index)
                if partition is None:
                    continue
                deleted = partition.enforce_retention(keep_bytes, keep_ms, time.time())
                if deleted:
                    log.info("partition %s-%d: retention deleted %d segments; log starts at %d",
                             topic.name, index, deleted, partition.log_start_offset)

    def _flush(self, registry: TopicRegistry) -> None:
        for topic in list(registry.topics().values()):
            for index in range(topic.partitions):
                partition = registry.partition(topic.name, index)
                if partition is not None and partition.unflushed_messages():
                    partition.flush()
