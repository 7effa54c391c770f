"""The worker's request queue and memory-pool waiters (workers/backpressure.py), with fakes."""

import collections

import pytest

from workers.backpressure import MemoryWaiters, RequestQueue


class Stats:
    def __init__(self):
        self.muted_now = collections.Counter()
        self.queued = 0

    def muted(self, reason, change):
        self.muted_now[reason] += change

    def queued_requests(self, count):
        self.queued = count


class Waiter:
    """A connection as the two waits see it."""

    def __init__(self, name, listener_index=0, memory_wait=0, on_resume=None):
        self.name, self.listener_index, self.memory_wait = name, listener_index, memory_wait
        self.closing = False
        self.on_resume = on_resume
        self.events = []

    def queue_resumed(self):
        self.events.append("queue")
        if self.on_resume:
            self.on_resume()

    def memory_granted(self):
        self.events.append(("memory", self.memory_wait))
        self.memory_wait = 0


class Pool:
    """Grants are counted per listener, as broker.shared.pool counts them per worker."""

    def __init__(self):
        self.granted = collections.Counter()
        self.released = []

    def try_allocate(self, size, listener):
        return False

    def grants(self, listener):
        return self.granted[listener]

    def release(self, size, listener):
        self.released.append((size, listener))


def test_a_queue_holds_at_least_one_request():
    with pytest.raises(ValueError):
        RequestQueue(0, Stats())


def test_the_queue_is_full_at_capacity_and_counts_only_queued_requests():
    stats = Stats()
    queue = RequestQueue(2, stats)
    queue.parked(queued=False)  # a long poll: parked, not queued
    queue.parked(queued=True)
    assert not queue.full and stats.queued == 1 and stats.muted_now["in_flight"] == 2
    queue.parked(queued=True)
    assert queue.full and stats.queued == 2
    queue.done(queued=False)
    assert queue.full and stats.muted_now["in_flight"] == 2


def test_waiters_resume_in_order_while_there_is_room():
    stats = Stats()
    queue = RequestQueue(1, stats)
    queue.parked(queued=True)
    # The first resumed connection parks a request of its own: the queue is full again.
    first = Waiter("first", on_resume=lambda: queue.parked(queued=True))
    second = Waiter("second")
    queue.wait(first)
    queue.wait(second)
    assert stats.muted_now["queue"] == 2
    queue.done(queued=True)
    assert first.events == ["queue"] and second.events == [] and queue.full
    queue.done(queued=True)
    assert second.events == ["queue"] and not queue.full
    assert stats.muted_now["queue"] == 0 and stats.queued == 0


def test_memory_waiters_need_a_listener():
    with pytest.raises(ValueError):
        MemoryWaiters(Pool(), 0, Stats(), None)


def test_grants_go_to_the_longest_waiter_of_their_listener():
    pool, stats = Pool(), Stats()
    waiters = MemoryWaiters(pool, 2, stats, None)
    assert waiters.try_allocate(10, 0) is False  # the pool's own, bound once
    a, b, c = Waiter("a", 0, 100), Waiter("b", 0, 200), Waiter("c", 1, 300)
    for conn in (a, b, c):
        waiters.wait(conn)
    assert stats.muted_now["memory"] == 3
    pool.granted[0] = 1
    pool.granted[1] = 1
    waiters.take_grants()
    assert a.events == [("memory", 100)] and b.events == [] and c.events == [("memory", 300)]
    pool.granted[0] = 2
    waiters.take_grants()
    waiters.take_grants()  # a grant is handed over once
    assert b.events == [("memory", 200)] and stats.muted_now["memory"] == 0


def test_a_waiter_gone_before_its_grant_gives_the_bytes_back():
    pool = Pool()
    waiters = MemoryWaiters(pool, 1, Stats(), None)
    gone = Waiter("gone", 0, 500)
    waiters.wait(gone)
    gone.closing = True
    pool.granted[0] = 1
    waiters.release(64, 0)  # our own release takes the grants it made
    assert pool.released == [(64, 0), (500, 0)]
    assert gone.events == [] and gone.memory_wait == 0
