"""A read's counts (workers/counts.py, workers/_counts.c): the C against the Python on arbitrary
counters, api keys, latencies and aggregates, and the request metrics and event aggregates a
connection's reads leave behind, memoized or not, read whole or in pieces."""

import os
from array import array

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.shared.events import EventLog, latency_bucket
from shm.block import SharedBlock, duration_bucket
from tests.helpers import FakeTransport, FakeWorker
from tests.wire import api_versions_request, metadata_request
from workers import connection, counts, worker
from workers.connection import Connection
from workers.worker_events import WorkerEvents
from workers.stats import WorkerStats

needs_c = pytest.mark.skipif(counts._counts is None, reason="never: make install builds it")

INT64 = st.integers(-(2**63), 2**63 - 1)


def _outcome(count, words, *args):
    try:
        count(words, *args)
    except Exception as error:  # noqa: BLE001 - the kind of refusal is what is compared
        return type(error).__name__, list(words)
    return None, list(words)


@needs_c
def test_the_c_counts_are_built_by_make_install_and_share_the_bounds():
    assert counts.count_requests is counts._counts.count_requests
    assert counts.aggregate is counts._counts.aggregate
    assert (counts._counts.API_KEYS, counts._counts.SKETCH_BUCKETS) == (
        counts.API_KEYS, counts.SKETCH_BUCKETS)


@needs_c
@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(words=st.lists(st.integers(-5, 5) | INT64, min_size=0, max_size=40),
       cells=st.lists(st.tuples(st.integers(-45, 45), st.integers(-45, 45),
                                st.integers(-45, 45) | st.sampled_from([2**63, -(2**70)])),
                      min_size=1, max_size=3),
       listener=st.integers(-4, 4),
       bounds=st.lists(st.integers(0, 100), max_size=4).map(lambda b: tuple(sorted(b))),
       api_keys=st.lists(st.integers(0, 3) | st.integers(-2, 130) | st.just(2**70), max_size=8),
       elapsed=st.integers(-5, 120) | INT64 | st.sampled_from([2**63, -(2**64)]))
def test_the_c_count_of_requests_is_the_python_count(words, cells, listener, bounds, api_keys,
                                                     elapsed):
    """Same words written, same refusal (an index past the counters, a sum past 8 bytes) at
    the same step, on any counters, cells, keys and latencies."""
    cells = tuple(cells)
    expected = _outcome(counts.python_count_requests, memoryview(array("q", words)), cells,
                        bounds, listener, api_keys, elapsed)
    assert _outcome(counts._counts.count_requests, memoryview(array("q", words)), cells, bounds,
                    listener, api_keys, elapsed) == expected


@needs_c
@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(entry=st.lists(st.integers(-3, 3) | INT64, min_size=0, max_size=200),
       requests=st.integers(0, 60) | INT64, moved=st.tuples(st.integers(0, 10**6), INT64),
       us=st.integers(-3, 10**7) | INT64)
def test_the_c_aggregate_is_the_python_aggregate(entry, requests, moved, us):
    """Same counts added, same refusal at the same step: a sketch shorter than the bucket,
    a count past 8 bytes."""
    expected = _outcome(counts.python_aggregate, array("q", entry), requests, *moved, us)
    assert _outcome(counts._counts.aggregate, array("q", entry), requests, *moved, us) == \
        expected


@needs_c
def test_the_counts_refuse_what_is_not_their_arguments():
    words = memoryview(array("q", [0] * 8))
    cells = ((0, 1, 2),)
    for count in (counts.python_count_requests, counts._counts.count_requests):
        with pytest.raises(IndexError):
            count(words, cells, (), 1, [0], 5)  # no such listener
    for args in ((bytearray(64), cells, (), 0, [0], 5), (words, [(0, 1, 2)], (), 0, [0], 5),
                 (words, ((0, 1),), (), 0, [0], 5), (words, cells, (), 0, (0,), 5),
                 (words, cells, (), 0, ["0"], 5), (words, cells, (), 0, [0], 5.0)):
        with pytest.raises(TypeError):
            counts._counts.count_requests(*args)
    with pytest.raises(ValueError):  # as a memoryview refuses a sum past 8 bytes
        counts._counts.count_requests(memoryview(array("q", [2**63 - 1] * 8)), cells, (), 0,
                                      [0], 5)
    entry = counts.new_aggregate()
    assert len(entry) == counts.AGGREGATE_SKETCH + counts.SKETCH_BUCKETS
    for args in ((list(entry), 1, 0, 0, 5), (entry, 1.0, 0, 0, 5), (bytearray(1600), 1, 0, 0, 5)):
        with pytest.raises(TypeError):
            counts._counts.aggregate(*args)
    with pytest.raises(OverflowError):
        counts._counts.aggregate(entry, 2**64, 0, 0, 5)
    assert not any(entry)


def test_latencies_past_the_sketch_count_in_its_last_bucket():
    for us in (0, 7, 8, 1000, 2**46, 2**47, 2**61):
        entry = counts.new_aggregate()
        counts.aggregate(entry, 3, 10, 20, us)
        bucket = min(latency_bucket(us), counts.SKETCH_BUCKETS - 1)
        assert entry[:4] == array("q", [3, 10, 20, 3 * us])
        assert entry[counts.AGGREGATE_SKETCH + bucket] == 3 and sum(entry[4:]) == 3


# --- the counts of a connection's reads ------------------------------------------------------

STEP = 2**-15  # seconds, exact in a float: a read's answer comes this long after it


class _Clock:
    """time.monotonic for the connection and the worker: STEP later at each look."""

    def __init__(self):
        self.now = 1024.0

    def __call__(self):
        self.now += STEP
        return self.now


class _Host(FakeWorker):
    """A connection's host with the worker's own request accounting, real counters and a real
    event log (a shared block and an event file in a temporary directory)."""

    requests_served = worker.Worker.requests_served

    def __init__(self, directory):
        super().__init__()
        self.block = SharedBlock.create(os.path.join(directory, "block"), 2, 1)
        self.stats = WorkerStats(self.block, 0)
        self.events = WorkerEvents(EventLog(os.path.join(directory, "events"), "w0", 0,
                                            1 << 20, 1 << 24), ["PLAINTEXT"], ["data"], {},
                                   60_000)

    def muted(self, reason, change):
        pass

    def counted(self, api_key: int, bucket: int | None = None) -> int:
        block, words = self.block, self.stats.words
        if bucket is not None:
            return words[block.worker_cell(0, "request_duration_bucket", 0, api_key, bucket)]
        return words[block.worker_cell(0, "requests", 0, api_key)]

    def duration_ns(self, api_key: int) -> int:
        return self.stats.words[self.block.worker_cell(0, "request_duration_ns", 0, api_key)]


@pytest.fixture
def host(tmp_path, monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(connection, "_monotonic", clock)
    monkeypatch.setattr(worker, "_monotonic", clock)
    made = _Host(str(tmp_path))
    yield made
    made.block.close()


def _read(conn, data: bytes) -> None:
    buffer = conn.get_buffer(-1)
    buffer[:len(data)] = data
    conn.buffer_updated(len(data))


def test_each_read_counts_its_requests_latency_and_bytes_memoized_or_not(host):
    """Reads answered from the memo (one request, a pipeline), a read the router answers, one
    that mixes both and a frame cut in two: the counters and the event aggregates hold each
    request once, with the latency from its read to its answer and the bytes the connection
    moved since its previous read (a mixed read's split by count)."""
    conn, transport = Connection(host, 1, 0, "127.0.0.1:1"), FakeTransport()
    conn.connection_made(transport)
    one = api_versions_request(3, correlation_id=1)
    meta = metadata_request(12, correlation_id=2)
    mixed = one + meta + one
    for data in (one, one, one * 5, meta, mixed, one[:7]):
        _read(conn, data)
    _read(conn, one[7:] + one)  # the rest of the cut frame and a whole one: 2 requests
    assert transport.responses() == [1] * 7 + [2, 1, 2, 1, 1, 1]
    elapsed_ns = int(STEP * 1e9)
    assert (host.counted(18), host.counted(3)) == (11, 2)
    bucket = duration_bucket(elapsed_ns)
    assert (host.counted(18, bucket), host.counted(3, bucket)) == (11, 2)
    assert (host.duration_ns(18), host.duration_ns(3)) == (11 * elapsed_ns, 2 * elapsed_ns)
    entries = {api_key: entry for (_, api_key, _), entry in host.events._table.items()}
    assert sorted(entries) == [3, 18]
    us = elapsed_ns // 1000
    assert list(entries[18][:4:3]) == [11, 11 * us] and list(entries[3][:4:3]) == [2, 2 * us]
    sketch = counts.AGGREGATE_SKETCH + latency_bucket(us)
    assert (entries[18][sketch], entries[3][sketch]) == (11, 2)
    answer, meta_answer = len(transport.writes[0]), len(transport.writes[3])
    mixed_out = 2 * answer + meta_answer
    assert entries[18][1] == 9 * len(one) + 2 * len(mixed) // 3
    assert entries[3][1] == len(meta) + len(mixed) // 3
    assert entries[18][2] == 9 * answer + 2 * mixed_out // 3
    assert entries[3][2] == meta_answer + mixed_out // 3
    assert (conn.bytes_in_logged, conn.bytes_out_logged) == (conn.bytes_in, conn.bytes_out)
    assert conn.requests == 13 and conn.is_idle()
