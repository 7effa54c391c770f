"""The memory pool's shared state survives a process killed in the middle of changing it.

Each case forks a process that takes the pool lock and dies (os._exit) at a chosen point of a
change; the survivors then find the state either untouched or wholly changed, never half, and
the parent's reclaim returns every byte.
"""

import os

import pytest

from broker.shared.pool import QueueFull, SharedPool, initialise_pool

LIMIT = 1000
BLOCK_LAYOUT = {"slots": 2, "listeners": 1, "pool_ring": 16}


@pytest.fixture(autouse=True)
def pool(block):
    """Every test's block holds a pool of LIMIT bytes."""
    initialise_pool(block, LIMIT, {})


def die_during(block, slot: int, action) -> None:
    """Run `action(pool)` in a child whose process ends inside the pool's change."""
    pid = os.fork()
    if pid == 0:  # the child: never returns
        pool = SharedPool(block, slot, LIMIT, {})
        original = pool._set

        def dying_set(field, value):
            original(field, value)
            os._exit(0)  # killed between two writes of one change

        pool._set = dying_set
        try:
            action(pool)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def test_a_worker_killed_while_taking_memory_changed_nothing(block):
    parent = SharedPool(block, -1, LIMIT, {})

    def take_and_queue(pool):
        pool._add = lambda field, change: (pool.words.__setitem__(
            pool._base + field, pool.words[pool._base + field] + change), os._exit(0))
        pool.try_allocate(300, 0)

    die_during(block, 0, take_and_queue)
    assert parent.used() == 0 and parent.leased(0, 0) == 0  # nothing half-taken
    worker = SharedPool(block, 1, LIMIT, {})
    assert worker.try_allocate(LIMIT, 0)  # the whole pool is still there
    worker.release(LIMIT, 0)
    assert parent.used() == 0


def test_a_worker_killed_while_granting_leaves_the_waiter_queued_not_lost(block):
    parent = SharedPool(block, -1, LIMIT, {})
    holder, waiter = SharedPool(block, 0, LIMIT, {}), SharedPool(block, 1, LIMIT, {})
    assert holder.try_allocate(LIMIT, 0)
    assert not waiter.try_allocate(200, 0)  # queued behind an empty pool
    assert parent.waiting() == 1

    die_during(block, 0, lambda pool: pool.release(LIMIT, 0))  # dies mid-grant
    assert parent.waiting() == 1 and waiter.grants(0) == 0  # still queued: nothing half-done
    assert parent.reclaim(0) == LIMIT  # the parent returns the dead worker's lease...
    assert waiter.grants(0) == 1 and parent.leased(1, 0) == 200  # ...and the waiter is served
    waiter.release(200, 0)
    assert parent.used() == 0 and parent.waiting() == 0


def test_the_waiters_bound_is_a_clear_refusal(block):
    holder, waiter = SharedPool(block, 0, LIMIT, {}), SharedPool(block, 1, LIMIT, {})
    assert holder.try_allocate(LIMIT, 0)
    for _ in range(16):
        assert not waiter.try_allocate(10, 0)
    with pytest.raises(QueueFull):
        waiter.try_allocate(10, 0)
    assert SharedPool(block, -1, LIMIT, {}).waiting() == 16  # the refused one left no trace
