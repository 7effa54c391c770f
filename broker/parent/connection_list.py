"""The operator's live view of who is connected: GET /connections and `python -m broker
connections` (Redpanda's `rpk cluster connections list` is the model).

The HTTP thread asks; the parent's loop sends every serving worker (data and control plane)
an ipc.ConnectionsQuery, and merges their ipc.ConnectionsList answers into the top N across
the broker.  Bounds, whatever the number of connections:
- at most MAX_TOP rows per worker and in the answer;
- one listing at a time (a second asker waits up to ASK_TIMEOUT for its turn, then is told
  the view is busy);
- a worker that has not answered within ANSWER_TIMEOUT is named in `unanswered`, and the
  listing is given with the others.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading

import msgspec

from broker.shared import ipc

MAX_TOP = 1000
DEFAULT_TOP = 20
ANSWER_TIMEOUT = 1.0
ASK_TIMEOUT = 3.0


class ListingBusy(RuntimeError):
    """Another listing is still being gathered."""


class ConnectionListing:
    def __init__(self, loop, workers: list, listener_names: list[str]):
        self.loop = loop
        self.workers = workers  # WorkerProcess objects; only serving ones are asked
        self.listener_names = listener_names
        self._turn = threading.Lock()
        self._ids = itertools.count(1)
        self._current: _Gathering | None = None  # touched on the loop only

    # --- the HTTP thread ------------------------------------------------------------------

    def ask(self, top: int = DEFAULT_TOP, by: str = "bytes") -> dict:
        """The listing as a JSON-ready dict; raises ValueError for a bad argument and
        ListingBusy when another one is still being gathered."""
        if by not in ipc.CONNECTION_SORT_KEYS:
            raise ValueError(f"by must be one of {', '.join(ipc.CONNECTION_SORT_KEYS)}")
        if not 1 <= top <= MAX_TOP:
            raise ValueError(f"top must be 1..{MAX_TOP}")
        if not self._turn.acquire(timeout=ASK_TIMEOUT):
            raise ListingBusy("another connection listing is being gathered")
        try:
            done: concurrent.futures.Future = concurrent.futures.Future()
            try:
                self.loop.call_soon_threadsafe(self._start, top, by, done)
            except RuntimeError:  # the loop is closed: the broker is stopping
                raise ListingBusy("the broker is shutting down") from None
            return done.result(timeout=ANSWER_TIMEOUT + ASK_TIMEOUT)
        except concurrent.futures.TimeoutError:  # the parent's loop itself is stuck
            raise ListingBusy("the parent did not gather the listing in time") from None
        finally:
            self._turn.release()

    # --- the parent's loop ------------------------------------------------------------------

    def _start(self, top: int, by: str, done: concurrent.futures.Future) -> None:
        query = ipc.ConnectionsQuery(query=next(self._ids), top=top, by=by)
        gathering = _Gathering(query, done)
        for worker in self.workers:
            if worker.serving and worker.channel is not None:
                try:
                    worker.channel.send(query)
                    gathering.pending[worker.name] = worker
                except OSError:
                    gathering.unanswered.append(worker.name)
        self._current = gathering
        gathering.timer = self.loop.call_later(ANSWER_TIMEOUT, self._finish, gathering)
        if not gathering.pending:
            self._finish(gathering)

    def answered(self, worker, message: ipc.ConnectionsList) -> None:
        gathering = self._current
        if gathering is None or message.query != gathering.query.query:
            return  # a late answer to a listing already given
        if gathering.pending.pop(worker.name, None) is None:
            return
        gathering.totals[worker.name] = message.total
        gathering.rows += [(worker.name, row) for row in message.rows[:gathering.query.top]]
        if not gathering.pending:
            self._finish(gathering)

    def _finish(self, gathering: "_Gathering") -> None:
        if self._current is gathering:
            self._current = None
        if gathering.timer is not None:
            gathering.timer.cancel()
        if not gathering.done.done():
            gathering.unanswered += sorted(gathering.pending)
            gathering.done.set_result(self._answer(gathering))

    def _answer(self, gathering: "_Gathering") -> dict:
        query = gathering.query
        rank = _RANKS[query.by]
        rows = sorted(gathering.rows, key=lambda item: rank(item[1]), reverse=True)[:query.top]
        return {"by": query.by, "top": query.top,
                "connections": sum(gathering.totals.values()),
                "workers": gathering.totals, "unanswered": gathering.unanswered,
                "rows": [self._named(worker, row) for worker, row in rows]}

    def _named(self, worker: str, row: ipc.ConnectionRow) -> dict:
        fields = msgspec.structs.asdict(row)
        index = fields.pop("listener")
        names = self.listener_names
        fields["listener"] = names[index] if 0 <= index < len(names) else str(index)
        fields["worker"] = worker
        return fields


_RANKS = {
    "bytes": lambda row: row.bytes_in + row.bytes_out,
    "requests": lambda row: row.requests,
    "throttle": lambda row: row.throttle_ms,
    "age": lambda row: row.age_s,
}


class _Gathering:
    """One listing being gathered from the workers."""

    def __init__(self, query: ipc.ConnectionsQuery, done: concurrent.futures.Future):
        self.query = query
        self.done = done
        self.pending: dict[str, object] = {}  # worker name -> worker, still to answer
        self.totals: dict[str, int] = {}
        self.rows: list[tuple[str, ipc.ConnectionRow]] = []
        self.unanswered: list[str] = []
        self.timer = None
