"""Requests workers forward to the parent (IPC `ForwardedRequest`): `ForwardedRouter` takes each
to the service the API table names (broker.shared.apis) - the group coordinator
(broker.parent.groups), the transaction coordinator (broker.parent.transactions) or the admin
service (broker.parent.admin) - and sends the answer back on the worker's channel when it is
ready (a JoinGroup waits for its rebalance); it also tells workers the client quotas after
every change.  `decode_forwarded` decodes a request for the service that answers it, and
`ResponseBudget` bounds the answer it gets.

`ResponseBudget` is what one answer may take: at most pybroker.forwarded.response.max.bytes
and pybroker.request.max.entries entries.  Services charge each entry before they build it,
so a small request that asks for a huge answer (a group named 10,000 times, every key of every
config resource) is refused before the parent spends time or memory on it:
`ResponseTooLarge`, and the connection that asked is closed.  `ForwardedRouter` checks every
answer's size once more when it is done, which covers the answers nothing estimates (a
JoinGroup's member list, the transaction APIs).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from broker.parent.worker_process import WorkerProcess
from broker.shared import ipc
from broker.shared.acl import canonical_host
from broker.shared.apis import API_NAMES, GROUP_KEYS, TRANSACTION_KEYS, api_key_of
from broker.shared.config import ServerProperties
from broker.shared.protocol.codec import REQUEST_PREFIX, request_readers
from broker.shared.protocol.context import RequestContext

if TYPE_CHECKING:
    from broker.parent.admin import AdminService
    from broker.parent.dynamic import DynamicConfig

log = logging.getLogger("broker.parent.forwarded")
RESPONSE_TOO_LARGE = "response_too_large"  # the invalid-request reason of a refused answer
ENTRY_BYTES = 16  # what an answer's entry takes at least besides its strings and blobs


def decode_forwarded(request: bytes, listener: int, peer: str, user: str):
    """(RequestContext, body) of a forwarded frame; `peer` is the client's "ip:port", `user`
    its principal's name.  The worker decoded it once already, so it decodes."""
    api_key, version, _ = REQUEST_PREFIX.unpack_from(request, 0)
    header_reader, body_reader = request_readers(api_key, version)
    header, offset = header_reader(request, 0)
    body, _ = body_reader(request, offset)
    host = canonical_host(peer.rpartition(":")[0] or peer)
    return RequestContext(request[4:8], api_key, version, listener, header, user, host), body


class ResponseTooLarge(Exception):
    """An answer past its budget: it is not built, and the connection that asked is closed."""

    def __init__(self, what: str):
        super().__init__(what)


class ResponseBudget:
    """The bytes and entries one answer may still take; `charge` before building an entry."""

    __slots__ = ("max_bytes", "max_entries", "bytes", "entries")

    def __init__(self, max_bytes: int, max_entries: int):
        if max_bytes <= 0 or max_entries <= 0:
            raise ValueError(f"a response budget needs room: {max_bytes} bytes, "
                             f"{max_entries} entries")
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self.bytes = self.entries = 0

    def charge(self, nbytes: int, entries: int = 1) -> None:
        """Count an entry of about `nbytes` (ENTRY_BYTES are added for each entry); raise
        ResponseTooLarge past either bound."""
        self.bytes += nbytes + ENTRY_BYTES * entries
        self.entries += entries
        if self.bytes > self.max_bytes:
            raise ResponseTooLarge(f"the answer would take more than {self.max_bytes} bytes "
                                   f"(pybroker.forwarded.response.max.bytes)")
        if self.entries > self.max_entries:
            raise ResponseTooLarge(f"the answer would hold more than {self.max_entries} "
                                   f"entries (pybroker.request.max.entries)")


def budget_of(props: ServerProperties | None = None) -> ResponseBudget:
    """A fresh budget for one answer, from the broker's settings (None: the defaults)."""
    props = props or _DEFAULTS
    return ResponseBudget(props.pybroker_forwarded_response_max_bytes,
                          props.pybroker_request_max_entries)


_DEFAULTS = ServerProperties()


class ForwardedRouter:
    """Forwarded requests to their parent service, answers back to the worker that asked.

    No answer is larger than pybroker.forwarded.response.max.bytes, and none goes to a worker
    whose channel already holds ipc.CLIENT_QUEUED_BYTES: such a request is refused instead
    (the worker closes its connection, invalid reason response_too_large), so one client
    can neither hold the parent's loop with one answer nor break the channel that carries
    every other client of its worker."""

    def __init__(self, admin: AdminService, groups, transactions, dynamic: DynamicConfig):
        self.admin = admin
        self.groups = groups  # broker.parent.groups.coordinator.GroupCoordinator
        self.transactions = transactions  # broker.parent.transactions.coordinator
        self.dynamic = dynamic
        self.max_bytes = admin.dynamic.config.props.pybroker_forwarded_response_max_bytes

    def serve(self, worker: WorkerProcess, message: ipc.ForwardedRequest) -> None:
        started = time.perf_counter_ns()
        refusal = None
        try:
            service = self.service_for(api_key_of(message.frame))
            answer = service.handle(message.frame, message.listener, message.peer, message.user)
        except ResponseTooLarge as error:  # refused before it was built
            answer, refusal = None, str(error)
        except Exception:  # a malformed forwarded request costs that connection only
            log.exception("forwarded request from %s failed", worker.name)
            answer = None
        busy = time.perf_counter_ns() - started
        channel = worker.channel
        if isinstance(answer, asyncio.Future):  # a JoinGroup or SyncGroup waiting
            answer.add_done_callback(lambda done: self._answer(
                worker, channel, message, None if done.cancelled() else done.result(), busy))
            return
        self._answer(worker, channel, message, answer, busy, refusal)

    def service_for(self, api_key: int):
        if api_key in GROUP_KEYS:
            return self.groups
        return self.transactions if api_key in TRANSACTION_KEYS else self.admin

    def _answer(self, worker: WorkerProcess, channel, request: ipc.ForwardedRequest, answer,
                busy: int, refusal: str | None = None) -> None:
        if channel is None or worker.channel is not channel:
            return  # the worker that asked is gone, and the connection with it
        if answer is not None and len(answer) > self.max_bytes:
            answer, refusal = None, (f"the answer takes {len(answer)} bytes, more than "
                                     f"pybroker.forwarded.response.max.bytes {self.max_bytes}")
        elif answer is not None and not channel.has_room(len(answer)):
            answer, refusal = None, (f"the channel to {worker.name} holds "
                                     f"{channel.pending()} bytes already")
        response = ipc.ForwardedResponse(request_id=request.request_id, frame=answer, busy_ns=busy)
        if refusal is not None:
            api = API_NAMES.get(api_key_of(request.frame), "?")
            log.warning("%s from %s (%s) refused: %s; closing its connection", api,
                        request.peer, request.user, refusal)
            response = ipc.ForwardedResponse(request_id=request.request_id, frame=None,
                                         busy_ns=busy, refused=RESPONSE_TOO_LARGE,
                                         detail=f"{api}: {refusal}")
        try:
            channel.send(response)
        except OSError:
            pass  # the worker is gone, and the connection that asked with it

    def send_quotas(self, worker: WorkerProcess) -> None:
        """The client quotas in force, to one worker (after a change, or when it starts)."""
        quotas = ipc.Quotas(entries=self.dynamic.stored.client_quotas,
                            shadow=self.dynamic.value("pybroker.shadow.client.quotas")[0]
                            == "true")
        try:
            worker.channel.send(quotas)
        except OSError:
            pass  # a dead worker gets them again when it is respawned
