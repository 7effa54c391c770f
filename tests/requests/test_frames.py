"""The frame walk that answers memoized requests (workers/frames.py, workers/_frames.c): the C
walk against the Python one on arbitrary bytes and memos, both against the router's own
answers on real ApiVersions frames, and a connection that serves pipelined ApiVersions through
it; the bounded answer table (workers/answer_cache.py) the memo lives in."""

import asyncio
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workers.answer_cache import BoundedCache
from tests.helpers import FakeTransport, connect, feed, make_router
from tests.wire import api_versions_request, metadata_request
from workers import frames
from workers.connection import Connection
from workers.mute import MuteState

needs_c = pytest.mark.skipif(frames._frames is None, reason="never: make install builds it")

ROUTES = [struct.pack(">hh", 18, version) for version in range(4)] + [b"\x00\x03\x00\x0c"]


@needs_c
def test_the_c_walk_is_built_by_make_install_and_shares_the_bounds():
    assert frames.answer_memoized is frames._frames.answer_memoized
    assert (frames._frames.MAX_KEY_BYTES, frames._frames.MAX_ANSWERS) == (
        frames.MAX_KEY_BYTES, frames.MAX_ANSWERS)


def _outcome(walk, data, offset, max_bytes, memo, *end):
    out, handled = [], []
    try:
        stopped = walk(data, offset, max_bytes, memo, out, handled, *end)
    except Exception as error:  # noqa: BLE001 - the kind of refusal is what is compared
        return type(error).__name__, out, handled
    return stopped, out, handled


def _agree(data, offset, max_bytes, memo):
    expected = _outcome(frames.python_answer_memoized, data, offset, max_bytes, memo)
    assert _outcome(frames._frames.answer_memoized, data, offset, max_bytes, memo) == expected
    return expected


# A frame: a route, a correlation id, the rest; its size prefix true or any of the sizes a
# hostile client sends (negative, too small for a header, past the data, huge).
hostile_sizes = st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(0, 12),
                         st.integers(250, 270))
sizes = st.one_of(st.none(), st.none(), st.none(), hostile_sizes)  # mostly true ones
request_frames = st.tuples(st.sampled_from(ROUTES), st.binary(min_size=4, max_size=4),
                           st.sampled_from([b"", b"rest", b"rest!"]) | st.binary(max_size=24),
                           sizes)  # a few rests: the same request again (a pipeline)


def _stream(parts) -> tuple[bytes, list[bytes]]:
    """The bytes of the frames, and the key of each (route + all after the correlation id)."""
    data, keys = b"", []
    for route, correlation, rest, size in parts:
        body = route + correlation + rest
        data += struct.pack(">i", len(body) if size is None else size) + body
        keys.append(route + rest)
    return data, keys


@needs_c
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(parts=st.lists(request_frames, max_size=8), junk=st.binary(max_size=6),
       cut=st.just(0) | st.integers(1, 8), offset=st.none() | st.integers(0, 12),
       max_bytes=st.just(1 << 20) | st.sampled_from([-1, 0, 8, 20, 2**70]),
       chosen=st.none() | st.lists(st.integers(0, 7), max_size=8), prefixes=st.booleans(),
       values=st.tuples(st.binary(max_size=6), st.binary(max_size=30), st.integers(-5, 70)))
def test_the_c_walk_answers_as_the_python_walk(parts, junk, cut, offset, max_bytes, chosen,
                                               prefixes, values):
    data, keys = _stream(parts)
    data = (junk + data)[:max(0, len(junk) + len(data) - cut)]  # the last frame may be cut
    memo = {keys[i]: values for i in (range(len(keys)) if chosen is None else chosen)
            if i < len(keys)}  # every key, or some
    if prefixes and keys:  # a key that is only the start of a frame's key answers nothing
        memo[keys[0][:-1]] = values
    offset = len(junk) if offset is None else offset  # the first frame's, or anywhere
    _agree(data, offset, max_bytes, memo)
    _agree(bytearray(data), offset, max_bytes, memo)
    _agree(memoryview(data), offset, max_bytes, memo)


@needs_c
@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=64), offset=st.integers(0, 80), max_bytes=st.integers(-2, 300))
def test_the_walks_agree_on_random_bytes_and_an_empty_memo(data, offset, max_bytes):
    stopped, out, handled = _agree(data, offset, max_bytes, {})
    assert stopped == offset and out == [] and handled == []


@needs_c
@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(parts=st.lists(request_frames, max_size=6), after=st.binary(max_size=40),
       end=st.integers(-2, 160), offset=st.integers(0, 12))
def test_a_walk_up_to_end_is_the_walk_of_the_first_end_bytes(parts, after, end, offset):
    """A read lies at the start of a larger buffer: the walk never reads past `end`, and the C
    walk agrees with the Python one."""
    data, keys = _stream(parts)
    memo = {key: (b"HEAD", b"-tail", 18) for key in keys}
    buffer = bytearray(data + after)  # past the read: the bytes of an earlier one
    expected = _outcome(frames.python_answer_memoized, buffer, offset, 1 << 20, memo, end)
    assert _outcome(frames._frames.answer_memoized, buffer, offset, 1 << 20, memo, end) == \
        expected
    if end < 0:
        assert expected[0] == "ValueError"
    else:
        assert expected == _outcome(frames.python_answer_memoized, bytes(buffer[:end]), offset,
                                    1 << 20, memo)


@needs_c
def test_a_walk_stops_where_a_refusal_or_a_miss_begins():
    key_frame = struct.pack(">i", 12) + ROUTES[3] + b"\0\0\0\x07" + b"rest"
    memo = {ROUTES[3] + b"rest": (b"HEAD", b"-tail", 18)}
    for stop in (b"\0\0\0", struct.pack(">i", 7) + bytes(7), struct.pack(">i", -1),
                 struct.pack(">i", 265) + bytes(265), key_frame[:-1],
                 struct.pack(">i", 12) + ROUTES[2] + b"\0\0\0\x07" + b"rest"):
        data = key_frame * 2 + stop + key_frame
        stopped, out, handled = _agree(data, 0, 1 << 20, memo)
        assert stopped == 2 * len(key_frame)
        assert out == [b"HEAD\0\0\0\x07-tail" * 2] and handled == [18, 18]
    assert _agree(key_frame, 0, 11, memo)[0] == 0  # over max_bytes: the caller refuses it
    assert _agree(key_frame * 300, 0, 1 << 20, memo)[0] == frames.MAX_ANSWERS * len(key_frame)
    assert _agree(key_frame, 99, 1 << 20, memo)[0] == 99
    assert _agree(key_frame, -1, 1 << 20, memo)[0] == "ValueError"
    assert _agree(key_frame, 0, 1 << 20, {ROUTES[3] + b"rest": (b"", None, 18)})[0] == \
        "TypeError"
    assert _agree(key_frame, 0, 1 << 20, {ROUTES[3] + b"rest": None})[0] == "TypeError"


@needs_c
def test_real_api_versions_frames_get_the_routers_own_answers(tmp_path):
    router = make_router(str(tmp_path))
    requests = [api_versions_request(version, correlation_id=n) for n, version in
                enumerate([3, 3, 2, 1, 0, 3])]
    for request in requests:  # the router memoizes each version's answer
        router.handle(request[4:], 0)
    expected = b"".join(router.handle(request[4:], 0) for request in requests)
    stop = metadata_request(12, correlation_id=99)
    data = b"".join(requests) + stop + requests[0]
    out, handled = [], []
    assert frames.answer_memoized(data, 0, 1 << 20, router.memo.table, out, handled) == \
        len(data) - len(stop) - len(requests[0])
    assert out == [expected] and handled == [18] * len(requests)
    assert _agree(data, 0, 1 << 20, router.memo.table) == (len(data) - len(stop) -
                                                         len(requests[0]), out, handled)



def test_a_connection_answers_pipelined_api_versions_without_the_router():
    """The first request goes to the router (its client id is read, its answer memoized); the
    rest of the pipeline is answered by the walk, in order, counted as served, unmuted."""
    conn, transport, worker = connect()
    calls = []
    handle = conn._handle
    conn._handle = lambda request, *rest: calls.append(bytes(request[:2])) or handle(
        request, *rest)
    feed(conn, b"".join(metadata_request(12, correlation_id=n) if n == 20 else
                        api_versions_request(3, correlation_id=n) for n in range(40)))
    assert transport.responses() == list(range(40)) and len(transport.writes) == 1
    assert calls == [b"\x00\x12", b"\x00\x03"]  # the first ApiVersions, the Metadata
    assert worker.served == [18] * 20 + [3] + [18] * 19
    assert conn.client_id == "test" and conn.requests == 40
    assert conn.state is MuteState.NOT_MUTED and conn.is_idle()


def test_a_read_partly_answered_from_the_memo_is_served_on_in_order_with_one_write():
    """A read whose walk stops at a frame the memo cannot answer: the router answers that one
    (once), the walk goes on after it, every answer leaves in order in one write, and the
    incomplete frame at the end waits as bytes of its own."""
    conn, transport, worker = connect()
    feed(conn, api_versions_request(3, correlation_id=0))  # the client id; the answer memoized
    calls = []
    handle = conn._handle
    conn._handle = lambda request, *rest: calls.append(bytes(request[:2])) or handle(
        request, *rest)
    tail = api_versions_request(3, correlation_id=5)
    feed(conn, b"".join([api_versions_request(3, correlation_id=1),
                         api_versions_request(3, correlation_id=2),
                         metadata_request(12, correlation_id=3),
                         api_versions_request(3, correlation_id=4), tail[:9]]))
    assert calls == [b"\x00\x03"] and len(transport.writes) == 2
    assert transport.responses() == [0, 1, 2, 3, 4]
    assert type(conn._pending) is bytes and conn._pending == tail[:9]
    feed(conn, tail[9:])
    assert transport.responses() == [0, 1, 2, 3, 4, 5] and calls == [b"\x00\x03"]
    assert worker.served == [18, 18, 18, 3, 18, 18] and conn.is_idle()


def test_what_outlives_a_read_is_copied_out_of_the_shared_scratch_buffer():
    """A request whose answer waits keeps its own bytes, and so do the frames read behind it,
    while the next reads (another connection's) overwrite the worker's scratch buffer."""
    loop = asyncio.new_event_loop()
    conn, transport, worker = connect()
    other = Connection(worker, 2, 0, "127.0.0.1:2")
    other.connection_made(FakeTransport())
    feed(conn, api_versions_request(3, correlation_id=0))
    kept, waiting = [], loop.create_future()
    handle = conn._handle
    conn._handle = lambda request, *rest: (kept.append(request) or waiting) if \
        request[:2] == b"\x00\x03" else handle(request, *rest)
    parked = metadata_request(12, correlation_id=2)
    behind = api_versions_request(3, correlation_id=3)
    feed(conn, api_versions_request(3, correlation_id=1) + parked + behind)
    assert transport.responses() == [0, 1] and conn.owes_answer()
    feed(other, b"\xff" * len(worker.scratch))  # the scratch, overwritten: a refusal
    assert type(kept[0]) is bytes and kept[0] == parked[4:]
    assert type(conn._pending) is bytes and conn._pending == behind
    waiting.set_result(struct.pack(">ii", 4, 2))
    loop.run_until_complete(asyncio.sleep(0))  # the future's callbacks
    assert transport.responses() == [0, 1, 2, 3] and conn.is_idle()
    loop.close()


def test_the_answer_table_keeps_its_budget_oldest_first():
    cache = BoundedCache(100, 10)
    cache.put(b"a", "A", 1, 19)
    cache.put(b"b", "B", 1, 19)
    cache.put(b"too long key", "X", 12, 1)  # key over its bound: not kept
    cache.put(b"c", "C", 1, 30)  # over a quarter of the budget: not kept
    assert cache.table == {b"a": "A", b"b": "B"} and cache.bytes == 40
    cache.put(b"a", "A2", 1, 19)  # replaced: now the newest
    assert list(cache.table) == [b"b", b"a"] and cache.bytes == 40
    for key in (b"d", b"e", b"f"):
        cache.put(key, key.upper(), 1, 24)
    assert list(cache.table) == [b"a", b"d", b"e", b"f"] and cache.bytes == 95
    assert cache.get(b"b") is None and cache.get(b"e") == b"E" and len(cache) == 4
    cache.clear()
    assert cache.table == {} and cache.bytes == 0
