"""Front-end mode in process: a worker's links to an upstream node (workers.upstream) over a
fake transport - answers read whole however they arrive, one request per link at a time,
requests waiting for a link in order, a throttled link held back, a lost link failing its
request, a link closed when its answer is overdue or its client went away, a link whose SASL
session ran out never reused."""

from __future__ import annotations

import asyncio
import struct

import pytest

from broker.shared import ipc
from broker.shared.upstream_security import UpstreamSecurity
from workers.upstream import HEAD_BYTES, NodePool, UpstreamLink, UpstreamUnavailable


class FakeTransport:
    def __init__(self):
        self.written: list[bytes] = []
        self.closing = False

    def writelines(self, parts):
        self.written.append(b"".join(bytes(part) for part in parts))

    def abort(self):
        self.closing = True

    close = abort

    def is_closing(self):
        return self.closing


def request(correlation: int, api_key: int = 3, version: int = 12) -> bytes:
    """A request frame (no size): header v2 with an empty client id, no body."""
    return struct.pack(">hhih", api_key, version, correlation, 0) + b"\0"


def answer(correlation: int, body: bytes = b"", throttle_ms: int = 0) -> bytes:
    """A size-prefixed Metadata v12 answer: header v1, then throttle_time_ms first."""
    payload = struct.pack(">i", correlation) + b"\0" + struct.pack(">i", throttle_ms) + body
    return struct.pack(">i", len(payload)) + payload


def feed(link: UpstreamLink, data: bytes, chunk: int) -> None:
    while data:
        buffer = link.get_buffer(-1)
        part = data[:min(chunk, len(buffer))]
        buffer[:len(part)] = part
        link.buffer_updated(len(part))
        data = data[len(part):]


def pool_with_links(loop, count: int, cap: int = 2) -> tuple[NodePool, list[UpstreamLink]]:
    pool = NodePool(loop, ipc.UpstreamNode(node_id=1, host="127.0.0.1", port=9), cap, 1.0,
                    UpstreamSecurity("PLAINTEXT"))
    links = []
    for _ in range(count):
        link = UpstreamLink(pool)
        link.connection_made(FakeTransport())
        link.ready = True
        pool.links.add(link)
        pool.release(link)
        links.append(link)
    return pool, links


def run(coroutine):
    return asyncio.run(coroutine)


@pytest.mark.parametrize("chunk", [1, 7, HEAD_BYTES, 1 << 20])
@pytest.mark.parametrize("size", [0, 100, HEAD_BYTES * 3])
def test_an_answer_is_read_whole_however_it_arrives(chunk, size):
    async def scenario():
        pool, (link,) = pool_with_links(asyncio.get_running_loop(), 1)
        future = pool.request(request(5), lambda whole: whole, 5.0)
        assert link.transport.written == [struct.pack(">i", 11) + request(5)]
        expected = answer(5, bytes(range(256)) * (size // 256) + b"x" * (size % 256))
        feed(link, expected, chunk)
        assert bytes(await future) == expected
        assert pool.request(request(6), bytes, 5.0) is not None and link.busy  # idle again, reused

    run(scenario())


def test_requests_wait_for_a_link_and_go_in_order():
    async def scenario():
        pool, links = pool_with_links(asyncio.get_running_loop(), 2)
        futures = [pool.request(request(n), lambda whole: whole, 5.0) for n in range(1, 5)]
        assert all(link.busy for link in links) and len(pool._waiting) == 2
        first = next(link for link in links if link.transport.written[0][8:12] ==
                     struct.pack(">i", 1))
        feed(first, answer(1), 1 << 20)
        assert first.transport.written[-1][8:12] == struct.pack(">i", 3)  # next waiting
        assert (await futures[0])[4:8] == struct.pack(">i", 1)

    run(scenario())


def test_an_answer_to_another_request_fails_it_and_closes_the_link():
    async def scenario():
        pool, (link,) = pool_with_links(asyncio.get_running_loop(), 1)
        future = pool.request(request(5), lambda whole: whole, 5.0)
        feed(link, answer(6), 1 << 20)
        with pytest.raises(UpstreamUnavailable):
            await future
        assert link.transport.closing

    run(scenario())


def test_a_link_the_upstream_throttled_is_held_for_the_throttle():
    async def scenario():
        pool, (link,) = pool_with_links(asyncio.get_running_loop(), 1, cap=1)
        future = pool.request(request(5), lambda whole: whole, 5.0)
        feed(link, answer(5, throttle_ms=200), 1 << 20)
        await future
        waiting = pool.request(request(6), lambda whole: whole, 5.0)
        assert not link.busy and len(pool._waiting) == 1  # held, not given the next request
        await asyncio.sleep(0.3)
        assert link.busy and link.transport.written[-1][8:12] == struct.pack(">i", 6)
        waiting.cancel()

    run(scenario())


def test_a_link_lost_with_a_request_on_it_fails_that_request():
    async def scenario():
        pool, (link,) = pool_with_links(asyncio.get_running_loop(), 1)
        future = pool.request(request(5), lambda whole: whole, 5.0)
        link.connection_lost(ConnectionResetError())
        with pytest.raises(UpstreamUnavailable):
            await future
        await asyncio.sleep(0)  # the future's callbacks (the count) run
        assert link not in pool.links and pool.failures == 1

    run(scenario())


def test_an_overdue_answer_or_a_client_gone_closes_the_link():
    async def scenario():
        pool, links = pool_with_links(asyncio.get_running_loop(), 2)
        overdue = pool.request(request(5), lambda whole: whole, 0.05)
        abandoned = pool.request(request(6), lambda whole: whole, 5.0)
        await asyncio.sleep(0.1)
        closed = [link for link in links if link.transport.closing]
        assert len(closed) == 1 and closed[0].transport.written[0][8:12] == struct.pack(">i", 5)
        closed[0].connection_lost(None)  # what the transport's abort brings
        with pytest.raises(UpstreamUnavailable):
            await overdue
        abandoned.cancel()
        await asyncio.sleep(0)
        assert all(link.transport.closing for link in links)

    run(scenario())


def test_a_link_whose_sasl_session_ran_out_is_not_reused():
    async def scenario():
        pool, (link,) = pool_with_links(asyncio.get_running_loop(), 1, cap=1)
        link.expires_at = 0.0
        waiting = pool.request(request(5), lambda whole: whole, 5.0)
        assert link.transport.closing and link not in pool.links and not link.busy
        waiting.cancel()

    run(scenario())
