"""The parent's HTTP endpoint on `prometheus.listen`: `/metrics` (the shared block's counters,
broker.parent.metrics) and `/connections` (who is connected now, broker.parent.connection_list).

    GET /metrics                               Prometheus exposition
    GET /connections?top=N&by=bytes|requests|throttle|age
                                               JSON: the top N connections across all workers

Bounded whatever the peers do, in a fixed number of threads: one event loop of its own (so a
busy parent loop never delays a scrape) reads the requests, and each route builds its answers
on one thread of its own (a listing waits on the parent's loop; a scrape must not wait
behind it).  A connection carries one request, answered and closed (as HTTP/1.0).
- A request head not whole within READ_TIMEOUT, or larger than MAX_HEAD_BYTES, is closed.
- At most MAX_CONNECTIONS are open: one more drops the oldest still sending its request (idle
  or slow sockets cannot keep a scraper out), else the oldest whose answer is not taken.
- At most MAX_WAITING answers wait per route; more are answered 503.
- An answer not taken by the peer within WRITE_TIMEOUT is dropped.
Each drop is counted in `broker_status_http_dropped_total{reason}`.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import queue
import socket
import threading
import time
import urllib.parse
from typing import Callable

import uvloop
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from broker.parent.connection_list import DEFAULT_TOP, ConnectionListing, ListingBusy
from broker.parent.http_head import BadRequest, environ_of, head_end

log = logging.getLogger("broker.parent.status_http")

READ_TIMEOUT = 5.0
WRITE_TIMEOUT = 10.0
MAX_CONNECTIONS = 64
MAX_HEAD_BYTES = 8192
MAX_WAITING = 4
BACKLOG = 512  # a burst of connects waits in the kernel, not as dropped SYNs
DROP_REASONS = ("read_timeout", "connection_cap", "too_large", "bad_request", "busy",
                "write_timeout")
_LOG_EVERY = 60.0  # drops are logged at most this often, with their counts

Answer = tuple[str, list[tuple[str, str]], bytes]  # status, headers, body


def _json(start_response, status: str, body: dict) -> list[bytes]:
    data = json.dumps(body, indent=1).encode()
    start_response(status, [("Content-Type", "application/json"),
                            ("Content-Length", str(len(data)))])
    return [data]


def _connections_app(listing: ConnectionListing):
    def app(environ, start_response):
        query = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""))
        try:
            top = int(query.get("top", [DEFAULT_TOP])[0])
            return _json(start_response, "200 OK",
                         listing.ask(top, query.get("by", ["bytes"])[0]))
        except ValueError as error:
            return _json(start_response, "400 Bad Request", {"error": str(error)})
        except ListingBusy as error:
            return _json(start_response, "503 Service Unavailable", {"error": str(error)})

    return app


def _is_listing(environ: dict) -> bool:
    return environ["PATH_INFO"].rstrip("/") == "/connections"


def serve_status(host: str, port: int, collectors: list,
                 listing: ConnectionListing) -> "StatusServer":
    """Start the endpoint; its bound port is `.port`."""
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    routes = {"metrics": make_wsgi_app(registry), "connections": _connections_app(listing)}
    server = StatusServer(host, port, routes,
                          lambda environ: "connections" if _is_listing(environ) else "metrics")
    registry.register(_ServerCollector(server))
    server.start()
    return server


def _run_app(app, environ: dict) -> Answer:
    """A WSGI app's answer, gathered whole; a failing app is a 500, never a dead thread."""
    started: list = []
    try:
        body = b"".join(app(environ, lambda status, headers: started.extend((status, headers))))
        return started[0], list(started[1]), body
    except Exception:
        log.exception("status endpoint: %s %s failed", environ.get("REQUEST_METHOD"),
                      environ.get("PATH_INFO"))
        return "500 Internal Server Error", [], b""


class _Route:
    """One kind of answer, built on a daemon thread of its own, in arrival order."""

    def __init__(self, name: str, app, loop: asyncio.AbstractEventLoop):
        self.app = app
        self.loop = loop
        self.waiting = 0  # touched on the loop only
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"status-http-{name}",
                                        daemon=True)  # a slow answer never holds shutdown

    def start(self) -> None:
        self._thread.start()

    def submit(self, environ: dict, done: Callable[[Answer], None]) -> bool:
        """Queue an answer; False if MAX_WAITING are already waiting."""
        if self.waiting >= MAX_WAITING:
            return False
        self.waiting += 1
        self._queue.put((environ, done))
        return True

    def stop(self) -> None:
        self._queue.put(None)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            environ, done = item
            answer = _run_app(self.app, environ)
            try:
                self.loop.call_soon_threadsafe(self._answered, done, answer)
            except RuntimeError:  # the loop is closed: the endpoint stopped
                return

    def _answered(self, done: Callable[[Answer], None], answer: Answer) -> None:
        self.waiting -= 1
        done(answer)


class _Exchange(asyncio.Protocol):
    """One connection: its request head read within READ_TIMEOUT, answered once, closed."""

    def __init__(self, server: "StatusServer"):
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.reading = True  # then its answer is being built, then written
        self.writing = False
        self._head = bytearray()
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self._timer = self.server.loop.call_later(READ_TIMEOUT, self._read_expired)
        self.server.opened(self)

    def data_received(self, data: bytes) -> None:
        if not self.reading:
            return  # a body or a second request: never read, the answer closes
        seen = max(0, len(self._head) - 3)  # the blank line may straddle two reads
        self._head += data[:MAX_HEAD_BYTES + 4 - len(self._head)]  # never more is kept
        end = head_end(memoryview(self._head)[seen:])
        if end < 0 and len(self._head) <= MAX_HEAD_BYTES:
            return
        if end < 0 or seen + end > MAX_HEAD_BYTES:
            self.refuse("431 Request Header Fields Too Large", "too_large")
            return
        head = bytes(self._head[:seen + end])
        self._stop_reading()
        self.server.dispatch(self, head)

    def eof_received(self) -> bool:
        return not self.reading  # half-closed after its request: the answer still goes out

    def connection_lost(self, exc) -> None:
        self.reading = self.writing = False
        if self._timer is not None:
            self._timer.cancel()
        self.server.closed(self)

    def _stop_reading(self) -> None:
        self.reading = False
        self._head = bytearray()
        self._timer.cancel()
        self.transport.pause_reading()

    def _read_expired(self) -> None:
        self.drop("read_timeout")

    def drop(self, reason: str) -> None:
        """Close without an answer."""
        self.server.count_drop(reason)
        self.server.closed(self)  # its place is free now, not when the loop says it is gone
        self.reading = self.writing = False
        self.transport.abort()

    def refuse(self, status: str, reason: str) -> None:
        """Answer an error status and close."""
        self.server.count_drop(reason)
        if self.reading:
            self._stop_reading()
        self.respond((status, [("Content-Type", "text/plain")], status.encode() + b"\n"))

    def respond(self, answer: Answer) -> None:
        if self.transport.is_closing():
            return  # the peer left while its answer was built
        status, headers, body = answer
        lines = [f"HTTP/1.0 {status}", f"Date: {email.utils.formatdate(usegmt=True)}",
                 "Server: pybroker", "Connection: close"]
        lines += [f"{name}: {value}" for name, value in headers
                  if name.lower() != "content-length"]
        lines.append(f"Content-Length: {len(body)}")
        self.transport.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        self.transport.close()  # once written
        self.writing = True
        self._timer = self.server.loop.call_later(WRITE_TIMEOUT, self._write_expired)

    def _write_expired(self) -> None:
        self.drop("write_timeout")


class StatusServer:
    """The endpoint: a listening socket, an event loop on a thread, one thread per route."""

    def __init__(self, host: str, port: int, apps: dict, choose: Callable[[dict], str]):
        self.host = host
        self.loop = uvloop.new_event_loop()
        self._choose = choose  # environ -> the name of the route that answers it
        self.routes = {name: _Route(name, app, self.loop) for name, app in apps.items()}
        self.sock = self._bind(host, port)
        self.port = self.sock.getsockname()[1]
        self.open: dict[_Exchange, None] = {}  # in arrival order; touched on the loop only
        self.dropped = dict.fromkeys(DROP_REASONS, 0)
        self._logged_at, self._logged = 0.0, dict(self.dropped)
        self._server: asyncio.AbstractServer | None = None
        self._thread = threading.Thread(target=self._serve, name="status-http", daemon=True)

    @staticmethod
    def _bind(host: str, port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(BACKLOG)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        return sock

    def start(self) -> None:
        for route in self.routes.values():
            route.start()
        self._thread.start()

    def close(self) -> None:
        """Stop serving: the listening socket and every connection closed, threads told."""
        try:
            self.loop.call_soon_threadsafe(self._stop)
        except RuntimeError:
            pass  # the loop already stopped
        self._thread.join(timeout=5)
        for route in self.routes.values():
            route.stop()

    # --- the endpoint's loop ------------------------------------------------------------

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self._server = self.loop.run_until_complete(self.loop.create_server(
                lambda: _Exchange(self), sock=self.sock, backlog=BACKLOG))
            self.loop.run_forever()
        finally:
            self.loop.close()

    def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for exchange in list(self.open):
            exchange.transport.abort()
        self.loop.stop()

    def opened(self, exchange: _Exchange) -> None:
        if len(self.open) >= MAX_CONNECTIONS:
            self._droppable(exchange).drop("connection_cap")
        if exchange.reading:
            self.open[exchange] = None

    def _droppable(self, newest: _Exchange) -> _Exchange:
        """Who makes room: the oldest still sending its request, else the oldest whose
        answer is not being taken, else (all answers are being built) the newest."""
        for waiting in (lambda other: other.reading, lambda other: other.writing):
            oldest = next((other for other in self.open if waiting(other)), None)
            if oldest is not None:
                return oldest
        return newest

    def closed(self, exchange: _Exchange) -> None:
        self.open.pop(exchange, None)

    def dispatch(self, exchange: _Exchange, head: bytes) -> None:
        """A whole request head: hand it to its route."""
        try:
            environ = environ_of(head, (self.host, self.port),
                                 exchange.transport.get_extra_info("peername"))
        except BadRequest as error:
            exchange.refuse(error.status, "bad_request")
            return
        if not self.routes[self._choose(environ)].submit(environ, exchange.respond):
            exchange.refuse("503 Service Unavailable", "busy")

    def count_drop(self, reason: str) -> None:
        self.dropped[reason] += 1
        now = time.monotonic()
        if now - self._logged_at >= _LOG_EVERY:
            since = {r: n - self._logged[r] for r, n in self.dropped.items() if n > self._logged[r]}
            log.warning("status endpoint on port %d dropped connections: %s", self.port,
                        ", ".join(f"{reason} {count}" for reason, count in since.items()))
            self._logged_at, self._logged = now, dict(self.dropped)


class _ServerCollector:
    """The endpoint's own numbers, in its exposition."""

    def __init__(self, server: StatusServer):
        self.server = server

    def collect(self):
        open_now = GaugeMetricFamily("broker_status_http_connections",
                                     "Connections open to the metrics endpoint")
        open_now.add_metric([], len(self.server.open))
        yield open_now
        dropped = CounterMetricFamily(
            "broker_status_http_dropped",
            "Metrics endpoint connections closed by its bounds (read_timeout, connection_cap, "
            "too_large, bad_request, busy: answered 503, write_timeout)", labels=["reason"])
        for reason, count in list(self.server.dropped.items()):
            dropped.add_metric([reason], count)
        yield dropped
