"""Host names of `max.connections.per.ip.overrides`, resolved off the parent's event loop.

`getaddrinfo` can block for seconds (a slow or dead DNS server) and has no timeout, so the
parent never calls it on its loop after start-up: `lookup` answers from a cache and, for a name
not resolved yet or resolved more than REFRESH_SECONDS ago, asks a background thread.  When an
answer arrives, `on_change` is called on the loop (the connection limits are re-applied).  An
override whose host is not resolved yet, or does not resolve, does not apply meanwhile; a
lookup slower than SLOW_SECONDS is logged.  The cache holds the names the config mentions, and
forgets the ones it no longer does.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from broker.shared.overrides import resolve_now

log = logging.getLogger("broker.parent.resolver")

REFRESH_SECONDS = 60.0
SLOW_SECONDS = 2.0


class HostResolver:
    def __init__(self, loop=None, on_change=None):
        self._loop = loop
        self.on_change = on_change  # called on the loop when an answer changed something
        self._cache: dict[str, tuple[list, float]] = {}  # host -> (networks, resolved at)
        self._pending: set[str] = set()
        # One daemon thread: a lookup stuck in getaddrinfo must not hold up the broker's exit.
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="resolver", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._queue.put(None)

    def _serve(self) -> None:  # on the resolver thread
        while (host := self._queue.get()) is not None:
            self._resolve(host)

    def prime(self, hosts) -> None:
        """Resolve now, blocking (start-up, before the loop serves)."""
        for host in hosts:
            try:
                self._cache[host] = (resolve_now(host), time.monotonic())
            except OSError as error:
                log.error("cannot resolve host %s of max.connections.per.ip.overrides: %s",
                          host, error)
                self._cache[host] = ([], time.monotonic())

    def lookup(self, host: str) -> list | None:
        """The networks known for `host` (None if never resolved yet); refreshes in the
        background when the answer is old."""
        found = self._cache.get(host)
        if (found is None or time.monotonic() - found[1] > REFRESH_SECONDS) and \
                self._loop is not None and host not in self._pending:
            self._pending.add(host)
            self._queue.put(host)
        return None if found is None else found[0]

    def keep_only(self, hosts: set[str]) -> None:
        for host in [name for name in self._cache if name not in hosts]:
            del self._cache[host]

    def _resolve(self, host: str) -> None:  # on the resolver thread
        started = time.monotonic()
        try:
            networks = resolve_now(host)
        except OSError as error:
            log.error("cannot resolve host %s of max.connections.per.ip.overrides: %s; its "
                      "override does not apply", host, error)
            networks = []
        took = time.monotonic() - started
        if took > SLOW_SECONDS:
            log.warning("resolving %s took %.1fs (off the event loop)", host, took)
        try:
            self._loop.call_soon_threadsafe(self._resolved, host, networks)
        except RuntimeError:
            pass  # the loop is closed: the broker is stopping

    def _resolved(self, host: str, networks: list) -> None:  # on the loop
        self._pending.discard(host)
        before = self._cache.get(host)
        self._cache[host] = (networks, time.monotonic())
        if (before is None or before[0] != networks) and self.on_change is not None:
            self.on_change()
