"""The parent process: binds listeners, runs acceptors, spawns and supervises workers.

Process model (see ARCHITECTURE.md):

    parent (this module, one uvloop)
      acceptor per listener --fd + header over SOCK_SEQPACKET (SCM_RIGHTS)--> worker 0..N-1
      supervisor: spawn, reap, restart, heartbeat watch, graceful shutdown
      /metrics thread reading the shared block

Signal handlers only queue the signal and wake the main loop, which dispatches
`handle_<name>()` (gunicorn's arbiter does the same).  uvloop keeps SIGCHLD for itself, so a
pidfd per worker tells the loop when a child exits.  A worker that dies is reaped with
`waitpid(-1, WNOHANG)`, its cause logged, the connections it held counted as closed, its slot
folded into the archive, and it is restarted (with a back-off if it keeps dying young).  A
worker that exits with WORKER_BOOT_ERROR before it was ever ready halts the broker instead of
crash-looping.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import signal
import socket
import sys
import threading
import time

import msgspec

from broker import events, ipc
from broker.acceptor import bind_listener
from broker.admission import override_hosts
from broker.admin import AdminService
from broker.config import BrokerConfig, ConfigError, load_config
from broker.connections import Connections
from broker.dynamic import DynamicConfig
from broker.events import EventLog
from broker.groups.coordinator import GROUP_APIS, GroupCoordinator
from broker.groups.offsets import OffsetStore
from broker.handoff import WorkerHandle
from broker.log.manager import LogManager
from broker.log.topics import Epoch
from broker.metrics import BlockCollector, serve_metrics
from broker.pool import SharedPool, initialise_pool
from broker.protocol import guard
from broker.protocol.codec import REQUEST_PREFIX
from broker.quotas import DEFAULT, QUOTA_KEYS, QuotaSensors
from broker.resolver import HostResolver
from broker.runtime import Runtime
from shm.block import CLOSE_REASONS, SharedBlock

log = logging.getLogger("broker.supervisor")

WORKER_BOOT_ERROR = 3
BOOT_TIMEOUT = 30.0
TICK = 0.5
KILL_AFTER_ABORT = 5.0
YOUNG_DEATH = 2.0  # a worker dying sooner than this after start is restarted with back-off
MAX_BACKOFF = 5.0
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
MESSAGES_PER_WAKEUP = 16


class Supervisor:
    def __init__(self, config: BrokerConfig, runtime: Runtime, log_level: str = "INFO",
                 reload=None):
        self.config = config
        self.runtime = runtime
        self.log_level = log_level
        self._reload = reload  # () -> raw config (file + overrides) for SIGHUP, or None
        props = config.props
        guard.limits.max_entries = props.pybroker_request_max_entries  # forwarded requests too
        self.block: SharedBlock | None = None
        self.workers = [WorkerHandle(slot=i, name=f"data-{i}",
                                     handed=[0] * len(config.listeners))
                        for i in range(props.num_network_threads)]
        if config.control_plane_listener is not None:
            # KIP-291: one more worker, in the slot after the data workers, for one listener.
            self.workers.append(WorkerHandle(slot=len(self.workers), name="control-plane",
                                             control_plane=True,
                                             handed=[0] * len(config.listeners)))
        self.connections: Connections | None = None
        self.pool: SharedPool | None = None
        self._quota_sensors: QuotaSensors | None = None
        self.admin: AdminService | None = None
        self.metrics_lock = threading.Lock()
        self._metrics_server = None
        self._signals: collections.deque = collections.deque()
        self._wakeup: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._force = False
        self._exit_code = 0
        self._backoff: dict[int, float] = {}
        self.events: EventLog | None = None
        self.groups: GroupCoordinator | None = None
        self._topics = None  # the parent's TopicRegistry, for the group coordinator
        self._depleted_seen = 0  # pool depleted ns already reported
        self._depletion: tuple[int, float] | None = None  # (start epoch ms, depleted ns then)
        self._resolver: HostResolver | None = None

    # --- entry point ----------------------------------------------------------------------

    async def run(self) -> int:
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        for signum in SIGNALS:
            self._loop.add_signal_handler(signum, self._queue_signal, signum)
        sockets = self._bind()
        self.config = self.config.with_bound_ports(
            {listener.name: sock.getsockname()[1]
             for listener, sock in zip(self.config.listeners, sockets)})
        props = self.config.props
        self.block = SharedBlock.create(self.runtime.shm_path, len(self.workers),
                                        len(self.config.listeners),
                                        props.pybroker_quota_max_sensors, props.quota_window_num,
                                        props.pybroker_pool_max_waiters)
        self.logs = LogManager(self.config, Epoch(self.block.words,
                                                  self.block.parent_cell("metadata_epoch")))
        self.pool = self._create_pool()
        self.events = self._event_log()
        dynamic = DynamicConfig(self.config)
        dynamic.load()
        # Host names of the per-IP overrides: resolved now (start-up may wait), then only off
        # the loop, with the limits re-applied when an answer changes.
        self._resolver = HostResolver(self._loop,
                                      on_change=lambda: self.connections.apply_limits())
        self._resolver.prime(override_hosts(dynamic.value("max.connections.per.ip.overrides")[0]
                                            or ""))
        dynamic.resolver = self._resolver
        self.connections = Connections(self._loop, self.config, self.block, self.workers,
                                       dynamic, self.metrics_lock, self.events)
        self.admin = AdminService(self.config.node_id, dynamic, self._config_changed,
                                  self.config.may_alter, self.events)
        try:
            self.logs.startup()
            self.groups = self._group_coordinator()
            for worker in self.workers:
                self._spawn(worker)
            if await self._wait_until_ready():
                self.connections.start(sockets)
                self._start_metrics()
                self.logs.start_maintenance()
                if self.events is not None:
                    self._events_tick()
                log.info("broker ready node.id=%d workers=%d pid=%d", self.config.node_id,
                         len(self.workers), os.getpid())
                await self._main_loop()
            await self._shutdown()
            self.groups.close()
            self.logs.shutdown()
        finally:
            if self._topics is not None:
                self._topics.close()
            for sock in sockets:
                sock.close()
            self._stop_metrics()
            if self._resolver is not None:
                self._resolver.close()
            if self.events is not None:
                self.events.close()
            self.block.close()
            self.block.unlink()
        return self._exit_code

    # --- start-up -------------------------------------------------------------------------

    def _create_pool(self) -> SharedPool | None:
        limit = self.config.props.queued_max_request_bytes
        if limit <= 0:
            return None
        reserved = self.config.pool_reserved_by_index()
        initialise_pool(self.block, limit, reserved)
        return SharedPool(self.block, -1, limit, reserved)

    def _group_coordinator(self) -> GroupCoordinator:
        props = self.config.props
        offsets = OffsetStore(self.config.log_dirs[0],
                              fsync_every_commit=props.log_flush_interval_messages == 1)
        self._topics = self.logs.registry()

        def partitions_of(topic: str) -> int | None:
            info = self._topics.get(topic)
            return None if info is None else info.partitions

        return GroupCoordinator(self._loop, props, offsets, partitions_of)

    def _event_log(self) -> EventLog | None:
        if self.config.event_log_dir is None:
            return None
        props = self.config.props
        return EventLog(self.config.event_log_dir, "parent", self.config.node_id,
                        props.pybroker_event_log_file_bytes, props.pybroker_event_log_total_bytes)

    def _events_tick(self, boundary: int = 0) -> None:
        """On every wall-clock second: what the second that just ended looked like."""
        now = time.time()
        if boundary:
            self._events_second(boundary - 1, now)
        if not self._stopping:
            following = int(now) + 1
            self._loop.call_later(following - now, self._events_tick, following)

    def _events_second(self, second: int, now: float) -> None:
        second_ms = second * 1000
        emit = self.events.emit
        for acceptor in self.connections.acceptors:
            for reason, (episodes, nanoseconds) in acceptor.take_blocked().items():
                emit(events.AcceptorBlocked(ts=second_ms, listener=acceptor.listener.name,
                                            reason=reason, episodes=episodes,
                                            blocked_ms=nanoseconds / 1e6))
        stats = events.BrokerStats(ts=second_ms, active={
            listener.name: count for listener, count in
            zip(self.config.listeners, self.connections.quotas.per_listener)})
        if self.pool is not None:
            self._pool_events(stats, now)
        emit(stats)
        self.events.flush()

    def _pool_events(self, stats: events.BrokerStats, now: float) -> None:
        """Pool figures for the second, and a pool_depleted event when a depletion ended."""
        pool = self.pool
        depleted = pool.depleted_ns()
        stats.pool_used, stats.pool_limit = pool.used(), pool.limit
        stats.pool_waiting = pool.waiting()
        stats.depleted_ms = (depleted - self._depleted_seen) / 1e6
        self._depleted_seen = depleted
        if stats.pool_waiting and self._depletion is None:
            self._depletion = (int(now * 1000), depleted - stats.depleted_ms * 1e6)
        elif not stats.pool_waiting and self._depletion is not None:
            started, base = self._depletion
            self.events.emit(events.PoolDepleted(started=started,
                                                 duration_ms=(depleted - base) / 1e6))
            self._depletion = None

    def _bind(self) -> list[socket.socket]:
        props, sockets = self.config.props, []
        try:
            for listener in self.config.listeners:
                sockets.append(bind_listener(listener, props.socket_listen_backlog_size,
                                             props.socket_receive_buffer_bytes))
        except OSError as error:
            for sock in sockets:
                sock.close()
            raise OSError(error.errno, f"cannot bind listener {listener.name} on "
                                       f"{listener.address()}: {error.strerror}") from None
        for listener, sock in zip(self.config.listeners, sockets):
            host, port = sock.getsockname()[:2]
            log.info("listening listener=%s address=%s:%d", listener.name, host, port)
        return sockets

    async def _wait_until_ready(self) -> bool:
        deadline = time.monotonic() + BOOT_TIMEOUT
        while not all(worker.ready for worker in self.workers):
            if self._stopping:
                return False
            if time.monotonic() > deadline:
                log.error("workers did not boot within %.0fs", BOOT_TIMEOUT)
                self._exit_code = WORKER_BOOT_ERROR
                return False
            await self._next_event(0.05)
        return True

    def _start_metrics(self) -> None:
        if self.config.prometheus is None:
            return
        from workers.apis import api_names

        host, port = self.config.prometheus
        collector = BlockCollector(self.block, [item.name for item in self.config.listeners],
                                   self, api_names(), self.metrics_lock)
        self._metrics_server, bound = serve_metrics(host, port, collector)
        log.info("metrics listening address=%s:%d", host, bound)

    def _stop_metrics(self) -> None:
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
            self._metrics_server = None

    # --- main loop and signals ------------------------------------------------------------

    def _queue_signal(self, signum: int) -> None:
        """NO LOGGING, just queue the signal and wake the loop."""
        self._signals.append(signum)
        self._wakeup.set()

    async def _next_event(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self._wakeup.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        self._wakeup.clear()
        while self._signals:
            signum = self._signals.popleft()
            getattr(self, f"handle_{signal.Signals(signum).name.lower()}")()

    async def _main_loop(self) -> None:
        while not self._stopping:
            await self._next_event(TICK)
            self._reap()  # backstop for a missed pidfd wake-up
            self._check_heartbeats()
            # Per-IP rate sensors unused for an hour go, so many IPs cannot grow the parent.
            self.connections.quotas.expire_ip_sensors(time.monotonic())

    def handle_sigterm(self) -> None:
        """SIGTERM: graceful shutdown; a second one kills the workers at once."""
        self._request_stop()

    def handle_sigint(self) -> None:
        """SIGINT: as SIGTERM."""
        self._request_stop()

    def handle_sighup(self) -> None:
        """SIGHUP: re-read the config file; connection limits change, other keys need a restart."""
        if self._reload is None:
            log.info("SIGHUP: no config file to re-read")
            return
        try:
            fresh = load_config(self._reload())
        except ConfigError as error:
            log.error("SIGHUP: config not reloaded: %s", error)
            return
        changed = [key for key in fresh.props.__struct_fields__
                   if getattr(fresh.props, key) != getattr(self.config.props, key)]
        self.connections.dynamic.config = msgspec.structs.replace(
            self.connections.dynamic.config, props=fresh.props,
            listener_props=fresh.listener_props)
        log.info("SIGHUP: config re-read; changed: %s", ", ".join(changed) or "nothing")
        self.connections.apply_limits()

    def _request_stop(self) -> None:
        if self._stopping:
            log.warning("second stop signal: killing workers now")
            self._force = True
        self._stopping = True

    # --- workers --------------------------------------------------------------------------

    def _spawn(self, worker: WorkerHandle) -> None:
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            child_end.set_inheritable(True)
            argv = [sys.executable, "-m", "workers", "--channel", str(child_end.fileno()),
                    "--parent", str(os.getpid()), "--log-level", self.log_level]
            pid = os.posix_spawn(sys.executable, argv, os.environ)
            pidfd = os.pidfd_open(pid)
        except OSError:
            parent_end.close()
            raise
        finally:
            child_end.close()
        self.block.claim_slot(worker.slot, pid)
        channel = ipc.Channel(parent_end, self._loop,
                              on_broken=lambda error: self._channel_broken(worker, channel, error))
        worker.pid, worker.channel, worker.ready = pid, channel, False
        worker.started_at, worker.abort_sent_at, worker.outstanding = time.monotonic(), 0.0, 0
        worker.handed = [0] * len(self.config.listeners)
        boot = ipc.Boot(config=self.config, slot=worker.slot, shm_path=self.block.path,
                        cluster_id=self.runtime.cluster_id, name=worker.name,
                        control_plane=worker.control_plane)
        channel.send(boot)
        if self.connections is not None:
            self._send_quotas(worker)
        self._loop.add_reader(channel.fileno(), self._on_worker_message, worker)
        worker.pidfd = pidfd
        self._loop.add_reader(worker.pidfd, self._reap)
        log.info("spawned worker %s pid=%d", worker.name, pid)
        if self.events is not None:
            self.events.emit(events.WorkerStarted(
                worker=worker.name, pid=pid, plane="control" if worker.control_plane else "data"))

    def _on_worker_message(self, worker: WorkerHandle) -> None:
        # At most a few messages per call: the loop then serves other workers' channels
        # (the control plane's among them) before coming back to a busy one.
        for _ in range(MESSAGES_PER_WAKEUP):
            if worker.channel is None:
                return
            try:
                message, fds = worker.channel.receive()
            except BlockingIOError:
                return
            except (EOFError, OSError, ValueError, msgspec.DecodeError) as error:
                if not isinstance(error, EOFError):
                    log.error("channel of %s failed: %s", worker.name, error)
                self._detach_channel(worker)  # the worker is exiting; SIGCHLD follows
                return
            for fd in fds:
                os.close(fd)
            if isinstance(message, ipc.Progress):
                self.connections.progress(worker, message)
            elif isinstance(message, ipc.EvictCandidates):
                self.connections.evict_candidates(worker, message)
            elif isinstance(message, ipc.AdminRequest):
                self._serve_admin(worker, message)
            elif isinstance(message, ipc.Ready):
                worker.ready = True
                self.connections.wake_acceptors()
            else:
                log.error("unexpected message from %s: %r", worker.name, message)

    def _config_changed(self) -> None:
        """A dynamic change was persisted: apply connection limits, tell workers the quotas."""
        self.connections.apply_limits()
        for worker in self.workers:
            if worker.channel is not None:
                self._send_quotas(worker)

    def _send_quotas(self, worker: WorkerHandle) -> None:
        quotas = ipc.Quotas(entries=self.connections.dynamic.stored.client_quotas)
        try:
            worker.channel.send(quotas)
        except OSError:
            pass  # a dead worker gets them again when it is respawned

    def _serve_admin(self, worker: WorkerHandle, message: ipc.AdminRequest) -> None:
        """Config and quota requests (broker.admin) and group requests (broker.groups)."""
        started = time.perf_counter_ns()
        try:
            api_key = REQUEST_PREFIX.unpack_from(message.frame, 0)[0]
            service = self.groups if api_key in GROUP_APIS else self.admin
            answer = service.handle(message.frame, message.listener, message.peer)
        except Exception:  # a malformed forwarded request costs that connection only
            log.exception("admin request from %s failed", worker.name)
            answer = None
        busy = time.perf_counter_ns() - started
        channel = worker.channel
        if isinstance(answer, asyncio.Future):  # a JoinGroup or SyncGroup waiting
            answer.add_done_callback(lambda done: self._answer_admin(
                worker, channel, message.request_id,
                None if done.cancelled() else done.result(), busy))
            return
        self._answer_admin(worker, channel, message.request_id, answer, busy)

    @staticmethod
    def _answer_admin(worker: WorkerHandle, channel, request_id: int, answer, busy: int) -> None:
        if channel is None or worker.channel is not channel:
            return  # the worker that asked is gone, and the connection with it
        try:
            channel.send(ipc.AdminResponse(request_id=request_id, frame=answer, busy_ns=busy))
        except OSError:
            pass  # the worker is gone, and the connection that asked with it

    def _channel_broken(self, worker: WorkerHandle, channel: ipc.Channel, error) -> None:
        """The worker's end stopped reading or went away: it is treated as exiting (its
        heartbeat watch or SIGCHLD finishes the job)."""
        if worker.channel is channel:
            log.error("channel of %s broke: %s", worker.name, error)
            self._detach_channel(worker)

    def _detach_channel(self, worker: WorkerHandle) -> None:
        if worker.channel is not None:
            channel, worker.channel = worker.channel, None
            self._loop.remove_reader(channel.fileno())
            channel.close()
        worker.ready = False

    def _close_pidfd(self, worker: WorkerHandle) -> None:
        if worker.pidfd >= 0:
            self._loop.remove_reader(worker.pidfd)
            os.close(worker.pidfd)
            worker.pidfd = -1

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            worker = next((w for w in self.workers if w.pid == pid), None)
            if worker is not None:
                self._worker_exited(worker, status)

    def _worker_exited(self, worker: WorkerHandle, status: int) -> None:
        was_ready, lived = worker.ready, time.monotonic() - worker.started_at
        self._log_exit(worker, status)
        if self.events is not None:
            code = os.waitstatus_to_exitcode(status)
            cause = f"exit {code}" if code >= 0 else f"signal {signal.Signals(-code).name}"
            self.events.emit(events.WorkerExited(worker=worker.name, pid=worker.pid, cause=cause,
                                                 lived_ms=int(lived * 1000)))
        self._detach_channel(worker)
        self._close_pidfd(worker)
        self._retire_slot(worker)
        worker.pid = 0
        code = os.waitstatus_to_exitcode(status)
        if self._stopping:
            return
        if code == WORKER_BOOT_ERROR and not was_ready:
            log.error("worker %s failed to boot; halting to avoid a crash loop", worker.name)
            self._exit_code = WORKER_BOOT_ERROR
            self._stopping = True
            return
        delay = 0.0
        if lived < YOUNG_DEATH:
            delay = min(MAX_BACKOFF, self._backoff.get(worker.slot, 0.05) * 2)
            self._backoff[worker.slot] = delay
            log.warning("worker %s died %.1fs after start; restarting in %.1fs", worker.name,
                        lived, delay)
        else:
            self._backoff.pop(worker.slot, None)
        with self.metrics_lock:
            self.block.words[self.block.parent_cell("worker_restarts")] += 1
        self._loop.call_later(delay, self._respawn, worker)

    def _respawn(self, worker: WorkerHandle) -> None:
        """Start the worker again; if the process cannot be spawned (EMFILE, ENOMEM, ...),
        try again with a doubling back-off rather than leave its slot empty for good."""
        if self._stopping or worker.pid != 0:
            return
        try:
            self._spawn(worker)
        except OSError as error:
            delay = min(MAX_BACKOFF, self._backoff.get(worker.slot, 0.05) * 2)
            self._backoff[worker.slot] = delay
            with self.metrics_lock:
                self.block.words[self.block.parent_cell("worker_spawn_failures")] += 1
            log.error("worker %s could not be spawned: %s; trying again in %.1fs", worker.name,
                      error, delay)
            self._loop.call_later(delay, self._respawn, worker)

    def _log_exit(self, worker: WorkerHandle, status: int) -> None:
        code = os.waitstatus_to_exitcode(status)
        if code >= 0:
            level = logging.INFO if code == 0 and self._stopping else logging.ERROR
            log.log(level, "worker %s (pid %d) exited with status %d", worker.name, worker.pid, code)
            return
        name = signal.Signals(-code).name
        if -code == signal.SIGKILL:
            log.error("worker %s (pid %d) was killed by %s; perhaps out of memory?",
                      worker.name, worker.pid, name)
        else:
            log.warning("worker %s (pid %d) was killed by %s", worker.name, worker.pid, name)

    def _retire_slot(self, worker: WorkerHandle) -> None:
        """Count what the dead worker held as closed and fold its counters into the archive."""
        block, slot = self.block, worker.slot
        lost_reason = CLOSE_REASONS.index("worker_exit")
        if self.pool is not None:
            freed = self.pool.reclaim(slot)
            if freed:
                log.info("returned %d bytes of request memory held by %s", freed, worker.name)
        with self.metrics_lock:
            for listener, handed in enumerate(worker.handed):
                closed = sum(block.words[block.worker_cell(slot, "connections_closed", listener, r)]
                             for r in range(len(CLOSE_REASONS)))
                lost = handed - closed
                if lost > 0:
                    block.words[block.worker_cell(block.archive_slot, "connections_closed",
                                                  listener, lost_reason)] += lost
            block.archive_slot_counters(slot)
        worker.handed = [0] * len(self.config.listeners)
        worker.outstanding = 0
        self.connections.worker_gone(worker)

    def _check_heartbeats(self) -> None:
        timeout = self.config.props.pybroker_worker_heartbeat_timeout_ms / 1000
        now = time.monotonic()
        for worker in self.workers:
            if not worker.pid or not worker.ready:
                continue
            age = (time.monotonic_ns() - self.block.slot_heartbeat(worker.slot)) / 1e9
            if age <= timeout:
                continue
            if not worker.abort_sent_at:
                log.error("worker %s (pid %d) heartbeat is %.1fs old; aborting it",
                          worker.name, worker.pid, age)
                worker.abort_sent_at = now
                self._signal(worker, signal.SIGABRT)
            elif now - worker.abort_sent_at > KILL_AFTER_ABORT:
                self._signal(worker, signal.SIGKILL)

    @staticmethod
    def _signal(worker: WorkerHandle, signum: int) -> None:
        try:
            os.kill(worker.pid, signum)
        except ProcessLookupError:
            pass

    # --- shutdown -------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        """Stop accepting, let workers finish in-flight requests, then kill what remains."""
        # 1. No new connections: close every listening socket (and held throttled sockets);
        #    group requests waiting for a rebalance are answered now.
        if self.connections is not None:
            self.connections.stop()
        if self.groups is not None:
            self.groups.abort_waiting()
        # 2. Ask each worker to drain within the deadline.
        timeout_ms = self.config.props.pybroker_shutdown_timeout_ms
        for worker in self.workers:
            if worker.channel is not None:
                try:
                    worker.channel.send(ipc.Shutdown(deadline_ms=timeout_ms))
                except OSError:
                    self._signal(worker, signal.SIGTERM)
            elif worker.pid:
                self._signal(worker, signal.SIGTERM)
        # 3. Wait for them to exit, reaping as SIGCHLD arrives; a second signal cuts it short.
        deadline = time.monotonic() + timeout_ms / 1000 + 1.0
        while any(worker.pid for worker in self.workers):
            if self._force or time.monotonic() > deadline:
                break
            await self._next_event(0.05)
            self._reap()
        # 4. Kill and reap whatever is left.
        for worker in self.workers:
            if worker.pid:
                log.warning("killing worker %s (pid %d) after the shutdown deadline",
                            worker.name, worker.pid)
                self._signal(worker, signal.SIGKILL)
                try:
                    os.waitpid(worker.pid, 0)
                except ChildProcessError:
                    pass
                self._detach_channel(worker)
                self._close_pidfd(worker)
                worker.pid = 0
        log.info("broker stopped")

    # --- for the metrics collector (called from its thread) -------------------------------

    def acceptor_blocked_ns(self, index: int) -> int:
        acceptors = self.connections.acceptors if self.connections else []
        if index < len(acceptors):
            return acceptors[index].blocked_ns()
        return self.block.words[self.block.parent_cell("acceptor_blocked_ns", index)]

    def limit_view(self) -> dict:
        return self.connections.limit_view()

    def quota_sensors(self) -> QuotaSensors | None:
        """The parent's read-only view of the quota sensors (it never claims one)."""
        if self.connections is None:
            return None
        if self._quota_sensors is None:
            props = self.config.props
            self._quota_sensors = QuotaSensors(self.block, -1, props.quota_window_size_seconds,
                                               props.quota_window_num,
                                               props.pybroker_quota_burst_windows,
                                               props.num_network_threads)
        return self._quota_sensors

    def quota_rates(self, top: int = 10) -> list[tuple[str, str, float]]:
        """(quota, entity, rate) of the busiest named entities, per quota type."""
        if self.quota_sensors() is None:
            return []
        found = []
        for quota_index, quota in enumerate(QUOTA_KEYS):
            named = [key for key, values in self.connections.dynamic.stored.client_quotas.items()
                     if quota in values and DEFAULT not in key]
            unit = 1_000_000 if quota == "request_percentage" else 1  # see workers.quotas.UNITS
            rates = []
            for key in named:
                entity = self._quota_sensors.find(key)
                if entity is not None:
                    rates.append((self._quota_sensors.measure(quota_index, entity)[0] / unit, key))
            found += [(quota, key, rate) for rate, key in sorted(rates, reverse=True)[:top]]
        return found

    def pool_view(self) -> dict | None:
        if self.pool is None:
            return None
        return {"used": self.pool.used(), "limit": self.pool.limit,
                "depleted_ns": self.pool.depleted_ns()}

    def worker_states(self):
        return [(worker.name, bool(worker.pid and worker.ready)) for worker in self.workers]

    def worker_slots(self):
        """(slot, name, plane) of each running worker."""
        return [(worker.slot, worker.name, "control" if worker.control_plane else "data")
                for worker in self.workers if worker.pid]

    def queue_capacity(self) -> dict[str, int]:
        """Capacity of each plane's request queue (requests read and not yet answered)."""
        props = self.config.props
        capacity = {"data": props.queued_max_requests}
        if self.config.control_plane_listener is not None:
            capacity["control"] = props.pybroker_control_plane_queue_size
        return capacity
