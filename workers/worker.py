"""A worker process: receives sockets from the parent, registers them, serves their requests.

Event-loop turn, as Kafka's Processor has it:
  1. the hand-off socket is drained into `_incoming` (the parent never hands more than
     `pybroker.handoff.queue.size` unregistered sockets to one worker);
  2. at most `pybroker.registrations.per.turn` of them are registered; the rest wait for the
     next turn, so a storm of new connections cannot starve the existing ones;
  3. each registration is acknowledged to the parent (one `Progress` message per turn,
     with the ids of closed connections), which returns the hand-off credit;
  4. connections serve their reads (workers.connection).
A one-second timer refreshes the heartbeat in the shared block and closes idle connections.
With the memory pool on, connections that wait for memory are resumed in grant order when the
pool wakes this worker (broker.pool); `queued.max.requests` is enforced per worker share.

On Shutdown (or when the parent goes away) the worker stops registering, closes connections as
soon as they owe no answer, and exits when none is left or the deadline passes.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import select
import socket
import time

import msgspec

from broker import ipc
from broker.admin import ALTERING_APIS, refuse_change
from broker.events import EventLog
from broker.log.manager import log_settings
from broker.log.topics import Epoch, TopicRegistry
from broker.pool import SharedPool, wake_address
from broker.protocol import guard
from broker.quotas import REQUEST, QuotaSensors
from shm.block import (CLOSE_REASONS, DURATION_BOUNDS_NS, INVALID_REASONS, MUTE_REASONS,
                       STATE_DRAINING, STATE_SERVING, SharedBlock, duration_bucket)
from workers.apis import Services, build_apis
from workers.apis.fetch import FetchWaits
from workers.connection import Connection, PooledConnection, client_id_of
from workers.events import WorkerEvents
from workers.handlers import BrokerView, Router
from workers.quotas import (UNITS, ClientQuotas, Throttled, throttle_applies_client_side,
                            with_throttle)

log = logging.getLogger("workers.worker")

SCRATCH_BYTES = 256 * 1024
# An incomplete frame above this is read into a growing buffer of its own; below it, bytes
# accumulate with the next read's (a frame dripped a byte at a time then costs at most
# LARGE_FRAME_BYTES**2 / 2 bytes of copying: 8 MB, not 2 GB as at 64 KiB).
LARGE_FRAME_BYTES = 4 * 1024
TICK_SECONDS = 1.0
_HUNG_UP = select.POLLRDHUP | select.POLLHUP | select.POLLERR
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
        self._requests = [block.worker_cell(slot, "requests", i, 0) for i in listeners]
        self._buckets = [block.worker_cell(slot, "request_duration_bucket", i, 0, 0)
                         for i in listeners]
        self._duration = [block.worker_cell(slot, "request_duration_ns", i, 0) for i in listeners]
        self._cpu_ns = block.worker_cell(slot, "cpu_ns")
        self._idle_ppm = block.worker_cell(slot, "idle_ppm")
        self._last_tick = (time.monotonic_ns(), *_cpu_and_wait_ns())
        self._invalid = {reason: block.worker_cell(slot, "invalid_requests", n)
                         for n, reason in enumerate(INVALID_REASONS)}
        self._delayed_fetches = block.worker_cell(slot, "delayed_fetches")
        self._queued_requests = block.worker_cell(slot, "queued_requests")
        self._quota_untracked = block.worker_cell(slot, "quota_untracked")
        self._muted = {reason: block.worker_cell(slot, "muted_channels", n)
                       for n, reason in enumerate(MUTE_REASONS)}
        self._throttle_ns = block.worker_cell(slot, "throttle_ns", 0)
        self._throttle_buckets = block.worker_cell(slot, "throttle_bucket", 0, 0)

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

    def quota_untracked(self) -> None:
        self.words[self._quota_untracked] += 1

    def muted(self, reason: str, change: int) -> None:
        self.words[self._muted[reason]] += change

    def throttled(self, quota: int, seconds: float) -> None:
        nanoseconds = int(seconds * 1e9)
        words = self.words
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

    def requests(self, listener: int, api_keys: list[int], elapsed_ns: int) -> None:
        """Count requests that were all received in one read and answered `elapsed_ns` later."""
        words, requests = self.words, self._requests[listener]
        buckets = self._buckets[listener] + duration_bucket(elapsed_ns)
        duration = self._duration[listener]
        # A pipelined read usually holds one API many times: count per distinct key.
        for api_key in (set(api_keys) if len(api_keys) > 1 else api_keys):
            count = api_keys.count(api_key) if len(api_keys) > 1 else 1
            if 0 <= api_key < 128:
                words[requests + api_key] += count
                words[buckets + api_key * _BUCKETS] += count
                words[duration + api_key] += elapsed_ns * count


class Worker:
    """Owns the event loop's connections and the hand-off socket of one worker process."""

    def __init__(self, boot: ipc.Boot, channel: ipc.Channel, block: SharedBlock):
        config = boot.config
        self.boot = boot
        self.slot = boot.slot
        self.name = boot.name
        self.channel = channel
        self.block = block
        self.stats = WorkerStats(block, boot.slot)
        advertised = {item.name: (item.host, item.port) for item in config.advertised}
        view = BrokerView(node_id=config.node_id, cluster_id=boot.cluster_id,
                          advertised=tuple(advertised.get(item.name) for item in config.listeners))
        epoch = Epoch(block.words, block.parent_cell("metadata_epoch"))
        self.registry = TopicRegistry(config.log_dirs, log_settings(config), epoch)
        self.services = Services(view=view, props=config.props, registry=self.registry,
                                 may_alter=config.may_alter)
        self.events = self._event_log(boot)
        props = config.props
        self.control_plane = boot.control_plane
        if not self.control_plane:  # the control plane is exempt from client quotas
            sensors = QuotaSensors(block, boot.slot, props.quota_window_size_seconds,
                                   props.quota_window_num, props.pybroker_quota_burst_windows,
                                   props.num_network_threads)
            self.services.quotas = ClientQuotas(props, sensors, self.stats, self.events)
        guard.limits.max_entries = props.pybroker_request_max_entries
        self.router = Router(build_apis(self.services, self.control_plane), self.services.quotas)
        self.max_request_bytes = config.props.socket_request_max_bytes
        self.pool: SharedPool | None = None
        if config.props.queued_max_request_bytes > 0:
            self.pool = SharedPool(block, boot.slot, config.props.queued_max_request_bytes,
                                   config.pool_reserved_by_index())
        self._connection_class = PooledConnection if self.pool is not None else Connection
        self._memory_waiters: dict[int, collections.deque] = {
            index: collections.deque() for index in range(len(config.listeners))}
        self._grants_seen = [0] * len(config.listeners)
        self._wake_socket: socket.socket | None = None
        # queued.max.requests is broker-wide: each data worker takes an even share of it.
        # The control plane has a queue of its own (KIP-291's capacity 20).
        workers = config.props.num_network_threads
        self._queue_share = max(1, -(-config.props.queued_max_requests // workers))
        if self.control_plane:
            self._queue_share = config.props.pybroker_control_plane_queue_size
        # Requests read whose answer waits for the parent (queued.max.requests counts them).
        # Long polls, rebalance waits and delayed throttles wait in a purgatory instead, as in
        # Kafka: they never stop this worker from reading other clients' requests.
        self.in_flight = 0
        self._queue_waiters: collections.deque = collections.deque()
        self.large_frame_bytes = LARGE_FRAME_BYTES
        self.scratch = memoryview(bytearray(SCRATCH_BYTES))
        self.connections: set[Connection] = set()
        self.by_id: dict[int, Connection] = {}
        self._closed_ids: list[int] = []
        self._admin_ids = 0
        self._admin_waiting: dict[int, tuple] = {}  # id -> (future, api key, version, client)
        self._per_turn = config.props.pybroker_registrations_per_turn
        self._idle_seconds = config.props.connections_max_idle_ms / 1000
        self.receive_timeout = config.props.pybroker_request_receive_timeout_ms / 1000
        self.shutdown_seconds = config.props.pybroker_shutdown_timeout_ms / 1000
        self._send_buffer = config.props.socket_send_buffer_bytes
        self._families = [item.family() for item in config.listeners]
        self._incoming: collections.deque = collections.deque()
        self._registering = False
        self._credits_to_return = 0
        self._ack_scheduled = False
        self._draining = False
        self._deadline = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Future | None = None

    # --- life cycle -----------------------------------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    async def serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopped = self._loop.create_future()
        self.services.waits = FetchWaits(self._loop, self.stats.delayed_fetches)
        self.channel.attach(self._loop)
        self.channel.on_broken = self._parent_gone
        self._loop.add_reader(self.channel.fileno(), self._on_channel)
        self._pin()
        if self.pool is not None:
            self._wake_socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._wake_socket.bind(wake_address(self.block, self.slot))
            self._wake_socket.setblocking(False)
            self._loop.add_reader(self._wake_socket.fileno(), self._on_wake)
        self.block.set_state(self.slot, STATE_SERVING)
        self.block.beat(self.slot)
        self.channel.send(ipc.Ready(pid=os.getpid()))
        self._loop.call_later(TICK_SECONDS, self._tick)
        if self.events is not None:
            self._events_tick()
        log.info("worker %s serving (pid %d)", self.name, os.getpid())
        await self._stopped

    @staticmethod
    def _event_log(boot: ipc.Boot) -> WorkerEvents | None:
        config = boot.config
        if config.event_log_dir is None:
            return None
        from workers.apis import api_names

        props = config.props
        log_file = EventLog(config.event_log_dir, boot.name, config.node_id,
                            props.pybroker_event_log_file_bytes,
                            props.pybroker_event_log_total_bytes)
        control = config.control_plane_index()
        return WorkerEvents(log_file, [item.name for item in config.listeners],
                            ["control" if i == control else "data"
                             for i in range(len(config.listeners))],
                            api_names(), props.pybroker_event_log_slow_request_ms)

    def _events_tick(self, boundary: int = 0) -> None:
        """On every wall-clock second: write the second that just ended (the one before the
        boundary this call was scheduled for, even if it runs late)."""
        if self.events is not None and boundary:
            self.events.tick(boundary - 1)
        now = time.time()
        following = int(now) + 1
        self._loop.call_later(following - now, self._events_tick, following)

    def _pin(self) -> None:
        cpu = self.boot.config.props.pybroker_control_plane_cpu
        if self.control_plane and cpu is not None:
            try:
                os.sched_setaffinity(0, {cpu})
            except OSError as error:  # the CPU set changed since start-up: serve unpinned
                log.error("worker %s cannot be pinned to CPU %d: %s", self.name, cpu, error)
                return
            log.info("worker %s pinned to CPU %d", self.name, cpu)

    def begin_shutdown(self, deadline_seconds: float) -> None:
        """Stop taking connections; close each one once nothing is in flight."""
        if self._draining:
            return
        self._draining = True
        self._deadline = time.monotonic() + deadline_seconds
        self.block.set_state(self.slot, STATE_DRAINING)
        for fd, meta in self._incoming:
            os.close(fd)
            self._dropped(meta, "shutdown")
        self._incoming.clear()
        self._schedule_ack()
        self._drain_step()

    def _drain_step(self) -> None:
        # Only answers owed are waited for: a connection throttled, waiting for memory or
        # half-way through a request has nothing acknowledged to lose and closes at once.
        past_deadline = time.monotonic() >= self._deadline
        for conn in list(self.connections):
            if past_deadline or not conn.owes_answer():
                conn.close("shutdown")
                if past_deadline and conn.transport is not None:
                    conn.transport.abort()
        if not self.connections or past_deadline:
            self._loop.call_later(0.01 if self.connections else 0, self._finish)
        else:
            self._loop.call_later(0.02, self._drain_step)

    def _finish(self) -> None:
        if self.events is not None:
            self.events.close()
        if not self._stopped.done():
            self._stopped.set_result(None)

    def _tick(self) -> None:
        self.block.beat(self.slot)
        self.stats.tick()
        now = time.monotonic()
        if self._idle_seconds >= 0 and not self._draining:
            cutoff = now - self._idle_seconds
            for conn in [c for c in self.connections if c.last_active < cutoff and c.is_idle()]:
                log.debug("closing idle connection %s from %s", conn.conn_id, conn.peer)
                conn.close("idle")
        for conn in [c for c in self.connections if c.receive_overdue(now)]:
            log.info("connection %s from %s: a request still incomplete after %d ms; closing",
                     conn.conn_id, conn.peer, self.receive_timeout * 1000)
            conn.close("receive_timeout")
        self._close_hung_up()
        if self.pool is not None:
            self._take_grants()  # a wake-up lost (its sender died) delays a grant, no more
        self._loop.call_later(TICK_SECONDS, self._tick)

    def _close_hung_up(self) -> None:
        """Connections whose reading is paused (muted, parked, throttled, waiting for memory
        or queue room) never see their peer go: ask the kernel which peers hung up."""
        paused = {conn.fd: conn for conn in self.connections
                  if not conn.reading and not conn.closing and conn.fd >= 0}
        if not paused:
            return
        poller = select.poll()
        for fd in paused:
            poller.register(fd, _HUNG_UP)
        for fd, _events in poller.poll(0):
            conn = paused[fd]
            log.debug("connection %s from %s: the peer hung up while paused", conn.conn_id,
                      conn.peer)
            conn.close("client")

    # --- hand-off -------------------------------------------------------------------------

    def _on_channel(self) -> None:
        while True:
            try:
                message, fds = self.channel.receive()
            except BlockingIOError:
                break
            except (EOFError, OSError, ValueError, msgspec.DecodeError) as error:
                self._parent_gone(error)
                return
            if isinstance(message, ipc.Handoff):
                self._accept_handoff(message, fds)
            elif isinstance(message, ipc.Close):
                self._close_ids(message.conn_ids, message.reason)
            elif isinstance(message, ipc.EvictQuery):
                self._answer_evict_query(message)
            elif isinstance(message, ipc.AdminResponse):
                self._admin_answered(message)
            elif isinstance(message, ipc.Quotas):
                if self.services.quotas is not None:
                    self.services.quotas.update(message.entries)
            elif isinstance(message, ipc.Shutdown):
                self.begin_shutdown(message.deadline_ms / 1000)
            else:
                log.error("worker %s: unexpected message %r", self.name, message)
                for fd in fds:
                    os.close(fd)

    def _parent_gone(self, error: BaseException) -> None:
        """The channel to the parent broke: nothing can be forwarded or acknowledged any
        more, so the worker drains and exits (the parent, if alive, restarts it)."""
        if self.channel.closed and self.channel.sock.fileno() < 0:
            return
        log.warning("worker %s: channel to the parent failed (%s); shutting down", self.name,
                    error or "closed")
        self._loop.remove_reader(self.channel.fileno())
        self.channel.close()
        for future, *_ in self._admin_waiting.values():  # their clients must not wait forever
            if not future.done():
                future.set_exception(ConnectionError("the parent is gone"))
        self._admin_waiting.clear()
        self.begin_shutdown(1.0)

    def _accept_handoff(self, message: ipc.Handoff, fds: list[int]) -> None:
        if len(fds) != len(message.conns):
            log.error("hand-off carried %d fds for %d connections", len(fds), len(message.conns))
        for fd, meta in zip(fds, message.conns):
            if self._draining:
                os.close(fd)
                self._dropped(meta, "shutdown")
            else:
                self._incoming.append((fd, meta))
        for fd in fds[len(message.conns):]:
            os.close(fd)
        for meta in message.conns[len(fds):]:  # announced but no fd arrived: count it closed
            self._dropped(meta, "error")
        self._schedule_ack()
        if self._incoming and not self._registering:
            self._registering = True
            self._loop.call_soon(self._register_some)

    def _register_some(self) -> None:
        """Register at most `_per_turn` connections, then yield to existing connections."""
        for _ in range(min(self._per_turn, len(self._incoming))):
            fd, meta = self._incoming.popleft()
            self._register(fd, meta)
        if self._incoming:
            self._loop.call_soon(self._register_some)
        else:
            self._registering = False

    def _register(self, fd: int, meta: tuple[int, int, str, int]) -> None:
        conn_id, listener, host, port = meta
        # Naming the family and type spares three getsockopt calls per socket.
        sock = socket.socket(self._families[listener], socket.SOCK_STREAM, 0, fileno=fd)
        try:
            # As Kafka's acceptor; uvloop itself sets TCP_NODELAY on the transport.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            if self._send_buffer > 0:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._send_buffer)
        except OSError as error:
            log.info("connection %s from %s:%s failed before registration: %s",
                     conn_id, host, port, error)
            sock.close()
            self._dropped(meta, "error")
            self._schedule_ack()
            return
        connection = self._connection_class(self, conn_id, listener, f"{host}:{port}")
        task = self._loop.create_task(
            self._loop.connect_accepted_socket(lambda: connection, sock))
        task.add_done_callback(lambda done: self._registration_done(done, connection, sock))

    def _registration_done(self, task: asyncio.Task, connection: Connection, sock) -> None:
        if task.cancelled() or task.exception() is not None:
            log.info("registering connection %s failed: %r", connection.conn_id,
                     None if task.cancelled() else task.exception())
            sock.close()
            self._dropped((connection.conn_id, connection.listener_index), "error")
            self._schedule_ack()

    def _dropped(self, meta: tuple, reason: str) -> None:
        """A handed-off socket that never became a connection: return its credit and slot."""
        self.stats.closed(meta[1], reason)
        self._credits_to_return += 1
        self._closed_ids.append(meta[0])

    def _schedule_ack(self) -> None:
        if not self._ack_scheduled:
            self._ack_scheduled = True
            self._loop.call_soon(self._send_ack)

    def _send_ack(self) -> None:
        """One Progress message per loop turn: credits and closed ids, batched."""
        self._ack_scheduled = False
        if not self._credits_to_return and not self._closed_ids:
            return
        try:
            self.channel.send(ipc.Progress(registered=self._credits_to_return,
                                           closed=self._closed_ids))
        except OSError:
            pass  # the parent is gone; _parent_gone shuts the worker down
        self._credits_to_return = 0
        self._closed_ids = []

    # --- called by connections ------------------------------------------------------------

    def connection_registered(self, conn: Connection) -> None:
        self.connections.add(conn)
        self.by_id[conn.conn_id] = conn
        self.stats.registered(conn.listener_index)
        self._credits_to_return += 1
        self._schedule_ack()
        if self._draining:
            conn.close("shutdown")

    def connection_closed(self, conn: Connection, reason: str) -> None:
        self.connections.discard(conn)
        self.by_id.pop(conn.conn_id, None)
        self._closed_ids.append(conn.conn_id)  # first: the parent's slot accounting
        self._schedule_ack()
        self.stats.closed(conn.listener_index, reason)
        if self.events is not None:
            self.events.connection_closed(conn, reason, time.monotonic() - conn.opened_at)

    # --- queued.max.requests ----------------------------------------------------------------

    def queue_full(self) -> bool:
        return self.in_flight >= self._queue_share

    def wait_for_queue(self, conn) -> None:
        self._queue_waiters.append(conn)
        self.stats.muted("queue", +1)

    def request_parked(self, queued: bool) -> None:
        """A request whose answer waits; `queued` if it counts against queued.max.requests."""
        self.stats.muted("in_flight", +1)
        if queued:
            self.in_flight += 1
            self.stats.queued_requests(self.in_flight)

    def request_done(self, queued: bool) -> None:
        self.stats.muted("in_flight", -1)
        if not queued:
            return
        self.in_flight -= 1
        self.stats.queued_requests(self.in_flight)
        while self._queue_waiters and not self.queue_full():
            conn = self._queue_waiters.popleft()
            self.stats.muted("queue", -1)
            conn.queue_resumed()

    # --- memory pool ----------------------------------------------------------------------

    def wait_for_memory(self, conn) -> None:
        """A connection read a size the pool could not give yet: it waits in grant order."""
        self._memory_waiters[conn.listener_index].append(conn)
        self.stats.muted("memory", +1)
        if self.events is not None:
            self.events.memory_muted(+1)
        self._take_grants()  # a grant may have landed between the refusal and now

    def release_memory(self, size: int, listener: int) -> None:
        self.pool.release(size, listener)
        self._take_grants()  # the release may have granted our own waiters

    def _on_wake(self) -> None:
        try:
            while self._wake_socket.recv(64):
                pass
        except BlockingIOError:
            pass
        self._take_grants()

    def _take_grants(self) -> None:
        """Hand granted memory to our waiting connections, in the order they queued."""
        for listener, waiters in self._memory_waiters.items():
            granted = self.pool.grants(listener)
            while self._grants_seen[listener] < granted and waiters:
                self._grants_seen[listener] += 1
                conn = waiters.popleft()
                self.stats.muted("memory", -1)
                if self.events is not None:
                    self.events.memory_muted(-1)
                if conn.closing:  # it went away while queued: the bytes go straight back
                    self.pool.release(conn.memory_wait, listener)
                    conn.memory_wait = 0
                else:
                    conn.memory_granted()

    # --- orders from the parent -----------------------------------------------------------

    def _close_ids(self, conn_ids: list[int], reason: str) -> None:
        for conn_id in conn_ids:
            conn = self.by_id.get(conn_id)
            if conn is not None:
                conn.close(reason)

    def _answer_evict_query(self, query: ipc.EvictQuery) -> None:
        """The least recently active connections of the listeners the parent may evict."""
        allowed = set(query.listeners)
        candidates = sorted((c for c in self.connections
                             if c.listener_index in allowed and not c.closing),
                            key=lambda c: c.last_active)[:query.count]
        reply = ipc.EvictCandidates(round=query.round, candidates=[
            (c.conn_id, int(c.last_active * 1e9)) for c in candidates])
        try:
            self.channel.send(reply)
        except OSError:
            pass  # the parent finishes the round without us

    def forward_admin(self, request, listener: int, peer: str) -> asyncio.Future:
        """Send a config or quota request to the parent, which owns configuration."""
        future = self._loop.create_future()
        api_key = request[1] | request[0] << 8
        if api_key in ALTERING_APIS and not self.services.may_alter(listener):
            future.set_result(refuse_change(request, listener))  # no trip to the parent
            return future
        self._admin_ids += 1
        self._admin_waiting[self._admin_ids] = (future, api_key, request[3] | request[2] << 8,
                                                client_id_of(request))
        try:
            self.channel.send(ipc.AdminRequest(
                request_id=self._admin_ids, listener=listener, peer=peer, frame=bytes(request)))
        except OSError as error:
            self._admin_waiting.pop(self._admin_ids, None)
            if not future.done():  # _parent_gone may have failed it already
                future.set_exception(error)
        return future

    def _admin_answered(self, message: ipc.AdminResponse) -> None:
        waiting = self._admin_waiting.pop(message.request_id, None)
        if waiting is None or waiting[0].done():
            return
        future, api_key, version, client_id = waiting
        if message.frame is None:
            future.set_exception(RuntimeError("the parent refused the request"))
            return
        quotas = self.services.quotas
        seconds = 0.0
        if quotas is not None and quotas.active():  # the parent's time, as if spent here
            seconds = quotas.record(REQUEST, client_id,
                                    message.busy_ns / 1e9 * 100 * UNITS[REQUEST])
        if seconds <= 0:
            future.set_result(message.frame)
            return
        # A client over its request quota: group and config answers are throttled too.
        ms = max(1, int(seconds * 1000))
        future.set_result(Throttled(with_throttle(message.frame, api_key, version, ms), ms,
                                    delay=not throttle_applies_client_side(api_key, version)))

    def requests_served(self, conn: Connection, api_keys: list[int], received_at: float,
                        parked: bool = False) -> None:
        elapsed = int((time.monotonic() - received_at) * 1e9)
        self.stats.requests(conn.listener_index, api_keys, elapsed)
        if self.events is not None:
            self.events.requests(conn, api_keys, elapsed, parked)

    def invalid_request(self, reason: str) -> None:
        self.stats.invalid(reason)
