"""The supervisor of the worker processes: spawn, reap, restart, heartbeat watch, signals,
graceful shutdown.  What the parent serves beside that (listeners, acceptors, admission, the
admin and group services, /metrics, the event ticker) is wired in broker.parent.services.

    parent (one uvloop)
      Supervisor (this module) -- spawns with posix_spawn, one SOCK_SEQPACKET channel each -->
          worker data-0 .. data-N-1, control-plane   (python -m workers)
      ParentServices (broker.parent.services): acceptors hand accepted fds to the workers

Signal handlers only queue the signal and wake the main loop, which dispatches
`handle_<name>()` (gunicorn's arbiter does the same).  uvloop keeps SIGCHLD for itself, so a
pidfd per worker tells the loop when a child exits.  A worker that dies is reaped with
`waitpid(-1, WNOHANG)`, its cause logged, what it held returned (connection slots counted
closed, pool memory, its counters folded into the archive), and it is restarted (with a
back-off if it keeps dying young, or if it cannot be spawned).  A worker that exits with
WORKER_BOOT_ERROR before it was ever ready halts the broker instead of crash-looping.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import signal
import socket
import sys
import time

import msgspec

from broker.parent.acceptor import bind_listeners
from broker.parent.runtime import Runtime
from broker.parent.services import ParentServices
from broker.parent.worker_process import WorkerProcess
from broker.shared import events, ipc
from broker.shared.config import BrokerConfig, ConfigError, load_config
from broker.shared.constants import WORKER_BOOT_ERROR
from broker.shared.gc_tuning import tune_after_start

log = logging.getLogger("broker.parent.supervisor")

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
        self.workers = [WorkerProcess(slot=i, name=f"data-{i}",
                                      handed=[0] * len(config.listeners))
                        for i in range(config.props.num_network_threads)]
        if config.control_plane_listener is not None:
            # KIP-291: one more worker, in the slot after the data workers, for one listener.
            self.workers.append(WorkerProcess(slot=len(self.workers), name="control-plane",
                                              control_plane=True,
                                              handed=[0] * len(config.listeners)))
        self.services: ParentServices | None = None
        self._signals: collections.deque = collections.deque()
        self._wakeup: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._force = False
        self._exit_code = 0
        self._backoff: dict[int, float] = {}

    # --- entry point ----------------------------------------------------------------------

    async def run(self) -> int:
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        for signum in SIGNALS:
            self._loop.add_signal_handler(signum, self._queue_signal, signum)
        sockets = bind_listeners(self.config)
        self.config = self.config.with_bound_ports(
            {listener.name: sock.getsockname()[1]
             for listener, sock in zip(self.config.listeners, sockets)})
        self.services = services = ParentServices(self._loop, self.config, self.runtime,
                                                  self.workers)
        try:
            services.recover()
            for worker in self.workers:
                self._spawn(worker)
            if await self._wait_until_ready():
                services.start(sockets)
                if services.directory is not None:  # front-end mode: ready once it sees the cluster
                    await services.directory.first_view(
                        self.config.props.pybroker_upstream_connect_timeout_ms / 1000)
                tune_after_start()
                log.info("broker ready node.id=%d workers=%d pid=%d", self.config.node_id,
                         len(self.workers), os.getpid())
                await self._main_loop()
            await self._shutdown()
            services.finish()
        finally:
            for sock in sockets:
                sock.close()
            services.close()
        return self._exit_code

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
            self.services.ledger.quotas.expire_rate_sensors(time.monotonic())

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
        self.services.reload(fresh)

    def _request_stop(self) -> None:
        if self._stopping:
            log.warning("second stop signal: killing workers now")
            self._force = True
        self._stopping = True

    # --- workers --------------------------------------------------------------------------

    def _spawn(self, worker: WorkerProcess) -> None:
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
        block = self.services.block
        block.claim_slot(worker.slot, pid)
        channel = ipc.Channel(parent_end, self._loop,
                              on_broken=lambda error: self._channel_broken(worker, channel, error))
        worker.pid, worker.channel, worker.ready = pid, channel, False
        worker.started_at, worker.abort_sent_at, worker.outstanding = time.monotonic(), 0.0, 0
        worker.handed = [0] * len(self.config.listeners)
        boot = ipc.Boot(config=self.config, slot=worker.slot, shm_path=block.path,
                        cluster_id=self.runtime.cluster_id, name=worker.name,
                        control_plane=worker.control_plane)
        channel.send(boot)
        self.services.worker_started(worker)
        self._loop.add_reader(channel.fileno(), self._on_worker_message, worker)
        worker.pidfd = pidfd
        self._loop.add_reader(worker.pidfd, self._reap)
        log.info("spawned worker %s pid=%d", worker.name, pid)
        if self.services.events is not None:
            self.services.events.emit(events.WorkerStarted(worker=worker.name, pid=pid,
                                                           plane=worker.plane))

    def _on_worker_message(self, worker: WorkerProcess) -> None:
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
            if isinstance(message, ipc.Ready):
                worker.ready = True
                self.services.ledger.wake_acceptors()
            elif not self.services.on_message(worker, message):
                log.error("unexpected message from %s: %r", worker.name, message)

    def _channel_broken(self, worker: WorkerProcess, channel: ipc.Channel, error) -> None:
        """The worker's end stopped reading or went away: it is treated as exiting (its
        heartbeat watch or SIGCHLD finishes the job)."""
        if worker.channel is channel:
            log.error("channel of %s broke: %s", worker.name, error)
            self._detach_channel(worker)

    def _detach_channel(self, worker: WorkerProcess) -> None:
        if worker.channel is not None:
            channel, worker.channel = worker.channel, None
            self._loop.remove_reader(channel.fileno())
            channel.close()
        worker.ready = False

    def _close_pidfd(self, worker: WorkerProcess) -> None:
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

    def _worker_exited(self, worker: WorkerProcess, status: int) -> None:
        was_ready, lived = worker.ready, time.monotonic() - worker.started_at
        self._log_exit(worker, status)
        if self.services.events is not None:
            code = os.waitstatus_to_exitcode(status)
            cause = f"exit {code}" if code >= 0 else f"signal {signal.Signals(-code).name}"
            self.services.events.emit(events.WorkerExited(
                worker=worker.name, pid=worker.pid, cause=cause, lived_ms=int(lived * 1000)))
        self._detach_channel(worker)
        self._close_pidfd(worker)
        self.services.worker_gone(worker)
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
        self._count("worker_restarts")
        self._loop.call_later(delay, self._respawn, worker)

    def _respawn(self, worker: WorkerProcess) -> None:
        """Start the worker again; if the process cannot be spawned (EMFILE, ENOMEM, ...),
        try again with a doubling back-off rather than leave its slot empty for good."""
        if self._stopping or worker.pid != 0:
            return
        try:
            self._spawn(worker)
        except OSError as error:
            delay = min(MAX_BACKOFF, self._backoff.get(worker.slot, 0.05) * 2)
            self._backoff[worker.slot] = delay
            self._count("worker_spawn_failures")
            log.error("worker %s could not be spawned: %s; trying again in %.1fs", worker.name,
                      error, delay)
            self._loop.call_later(delay, self._respawn, worker)

    def _log_exit(self, worker: WorkerProcess, status: int) -> None:
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

    def _count(self, cell: str) -> None:
        block = self.services.block
        with self.services.metrics_lock:
            block.words[block.parent_cell(cell)] += 1

    def _check_heartbeats(self) -> None:
        timeout = self.config.props.pybroker_worker_heartbeat_timeout_ms / 1000
        now = time.monotonic()
        for worker in self.workers:
            if not worker.pid or not worker.ready:
                continue
            age = (time.monotonic_ns() - self.services.block.slot_heartbeat(worker.slot)) / 1e9
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
    def _signal(worker: WorkerProcess, signum: int) -> None:
        try:
            os.kill(worker.pid, signum)
        except ProcessLookupError:
            pass

    # --- shutdown -------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        """Stop accepting, let workers finish in-flight requests, then kill what remains."""
        # 1. No new connections: close every listening socket (and held throttled sockets);
        #    group requests waiting for a rebalance are answered now.
        self.services.stop_accepting()
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
