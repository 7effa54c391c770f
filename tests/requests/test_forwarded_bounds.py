"""The bound on the parent's answers to forwarded requests, in process: `ResponseBudget` and
`ForwardedRouter`'s refusals (an answer past pybroker.forwarded.response.max.bytes, or one the
worker's channel has no room for, goes back as a refusal the worker closes the connection
for, never as bytes that could break the channel)."""

from __future__ import annotations

import types

import pytest

from broker.parent.forwarded import (RESPONSE_TOO_LARGE, ForwardedRouter, ResponseBudget,
                                     ResponseTooLarge, budget_of)
from broker.shared import ipc
from broker.shared.config import load_config
from shm.block import INVALID_REASONS


def test_a_budget_refuses_past_its_bytes_or_its_entries():
    budget = ResponseBudget(1000, 3)
    budget.charge(100)
    budget.charge(100, 2)
    with pytest.raises(ResponseTooLarge, match="more than 3 entries"):
        budget.charge(0)
    budget = ResponseBudget(1000, 100)
    with pytest.raises(ResponseTooLarge, match="more than 1000 bytes"):
        budget.charge(990)  # and ENTRY_BYTES for the entry
    with pytest.raises(ValueError):
        ResponseBudget(0, 1)
    defaults = budget_of()
    assert (defaults.max_bytes, defaults.max_entries) == (32 << 20, 100_000)
    assert RESPONSE_TOO_LARGE in INVALID_REASONS and "forward_backlog" in INVALID_REASONS


class Channel:
    """A worker's channel that takes what it is sent, with as much room as it is told."""

    def __init__(self, room: int):
        self.room, self.sent = room, []

    def has_room(self, nbytes: int) -> bool:
        return nbytes <= self.room

    def pending(self) -> int:
        return ipc.CLIENT_QUEUED_BYTES - self.room

    def send(self, message) -> None:
        self.sent.append(message)


@pytest.mark.parametrize("size, room, refused", [
    (1000, 1 << 30, False), (2 << 20, 1 << 30, True), (1000, 999, True)])
def test_the_router_refuses_an_answer_too_large_or_without_room(size, room, refused):
    config = load_config({"pybroker.forwarded.response.max.bytes": str(1 << 20)})
    admin = types.SimpleNamespace(dynamic=types.SimpleNamespace(config=config))
    router = ForwardedRouter(admin, None, None, None)
    channel = Channel(room)
    worker = types.SimpleNamespace(channel=channel, name="data-0")
    request = ipc.ForwardedRequest(request_id=9, listener=0, peer="127.0.0.1:1",
                               frame=b"\x00\x0f\x00\x05" + bytes(10))
    router._answer(worker, channel, request, b"x" * size, busy=5)
    [response] = channel.sent
    assert response.request_id == 9 and response.busy_ns == 5
    if refused:
        assert response.frame is None and response.refused == RESPONSE_TOO_LARGE
        assert response.detail.startswith("DescribeGroups: ")
    else:
        assert response.frame == b"x" * size and response.refused == ""
