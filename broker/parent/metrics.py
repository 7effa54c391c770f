"""Prometheus `/metrics`, served by the parent from the shared counter block (the HTTP side is
broker.parent.status_http).

Workers never touch prometheus-client on the request path: they bump plain 64-bit cells in
their own slot of the shared block (shm.block).  At scrape time `BlockCollector` sums the
slots (plus the archive of dead workers' counts) and yields metric families; prometheus-client
does the exposition.  This is the "equivalent collector over the shared block" alternative to
multiprocess mode: no per-pid files to clean up, exact totals across worker crashes, and no
lock on the hot path.
"""

from __future__ import annotations

import logging
import threading
import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from broker.parent.dynamic import DynamicConfig
from broker.parent.ledger import ConnectionLedger
from broker.parent.worker_process import WorkerProcess
from broker.shared.apis import API_NAMES
from broker.shared.client_quotas import DEFAULT, QUOTA_KEYS, QuotaSensors
from broker.shared.config import BrokerConfig
from broker.shared.constants import INT_MAX
from broker.shared.pool import SharedPool
from shm.block import (AUTH_RESULTS, CLOSE_REASONS, DRY_RUN_REASONS, DURATION_BUCKETS,
                       INVALID_REASONS, MUTE_REASONS, QUOTA_TYPES, REJECT_REASONS,
                       SASL_MECHANISMS, STATE_SERVING, SharedBlock)

log = logging.getLogger("broker.parent.metrics")


def _queue_capacity(config: BrokerConfig) -> dict[str, int]:
    """Capacity of each plane's request queue (requests read and not yet answered)."""
    capacity = {"data": config.props.queued_max_requests}
    if config.control_plane_listener is not None:
        capacity["control"] = config.props.pybroker_control_plane_queue_size
    return capacity


class BlockCollector:
    """Reads the shared block, and asks the parent's owners what only they know: the ledger
    (limits, rates, acceptors), the pool, the quota sensors and the worker processes."""

    def __init__(self, block: SharedBlock, config: BrokerConfig, ledger: ConnectionLedger,
                 pool: SharedPool | None, sensors: QuotaSensors, dynamic: DynamicConfig,
                 workers: list[WorkerProcess], lock: threading.Lock):
        self.block = block
        self.listeners = [listener.name for listener in config.listeners]
        self.ledger = ledger
        self.pool = pool
        self.sensors = sensors  # a read-only view: the parent never claims a sensor
        self.dynamic = dynamic
        self.workers = workers
        self.queue_capacity = _queue_capacity(config)
        self.lock = lock
        self.planes = [(listener.name,  # (listener, plane, inter_broker): static
                        "control" if listener.name == config.control_plane_listener else "data",
                        str(listener.name == config.inter_broker_listener).lower())
                       for listener in config.listeners]

    def collect(self):
        with self.lock:  # the supervisor folds a dead worker's slot into the archive under it
            yield self._listeners()
            yield from self._connections()
            yield from self._requests()
            yield from self._workers()

    def _listeners(self):
        """Which plane each listener serves, for joins (`* on(listener) group_left ...`): alert
        rules and dashboards then need no listener names of their own."""
        info = GaugeMetricFamily("broker_listener_info", "1 per listener; plane is control "
                                 "(the KIP-291 control-plane listener) or data, inter_broker "
                                 "marks inter.broker.listener.name", labels=["listener", "plane",
                                                                              "inter_broker"])
        for labels in self.planes:
            info.add_metric(labels, 1)
        return info

    def _connections(self):
        block = self.block
        active = GaugeMetricFamily("broker_connections", "Open client connections",
                                   labels=["listener"])
        accepted = CounterMetricFamily("broker_connections_accepted",
                                       "Connections accepted", labels=["listener"])
        closed = CounterMetricFamily("broker_connections_closed", "Connections closed",
                                     labels=["listener", "reason"])
        blocked = CounterMetricFamily("broker_acceptor_blocked_seconds",
                                      "Time each acceptor spent unable to hand off connections "
                                      "(KIP-402 AcceptorBlockedPercent)", labels=["listener"])
        rejected = CounterMetricFamily("broker_connections_rejected",
                                       "Connections refused or closed by admission",
                                       labels=["listener", "reason"])
        dry_run = CounterMetricFamily("broker_connections_rejected_dry_run",
                                      "Connections a limit in shadow mode would have refused "
                                      "(or paused the acceptor for): admitted",
                                      labels=["listener", "reason"])
        throttled = CounterMetricFamily("broker_connection_accept_throttle_seconds",
                                        "Time each acceptor paused for a creation-rate limit "
                                        "(KIP-612)", labels=["listener"])
        for index, name in enumerate(self.listeners):
            for reason_index, reason in enumerate(CLOSE_REASONS):
                closed.add_metric([name, reason],
                                  block.worker_total("connections_closed", index, reason_index))
            for reason_index, reason in enumerate(REJECT_REASONS):
                rejected.add_metric([name, reason], block.words[
                    block.parent_cell("connections_rejected", index, reason_index)])
            for reason_index, reason in enumerate(DRY_RUN_REASONS):
                dry_run.add_metric([name, reason], block.words[
                    block.parent_cell("connections_dry_run", index, reason_index)])
            accepted.add_metric([name], block.words[block.parent_cell("connections_accepted", index)])
            active.add_metric([name], block.words[block.parent_cell("connections_active", index)])
            blocked.add_metric([name], self.ledger.acceptor_blocked_ns(index) / 1e9)
            throttled.add_metric([name], block.words[block.parent_cell("accept_throttle_ns", index)] / 1e9)
        yield from (active, accepted, closed, blocked, rejected, dry_run, throttled)
        yield from self._limits()
        yield self._authentications()
        yield self._denials()

    def _denials(self):
        """Requests (per resource) the ACLs refused, by API: the workers' and the parent's."""
        family = CounterMetricFamily("broker_authorization_denied",
                                     "Authorization denials (one per resource refused)",
                                     labels=["api"])
        block = self.block
        for api_key, name in API_NAMES.items():
            count = block.worker_total("authorization_denied", api_key) + \
                block.words[block.parent_cell("authorization_denied", api_key)]
            if count:
                family.add_metric([name], count)
        return family

    def _authentications(self):
        family = CounterMetricFamily("broker_authentication", "SASL authentications by outcome",
                                     labels=["listener", "mechanism", "result"])
        for index, name in enumerate(self.listeners):
            for mechanism_index, mechanism in enumerate(SASL_MECHANISMS):
                for result_index, result in enumerate(AUTH_RESULTS):
                    count = self.block.worker_total("authentications", index, mechanism_index,
                                                    result_index)
                    if count:
                        family.add_metric([name, mechanism, result], count)
        return family

    def _limits(self):
        """Each configured limit beside its usage (absent limits are not exported)."""
        view = self.ledger.limit_view()
        unlimited = INT_MAX
        limit = GaugeMetricFamily("broker_connections_limit",
                                  "Configured connection limits (max.connections and per listener)",
                                  labels=["scope", "listener"])
        if view["max_connections"] < unlimited:
            limit.add_metric(["broker", ""], view["max_connections"])
        rate_limit = GaugeMetricFamily("broker_connection_creation_rate_limit",
                                       "Configured connection creation rate limits, per second",
                                       labels=["scope", "listener"])
        rate = GaugeMetricFamily("broker_connection_creation_rate",
                                 "Measured connection creation rate (the quota's window), per second",
                                 labels=["scope", "listener"])
        if view["broker_rate_limit"] < unlimited:
            rate_limit.add_metric(["broker", ""], view["broker_rate_limit"])
        rate.add_metric(["broker", ""], view["broker_rate"])
        for index, name in enumerate(self.listeners):
            if view["listener_max"][index] < unlimited:
                limit.add_metric(["listener", name], view["listener_max"][index])
            if view["listener_rate_limit"][index] < unlimited:
                rate_limit.add_metric(["listener", name], view["listener_rate_limit"][index])
            rate.add_metric(["listener", name], view["listener_rate"][index])
        held = GaugeMetricFamily("broker_throttled_sockets",
                                 "Sockets held unread until their per-IP throttle delay ends",
                                 value=view["throttled_sockets"])
        yield from (limit, rate_limit, rate, held)

    def _requests(self):
        block = self.block
        requests = CounterMetricFamily("broker_requests", "Requests served",
                                       labels=["api", "listener"])
        duration = HistogramMetricFamily("broker_request_duration_seconds",
                                         "Time from reading a request to writing its response",
                                         labels=["api", "listener"])
        invalid = CounterMetricFamily("broker_invalid_requests",
                                      "Requests that closed their connection", labels=["reason"])
        for api_key, api in sorted(API_NAMES.items()):
            for index, name in enumerate(self.listeners):
                count = block.worker_total("requests", index, api_key)
                requests.add_metric([api, name], count)
                if count:  # 128 APIs x listeners x 17 buckets: only the ones used
                    duration.add_metric([api, name], *self._histogram(index, api_key))
        for reason_index, reason in enumerate(INVALID_REASONS):
            invalid.add_metric([reason], block.worker_total("invalid_requests", reason_index))
        delayed = GaugeMetricFamily("broker_delayed_fetches",
                                    "Fetch requests waiting for data (Kafka's fetch purgatory size)",
                                    value=block.worker_total("delayed_fetches"))
        muted = GaugeMetricFamily("broker_muted_channels", "Connections not being read, by reason",
                                  labels=["reason"])
        for index, reason in enumerate(MUTE_REASONS):
            muted.add_metric([reason], block.worker_total("muted_channels", index))
        yield from (requests, duration, invalid, delayed, muted)
        yield from self._fetch_sessions()
        yield from self._upstream()
        yield from self._throttles()
        pool = self.pool
        if pool is not None:
            yield GaugeMetricFamily("broker_request_memory_used_bytes",
                                    "Bytes held for requests by all workers (KIP-72 pool)",
                                    value=pool.used())
            yield GaugeMetricFamily("broker_request_memory_limit_bytes",
                                    "queued.max.request.bytes", value=pool.limit)
            depleted = CounterMetricFamily("broker_request_memory_depleted_seconds",
                                           "Time some request waited for pool memory")
            depleted.add_metric([], pool.depleted_ns() / 1e9)
            yield depleted

    def _histogram(self, listener: int, api_key: int):
        cumulative, buckets = 0, []
        for bucket, bound in enumerate(DURATION_BUCKETS + (float("inf"),)):
            cumulative += self.block.worker_total("request_duration_bucket", listener, api_key,
                                                  bucket)
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
        return buckets, self.block.worker_total("request_duration_ns", listener, api_key) / 1e9

    def _workers(self):
        up = GaugeMetricFamily("broker_worker_up", "1 while the worker process is serving",
                               labels=["worker"])
        for worker in self.workers:
            up.add_metric([worker.name], 1 if worker.serving else 0)
        restarts = CounterMetricFamily("broker_worker_restarts", "Worker processes restarted")
        restarts.add_metric([], self.block.words[self.block.parent_cell("worker_restarts")])
        spawn_failures = CounterMetricFamily(
            "broker_worker_spawn_failures", "Worker restarts that could not spawn the process "
            "(retried with back-off)",
            value=self.block.words[self.block.parent_cell("worker_spawn_failures")])
        heartbeat = GaugeMetricFamily("broker_worker_heartbeat_age_seconds",
                                      "Seconds since each worker last refreshed its heartbeat",
                                      labels=["worker"])
        now = time.monotonic_ns()
        for worker in self._running():
            beat = self.block.slot_heartbeat(worker.slot)
            if beat:
                heartbeat.add_metric([worker.name], max(0, now - beat) / 1e9)
        yield from (up, restarts, spawn_failures, heartbeat)
        yield from self._planes()

    def _planes(self):
        """Per worker CPU and idle ratio, and each plane's request queue (KIP-291's split)."""
        block, words = self.block, self.block.words
        idle = GaugeMetricFamily("broker_network_worker_idle_ratio",
                                 "Share of the last second each worker's event loop neither ran "
                                 "nor waited for a CPU (Kafka's NetworkProcessorAvgIdlePercent)",
                                 labels=["worker", "plane"])
        cpu = CounterMetricFamily("broker_network_worker_cpu_seconds",
                                  "CPU time of each worker process", labels=["worker", "plane"])
        queue = GaugeMetricFamily("broker_request_queue_size",
                                  "Requests read and waiting for the parent to serve them "
                                  "(counted against queued.max.requests; long polls and "
                                  "rebalance waits are not)", labels=["plane"])
        capacity = GaugeMetricFamily("broker_request_queue_capacity",
                                     "queued.max.requests, or the control plane's queue size",
                                     labels=["plane"])
        queued = dict.fromkeys(self.queue_capacity, 0)
        for worker in self._running():
            slot, name, plane = worker.slot, worker.name, worker.plane
            if block.slot_state(slot) != STATE_SERVING:
                continue
            idle.add_metric([name, plane], words[block.worker_cell(slot, "idle_ppm")] / 1e6)
            cpu.add_metric([name, plane], words[block.worker_cell(slot, "cpu_ns")] / 1e9)
            queued[plane] = queued.get(plane, 0) + words[block.worker_cell(slot,
                                                                           "queued_requests")]
        for plane, size in self.queue_capacity.items():
            queue.add_metric([plane], queued[plane])
            capacity.add_metric([plane], size)
        yield from (idle, cpu, queue, capacity)

    def _running(self) -> list[WorkerProcess]:
        return [worker for worker in self.workers if worker.pid]

    def _fetch_sessions(self):
        """Kafka's FetchSessionCache metrics, summed over the workers."""
        block = self.block
        yield GaugeMetricFamily("broker_incremental_fetch_sessions",
                                "Incremental fetch sessions held (KIP-227)",
                                value=block.worker_total("fetch_sessions"))
        yield GaugeMetricFamily("broker_incremental_fetch_partitions_cached",
                                "Partitions the incremental fetch sessions remember",
                                value=block.worker_total("fetch_session_partitions"))
        yield CounterMetricFamily("broker_incremental_fetch_session_evictions",
                                  "Fetch sessions evicted to make room, given back to a worker "
                                  "below its share, or grown past their bounds",
                                  value=block.worker_total("fetch_session_evictions"))

    def _upstream(self):
        """Front-end mode: the workers' connections and requests to the upstream cluster."""
        block = self.block
        yield GaugeMetricFamily("broker_upstream_connections",
                                "Connections the workers hold open to upstream nodes",
                                value=block.worker_total("upstream_connections"))
        yield CounterMetricFamily("broker_upstream_requests",
                                  "Requests sent to the upstream cluster",
                                  value=block.worker_total("upstream_requests"))
        yield CounterMetricFamily("broker_upstream_request_failures",
                                  "Requests the upstream could not answer (node refused, "
                                  "connection lost): their clients' connections closed",
                                  value=block.worker_total("upstream_failures"))

    def _throttles(self):
        block = self.block
        total = CounterMetricFamily("broker_throttle_time_seconds",
                                    "Throttle time handed to clients (KIP-219)", labels=["quota"])
        dry_run = CounterMetricFamily("broker_throttle_time_dry_run_seconds",
                                      "Throttle time quotas in shadow mode would have handed "
                                      "out (not applied)", labels=["quota"])
        histogram = HistogramMetricFamily("broker_throttle_seconds",
                                          "Single throttles handed to clients", labels=["quota"])
        for quota_index, quota in enumerate(QUOTA_TYPES):
            total.add_metric([quota], block.worker_total("throttle_ns", quota_index) / 1e9)
            dry_run.add_metric([quota],
                               block.worker_total("throttle_dry_run_ns", quota_index) / 1e9)
            cumulative, buckets = 0, []
            for bucket, bound in enumerate(DURATION_BUCKETS + (float("inf"),)):
                cumulative += block.worker_total("throttle_bucket", quota_index, bucket)
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
            histogram.add_metric([quota], buckets, block.worker_total("throttle_ns", quota_index) / 1e9)
        rates = GaugeMetricFamily("broker_quota_rate",
                                  "Measured rate of the busiest quota entities (top 10 per quota "
                                  "type; bytes/s, or percent for request_percentage)",
                                  labels=["quota", "entity"])
        for quota, entity, rate in self._quota_rates():
            rates.add_metric([quota, entity], rate)
        untracked = CounterMetricFamily(
            "broker_quota_untracked_requests", "Requests of clients no quota sensor could "
            "track (every one of pybroker.quota.max.sensors in use)",
            value=block.worker_total("quota_untracked"))
        in_use = GaugeMetricFamily("broker_quota_sensors", "Client quota sensors counted into "
                                   "within the last rate span, and their capacity",
                                   labels=["state"])
        in_use.add_metric(["in_use"], self.sensors.in_use())
        in_use.add_metric(["capacity"], self.sensors.entities)
        yield from (total, dry_run, histogram, rates, untracked, in_use)

    def _quota_rates(self, top: int = 10) -> list[tuple[str, str, float]]:
        """(quota, entity, rate) of the busiest named entities, per quota type."""
        found = []
        client_quotas = self.dynamic.stored.client_quotas
        for quota_index, quota in enumerate(QUOTA_KEYS):
            named = [key for key, values in client_quotas.items()
                     if quota in values and DEFAULT not in key]
            unit = 1_000_000 if quota == "request_percentage" else 1  # see workers.throttling.UNITS
            rates = []
            for key in named:
                entity = self.sensors.find(key)
                if entity is not None:
                    rates.append((self.sensors.measure(quota_index, entity)[0] / unit, key))
            found += [(quota, key, rate) for rate, key in sorted(rates, reverse=True)[:top]]
        return found


class DescriptorCollector:
    """Descriptors of the log store and of the answers sent from its files: the workers'
    figures from the shared block, the parent's from its log manager."""

    def __init__(self, block: SharedBlock, logs):
        self.block = block
        self.logs = logs

    def collect(self):
        total = self.block.worker_total
        held, evictions, failures = self.logs.descriptor_figures()
        yield GaugeMetricFamily(
            "broker_log_open_files", "Log files (segments, states, indexes) held open by the "
            "broker's processes; each keeps at most a quarter of its open-files limit",
            value=total("log_files") + held)
        yield CounterMetricFamily(
            "broker_log_file_evictions", "Times a process closed its least recently used log "
            "files to open others (more partitions in use than its descriptor budget)",
            value=total("log_file_evictions") + evictions)
        yield CounterMetricFamily(
            "broker_log_descriptor_failures", "Log files that could not be opened for want of "
            "descriptors (answered KAFKA_STORAGE_ERROR, retriable)",
            value=total("log_descriptor_failures") + failures)
        yield CounterMetricFamily(
            "broker_log_duty_failures", "Partition duties of the parent (retention, flush, "
            "compaction, shutdown flush) that failed on one partition and went on",
            value=self.logs.failures)
        yield GaugeMetricFamily(
            "broker_fetch_file_regions", "File regions (a descriptor each) held by Fetch "
            "answers being sent", value=total("fetch_regions"))
        yield CounterMetricFamily(
            "broker_fetch_regions_read", "File regions read into a Fetch answer because the "
            "worker's region budget was spent", value=total("fetch_regions_read"))
