"""The parent's connection bookkeeping: acceptors, admission, closes, eviction, live limits.

Glue between the pieces that each do one thing: `ConnectionQuotas` (counts and rates),
the `Acceptor`s (one per listener), the `Dispatcher` (bounded hand-off), and the workers'
reports.  Workers report every connection that ends (IPC `Progress.closed`), and a dead
worker's connections are all released at once, so the counts are exact within a loop turn.
A connection that authenticated is counted for its principal when its worker asks
(`UserClaim`, answered with `UserVerdict`) and released by the same reports.  One refused
for its principal's limits holds no slot from the refusal on, as one refused at accept: its
worker answers it and closes it after the failed-authentication delay, and up to
MAX_DELAYED_CLOSES such connections are left out of the counts meanwhile (past that they
count until closed, so max.connections still bounds the sockets the workers hold).

Eviction (KIP-402 inter-broker protection, or a lowered `max.connections`): when more
connections are open than allowed, the parent asks every worker for its least recently
active connections on the non-protected listeners (`EvictQuery`), keeps the globally oldest
ones among the answers, and orders exactly those closed (`Close`, reason "evicted") - all in
one round trip, not one connection per loop turn per worker.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import threading
import time
from dataclasses import dataclass, field

from broker.parent.acceptor import MAX_DELAYED_CLOSES, Acceptor, DelayedCloser, ListenerPauses
from broker.parent.admission import ConnectionQuotas, Verdict
from broker.parent.dynamic import DynamicConfig
from broker.parent.handoff import Dispatcher
from broker.parent.proxy_header import TrustedProxies
from broker.parent.worker_process import WorkerProcess
from broker.shared import ipc
from broker.shared.config import BrokerConfig
from broker.shared.constants import INT_MAX
from broker.shared.events import EventLog
from shm.block import CLOSE_REASONS, SharedBlock

log = logging.getLogger("broker.parent.ledger")

EVICT_ROUND_TIMEOUT = 0.2
EVICT_RETRY = 0.05


@dataclass(eq=False)
class EvictionRound:
    """One eviction round: the workers asked, and the candidates they answered with."""

    id: int
    need: int  # connections to close
    pending: set[WorkerProcess]  # asked and not answered yet
    # (last active ns, conn id, the worker holding it), as the workers answered
    found: list[tuple[int, int, WorkerProcess]] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


class ConnectionLedger:
    """Every connection the parent admitted, until its worker reports it closed or dies."""

    def __init__(self, loop: asyncio.AbstractEventLoop, config: BrokerConfig, block: SharedBlock,
                 workers: list[WorkerProcess], dynamic: DynamicConfig, lock: threading.Lock,
                 events: EventLog | None = None):
        self.loop = loop
        self.config = config
        self.block = block
        self.workers = workers
        self.dynamic = dynamic
        self.lock = lock  # held by the metrics thread while it reads
        self.events = events
        props = config.props
        names = [listener.name for listener in config.listeners]
        data = config.data_listener_indexes()
        # Inter-broker protection only means something beside another data listener.
        protected = names.index(config.inter_broker_listener) if len(data) > 1 else None
        self.control_plane = config.control_plane_index()
        self.quotas = ConnectionQuotas(len(names), protected, dynamic.limits(),
                                       window=props.quota_window_size_seconds,
                                       samples=props.quota_window_num,
                                       burst_windows=props.pybroker_quota_burst_windows,
                                       control_plane=self.control_plane)
        self.evictable = [index for index in data if index != protected]
        capacity = props.pybroker_handoff_queue_size
        self.data_workers = [worker for worker in workers if not worker.control_plane]
        self.dispatcher = Dispatcher(self.data_workers, capacity, self._handoff_lost,
                                     self.wake_acceptors)
        # KIP-291: the control-plane listener hands off to its own worker only.
        self.control_dispatcher = Dispatcher([w for w in workers if w.control_plane], capacity,
                                             self._handoff_lost, self.wake_acceptors)
        self.delayed = DelayedCloser(loop)
        self.acceptors: list[Acceptor] = []  # by listener index
        self.node_acceptors: list[Acceptor] = []  # front-end mode: the upstream nodes' ports
        self._pauses: dict[int, ListenerPauses] = {}  # by listener index, shared by its ports
        self._ids = itertools.count(1)
        self._evicting: set[int] = set()
        self._refused: set[int] = set()  # refused for their user, released, not closed yet
        self._round: EvictionRound | None = None
        self._rounds = itertools.count(1)

    # --- life cycle -----------------------------------------------------------------------

    def _proxy(self, listener: str) -> tuple[TrustedProxies, float] | None:
        """The PROXY protocol settings of a listener behind a balancer, else None."""
        if listener not in self.config.proxy_listeners:
            return None
        props = self.config.props
        trusted = TrustedProxies(props.pybroker_proxy_protocol_trusted_cidrs.split(","))
        return trusted, props.pybroker_proxy_protocol_timeout_ms / 1000

    def _refusal_delay(self) -> float | None:
        """How long a refused connection is held after its answer; None: refusals are not
        answered (pybroker.connection.refusal.answer.enable)."""
        props = self.config.props
        if not props.pybroker_connection_refusal_answer_enable:
            return None
        return props.pybroker_connection_refusal_delay_ms / 1000

    def start(self, sockets: list[socket.socket]) -> None:
        for index, sock in enumerate(sockets):
            self.acceptors.append(self._acceptor(index, sock))
        for acceptor in self.acceptors:
            acceptor.start()

    def add_node_acceptor(self, index: int, sock: socket.socket) -> None:
        """Front-end mode: one more port of listener `index`, for one upstream node.  It
        counts as the listener itself: same limits, same counters, same hand-off."""
        acceptor = self._acceptor(index, sock, node_port=True)
        self.node_acceptors.append(acceptor)
        acceptor.start()

    def _acceptor(self, index: int, sock: socket.socket, node_port: bool = False) -> Acceptor:
        listener = self.config.listeners[index]
        dispatcher = self.control_dispatcher if index == self.control_plane else self.dispatcher
        return Acceptor(self.loop, index, listener, sock, dispatcher, self.block, self.quotas,
                        self.delayed, lambda: next(self._ids), self.maybe_evict, self.events,
                        self._proxy(listener.name), self._refusal_delay(),
                        self._pauses.setdefault(index, ListenerPauses()), node_port)

    def stop(self) -> None:
        for acceptor in self.acceptors + self.node_acceptors:
            acceptor.close()
        self.delayed.close_all()

    def wake_acceptors(self) -> None:
        for acceptor in self.acceptors:
            acceptor.maybe_resume()
        for acceptor in self.node_acceptors:
            acceptor.maybe_resume()

    # --- reports from workers -------------------------------------------------------------

    def progress(self, worker: WorkerProcess, message: ipc.Progress) -> None:
        for conn_id in message.closed:
            worker.conn_ids.discard(conn_id)
            self._release(conn_id)
        self.dispatcher.credit(worker, message.registered)
        if message.closed:
            self._sync_active()
            self.wake_acceptors()
            self.maybe_evict()

    def claim_user(self, worker: WorkerProcess, message: ipc.UserClaim) -> None:
        """A connection authenticated: count it for its principal, or refuse it (the worker
        answers the client with an authentication failure and closes it after the delay)."""
        decision = self.quotas.claim_user(message.conn_id, message.user, time.monotonic())
        verdict, refused, limit = decision.verdict, "", 0
        if decision.would:  # shadow mode: admitted, and counted as it would have been refused
            listener, ip = self.quotas.owner(message.conn_id)
            for reason in decision.would:
                self.acceptors[listener].shadowed(reason, ip=ip,
                                                  principal=f"User:{message.user}")
        if verdict is not Verdict.ADMIT:
            refused = verdict.value
            limits = self.quotas.limits
            limit = (limits.per_user_limit(message.user) if verdict is Verdict.REJECT_USER_LIMIT
                     else limits.user_rate(message.user))
            listener, ip = self.quotas.owner(message.conn_id)
            self.acceptors[listener].rejected(refused, ip=ip, principal=f"User:{message.user}")
            self._release_refused(message.conn_id)
        try:
            worker.channel.send(ipc.UserVerdict(conn_id=message.conn_id, refused=refused,
                                                limit=limit))
        except (OSError, AttributeError):
            pass  # a dead worker's connections are released by worker_gone

    def worker_gone(self, worker: WorkerProcess) -> None:
        """The dead worker's connections died with it: count them closed (reason worker_exit),
        fold its slot's counters into the archive, and release every slot they held."""
        block, slot = self.block, worker.slot
        lost_reason = CLOSE_REASONS.index("worker_exit")
        with self.lock:
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
        for conn_id in worker.conn_ids:
            self._release(conn_id)
        worker.conn_ids.clear()
        self._sync_active()
        self.wake_acceptors()

    def _release(self, conn_id: int) -> None:
        self.quotas.closed(conn_id)
        self._evicting.discard(conn_id)
        self._refused.discard(conn_id)

    def _release_refused(self, conn_id: int) -> None:
        """A connection refused for its user: its slots are free now, though its worker
        closes it only after the delay (its close report then finds nothing to release)."""
        if len(self._refused) >= MAX_DELAYED_CLOSES:
            return  # counted until closed: the workers' held sockets stay bounded
        self._release(conn_id)
        self._refused.add(conn_id)
        self._sync_active()
        self.wake_acceptors()

    def _handoff_lost(self, listener: int, conn_ids: list[int]) -> None:
        with self.lock:
            cell = self.block.worker_cell(self.block.archive_slot, "connections_closed", listener,
                                          CLOSE_REASONS.index("error"))
            self.block.words[cell] += len(conn_ids)
        for conn_id in conn_ids:
            self._release(conn_id)
        self._sync_active()

    def _sync_active(self) -> None:
        for acceptor in self.acceptors:
            acceptor.sync_active()

    # --- limits ---------------------------------------------------------------------------

    def apply_limits(self) -> None:
        """Re-read the limits after a dynamic change or a SIGHUP; evict if now over."""
        try:
            limits = self.dynamic.limits()
        except ValueError as error:  # e.g. a host name in the overrides no longer resolves
            log.error("keeping the previous connection limits: %s", error)
            return
        self.quotas.limits = limits
        log.info("connection limits now: max.connections=%d, per IP %d, rate %d/s, per user %d "
                 "(%d overrides), %d/s (%d overrides)", limits.max_connections,
                 limits.max_connections_per_ip, limits.max_connection_creation_rate,
                 limits.max_connections_per_user, len(limits.user_overrides),
                 limits.user_creation_rate, len(limits.user_rate_overrides))
        self.wake_acceptors()
        self.maybe_evict()

    # --- eviction -------------------------------------------------------------------------

    def maybe_evict(self) -> None:
        if self._round is not None:
            return
        need = self.quotas.excess() - len(self._evicting)
        if need <= 0:
            return
        live = [w for w in self.data_workers if w.ready and w.channel is not None]
        round_id = next(self._rounds)
        self._round = current = EvictionRound(round_id, need, set(live))
        query = ipc.EvictQuery(round=round_id, count=need, listeners=self.evictable)
        for worker in live:
            try:
                worker.channel.send(query)
            except OSError:
                current.pending.discard(worker)
        current.timer = self.loop.call_later(EVICT_ROUND_TIMEOUT, self._finish_round)
        if not current.pending:
            self._finish_round()

    def evict_candidates(self, worker: WorkerProcess, message: ipc.EvictCandidates) -> None:
        current = self._round
        if current is None or message.round != current.id:
            return
        current.found.extend((last, conn_id, worker) for conn_id, last in message.candidates)
        current.pending.discard(worker)
        if not current.pending:
            self._finish_round()

    def _finish_round(self) -> None:
        current, self._round = self._round, None
        if current is None:
            return
        current.timer.cancel()
        chosen = sorted((item for item in current.found if item[1] not in self._evicting),
                        key=lambda item: item[0])[:current.need]
        orders: dict[WorkerProcess, list[int]] = {}
        for _last, conn_id, worker in chosen:
            owner = self.quotas.owner(conn_id)
            if owner is None:
                continue  # closed meanwhile
            orders.setdefault(worker, []).append(conn_id)
            self._evicting.add(conn_id)
            self.acceptors[owner[0]].rejected("evicted", ip=owner[1])
        for worker, conn_ids in orders.items():
            try:
                worker.channel.send(ipc.Close(conn_ids=conn_ids, reason="evicted"))
            except (OSError, AttributeError):
                pass  # a dead worker's connections are released by worker_gone
        if chosen:
            log.info("evicting %d connections to get back within max.connections=%d",
                     len(chosen), self.quotas.limits.max_connections)
        if self.quotas.excess() > len(self._evicting):
            self.loop.call_later(EVICT_RETRY if chosen else 10 * EVICT_RETRY, self.maybe_evict)

    # --- for metrics (called from the metrics thread) -------------------------------------

    def acceptor_blocked_ns(self, index: int) -> int:
        """A listener's blocked time: its own port's, or the longest of its node ports' (they
        block together, for the listener's room), never their sum."""
        if index < len(self.acceptors):
            return max([self.acceptors[index].blocked_ns()]
                       + [node.blocked_ns() for node in self.node_acceptors
                          if node.index == index])
        return self.block.words[self.block.parent_cell("acceptor_blocked_ns", index)]

    def limit_view(self) -> dict:
        now = time.monotonic()
        limits = self.quotas.limits
        return {
            "max_connections": limits.max_connections,
            "listener_max": [limits.listener_max(i) for i in range(len(self.config.listeners))],
            "broker_rate_limit": limits.max_connection_creation_rate,
            "broker_rate": self.quotas.broker_rate(now),
            "listener_rate_limit": [limits.listener_creation_rate.get(i, INT_MAX)
                                    for i in range(len(self.config.listeners))],
            "listener_rate": [self.quotas.listener_rate(i, now)
                              for i in range(len(self.config.listeners))],
            "throttled_sockets": self.delayed.held(),
        }
