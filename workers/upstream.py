"""Front-end mode: a worker's connections to the upstream Kafka nodes.

One `NodePool` per upstream node holds this worker's connections to it (`UpstreamLink`), at
most `pybroker.upstream.max.connections.per.node`.  A request takes an idle link (or opens
one, or waits for one when all are busy), is written to it as it arrived, and the link is
free again once the answer is read.  A link carries one request at a time, because a Kafka
broker serves one request per connection at a time: pipelining several clients' requests on
one link would queue each behind the others' long polls and rebalances.  A client connection
has at most one request upstream at a time (the worker's connection stays muted while its
answer waits), so the order of its requests - and its idempotent producer's sequences - is
the order they reach the node, and the client's correlation id goes upstream unchanged.

So N client connections cost this worker as many links to a node as there are requests in
flight to that node at once, up to the cap; idle links close after `pybroker.upstream.idle.ms`
(below Kafka's connections.max.idle.ms, so the front-end closes first).  A link lost with a
request on it fails that request with `UpstreamUnavailable`: the client's connection closes
(reason upstream), as a direct client's would when its broker went away.

`Upstream` holds the pools of every node in the parent's UpstreamView, and which node a
connection on a listener's own port (the bootstrap port) is pinned to.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections import deque
from typing import Callable

from broker.shared import ipc
from broker.shared.protocol.client_codec import decode_response
from broker.shared.protocol.codec import throttle_field_at
from broker.shared.upstream_security import UpstreamSecurity

log = logging.getLogger("workers.upstream")

_SIZE = struct.Struct(">i")
HEAD_BYTES = 16 * 1024  # an answer this size or smaller is read whole into the link's buffer
MAX_ANSWER_BYTES = 256 << 20  # an upstream answer claiming more closes the link
DOWN_SECONDS = 2.0  # a node that refused a connection is skipped for bootstraps this long


class UpstreamUnavailable(Exception):
    """The upstream node cannot answer this request: the client's connection closes."""

    reason = "upstream"


class UpstreamLink(asyncio.BufferedProtocol):
    """One connection to an upstream node, one request at a time."""

    def __init__(self, pool: NodePool):
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.idle_since = time.monotonic()
        self._head = bytearray(HEAD_BYTES)
        self._head_view = memoryview(self._head)
        self._answer: bytearray | None = None  # a large answer, read into its own buffer
        self._answer_view: memoryview | None = None
        self._got = 0
        self._future: asyncio.Future | None = None
        self._finish: Callable | None = None
        self._correlation = b""
        self.ready = False  # authenticated (if need be) and in its pool
        self.expires_at = float("inf")  # monotonic: its SASL session ends (KIP-368)
        self._throttle_at = 0  # where the answer's throttle_time_ms lies, 0: not read
        self._produce = 0  # a Produce's version + 1 (its throttle follows the topics), or 0
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.lost = False

    def send(self, request, future: asyncio.Future, finish: Callable,
             deadline: float) -> None:
        """Write a request frame (without its size); `future` gets `finish(answer)`, the
        answer size-prefixed, or the error `finish` raised.  No answer within `deadline`
        seconds aborts the link (its request fails)."""
        self._future, self._finish = future, finish
        self._correlation = bytes(request[4:8])
        api_key, version = request[0] << 8 | request[1], request[2] << 8 | request[3]
        self._produce = version + 1 if api_key == 0 else 0
        try:
            self._throttle_at = throttle_field_at(api_key, version)
        except Exception:  # noqa: BLE001 - a version kio does not know: no throttle is read
            self._throttle_at = 0
        self._deadline = self.pool.loop.call_later(deadline, self._overdue, deadline)
        future.add_done_callback(self._abandoned)
        self.transport.writelines((_SIZE.pack(len(request)), request))

    def ask(self, request) -> asyncio.Future:
        """A size-prefixed request of the front-end's own (SASL): a Future of its answer."""
        future = self.pool.loop.create_future()
        self.send(memoryview(request)[4:], future, bytes, self.pool.connect_timeout)
        return future

    def _overdue(self, seconds: float) -> None:
        self._deadline = None
        log.warning("upstream node %d: no answer within %.0f s; closing that connection",
                    self.pool.node_id, seconds)
        self.transport.abort()

    def _abandoned(self, future: asyncio.Future) -> None:
        """The client went away with its request upstream: the link, which would stay busy
        until the node answers (a long poll, a rebalance), is closed instead."""
        if future.cancelled() and self._future is future:
            self.transport.abort()

    def get_buffer(self, sizehint: int):
        if self._answer_view is not None:
            return self._answer_view[self._got:]
        return self._head_view[self._got:]

    def buffer_updated(self, nbytes: int) -> None:
        self._got += nbytes
        if self._answer is not None:
            if self._got == len(self._answer):
                self._deliver(self._answer)
            return
        if self._got < 4:
            return
        size = _SIZE.unpack_from(self._head, 0)[0]
        if size < 4 or size > MAX_ANSWER_BYTES or self._future is None:
            self._broken(f"an answer of {size} bytes" if self._future is not None
                         else "an answer to no request")
            return
        total = 4 + size
        if self._got > total:
            self._broken("more bytes than its one answer")
        elif self._got == total:
            self._deliver(bytes(self._head_view[:total]))
        elif total > HEAD_BYTES:  # the rest is read straight into the answer's own buffer
            self._answer = bytearray(total)
            self._answer[:self._got] = self._head_view[:self._got]
            self._answer_view = memoryview(self._answer)

    def _deliver(self, answer) -> None:
        future, finish = self._future, self._finish
        self._future = self._finish = self._answer = self._answer_view = None
        self._got = 0
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if answer[4:8] != self._correlation:
            self._broken("an answer to another request")
            if not future.done():
                future.set_exception(UpstreamUnavailable(
                    f"upstream node {self.pool.node_id} answered another request"))
            return
        if self.ready:
            held = self._upstream_throttle(answer)
            if held:  # Kafka mutes a throttled connection (KIP-219): so is the link, here
                self.pool.loop.call_later(held, self.pool.release_held, self)
            else:
                self.pool.release(self)
        if future.done():  # the client went away meanwhile
            return
        try:
            future.set_result(finish(answer))
        except Exception as error:  # noqa: BLE001 - the client's connection hears of it
            future.set_exception(error)

    def _upstream_throttle(self, answer) -> float:
        """Seconds the upstream throttled this link for (0: none, or not where it is read)."""
        at = self._throttle_at
        if at and len(answer) >= at + 4:
            return max(0, _SIZE.unpack_from(answer, at)[0]) / 1000
        if self._produce:  # a Produce answer: its throttle follows the topics
            try:
                body = decode_response(0, self._produce - 1, answer)[1]
            except Exception:  # noqa: BLE001 - the client's own decode reports it
                return 0.0
            return max(0.0, body.throttle_time.total_seconds())
        return 0.0

    def _broken(self, what: str) -> None:
        log.warning("upstream node %d sent %s; closing that connection", self.pool.node_id, what)
        self.transport.abort()

    def connection_lost(self, exc) -> None:
        self.lost = True
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self.pool.lost(self)
        future, self._future = self._future, None
        if future is not None and not future.done():
            future.set_exception(UpstreamUnavailable(
                f"upstream node {self.pool.node_id} closed the connection with a request on it"
                + (f" ({exc})" if exc else "")))

    @property
    def busy(self) -> bool:
        return self._future is not None


class NodePool:
    """This worker's links to one upstream node."""

    def __init__(self, loop: asyncio.AbstractEventLoop, node: ipc.UpstreamNode, cap: int,
                 connect_timeout: float, security: UpstreamSecurity):
        self.loop = loop
        self.security = security
        self.node_id = node.node_id
        self.address = (node.host, node.port)
        self.cap = cap
        self.connect_timeout = connect_timeout
        self.links: set[UpstreamLink] = set()
        self._idle: list[UpstreamLink] = []  # the most recently used last: few stay warm
        self._opening = 0
        self._waiting: deque = deque()  # (request, future, finish) waiting for a free link
        self.down_until = 0.0  # monotonic: a connection was refused; bootstraps skip it
        self.closed = False
        self.requests = 0  # sent (or queued to be), for the metrics
        self.failures = 0  # failed for the upstream

    def request(self, request, finish: Callable, deadline: float) -> asyncio.Future:
        """Send a request frame (without its size prefix) to the node; a Future of
        `finish(answer)`; no answer within `deadline` seconds closes the link."""
        future = self.loop.create_future()
        self.requests += 1
        future.add_done_callback(self._settled)
        link = self._idle_link()
        if link is not None:
            link.send(request, future, finish, deadline)
        elif len(self.links) + self._opening < self.cap:
            self._open((request, future, finish, deadline))
        else:
            self._waiting.append((request, future, finish, deadline))
        return future

    def _idle_link(self) -> UpstreamLink | None:
        """The most recently used idle link whose SASL session has time left."""
        now = time.monotonic()
        while self._idle:
            link = self._idle.pop()
            if link.expires_at > now:
                return link
            self.links.discard(link)  # re-authenticating it would cost as much as a new one
            link.transport.close()
        return None

    def _settled(self, future: asyncio.Future) -> None:
        if future.cancelled():  # a client gone while its request waited for a link
            waiting = self._waiting
            for index, item in enumerate(waiting):
                if item[1] is future:
                    del waiting[index]
                    break
        elif isinstance(future.exception(), UpstreamUnavailable):
            self.failures += 1

    def _open(self, item: tuple) -> None:
        """A new link for `item` (request, future, finish, deadline)."""
        self._opening += 1
        task = self.loop.create_task(asyncio.wait_for(self._connect(), self.connect_timeout))
        task.add_done_callback(lambda done: self._opened(done, item))

    async def _connect(self) -> UpstreamLink:
        """A new link, connected (and authenticated) within the connect timeout."""
        host, port = self.address
        _, link = await self.loop.create_connection(
            lambda: UpstreamLink(self), host, port, **self.security.connection_options(host))
        try:
            lifetime = await self.security.authenticate(link.ask)
        except BaseException:
            link.transport.abort()
            raise
        if lifetime:  # retired before the upstream would close it (KIP-368)
            link.expires_at = time.monotonic() + lifetime * 0.9
        return link

    def _opened(self, task: asyncio.Task, item: tuple) -> None:
        self._opening -= 1
        request, future, finish, deadline = item
        error = task.exception() if not task.cancelled() else asyncio.CancelledError()
        if error is None and task.result().lost:  # closed before it could be used
            error = ConnectionResetError("closed by the node as it was made")
        if error is not None or self.closed:
            if self.closed and error is None:
                task.result().transport.close()
            self.down_until = time.monotonic() + DOWN_SECONDS
            failure = UpstreamUnavailable(
                f"upstream node {self.node_id} at {self.address[0]}:{self.address[1]}: "
                + (repr(error) if error is not None else "left the cluster"))
            _fail(future, failure)
            if not self.links and not self._opening:  # nothing will ever free a link
                while self._waiting:
                    _fail(self._waiting.popleft()[1], failure)
            return
        link = task.result()
        link.ready = True
        self.links.add(link)
        if future.done():  # the client went away while the link was being made
            self.release(link)
        else:
            link.send(request, future, finish, deadline)

    def release(self, link: UpstreamLink) -> None:
        """A link's answer arrived: the next waiting request takes it, or it idles."""
        now = time.monotonic()
        if link.expires_at <= now:
            self.links.discard(link)
            link.transport.close()
            if self._waiting and len(self.links) + self._opening < self.cap:
                self._open(self._waiting.popleft())
            return
        while self._waiting:
            request, future, finish, deadline = self._waiting.popleft()
            if not future.done():
                link.send(request, future, finish, deadline)
                return
        link.idle_since = now
        self._idle.append(link)

    def release_held(self, link: UpstreamLink) -> None:
        """A link the upstream throttled: back in use once its throttle is over, if alive."""
        if link in self.links and not link.transport.is_closing():
            self.release(link)

    def lost(self, link: UpstreamLink) -> None:
        self.links.discard(link)
        if link in self._idle:
            self._idle.remove(link)
        while (self._waiting and not self.closed  # a waiting request takes the freed place
               and len(self.links) + self._opening < self.cap):
            item = self._waiting.popleft()
            if not item[1].done():
                self._open(item)
                return

    def close_idle(self, before: float) -> int:
        """Close the links idle since before `before` (monotonic); how many."""
        stale = [link for link in self._idle if link.idle_since < before]
        for link in stale:
            self._idle.remove(link)
            self.links.discard(link)
            link.transport.close()
        return len(stale)

    def close(self) -> None:
        self.closed = True
        for link in list(self.links):
            link.transport.close()
        while self._waiting:
            _fail(self._waiting.popleft()[1], UpstreamUnavailable(
                f"upstream node {self.node_id} left the cluster"))

    @property
    def down(self) -> bool:
        return self.down_until > time.monotonic()


def _fail(future: asyncio.Future, error: Exception) -> None:
    if not future.done():
        future.set_exception(error)


class Upstream:
    """The upstream cluster as this worker knows it: the parent's view and a pool per node."""

    def __init__(self, loop: asyncio.AbstractEventLoop, cap: int, connect_timeout: float,
                 idle_seconds: float, security: UpstreamSecurity):
        self.loop = loop
        self.security = security
        self.cap = cap
        self.connect_timeout = connect_timeout
        self.idle_seconds = idle_seconds
        self.view: ipc.UpstreamView | None = None
        self.pools: dict[int, NodePool] = {}
        self._turn = 0
        self._gone_requests = self._gone_failures = 0  # of pools closed (nodes gone, moved)

    def update(self, view: ipc.UpstreamView) -> None:
        """A new view from the parent: pools for new nodes, moved or departed ones closed."""
        self.view = view
        nodes = {node.node_id: node for node in view.nodes}
        for node_id, pool in list(self.pools.items()):
            node = nodes.get(node_id)
            if node is None or (node.host, node.port) != pool.address:
                pool.close()
                del self.pools[node_id]
                self._gone_requests += pool.requests
                self._gone_failures += pool.failures
        for node_id, node in nodes.items():
            if node_id not in self.pools:
                self.pools[node_id] = NodePool(self.loop, node, self.cap, self.connect_timeout,
                                               self.security)

    def bootstrap_node(self) -> int | None:
        """The node a new bootstrap connection is pinned to: the next in turn that did not
        refuse a connection lately (any, if all did); None before the first view."""
        if not self.pools:
            return None
        nodes = sorted(self.pools)
        self._turn += 1
        ordered = nodes[self._turn % len(nodes):] + nodes[:self._turn % len(nodes)]
        for node_id in ordered:
            if not self.pools[node_id].down:
                return node_id
        return ordered[0]

    def close_idle(self) -> int:
        before = time.monotonic() - self.idle_seconds
        return sum(pool.close_idle(before) for pool in self.pools.values())

    def counts(self) -> tuple[int, int, int]:
        """(links open, requests sent, requests failed) over every node, for the metrics;
        the totals of pools closed since are kept."""
        pools = self.pools.values()
        return (sum(len(pool.links) for pool in pools),
                self._gone_requests + sum(pool.requests for pool in pools),
                self._gone_failures + sum(pool.failures for pool in pools))

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()
