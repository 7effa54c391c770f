"""A read's requests counted: into a worker's request counters in the shared block
(workers.stats) and into the event log's per-second aggregate (workers.worker_events).

    count_requests(words, cells, bounds, listener, api_keys, elapsed_ns)

adds the requests of one read, `api_keys` (their api keys), answered `elapsed_ns` after the
read, to the counters of `listener`: `words` is the shared block's words (a memoryview of
format 'q'), `cells[listener]` (requests, buckets, duration) the indexes of API 0's cells on
that listener (shm.block: each API's cells follow API 0's, len(bounds) + 1 buckets per API)
and `bounds` the buckets' upper bounds in nanoseconds (shm.block.DURATION_BOUNDS_NS).  APIs
outside 0..127 are not counted; an index outside `words` raises IndexError and a sum outside
8 bytes ValueError.

    aggregate(entry, requests, bytes_in, bytes_out, us)

adds to an aggregate of the event log - an array('q'): count, bytes in, bytes out, latency
sum in us, then SKETCH_BUCKETS counts by broker.shared.events.latency_bucket (new_aggregate)
- `requests` requests that moved `bytes_in` and `bytes_out` bytes, each answered `us`
microseconds after it arrived; latencies past the sketch count in its last bucket.  A count
past 8 bytes raises OverflowError (the four arguments are ints of 8 bytes: the C refuses
others before it adds anything).

Both run once per read, so they are in C (workers/_counts.c, built by `pip install -e .`): in
Python, the additions to shared memory and to the aggregate cost ~9,000 instructions a read,
half of what a memoized answer costs all told.  The python_ functions are the same in Python,
the oracles the tests and the fuzz target compare them with, and what runs where the C ones
are not built.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left

from broker.shared.events import latency_bucket

API_KEYS = 128  # the counted APIs: 0..127, as the shared block's layout has them
SKETCH_BUCKETS = 192  # up to about 2**47 us; slower requests count in the last bucket
AGGREGATE_SKETCH = 4  # where an aggregate's sketch begins, after its four sums


def python_count_requests(words, cells: tuple, bounds: tuple, listener: int,
                          api_keys: list[int], elapsed_ns: int) -> None:
    """The requests' counters, in Python (see the module's docstring)."""
    requests, buckets, duration = cells[listener]
    buckets += bisect_left(bounds, elapsed_ns)
    per_api = len(bounds) + 1
    for api_key in (sorted(set(api_keys)) if len(api_keys) > 1 else api_keys):
        if 0 <= api_key < API_KEYS:
            count = api_keys.count(api_key)
            words[requests + api_key] += count
            words[buckets + api_key * per_api] += count
            words[duration + api_key] += elapsed_ns * count


def new_aggregate():
    """A zeroed aggregate (see the module's docstring)."""
    return array("q", bytes(8 * (AGGREGATE_SKETCH + SKETCH_BUCKETS)))


def python_aggregate(entry, requests: int, bytes_in: int, bytes_out: int, us: int) -> None:
    """An aggregate's additions, in Python (see the module's docstring)."""
    entry[0] += requests
    entry[1] += bytes_in
    entry[2] += bytes_out
    entry[3] += us * requests
    entry[AGGREGATE_SKETCH + min(latency_bucket(us), SKETCH_BUCKETS - 1)] += requests


try:  # the same in C, built by `pip install -e .`
    from workers import _counts
except ImportError:
    _counts = None
if _counts is None:
    count_requests, aggregate = python_count_requests, python_aggregate
else:
    count_requests, aggregate = _counts.count_requests, _counts.aggregate
