"""Requests a worker forwards to the parent, which serves them (configs, quotas, ACLs, groups,
transactions: the API table says which), and their answers coming back.

`Forwarder.forward` sends the raw frame as an IPC `ForwardedRequest` and returns a Future of its
answer: an `Answer` (workers.answer) carrying the parent's handling time, charged by the router
to the client's request quota as if it had been spent here.  A change refused on a data
listener is answered at once, without a trip to the parent; a request the channel has no room
for is refused (its connection closes) rather than queued past what the channel can hold.
"""

from __future__ import annotations

import asyncio

from broker.shared import ipc
from broker.shared.apis import API_NAMES, REFUSED_ON_DATA_LISTENERS, api_key_of
from broker.shared.protocol.refusal import refuse_change
from workers.answer import Answer
from workers.router import InvalidRequest


class Forwarder:
    """The forwarded requests of one worker that wait for the parent's answer."""

    def __init__(self, channel: ipc.Channel, may_alter):
        self.channel = channel
        self.may_alter = may_alter  # (listener index) -> whether changes are served there
        self._ids = 0
        self._waiting: dict[int, asyncio.Future] = {}  # request id -> the answer's future

    def forward(self, request, listener: int, peer: str, user: str = "ANONYMOUS"
                ) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        api_key = api_key_of(request)
        if api_key in REFUSED_ON_DATA_LISTENERS and not self.may_alter(listener):
            future.set_result(refuse_change(request, listener))  # no trip to the parent
            return future
        if not self.channel.has_room(len(request)):
            # Queued, it could fill the channel past what breaks it, which would take every
            # client of this worker: the one request is refused instead.
            future.set_exception(InvalidRequest("forward_backlog", (
                f"{API_NAMES.get(api_key, api_key)}: {len(request)} bytes to forward, "
                f"{self.channel.pending()} wait for the parent already")))
            return future
        self._ids += 1
        self._waiting[self._ids] = future
        try:
            self.channel.send(ipc.ForwardedRequest(request_id=self._ids, listener=listener,
                                               peer=peer, frame=bytes(request), user=user))
        except OSError as error:
            self._waiting.pop(self._ids, None)
            if not future.done():  # fail_all may have failed it already
                future.set_exception(error)
        return future

    def answered(self, message: ipc.ForwardedResponse) -> None:
        future = self._waiting.pop(message.request_id, None)
        if future is None or future.done():
            return
        if message.frame is None:
            future.set_exception(InvalidRequest(message.refused, message.detail)
                                 if message.refused else
                                 RuntimeError("the parent refused the request"))
            return
        future.set_result(Answer(message.frame, busy=message.busy_ns / 1e9))

    def fail_all(self, error: BaseException) -> list[asyncio.Future]:
        """The parent is gone: no forwarded request will be answered."""
        waiting = list(self._waiting.values())
        self._waiting.clear()
        for future in waiting:
            if not future.done():
                future.set_exception(error)
        return waiting
