"""The router settles every answer in one place (workers.router.Router.settle): quotas charged,
throttle_time_ms written where the answer keeps it, old versions held back by the broker,
file answers read into bytes where the connection cannot send them, waits chained."""

from __future__ import annotations

import asyncio
import os
import struct

from broker.shared.client_quotas import FETCH, PRODUCE
from workers.answer import Answer, Throttled
from workers.fetch_response import FileRegion, FileResponse
from workers.router import Api, Router

from tests.wire import metadata_request, raw_request


class Quotas:
    """Client quotas that answer a fixed throttle and remember what they were charged."""

    def __init__(self, seconds: float = 0.0):
        self.seconds = seconds
        self.charged: list[tuple] = []

    def active(self) -> bool:
        return True

    def earned(self, user, client_id, busy, quota=None, amount=0) -> float:
        self.charged.append((user, client_id, quota, amount, busy > 0))
        return self.seconds


class Answering(Api):
    """An API answering whatever the test sets, framed for the request's correlation id."""

    def __init__(self, key: int, versions: tuple[int, int]):
        super().__init__()
        self.key, self.name, self.versions = key, f"api-{key}", versions
        self.answer = None

    def handle(self, ctx, body):
        return self.answer(ctx) if callable(self.answer) else self.answer


class Client:
    peer = "127.0.0.1:9"

    def __init__(self, files: bool):
        self.files = files


def _router(api: Api, seconds: float = 0.0, forward=None) -> tuple[Router, Quotas]:
    quotas = Quotas(seconds)
    return Router([api], quotas, forward), quotas


def _metadata(ctx, throttle_ms: int = 0) -> bytes:
    """A Metadata v12 answer: size, correlation id, tags, throttle_time_ms, then the rest."""
    return ctx.frame(struct.pack(">i", throttle_ms) + b"rest")


def test_a_throttled_answer_carries_its_throttle_where_the_version_keeps_it():
    api = Answering(3, (12, 12))
    api.answer = _metadata
    router, quotas = _router(api, seconds=0.25)
    settled = router.handle(metadata_request(12, correlation_id=7)[4:], 0, "alice", "1.2.3.4")
    assert type(settled) is Throttled and settled.ms == 250 and not settled.delay
    assert struct.unpack_from(">i", settled.frame, 4)[0] == 7
    assert settled.frame[9:13] == struct.pack(">i", 250)  # after the tags byte
    assert settled.frame.endswith(b"rest")
    assert quotas.charged == [("alice", "test", None, 0, True)]


def test_an_old_version_is_held_back_by_the_broker():
    api = Answering(3, (5, 5))  # Metadata v5: before its clients back off by themselves
    api.answer = _metadata
    router, _quotas = _router(api, seconds=0.01)
    settled = router.handle(metadata_request(5)[4:], 0)
    assert type(settled) is Throttled and settled.delay and settled.ms == 10


def test_an_answer_with_its_own_encoding_is_encoded_with_the_throttle():
    api = Answering(3, (12, 12))
    api.answer = lambda ctx: Answer(_metadata(ctx), PRODUCE, 123,
                                    encode=lambda ms: _metadata(ctx, ms + 1))
    router, quotas = _router(api, seconds=0.002)
    settled = router.handle(metadata_request(12)[4:], 0)
    assert settled.ms == 2 and struct.unpack_from(">i", settled.frame, 9)[0] == 3
    assert quotas.charged[0][2:4] == (PRODUCE, 123)


def test_no_answer_throttled_is_muted_without_an_answer_and_never_held_back():
    api = Answering(3, (5, 5))
    api.answer = Answer(None, PRODUCE, 10)  # acks=0
    router, _quotas = _router(api, seconds=1.0)
    assert router.handle(metadata_request(5)[4:], 0) == Throttled(None, 1000, delay=False)
    router.quotas.seconds = 0
    assert router.handle(metadata_request(5)[4:], 0) is None


def _file_answer(tmp_path, ctx) -> FileResponse:
    """The Metadata-shaped answer followed by ten bytes of a file, as a region."""
    path = tmp_path / "records"
    path.write_bytes(b"0123456789")
    head = _metadata(ctx)
    size = len(head) - 4 + 10
    return FileResponse([struct.pack(">i", size) + head[4:],
                         FileRegion(os.open(path, os.O_RDONLY), 0, 10)], size + 4)


def test_file_answers_are_read_into_bytes_for_a_connection_that_cannot_send_them(tmp_path):
    api = Answering(3, (12, 12))
    api.answer = lambda ctx: Answer(_file_answer(tmp_path, ctx), FETCH, 10)
    router, _quotas = _router(api)
    sent = router.handle(metadata_request(12)[4:], 0, client=Client(files=True))
    assert type(sent) is FileResponse
    sent.close()
    read = router.handle(metadata_request(12)[4:], 0, client=Client(files=False))
    assert type(read) is bytes and read.endswith(b"rest0123456789")
    router.quotas.seconds = 0.5  # a throttled one too, whatever the connection
    throttled = router.handle(metadata_request(12)[4:], 0, client=Client(files=True))
    assert type(throttled.frame) is bytes and struct.unpack_from(">i", throttled.frame, 9)[0] == 500


def test_a_forwarded_answer_is_charged_the_parents_time_and_a_cancel_reaches_the_parent_wait():
    loop = asyncio.new_event_loop()
    forwarded = []

    def forward(request, listener, peer, user):
        forwarded.append((peer, user, loop.create_future()))
        return forwarded[-1][2]

    # OffsetCommit v3 (a forwarded API): its answer begins with throttle_time_ms.
    api = Answering(8, (3, 3))
    api.forwarded = True
    router, quotas = _router(api, seconds=0.003, forward=forward)
    body = struct.pack(">h1sihqi", 1, b"g", -1, 0, -1, 0)  # group, generation, member, ...
    request = raw_request(8, 3, 5, body)[4:]
    try:
        settled = router.handle(request, 0, "bob", "10.0.0.1", Client(files=True))
        assert forwarded[0][:2] == ("127.0.0.1:9", "bob")
        answer = struct.pack(">iiii", 12, 5, 0, 0)  # size, correlation, throttle, no topics
        forwarded[0][2].set_result(Answer(answer, busy=0.5))
        loop.run_until_complete(asyncio.sleep(0))
        result = settled.result()
        assert type(result) is Throttled and result.delay  # v3: before clients back off
        assert struct.unpack_from(">iii", result.frame, 4) == (5, 3, 0)
        assert quotas.charged[-1] == ("bob", "raw", None, 0, True)  # the parent's busy time
        waiting = router.handle(request, 0, "bob", "10.0.0.1", Client(files=True))
        waiting.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        assert forwarded[1][2].cancelled()
    finally:
        loop.close()


def test_a_longer_throttle_the_handler_wrote_stays():
    """CreateTopics writes KIP-599's retry-after itself: a shorter request throttle keeps it."""
    api = Answering(3, (12, 12))
    api.answer = lambda ctx: _metadata(ctx, 1000)
    router, _quotas = _router(api, seconds=0.005)
    settled = router.handle(metadata_request(12)[4:], 0)
    assert settled.ms == 5 and struct.unpack_from(">i", settled.frame, 9)[0] == 1000


def test_a_fetch_emptied_for_what_its_client_owed_is_throttled_at_least_that_long():
    """The debt may run out between the handler's look and the router's charge: the answer
    that read nothing for it still carries (and mutes for) what was owed."""
    api = Answering(3, (12, 12))
    api.answer = lambda ctx: Answer(_metadata(ctx), FETCH, 0, owed=0.04)
    router, _quotas = _router(api, seconds=0.0)
    settled = router.handle(metadata_request(12)[4:], 0)
    assert settled.ms == 40 and struct.unpack_from(">i", settled.frame, 9)[0] == 40


def test_the_handling_time_of_a_wait_that_is_cancelled_is_charged_all_the_same():
    loop = asyncio.new_event_loop()
    api = Answering(3, (12, 12))
    api.answer = lambda ctx: loop.create_future()  # a long poll
    router, quotas = _router(api, seconds=0.0)
    try:
        settled = router.handle(metadata_request(12)[4:], 0, "carol")
        assert quotas.charged == []  # nothing yet: the wait is charged when it ends
        settled.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        assert quotas.charged == [("carol", "test", None, 0, True)]
    finally:
        loop.close()
