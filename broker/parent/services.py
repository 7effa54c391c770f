"""The parent's services: everything it runs beside supervising the workers, for its whole life.

Once the listening sockets are bound (broker.parent.acceptor.bind_listeners), `ParentServices`
builds, in order: the
shared block (shm.block), the log manager (start-up recovery, retention, flush), the memory
pool (KIP-72), the event log, the dynamic config with its host resolver, the connection
ledger (admission, acceptors, hand-off), the ACLs and the parent's authorization, and the admin
service and group coordinator behind the admin router.  Once every worker is ready, `start` opens the doors: acceptors, /metrics,
log maintenance and the event ticker.  It never spawns, signals or reaps a process: that is the
supervisor's job (broker.parent.supervisor), which calls in here.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Callable

import msgspec

from broker.parent.acceptor import bind_listener
from broker.parent.acl_store import AclService, AclStore
from broker.parent.admin import AdminService
from broker.parent.connection_list import ConnectionListing
from broker.parent.dynamic import DynamicConfig
from broker.parent.forwarded import ForwardedRouter
from broker.parent.group_configs import GroupConfigs
from broker.parent.groups.coordinator import GroupCoordinator
from broker.parent.groups.offset_store import OffsetStore
from broker.parent.transactions.coordinator import TransactionCoordinator
from broker.parent.transactions.metrics import TransactionCollector
from broker.parent.ledger import ConnectionLedger
from broker.parent.log_manager import LogManager
from broker.parent.metrics import BlockCollector, DescriptorCollector
from broker.parent.resolver import HostResolver
from broker.parent.runtime import Runtime
from broker.parent.scram import ScramStore
from broker.parent.status_http import serve_status
from broker.parent.ticker import EventTicker
from broker.parent.upstream_directory import UpstreamDirectory
from broker.parent.worker_process import WorkerProcess
from broker.shared import ipc
from broker.shared.access import Access
from broker.shared.apis import API_NAMES
from broker.shared.client_quotas import QuotaSensors
from broker.shared.config import BrokerConfig, listen_backlog
from broker.shared.events import EventLog
from broker.shared.log.topics import Epoch
from broker.shared.overrides import override_hosts
from broker.shared.pool import SharedPool, initialise_pool
from broker.shared.upstream_security import UpstreamSecurity
from broker.shared.protocol import guard
from shm.block import MAX_API_KEY, SharedBlock

log = logging.getLogger("broker.parent.services")
ACL_PUSH_SECONDS = 0.1  # changed ACLs reach every worker at once, or this long later at most


class ParentServices:
    """What the parent serves: built in the constructor, started once the workers are ready."""

    def __init__(self, loop, config: BrokerConfig, runtime: Runtime,
                 workers: list[WorkerProcess]):
        self.loop = loop
        self.config = config
        self.runtime = runtime
        self.workers = workers
        props = config.props
        guard.limits.max_entries = props.pybroker_request_max_entries  # forwarded requests too
        self.metrics_lock = threading.Lock()  # the metrics thread reads the block under it
        self.block = SharedBlock.create(runtime.shm_path, len(workers), len(config.listeners),
                                        props.pybroker_quota_max_sensors, props.quota_window_num,
                                        props.pybroker_pool_max_waiters)
        self.logs = LogManager(config, Epoch(self.block.words,
                                             self.block.parent_cell("metadata_epoch")))
        self.pool = self._create_pool()
        self.events = self._event_log()
        dynamic = DynamicConfig(config)
        dynamic.load()
        # Host names of the per-IP overrides: resolved now (start-up may wait), then only off
        # the loop, with the limits re-applied when an answer changes.
        self.resolver = HostResolver(loop, on_change=lambda: self.ledger.apply_limits())
        self.resolver.prime(override_hosts(
            dynamic.value("max.connections.per.ip.overrides")[0] or ""))
        dynamic.resolver = self.resolver
        self.dynamic = dynamic
        self.ledger = ConnectionLedger(loop, config, self.block, workers, dynamic,
                                       self.metrics_lock, self.events)
        self.scram = ScramStore(config.log_dirs[0])
        self.scram.load()
        self.access = self._access()
        self.acl_store = AclStore(config.log_dirs[0])
        self.acl_store.load()
        self.access.update(self.acl_store.acls)
        self._acl_push = None  # the pending push of changed ACLs to the workers
        self._acl_pushed = 0.0  # when ACLs were last pushed (monotonic)
        acls = AclService(self.acl_store, self.access, on_change=self._push_acls)
        # The groups' own configs: altered by the admin service, read by the group coordinator.
        self.group_configs = GroupConfigs(
            props, config.log_dirs[0],
            fsync_every_write=props.log_flush_interval_messages == 1)
        self.admin = AdminService(config.node_id, dynamic, self.config_changed,
                                  config.may_alter, self.events, self.scram, self.access, acls,
                                  self.group_configs)
        self.groups: GroupCoordinator | None = None
        self.transactions: TransactionCoordinator | None = None
        self.router: ForwardedRouter | None = None
        self._served: dict[type, Callable[[WorkerProcess, object], None]] = {}
        self._topics = None  # the parent's TopicRegistry, for the group coordinator
        self._ticker: EventTicker | None = None
        self._metrics_server = None
        self.listing = ConnectionListing(loop, workers, [item.name for item in config.listeners])
        # The SSL listeners' settings in force; when they differ from the Boot config's
        # (dynamic key stores, a SIGHUP), every worker starting is told after its Boot.
        self._tls = self._tls_at_start()
        self.directory: UpstreamDirectory | None = None  # front-end mode only

    def _access(self) -> Access:
        """The parent's authorization of the requests it serves (admin, groups, ACLs)."""
        config, block = self.config, self.block
        cells = {key: block.parent_cell("authorization_denied", key)
                 for key in range(MAX_API_KEY + 1)}

        def count(api_key: int) -> None:
            block.words[cells[api_key]] += 1

        return Access(config.authorizing(), config.super_users,
                      config.props.allow_everyone_if_no_acl_found, count, self.events,
                      tuple(listener.name for listener in config.listeners), API_NAMES)

    def _create_pool(self) -> SharedPool | None:
        limit = self.config.props.queued_max_request_bytes
        if limit <= 0:
            return None
        reserved = self.config.pool_reserved_by_index()
        initialise_pool(self.block, limit, reserved)
        return SharedPool(self.block, -1, limit, reserved)

    def _event_log(self) -> EventLog | None:
        if self.config.event_log_dir is None:
            return None
        props = self.config.props
        return EventLog(self.config.event_log_dir, "parent", self.config.node_id,
                        props.pybroker_event_log_file_bytes, props.pybroker_event_log_total_bytes)

    # --- life cycle -----------------------------------------------------------------------

    def recover(self) -> None:
        """Before any worker runs: the log's start-up recovery, then the group coordinator."""
        self.logs.startup()
        props = self.config.props
        offsets = OffsetStore(self.config.log_dirs[0],
                              fsync_every_commit=props.log_flush_interval_messages == 1)
        self._topics = topics = self.logs.registry()

        def partitions_of(topic: str) -> int | None:
            info = topics.get(topic)
            return None if info is None else info.partitions

        self.groups = GroupCoordinator(self.loop, props, offsets, partitions_of, self.access,
                                       topics=topics, events=self.events,
                                       node_id=self.config.node_id,
                                       group_configs=self.group_configs)
        self.transactions = TransactionCoordinator(
            self.loop, props, self.config.log_dirs[0], topics, offsets, self.access,
            fsync_every_write=props.log_flush_interval_messages == 1, events=self.events,
            listeners=tuple(listener.name for listener in self.config.listeners))
        self.groups.transaction_problem = self.transactions.offsets_problem
        self.transactions.recover()  # a Prepare state a crash left: its markers, now
        self.admin.topics = topics  # topic configs: DescribeConfigs and (Incremental)AlterConfigs
        self.router = ForwardedRouter(self.admin, self.groups, self.transactions, self.dynamic)
        # What serves each kind of message a worker sends (Ready is the supervisor's).
        self._served = {ipc.Progress: self.ledger.progress,
                        ipc.EvictCandidates: self.ledger.evict_candidates,
                        ipc.ForwardedRequest: self.router.serve,
                        ipc.UserClaim: self.ledger.claim_user,
                        ipc.ConnectionsList: self.listing.answered}

    def start(self, sockets: list[socket.socket]) -> None:
        """Every worker is ready: restored group sessions start; accept, expose /metrics,
        maintain the log, tick events."""
        self.groups.start()
        self.ledger.start(sockets)
        if self.config.upstream:
            props = self.config.props
            self.directory = UpstreamDirectory(
                self.loop, self.config.upstream, props.pybroker_upstream_metadata_refresh_ms / 1000,
                props.pybroker_upstream_connect_timeout_ms / 1000, self._publish_view,
                self._bind_node, UpstreamSecurity.of(props))
            self.directory.start()
        self.transactions.start()
        self._start_metrics()
        self.logs.start_maintenance()
        if self.events is not None:
            self._ticker = EventTicker(self.loop, self.config, self.events, self.ledger,
                                       self.pool, self.access, self.transactions.bounds)
            self._ticker.start()

    def stop_accepting(self) -> None:
        """Shutdown's first step: listeners closed, group requests waiting answered now."""
        if self._ticker is not None:
            self._ticker.stop()
        self.ledger.stop()
        if self.groups is not None:
            self.groups.abort_waiting()

    def finish(self) -> None:
        """After the workers are gone: offsets and transactions closed, partitions flushed."""
        self.groups.close()
        self.transactions.close()
        self.group_configs.close()
        self.logs.shutdown()

    def close(self) -> None:
        if self.directory is not None:
            self.directory.close()
        if self._topics is not None:
            self.logs.close_registry(self._topics)
        self._stop_metrics()
        self.resolver.close()
        if self.events is not None:
            self.events.close()
        self.block.close()
        self.block.unlink()

    # --- workers' traffic -----------------------------------------------------------------

    def worker_started(self, worker: WorkerProcess) -> None:
        if self.router is not None:
            self.router.send_quotas(worker)
        if self.config.listener_sasl:
            self._send(worker, ipc.Credentials(scram=self.scram.users))
        if self._tls != self.config.listener_tls:  # its Boot carries the static ones
            self._send(worker, ipc.Tls(listener_tls=self._tls))
        if self.config.authorizing():
            self._send(worker, ipc.Acls(acls=list(self.acl_store.acls)))
        if self.directory is not None and self.directory.view is not None:
            self._send(worker, self.directory.view)

    @staticmethod
    def _send(worker: WorkerProcess, message) -> None:
        try:
            worker.channel.send(message)
        except OSError:
            pass  # a dead worker is told again when it is respawned

    def on_message(self, worker: WorkerProcess, message) -> bool:
        """Serve one message from a worker; False if it is not one of the services'."""
        serve = self._served.get(type(message))
        if serve is None:
            return False
        serve(worker, message)
        return True

    def worker_gone(self, worker: WorkerProcess) -> None:
        """Return what the dead worker held: pool memory, connection slots, counters."""
        if self.pool is not None:
            freed = self.pool.reclaim(worker.slot)
            if freed:
                log.info("returned %d bytes of request memory held by %s", freed, worker.name)
        self.ledger.worker_gone(worker)

    def config_changed(self) -> None:
        """A dynamic change was persisted: apply connection limits, tell workers the quotas
        and any new key store."""
        self.ledger.apply_limits()
        for worker in self.workers:
            if worker.channel is not None:
                self.router.send_quotas(worker)
                if self.config.listener_sasl:
                    self._send(worker, ipc.Credentials(scram=self.scram.users))
        self._push_tls()

    def _push_acls(self) -> None:
        """The ACLs changed (and were persisted): every worker decides with them from now on.
        They go out at once, before the change is answered; but as they are sent whole, at
        most once per ACL_PUSH_SECONDS: changes coming faster (a tool creating thousands, one
        request each) wait for the end of that window and go out together."""
        if self._acl_push is not None:
            return  # the push already scheduled will carry this change too
        wait = self._acl_pushed + ACL_PUSH_SECONDS - time.monotonic()
        if wait <= 0:
            self._send_acls()
        else:
            self._acl_push = self.loop.call_later(wait, self._send_acls)

    def _send_acls(self) -> None:
        self._acl_push = None
        self._acl_pushed = time.monotonic()
        message = ipc.Acls(acls=list(self.acl_store.acls))
        for worker in self.workers:
            if worker.channel is not None:
                self._send(worker, message)

    def reload(self, fresh: BrokerConfig) -> None:
        """SIGHUP: the re-read file's connection limits apply; other keys need a restart."""
        changed = [key for key in fresh.props.__struct_fields__
                   if getattr(fresh.props, key) != getattr(self.config.props, key)]
        self.dynamic.config = msgspec.structs.replace(
            self.dynamic.config, props=fresh.props, listener_props=fresh.listener_props)
        log.info("SIGHUP: config re-read; changed: %s", ", ".join(changed) or "nothing")
        self.ledger.apply_limits()
        self._reload_tls(fresh)

    def _reload_tls(self, fresh: BrokerConfig) -> None:
        """Certificates re-read (SIGHUP): every worker's new handshakes use them; the
        listeners and their protocols themselves need a restart."""
        if fresh.listener_tls.keys() != self.config.listener_tls.keys():
            log.error("SIGHUP: SSL listeners changed; that needs a restart")
            return
        self.dynamic.config = msgspec.structs.replace(self.dynamic.config,
                                                      listener_tls=fresh.listener_tls)
        self._push_tls(always=True)

    def _tls_at_start(self):
        """The static settings with the dynamic key stores over them, if those still load."""
        try:
            self.dynamic.check_tls(self.dynamic.stored.broker, self.dynamic.stored.cluster_default)
        except ValueError as error:
            log.error("dynamic SSL settings ignored until changed: %s", error)
            return self.config.listener_tls
        return self.dynamic.listener_tls()

    def _push_tls(self, always: bool = False) -> None:
        """Tell every worker the SSL settings in force if they changed (or `always`: a SIGHUP
        re-reads the files even when their names are the same)."""
        fresh = self.dynamic.listener_tls()
        if not fresh or (fresh == self._tls and not always):
            return
        self._tls = fresh
        for worker in self.workers:
            if worker.channel is not None:
                self._send(worker, ipc.Tls(listener_tls=fresh))
        log.info("SSL listeners' key stores re-read: %s", ", ".join(sorted(fresh)))

    # --- front-end mode ---------------------------------------------------------------------

    def _publish_view(self, view: ipc.UpstreamView) -> None:
        for worker in self.workers:
            if worker.channel is not None:
                self._send(worker, view)

    def _bind_node(self, node_id: int) -> bool:
        """Bind every listener's port for upstream node `node_id`; False (logged) if one
        cannot be bound, and none is kept."""
        config, props = self.config, self.config.props
        if not 0 <= node_id < props.pybroker_frontend_node_ports_per_listener:
            log.error("upstream node %d has no front-end port: node ids from 0 to %d are "
                      "served (pybroker.frontend.node.ports.per.listener)", node_id,
                      props.pybroker_frontend_node_ports_per_listener - 1)
            return False
        sockets = []
        for index in config.data_listener_indexes():  # the control plane is the front-end's own
            listener = config.listeners[index]
            port = config.node_port(index, node_id)
            try:
                sockets.append(bind_listener(msgspec.structs.replace(listener, port=port),
                                             listen_backlog(props),
                                             props.socket_receive_buffer_bytes,
                                             props.socket_send_buffer_bytes))
            except OSError as error:
                log.error("cannot bind port %d of listener %s for upstream node %d: %s",
                          port, listener.name, node_id, error.strerror)
                for sock in sockets:
                    sock.close()
                return False
        for index, sock in zip(config.data_listener_indexes(), sockets):
            self.ledger.add_node_acceptor(index, sock)
            log.info("listening listener=%s node=%d address=%s:%d", config.listeners[index].name,
                     node_id, *sock.getsockname()[:2])
        return True

    # --- /metrics -------------------------------------------------------------------------

    def _start_metrics(self) -> None:
        if self.config.prometheus is None:
            return
        sensors = QuotaSensors.of(self.block, -1, self.config.props)  # read-only: never claims
        collector = BlockCollector(self.block, self.config, self.ledger, self.pool, sensors,
                                   self.dynamic, self.workers, self.metrics_lock)
        host, port = self.config.prometheus
        collectors = [collector, TransactionCollector(self.transactions),
                      DescriptorCollector(self.block, self.logs)]
        self._metrics_server = serve_status(host, port, collectors, self.listing)
        log.info("metrics listening address=%s:%d (/metrics, /connections)", host,
                 self._metrics_server.port)

    def _stop_metrics(self) -> None:
        if self._metrics_server is not None:
            self._metrics_server.close()
            self._metrics_server = None
