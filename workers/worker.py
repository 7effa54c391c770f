"""A worker process: receives sockets from the parent, registers them, serves their requests.

Event-loop turn, as Kafka's Processor has it:
  1. the next message of the channel to the parent is read: a hand-off goes to the intake
     (workers.intake; the parent never hands more than `pybroker.handoff.queue.size`
     unregistered sockets to one worker);
  2. at most `pybroker.registrations.per.turn` sockets are registered; the rest wait for the
     next turn, so a storm of new connections cannot starve the existing ones;
  3. registrations are acknowledged to the parent (`Progress` messages, batched within a
     millisecond, with the ids of closed connections), which returns the hand-off credit;
  4. connections serve their reads (workers.connection), with this worker as their host.
A one-second timer refreshes the heartbeat in the shared block and sweeps the connections once
(idle, session expiry, receive timeout, send stall, peers gone while not read).
With the memory pool on, connections that wait for memory are resumed in grant order when the
pool wakes this worker; `queued.max.requests` is enforced per worker share (both in
workers.backpressure).

On Shutdown (or when the parent goes away) the worker stops registering, closes connections as
soon as they owe no answer, and exits when none is left or the deadline passes.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import select
import time
from time import monotonic as _monotonic
from typing import Callable

import msgspec

from broker.shared import ipc
from broker.shared.access import Access
from broker.shared.apis import API_NAMES, QUEUED_WHILE_FORWARDED
from broker.shared.client_quotas import QuotaSensors
from broker.shared.config import BrokerConfig
from broker.shared.events import EventLog, SecondTicker
from broker.shared.log.settings import log_settings
from broker.shared.log.topics import Epoch, TopicRegistry
from broker.shared.pool import SharedPool, wake_address
from broker.shared.protocol import guard
from broker.shared.tls import TlsConfigError, server_context
from broker.shared.upstream_security import UpstreamSecurity
from shm.block import STATE_DRAINING, STATE_SERVING, SharedBlock
from workers.apis import Services, build_apis
from workers.apis.authentication import SaslAuthenticate, SaslHandshake
from workers.apis.fetch import FetchWaits
from workers.apis.upstream import FrontEnd, FrontEndApiVersions, build_front_end_apis
from workers.authenticator import Authenticator
from workers.backpressure import MemoryWaiters, RequestQueue
from workers.connection import Connection
from workers.fetch_response import REGION_BUDGET
from workers.fetch_sessions import FetchSessionCache
from workers.forwarding import Forwarder
from workers.frame_maps import FrameMaps
from workers.framing import MAPPED_FRAME_BYTES
from workers.intake import Intake
from workers.pooled_connection import PooledConnection
from workers.principals import Principals
from workers.router import BrokerView, Router
from workers.stats import WorkerStats
from workers.throttling import ClientQuotas
from workers.top_connections import top_connections
from workers.upstream import Upstream
from workers.worker_events import WorkerEvents

log = logging.getLogger("workers.worker")

SCRATCH_BYTES = 256 * 1024
# An incomplete frame above this is read into a buffer of its own; below it, bytes
# accumulate with the next read's (a frame dripped a byte at a time then costs at most
# LARGE_FRAME_BYTES**2 / 2 bytes of copying: 8 MB, not 2 GB as at 64 KiB).
LARGE_FRAME_BYTES = 4 * 1024
TICK_SECONDS = 1.0
_HUNG_UP = select.POLLRDHUP | select.POLLHUP | select.POLLERR


class Worker:
    """Owns the event loop's connections and the hand-off socket of one worker process; the
    host (workers.connection.ConnectionHost) of every connection it serves."""

    def __init__(self, boot: ipc.Boot, channel: ipc.Channel, block: SharedBlock):
        config = boot.config
        props = config.props
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
        self.registry = TopicRegistry(config.log_dirs, log_settings(config), epoch, props)
        self.services = Services(view=view, props=props, registry=self.registry,
                                 may_alter=config.may_alter)
        self.events = self._event_log(boot)
        self.access = self.services.access = Access(
            config.authorizing(), config.super_users, props.allow_everyone_if_no_acl_found,
            self.stats.denied, self.events.log if self.events is not None else None,
            tuple(item.name for item in config.listeners), API_NAMES)
        self.control_plane = boot.control_plane
        if not self.control_plane:  # the control plane is exempt from client quotas
            sensors = QuotaSensors.of(block, boot.slot, props)
            self.services.quotas = ClientQuotas(props, sensors, self.stats, self.events)
        guard.limits.max_entries = props.pybroker_request_max_entries
        self.services.sessions = self._fetch_sessions(config, block, boot.slot)
        self.forwarder = Forwarder(channel, config.may_alter)
        self.front_end: FrontEnd | None = None  # front-end mode: the upstream cluster's APIs
        self._api_versions: FrontEndApiVersions | None = None
        if config.upstream and not boot.control_plane:  # the control plane stays the front-end's own
            self.front_end = FrontEnd(config.node_port, view.advertised,
                                      props.pybroker_frontend_node_ports_per_listener,
                                      props.pybroker_upstream_request_timeout_ms / 1000,
                                      props.pybroker_fetch_max_wait_ms)
            apis, self._api_versions = build_front_end_apis(
                self.front_end, [SaslHandshake(self.services), SaslAuthenticate(self.services)],
                config.authorizing())
            self.front_end.access = self.access
            self.router = Router(apis, self.services.quotas, None)
        else:
            self.router = Router(build_apis(self.services, self.control_plane,
                                            front_end=bool(config.upstream)),
                                 self.services.quotas, self.forwarder.forward)
        self.principals = Principals(config, channel, self.control_plane, self.router.handle,
                                     self.stats, self.events)
        # Who a connection is (ConnectionHost): the worker's Principals answer, called directly
        # (each connection asks twice as it is made).
        self.principal_of = self.principals.principal_of
        self.authenticator = self.principals.authenticator
        self.claim_user = self.principals.claim_user
        self.user_refused = self.principals.user_refused
        self.max_request_bytes = props.socket_request_max_bytes
        self.memory: MemoryWaiters | None = None
        if props.queued_max_request_bytes > 0:
            pool = SharedPool(block, boot.slot, props.queued_max_request_bytes,
                              config.pool_reserved_by_index())
            self.memory = MemoryWaiters(pool, len(config.listeners), self.stats, self.events)
        self.queue = RequestQueue(self._queue_capacity(config, self.control_plane), self.stats)
        self.queued_keys = QUEUED_WHILE_FORWARDED if self.front_end is None else frozenset()
        self.large_frame_bytes = LARGE_FRAME_BYTES
        keep = props.pybroker_request_buffer_keep_bytes
        self.frame_maps = FrameMaps(MAPPED_FRAME_BYTES, keep) if keep > 0 else None
        self.sasl_max_receive_bytes = props.sasl_server_max_receive_size
        self.scratch = memoryview(bytearray(SCRATCH_BYTES))
        self.connections: dict[int, Connection] = {}  # by conn id
        self._idle_seconds = props.connections_max_idle_ms / 1000
        self.receive_timeout = props.pybroker_request_receive_timeout_ms / 1000
        self.max_unsent_bytes = props.pybroker_connection_max_unsent_bytes
        self.send_stall_seconds = props.pybroker_connection_send_stall_ms / 1000
        self.shutdown_seconds = props.pybroker_shutdown_timeout_ms / 1000
        self._draining = False
        self._deadline = 0.0
        # Set by serve(), which runs before anything else can happen: they need the loop.
        self.loop: asyncio.AbstractEventLoop
        self.intake: Intake
        self._orders: dict[type, Callable[[object], None]] = {}
        self._stopped: asyncio.Future
        self._ticker: SecondTicker | None = None

    def _fetch_sessions(self, config: BrokerConfig, block, slot: int) -> FetchSessionCache:
        """This worker's fetch sessions: an even share of the broker-wide slots and partition
        budget for a data worker (the control plane borrows free slots only)."""
        props, workers = config.props, config.props.num_network_threads
        slots = props.max_incremental_fetch_session_cache_slots
        share = slots // workers + (slot < slots % workers) if slot < workers else 0
        stats = self.stats
        return FetchSessionCache(
            slots, share, slot, block.slots, props.pybroker_request_max_entries,
            props.pybroker_incremental_fetch_session_cache_partitions // workers,
            props.pybroker_incremental_fetch_session_eviction_ms,
            total=lambda: block.worker_total("fetch_sessions"), publish=stats.fetch_sessions)

    @staticmethod
    def _queue_capacity(config: BrokerConfig, control_plane: bool) -> int:
        """queued.max.requests is broker-wide: each data worker takes an even share of it.
        The control plane has a queue of its own (KIP-291's capacity 20)."""
        if control_plane:
            return config.props.pybroker_control_plane_queue_size
        return max(1, -(-config.props.queued_max_requests // config.props.num_network_threads))

    # --- life cycle -----------------------------------------------------------------------

    async def serve(self) -> None:
        self.loop = loop = asyncio.get_running_loop()
        self._stopped = loop.create_future()
        self.services.waits = waits = FetchWaits(loop, self.stats.delayed_fetches)
        self.services.appended = waits.appended
        self.intake = self._intake(loop)
        if self.front_end is not None:
            props = self.boot.config.props
            self.front_end.upstream = Upstream(
                loop, props.pybroker_upstream_max_connections_per_node,
                props.pybroker_upstream_connect_timeout_ms / 1000,
                props.pybroker_upstream_idle_ms / 1000, UpstreamSecurity.of(props))
        self._orders = self._parent_orders()
        self.channel.attach(loop)
        self.channel.on_broken = self._parent_gone
        loop.add_reader(self.channel.fileno(), self._on_channel)
        self._pin()
        if self.memory is not None:
            self.memory.listen(loop, wake_address(self.block, self.slot))
        self.block.set_state(self.slot, STATE_SERVING)
        self.block.beat(self.slot)
        self.channel.send(ipc.Ready(pid=os.getpid()))
        loop.call_later(TICK_SECONDS, self._tick)
        if self.events is not None:
            self._ticker = SecondTicker(loop, self._second)
            self._ticker.start()
        log.info("worker %s serving (pid %d)", self.name, os.getpid())
        await self._stopped

    def _second(self, second: int) -> None:
        """Once a wall-clock second: the second's denials and requests to the event log."""
        self.access.flush(second)
        self.events.tick(second)

    def _intake(self, loop: asyncio.AbstractEventLoop) -> Intake:
        config = self.boot.config
        connection_class = PooledConnection if self.memory is not None else Connection
        tls = self._tls_contexts(config.listener_tls)
        return Intake(loop, self.channel, self.stats,
                      new_connection=functools.partial(connection_class, self),
                      families=[item.family() for item in config.listeners],
                      per_turn=config.props.pybroker_registrations_per_turn, tls=tls,
                      handshake_timeout=config.props.pybroker_ssl_handshake_timeout_ms / 1000)

    def _tls_contexts(self, listener_tls) -> list:
        """By listener index: the SSL listeners' server contexts, None for the others."""
        return [None if (settings := listener_tls.get(item.name)) is None
                else server_context(settings) for item in self.boot.config.listeners]

    def _new_certificates(self, listener_tls) -> None:
        """A SIGHUP re-read the key stores: new handshakes use them, open connections keep
        their sessions.  Should they no longer load, the previous ones stay."""
        try:
            contexts = self._tls_contexts(listener_tls)
        except (TlsConfigError, OSError) as error:
            log.error("worker %s: keeping the previous certificates: %s", self.name, error)
            return
        self.intake.use_tls(contexts)
        log.info("worker %s: new certificates for %s", self.name, ", ".join(sorted(listener_tls)))

    @staticmethod
    def _event_log(boot: ipc.Boot) -> WorkerEvents | None:
        config = boot.config
        if config.event_log_dir is None:
            return None
        props = config.props
        log_file = EventLog(config.event_log_dir, boot.name, config.node_id,
                            props.pybroker_event_log_file_bytes,
                            props.pybroker_event_log_total_bytes)
        control = config.control_plane_index()
        return WorkerEvents(log_file, [item.name for item in config.listeners],
                            ["control" if i == control else "data"
                             for i in range(len(config.listeners))],
                            API_NAMES, props.pybroker_event_log_slow_request_ms)

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
        self.intake.stop()
        self._drain_step()

    def _drain_step(self) -> None:
        # Only answers owed are waited for: a connection throttled, waiting for memory or
        # half-way through a request has nothing acknowledged to lose and closes at once.
        past_deadline = time.monotonic() >= self._deadline
        for conn in list(self.connections.values()):
            if past_deadline or not conn.owes_answer():
                conn.close("shutdown")
                if past_deadline and conn.transport is not None:
                    conn.transport.abort()
        if not self.connections or past_deadline:
            self.loop.call_later(0.01 if self.connections else 0, self._finish)
        else:
            self.loop.call_later(0.02, self._drain_step)

    def _finish(self) -> None:
        if self.front_end is not None:
            self.front_end.upstream.close()
        if self._ticker is not None:
            self._ticker.stop()  # the event log's close() writes the last second
        if self.events is not None:
            self.events.close()
        if not self._stopped.done():
            self._stopped.set_result(None)

    def _tick(self) -> None:
        self.block.beat(self.slot)
        self.stats.tick()
        self.stats.descriptors(self.registry.files, REGION_BUDGET)
        self._sweep(time.monotonic())
        self.services.sessions.tick()
        if self.front_end is not None:
            self.front_end.upstream.close_idle()
            self.stats.upstream(*self.front_end.upstream.counts())
        if self.memory is not None:
            self.memory.take_grants()  # a wake-up lost (its sender died) delays a grant, no more
        self.loop.call_later(TICK_SECONDS, self._tick)

    def _sweep(self, now: float) -> None:
        """One pass over the connections, once a tick: close those idle past
        connections.max.idle.ms, past their SASL session (KIP-368), with a request incomplete
        past pybroker.request.receive.timeout.ms or answers not taken past
        pybroker.connection.send.stall.ms, in that order of precedence; then ask the kernel
        about the peers of those not being read (`_close_hung_up`)."""
        idle_before = (now - self._idle_seconds if self._idle_seconds >= 0 and not self._draining
                       else float("-inf"))
        due: list[tuple[Connection, str]] = []
        paused: dict[int, Connection] = {}
        for conn in self.connections.values():
            if conn.last_active < idle_before and conn.is_idle():
                due.append((conn, "idle"))
            elif conn.session_expires and conn.session_expires < now:
                due.append((conn, "session_expired"))
            elif conn.receive_overdue(now):
                due.append((conn, "receive_timeout"))
            elif conn.send_stalled(now):
                due.append((conn, "send_stalled"))
            elif not conn.reading and not conn.closing and conn.fd >= 0:
                paused[conn.fd] = conn
        for conn, reason in due:
            self._log_sweep(conn, reason)
            conn.close(reason)
        if paused:
            self._close_hung_up(paused)

    def _log_sweep(self, conn: Connection, reason: str) -> None:
        if reason == "idle":
            log.debug("closing idle connection %s from %s", conn.conn_id, conn.peer)
        elif reason == "session_expired":
            log.info("connection %s from %s: SASL session expired without re-authentication "
                     "(connections.max.reauth.ms); closing", conn.conn_id, conn.peer)
        elif reason == "receive_timeout":
            log.info("connection %s from %s: a request still incomplete after %d ms; closing",
                     conn.conn_id, conn.peer, self.receive_timeout * 1000)
        else:
            log.info("connection %s from %s: took none of its answers for %d ms; closing",
                     conn.conn_id, conn.peer, self.send_stall_seconds * 1000)

    @staticmethod
    def _close_hung_up(paused: dict[int, Connection]) -> None:
        """Connections whose reading is paused (muted, parked, throttled, waiting for memory
        or queue room) never see their peer go: ask the kernel which peers hung up."""
        poller = select.poll()
        for fd in paused:
            poller.register(fd, _HUNG_UP)
        for fd, _events in poller.poll(0):
            conn = paused[fd]
            log.debug("connection %s from %s: the peer hung up while paused", conn.conn_id,
                      conn.peer)
            conn.close("client")

    # --- the channel to the parent --------------------------------------------------------

    def _on_channel(self) -> None:
        """One message per call: the loop polls the channel level-triggered, so it calls again
        while more wait, and no call ends in a read that finds nothing (an exception each)."""
        try:
            message, fds = self.channel.receive()
        except BlockingIOError:
            return
        except (EOFError, OSError, ValueError, msgspec.DecodeError) as error:
            self._parent_gone(error)
            return
        if type(message) is ipc.Handoff:  # the one message that carries descriptors
            self.intake.accept(message, fds)
            return
        order = self._orders.get(type(message))
        if order is not None:
            order(message)
        else:
            log.error("worker %s: unexpected message %r", self.name, message)
        for fd in fds:  # only a Handoff brings descriptors
            os.close(fd)

    def _parent_orders(self) -> dict:
        """What the worker does with each kind of message from the parent (but Handoff)."""
        return {
            ipc.Close: lambda message: self._close_ids(message.conn_ids, message.reason),
            ipc.EvictQuery: self._answer_evict_query,
            ipc.ConnectionsQuery: lambda query: self._reply(
                top_connections(self.connections.values(), query)),
            ipc.ForwardedResponse: self.forwarder.answered,
            ipc.UserVerdict: self.principals.verdict,
            ipc.Quotas: self._quotas_changed,
            ipc.Credentials: lambda message: setattr(self.principals, "scram", message.scram),
            ipc.Acls: lambda message: self.access.update(message.acls),
            ipc.Tls: lambda message: self._new_certificates(message.listener_tls),
            ipc.Shutdown: lambda message: self.begin_shutdown(message.deadline_ms / 1000),
            ipc.UpstreamView: self._upstream_view,
        }

    def _upstream_view(self, view: ipc.UpstreamView) -> None:
        """Front-end mode: the parent's new view of the upstream cluster."""
        if self.front_end is None:
            return
        self.front_end.upstream.update(view)
        self.front_end.bound = frozenset(view.bound)
        self._api_versions.update(view)
        self.router.memo.clear()  # memoized ApiVersions answers advertise the old view

    def _quotas_changed(self, message: ipc.Quotas) -> None:
        if self.services.quotas is not None:  # the control plane is exempt from client quotas
            self.services.quotas.update(message.entries, message.shadow)

    def _parent_gone(self, error: BaseException) -> None:
        """The channel to the parent broke: nothing can be forwarded or acknowledged any
        more, so the worker drains and exits (the parent, if alive, restarts it)."""
        if self.channel.closed and self.channel.sock.fileno() < 0:
            return
        log.warning("worker %s: channel to the parent failed (%s); shutting down", self.name,
                    error or "closed")
        self.loop.remove_reader(self.channel.fileno())
        self.channel.close()
        gone = ConnectionError("the parent is gone")
        self.forwarder.fail_all(gone)  # no client may wait forever
        self.principals.fail_claims(gone)
        self.begin_shutdown(1.0)

    # --- called by connections (ConnectionHost) -------------------------------------------

    def connection_registered(self, conn: Connection) -> None:
        self.connections[conn.conn_id] = conn
        self.stats.registered(conn.listener_index)
        if self._draining:
            conn.close("shutdown")

    def connection_closed(self, conn: Connection, reason: str) -> None:
        self.connections.pop(conn.conn_id, None)
        self.intake.closed(conn.conn_id)  # first: the parent's slot accounting
        self.stats.closed(conn.listener_index, reason)
        if self.events is not None:
            self.events.connection_closed(conn, reason, time.monotonic() - conn.opened_at)

    def requests_served(self, conn: Connection, api_keys: list[int], received_at: float,
                        parked: bool = False) -> None:
        elapsed = int((_monotonic() - received_at) * 1e9)
        self.stats.requests(conn.listener_index, api_keys, elapsed)
        events = self.events
        if events is not None:
            events.requests(conn, api_keys, elapsed, parked)

    def invalid_request(self, reason: str) -> None:
        self.stats.invalid(reason)

    # --- orders from the parent -----------------------------------------------------------

    def _close_ids(self, conn_ids: list[int], reason: str) -> None:
        for conn_id in conn_ids:
            conn = self.connections.get(conn_id)
            if conn is not None:
                conn.close(reason)

    def _answer_evict_query(self, query: ipc.EvictQuery) -> None:
        """The least recently active connections of the listeners the parent may evict."""
        allowed = set(query.listeners)
        candidates = sorted((c for c in self.connections.values()
                             if c.listener_index in allowed and not c.closing),
                            key=lambda c: c.last_active)[:query.count]
        self._reply(ipc.EvictCandidates(round=query.round, candidates=[
            (c.conn_id, int(c.last_active * 1e9)) for c in candidates]))

    def _reply(self, message) -> None:
        """Answer a query of the parent's; it finishes without us if the channel is gone."""
        try:
            self.channel.send(message)
        except OSError:
            pass
