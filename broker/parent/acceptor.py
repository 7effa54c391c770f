"""One acceptor per listener, on the parent's event loop, enforcing admission.

When its listening socket is readable, the acceptor accepts at most as many sockets as both
the hand-off (free worker capacity) and the connection limits (ConnectionQuotas.room) allow,
and judges each one (broker.parent.admission):

  * over the per-IP limit: closed at once (`per_ip_limit`);
  * over the per-IP creation rate: kept open and unread, closed after the throttle delay
    by the DelayedCloser, without holding up the acceptor (`per_ip_rate`);
  * admitted: counted, given an id and handed to a worker.  If it pushed the listener or
    broker creation rate over its limit, the acceptor pauses for the throttle time.

With no room it stops watching its socket (the kernel backlog, `socket.listen.backlog.size`,
holds new connections) until `maybe_resume` finds room again; the supervisor calls it whenever
credit returns, a connection closes or a limit changes.  Time stopped for any reason is
KIP-402's AcceptorBlockedPercent (`broker_acceptor_blocked_seconds_total`); time paused for a
rate is also KIP-612's accept throttle time.  Each acceptor stops and resumes on its own.

On a listener behind a PROXY protocol balancer (pybroker.proxy.protocol.listeners) a socket
is judged only once its header gave the client's address (broker.parent.proxy_reader); until
then, and while a socket with its header read waits for hand-off capacity, it counts against
the listener's room, so max.connections still bounds what the parent holds.
"""

from __future__ import annotations

import asyncio
import errno
import heapq
import logging
import os
import socket
import time
from collections import deque
from typing import Callable

from broker.parent.admission import ConnectionQuotas, Verdict
from broker.parent.handoff import Dispatcher
from broker.parent.proxy_header import TrustedProxies
from broker.parent.proxy_reader import ProxyReader
from broker.parent.refusal_answer import RefusalAnswers
from broker.shared.config import BrokerConfig, Listener, listen_backlog
from broker.shared.events import ConnectionAccepted, ConnectionRejected, EventLog
from shm.block import DRY_RUN_REASONS, REJECT_REASONS, SharedBlock

log = logging.getLogger("broker.parent.acceptor")

ACCEPT_BATCH = 64
MAX_ACCEPTS_PER_WAKEUP = 256  # bounds the loop when most sockets are refused at once
_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
FD_EXHAUSTION_PAUSE = 0.1
MAX_DELAYED_CLOSES = 10000


def bind_listener(listener: Listener, backlog: int, receive_buffer: int,
                  send_buffer: int = -1) -> socket.socket:
    """Bind and listen; port 0 picks an ephemeral port (read it back from getsockname).

    Accepted sockets inherit the listening socket's options: SO_RCVBUF (which must be set
    before the handshake to size the window), SO_KEEPALIVE and SO_SNDBUF (Kafka sets the last
    two on each accepted socket; inherited, they cost no system call per connection)."""
    family = listener.family()
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if receive_buffer > 0:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        if send_buffer > 0:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
        sock.bind((listener.host or ("::" if family == socket.AF_INET6 else "0.0.0.0"),
                   listener.port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def bind_listeners(config: BrokerConfig) -> list[socket.socket]:
    """One listening socket per listener, or OSError naming the listener that failed."""
    props, sockets = config.props, []
    try:
        for listener in config.listeners:
            sockets.append(bind_listener(listener, listen_backlog(props),
                                         props.socket_receive_buffer_bytes,
                                         props.socket_send_buffer_bytes))
    except OSError as error:
        for sock in sockets:
            sock.close()
        raise OSError(error.errno, f"cannot bind listener {listener.name} on "
                                   f"{listener.address()}: {error.strerror}") from None
    for listener, sock in zip(config.listeners, sockets):
        host, port = sock.getsockname()[:2]
        log.info("listening listener=%s address=%s:%d backlog=%d", listener.name, host, port,
                 listen_backlog(props))
    return sockets


class DelayedCloser:
    """Sockets refused for their IP's creation rate: held unread, closed when their time is up."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._heap: list[tuple[float, int]] = []
        self._timer: asyncio.TimerHandle | None = None

    def hold(self, fd: int, until: float) -> None:
        if len(self._heap) >= MAX_DELAYED_CLOSES:
            os.close(fd)  # never let throttled sockets exhaust the descriptors
            return
        heapq.heappush(self._heap, (until, fd))
        if self._timer is None or self._heap[0] == (until, fd):  # nothing armed, or new earliest
            self._arm()

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        if self._heap:
            delay = max(0.0, self._heap[0][0] - time.monotonic())
            self._timer = self.loop.call_later(delay, self._close_due)

    def _close_due(self) -> None:
        now = time.monotonic()
        while self._heap and self._heap[0][0] <= now:
            os.close(heapq.heappop(self._heap)[1])
        self._timer = None
        self._arm()

    def close_all(self) -> None:
        while self._heap:
            os.close(heapq.heappop(self._heap)[1])
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def held(self) -> int:
        return len(self._heap)


class ListenerPauses:
    """The creation-rate pauses of one listener's acceptors (its own port and, in front-end
    mode, its node ports), which pause together: each pause counts only the time no other
    pause already covers."""

    def __init__(self):
        self._until = 0  # monotonic ns the pauses so far cover

    def add(self, seconds: float) -> int:
        """Nanoseconds a pause of `seconds` from now adds to the listener's total."""
        now = time.monotonic_ns()
        end = now + int(seconds * 1e9)
        added = max(0, end - max(now, self._until))
        self._until = max(self._until, end)
        return added


class Acceptor:
    """Accepts on one listening socket, admits, and hands the sockets to workers."""

    def __init__(self, loop: asyncio.AbstractEventLoop, index: int, listener: Listener,
                 sock: socket.socket, dispatcher: Dispatcher, block: SharedBlock,
                 quotas: ConnectionQuotas, delayed: DelayedCloser, next_id: Callable[[], int],
                 over_limit: Callable[[], None], events: EventLog | None = None,
                 proxy: tuple[TrustedProxies, float] | None = None,
                 refusal_delay: float | None = None, pauses: "ListenerPauses | None" = None,
                 node_port: bool = False):
        """`pauses`: the creation-rate pauses of every acceptor of the listener, counted once
        however many of its ports pause together; `node_port`: one more port of a listener
        (front-end mode), whose blocked time is its own, not added to the listener's."""
        self.loop = loop
        self.index = index
        self.pauses = pauses if pauses is not None else ListenerPauses()
        self.node_port = node_port
        self._own_blocked_ns = 0  # a node port's blocked time
        self.listener = listener
        self.sock = sock
        self.dispatcher = dispatcher
        self.block = block
        self.quotas = quotas
        self.delayed = delayed
        self._next_id = next_id
        self._over_limit = over_limit  # called when admissions leave max.connections exceeded
        self._accepted_cell = block.parent_cell("connections_accepted", index)
        self._active_cell = block.parent_cell("connections_active", index)
        self._blocked_cell = block.parent_cell("acceptor_blocked_ns", index)
        self._throttle_cell = block.parent_cell("accept_throttle_ns", index)
        self._rejected_cells = {reason: block.parent_cell("connections_rejected", index, n)
                                for n, reason in enumerate(REJECT_REASONS)}
        self._dry_run_cells = {reason: block.parent_cell("connections_dry_run", index, n)
                               for n, reason in enumerate(DRY_RUN_REASONS)}
        self.events = events
        self._watching = False
        self._blocked_since = 0  # monotonic ns, 0 when not blocked
        # For the event log: why the current block began, and per reason this second.
        self._block_reason = ""
        self._block_mark = 0
        self._blocked_by: dict[str, list[int]] = {}  # reason -> [episodes, ns]
        self._paused_until = 0.0  # monotonic seconds of a rate pause in progress
        self._closed = False
        # PROXY protocol: sockets waiting for their header, then (fd, client address) of
        # those whose header is read, waiting for hand-off capacity.
        self.proxy = None if proxy is None else ProxyReader(
            loop, proxy[0], proxy[1], self._header_read, self._proxy_refused, self.maybe_resume)
        self._ready: deque[tuple[int, tuple]] = deque()
        # Legible refusals: the first request of a socket over its IP's limit is answered.
        self.refusals = None if refusal_delay is None else RefusalAnswers(
            loop, delayed.hold, refusal_delay)

    def start(self) -> None:
        self._watch()

    def close(self) -> None:
        """Stop accepting for good and close the listening socket."""
        self._closed = True
        self._unwatch()
        self._end_block()
        self.sock.close()
        if self.proxy is not None:
            self.proxy.close_all()
        if self.refusals is not None:
            self.refusals.close_all()
        while self._ready:
            os.close(self._ready.popleft()[0])

    def blocked_ns(self) -> int:
        """Total time blocked so far, including a block in progress."""
        total = self._own_blocked_ns if self.node_port else self.block.words[self._blocked_cell]
        if self._blocked_since:
            total += time.monotonic_ns() - self._blocked_since
        return total

    def rejected(self, reason: str, ip: str = "", principal: str | None = None) -> None:
        self.block.words[self._rejected_cells[reason]] += 1
        if self.events is not None:
            self.events.emit(ConnectionRejected(listener=self.listener.name, ip=ip,
                                                reason=reason, principal=principal))

    def shadowed(self, reason: str, ip: str = "", principal: str | None = None) -> None:
        """A connection a limit in shadow mode would have refused (or paused the acceptor
        for): admitted, counted and logged as a dry run."""
        self.block.words[self._dry_run_cells[reason]] += 1
        if self.events is not None:
            self.events.emit(ConnectionRejected(listener=self.listener.name, ip=ip,
                                                reason=reason, principal=principal,
                                                dry_run=True))

    def sync_active(self) -> None:
        self.block.words[self._active_cell] = self.quotas.per_listener[self.index]

    # --- watching -------------------------------------------------------------------------

    def _watch(self) -> None:
        if not self._watching and not self._closed:
            self.loop.add_reader(self.sock.fileno(), self._on_readable)
            self._watching = True

    def _unwatch(self) -> None:
        if self._watching:
            self.loop.remove_reader(self.sock.fileno())
            self._watching = False

    def _begin_block(self, reason: str) -> None:
        self._unwatch()
        if not self._blocked_since:
            self._blocked_since = self._block_mark = time.monotonic_ns()
            self._block_reason = reason
            self._blocked_by.setdefault(reason, [0, 0])[0] += 1

    def _end_block(self) -> None:
        if self._blocked_since:
            now = time.monotonic_ns()
            if self.node_port:
                self._own_blocked_ns += now - self._blocked_since
            else:
                self.block.words[self._blocked_cell] += now - self._blocked_since
            self._blocked_by[self._block_reason][1] += now - self._block_mark
            self._blocked_since = 0

    def _no_room_reason(self) -> str:
        return "handoff_full" if self.dispatcher.free_capacity() == 0 else "connection_limit"

    def take_blocked(self) -> dict[str, list[int]]:
        """Blocked episodes and nanoseconds by reason since the last call (event log)."""
        if self._blocked_since:
            now = time.monotonic_ns()
            self._blocked_by[self._block_reason][1] += now - self._block_mark
            self._block_mark = now
        taken, self._blocked_by = self._blocked_by, {}
        if self._blocked_since:
            self._blocked_by[self._block_reason] = [0, 0]
        return taken

    def _room(self) -> int:
        held = len(self._ready) + (len(self.proxy) if self.proxy is not None else 0)
        return max(0, min(self.dispatcher.free_capacity() - len(self._ready),
                          self.quotas.room(self.index) - held, ACCEPT_BATCH))

    def maybe_resume(self) -> None:
        """Watch again if blocked for room and room came back (not during a rate pause)."""
        if self._ready and not self._closed:
            self._admit_ready()
        if self._closed or self._watching or self._paused_until:
            return
        if self._room() > 0:
            self._end_block()
            self._watch()

    def _pause(self, seconds: float, throttle: bool = True) -> None:
        """Stop for a creation-rate throttle (or a lack of descriptors), then resume."""
        self._begin_block("creation_rate" if throttle else "descriptors")
        self._paused_until = time.monotonic() + seconds
        if throttle:
            self.block.words[self._throttle_cell] += self.pauses.add(seconds)
        self.loop.call_later(seconds, self._pause_over)

    def _pause_over(self) -> None:
        self._paused_until = 0.0
        self.maybe_resume()

    # --- accepting ------------------------------------------------------------------------

    def _on_readable(self) -> None:
        room = self._room()
        if room == 0:
            self._begin_block(self._no_room_reason())
            return
        admitted, pause, attempts, taken = [], 0.0, 0, 0
        accept = self.sock._accept  # returns (fd, address) without building a socket object
        now = time.monotonic()
        while taken < room and attempts < MAX_ACCEPTS_PER_WAKEUP:
            try:
                fd, address = accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError as error:
                self._accept_failed(error)
                break
            attempts += 1
            if self.proxy is not None:  # judged once its header says who the client is
                self.proxy.start(fd, address)
                taken += 1
                continue
            entry, delay = self._judge(fd, address, now)
            if entry is not None:
                admitted.append(entry)
                taken += 1
            if delay > 0:
                pause = delay
                break
        self._hand_off(admitted)
        if pause:
            self._pause(pause)
        elif self._room() == 0:
            self._begin_block(self._no_room_reason())

    def _judge(self, fd: int, address: tuple, now: float) -> tuple[tuple | None, float]:
        """Admission of one socket: ((fd, address, conn id) if admitted, else None; the
        creation-rate pause it asks for)."""
        decision = self.quotas.admit(self.index, address[0], now)
        if decision.verdict is Verdict.REJECT_IP_LIMIT:
            if self.refusals is not None:
                self.refusals.start(fd)  # answered, then closed after a delay
            else:
                os.close(fd)
            self.rejected("per_ip_limit", ip=address[0])
            log.debug("listener %s: %s over max.connections.per.ip; closed",
                      self.listener.name, address[0])
            return None, 0.0
        if decision.verdict is Verdict.THROTTLE_IP:
            self.delayed.hold(fd, now + decision.delay)
            self.rejected("per_ip_rate", ip=address[0])
            return None, 0.0
        for reason in decision.would:
            self.shadowed(reason, ip=address[0])
        conn_id = self._next_id()
        self.quotas.opened(conn_id, self.index, address[0])
        if self.events is not None:
            self.events.emit(ConnectionAccepted(listener=self.listener.name, ip=address[0],
                                                port=address[1], conn_id=conn_id))
        return (fd, address, conn_id), decision.delay

    def _hand_off(self, admitted: list) -> None:
        if admitted:
            self.block.words[self._accepted_cell] += len(admitted)
            self.sync_active()
            self.dispatcher.dispatch(self.index, admitted)
            if self.quotas.excess():
                self._over_limit()  # only the protected listener can get here: evict others

    # --- PROXY protocol -------------------------------------------------------------------

    def _header_read(self, fd: int, client: tuple) -> None:
        self._ready.append((fd, client))
        self.maybe_resume()  # judged now; one refused leaves its room to the next socket

    def _admit_ready(self) -> None:
        """Judge the sockets whose header is read, as far as hand-off capacity allows."""
        admitted, pause, now = [], 0.0, time.monotonic()
        while self._ready and len(admitted) < self.dispatcher.free_capacity():
            entry, delay = self._judge(*self._ready.popleft(), now)
            if entry is not None:
                admitted.append(entry)
            pause = max(pause, delay)
        self._hand_off(admitted)
        if pause and not self._paused_until:
            self._pause(pause)

    def _proxy_refused(self, reason: str, ip: str) -> None:
        self.rejected(reason, ip=ip)
        self.maybe_resume()  # its place in the room is free again

    def _accept_failed(self, error: OSError) -> None:
        if error.errno in _OUT_OF_FDS:
            # Out of descriptors: pause instead of spinning on a readable socket.
            log.error("listener %s: accept failed (%s); pausing %.1fs", self.listener.name,
                      os.strerror(error.errno), FD_EXHAUSTION_PAUSE)
            self._pause(FD_EXHAUSTION_PAUSE, throttle=False)
        elif error.errno not in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
            log.warning("listener %s: accept failed: %s", self.listener.name, error)
